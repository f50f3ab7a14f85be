// api/devices.h: the device list, choosing a session's device by index and by UUID, the C ABI's
// vkad_device_count / vkad_device_get, and sessions on several threads at once (run by the
// ThreadSanitizer CI job as ProcessWide.*).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api/vkad_c.h"
#include "ir/builder.h"
#include "runtime/runtime.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using codegen::Array;
using codegen::KernelBuilder;
using codegen::Value;

std::vector<DeviceInfo> listed_or_skip(bool* skip) {
  auto list = devices();
  *skip = !list.ok() || list->empty();
  return list.ok() ? *list : std::vector<DeviceInfo>{};
}

#define DEVICES_OR_SKIP(var)                                 \
  bool var##_skip = false;                                   \
  std::vector<DeviceInfo> var = listed_or_skip(&var##_skip); \
  if (var##_skip) GTEST_SKIP() << "SKIPPED: no Vulkan device"

std::unique_ptr<Session> open(const std::string& device) {
  SessionOptions o;
  o.validation = true;
  o.device = device;
  auto s = Session::create(o);
  EXPECT_TRUE(s.ok()) << "device '" << device << "': " << s.status().to_string();
  return s.ok() ? std::move(s).value() : nullptr;
}

void expect_no_validation_messages(Session& s) {
  const rhi::Device& d = s.runtime().device();
  EXPECT_EQ(d.validation_message_count(), 0u) << [&] {
    std::string all;
    for (const auto& m : d.validation_messages()) all += m + "\n";
    return all;
  }();
}

TEST(Devices, ListedInIndexOrderWithUuidsAndOneAutomaticChoice) {
  DEVICES_OR_SKIP(list);
  int automatic = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const DeviceInfo& d = list[i];
    EXPECT_EQ(d.index, i);
    EXPECT_FALSE(d.name.empty());
    ASSERT_EQ(d.uuid.size(), 36u) << d.uuid;
    EXPECT_EQ(d.uuid, rhi::format_uuid(d.uuid_bytes));
    EXPECT_EQ(d.cpu, d.kind == "CPU");
    EXPECT_EQ(d.usable, d.unusable.empty()) << d.unusable;
    automatic += d.automatic ? 1 : 0;
  }
  EXPECT_EQ(automatic, 1);
}

// Session(device = uuid), as nvidia-smi prints it too, and by index: each lands on the listed
// device; the automatic one is what Session::create() takes.
TEST(Devices, SessionsOpenTheDeviceTheirUuidOrIndexNames) {
  DEVICES_OR_SKIP(list);
  for (const DeviceInfo& d : list) {
    if (!d.usable) continue;
    for (const std::string& how : {d.uuid, "GPU-" + d.uuid, std::to_string(d.index)}) {
      auto s = open(how);
      ASSERT_TRUE(s);
      EXPECT_EQ(s->device_uuid(), d.uuid) << "device option '" << how << "'";
      EXPECT_EQ(s->device_name(), d.name);
      expect_no_validation_messages(*s);
    }
    if (d.automatic) {
      auto s = open("");
      ASSERT_TRUE(s);
      EXPECT_EQ(s->device_uuid(), d.uuid) << "the automatic choice";
    }
  }
}

TEST(Devices, AnUnknownUuidIsNotFoundAndNamesWhatExists) {
  DEVICES_OR_SKIP(list);
  SessionOptions o;
  o.device = "GPU-00000000-0000-0000-0000-0000000000ff";
  auto s = Session::create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(s.status().message().find("no device has UUID 00000000-0000-0000-0000-0000000000ff"),
            std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find(list[0].uuid), std::string::npos) << s.status().message();
}

TEST(Devices, CAbiListsTheSameDevices) {
  DEVICES_OR_SKIP(list);
  uint32_t count = 0;
  ASSERT_EQ(vkad_device_count(&count), nullptr);
  ASSERT_EQ(count, list.size());
  for (uint32_t i = 0; i < count; ++i) {
    vkad_device_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(vkad_device_get(i, &info), nullptr);
    EXPECT_EQ(info.index, i);
    EXPECT_STREQ(info.name, list[i].name.c_str());
    EXPECT_STREQ(info.uuid_string, list[i].uuid.c_str());
    EXPECT_EQ(std::memcmp(info.uuid, list[i].uuid_bytes.data(), 16), 0);
    EXPECT_EQ(info.usable != 0, list[i].usable);
    EXPECT_EQ(info.automatic != 0, list[i].automatic);
  }
  vkad_device_info info{};
  info.struct_size = sizeof info;
  vkad_status* past = vkad_device_get(count, &info);
  ASSERT_NE(past, nullptr);
  EXPECT_EQ(vkad_status_code(past), VKAD_NOT_FOUND);
  EXPECT_NE(std::string(vkad_status_message(past)).find("out of range"), std::string::npos);
  vkad_status_free(past);
  vkad_status* null_out = vkad_device_get(0, nullptr);
  ASSERT_NE(null_out, nullptr);
  EXPECT_EQ(vkad_status_code(null_out), VKAD_INVALID_ARGUMENT);
  vkad_status_free(null_out);

  vkad_session_options o{};
  o.struct_size = sizeof o;
  vkad_session* session = nullptr;
  // An index past unsigned long: refused like any index past the end (it aborted the process).
  o.device = "99999999999999999999999";
  vkad_status* huge = vkad_session_create(&o, &session);
  ASSERT_NE(huge, nullptr);
  EXPECT_EQ(vkad_status_code(huge), VKAD_NOT_FOUND);
  EXPECT_NE(std::string(vkad_status_message(huge))
                .find("device index 99999999999999999999999 out "
                      "of range"),
            std::string::npos)
      << vkad_status_message(huge);
  vkad_status_free(huge);
  EXPECT_EQ(session, nullptr);
  o.device = list[0].uuid.c_str();
  if (!list[0].usable) return;
  ASSERT_EQ(vkad_session_create(&o, &session), nullptr);
  EXPECT_STREQ(vkad_session_device_uuid(session), list[0].uuid.c_str());
  vkad_session_destroy(session);
}

// y = x^2 differentiated on its own session per thread, every thread listing the devices and
// opening its session at the same time (a data-parallel program's start): distinct sessions on
// distinct threads share nothing mutable but the instance registry, the log sink and the
// validation-layer sinks, all locked (ThreadSanitizer runs this).
TEST(ProcessWide, SessionsOnThreadsListDevicesCompileAndRunWithoutLocking) {
  DEVICES_OR_SKIP(list);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      auto fail = [&](const std::string& what) { failures[t] += what + "\n"; };
      auto seen = devices();
      if (!seen.ok()) return fail("devices: " + seen.status().to_string());
      SessionOptions o;
      o.validation = true;
      auto s = Session::create(o);
      if (!s.ok()) return fail("session: " + s.status().to_string());
      KernelBuilder kb("square");
      Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
      Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
      kb.parallel_for("main", 0, x.dim(0), [&](Value i) { y.store({i}, x(i) * x(i)); });
      auto d = (*s)->differentiate(kb.finish());
      if (!d.ok()) return fail("differentiate: " + d.status().to_string());
      const uint32_t n = 1000;
      std::vector<float> xs(n), grad(n);
      for (uint32_t i = 0; i < n; ++i) xs[i] = static_cast<float>(t) + 0.001f * i;
      Session& ss = **s;
      auto hx = ss.ndarray(DType::kF32, {n}), hy = ss.ndarray(DType::kF32, {n});
      auto gx = ss.ndarray(DType::kF32, {n}), gy = ss.ndarray(DType::kF32, {n});
      if (!hx.ok() || !hy.ok() || !gx.ok() || !gy.ok()) return fail("ndarray");
      const Arg fargs[] = {Arg::ndarray(*hx), Arg::ndarray(*hy)};
      const NdArrayHandle grads[] = {*gx, *gy};
      auto aargs = d->adjoint_args(fargs, grads);
      for (Status st : {ss.upload(*hx, std::span<const float>(xs)), ss.zero(*gx), ss.fill(*gy, 1.0),
                        ss.launch(d->forward, fargs), ss.launch(d->adjoint, *aargs),
                        ss.download(*gx, std::span<float>(grad))}) {
        if (!st.ok()) return fail(st.to_string());
      }
      for (uint32_t i = 0; i < n; ++i) {
        if (grad[i] != 2.0f * xs[i]) {
          return fail("dy/dx at " + std::to_string(i) + ": " + std::to_string(grad[i]));
        }
      }
      if (ss.runtime().device().validation_message_count() != 0) fail("validation messages");
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
}

}  // namespace
}  // namespace vkad::testing
