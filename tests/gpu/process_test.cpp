// One process, many runtimes, several threads: the process-wide instance, per-device function
// tables and the thread model (runtime/use_guard.h). Run by the ThreadSanitizer CI job too.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.h"
#include "support/sample_kernels.h"

namespace vkad::testing {
namespace {

using runtime::Arg;
using runtime::DType;
using runtime::Runtime;

Result<std::unique_ptr<Runtime>> make_runtime(bool validation) {
  runtime::RuntimeOptions o;
  o.device.enable_validation = validation;
  return Runtime::create(o);
}

// Runs y = a*x + y once on `rt` (n elements, x = i, y = 1) and checks every element.
void check_axpy(Runtime& rt, float a, const std::string& where) {
  const uint32_t n = 257;
  std::vector<float> x(n), y(n, 1.0f), out(n);
  for (uint32_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  auto hx = rt.create_ndarray(DType::kF32, {n}, "x");
  auto hy = rt.create_ndarray(DType::kF32, {n}, "y");
  ASSERT_TRUE(hx.ok() && hy.ok()) << where;
  ASSERT_TRUE(rt.upload(*hx, x.data(), n * 4).ok()) << where;
  ASSERT_TRUE(rt.upload(*hy, y.data(), n * 4).ok()) << where;
  auto k = rt.register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok()) << where << ": " << k.status().to_string();
  Arg args[] = {Arg::f32(a), Arg::ndarray(*hx), Arg::ndarray(*hy)};
  ASSERT_TRUE(rt.launch(*k, args).ok()) << where;
  Status s = rt.download(*hy, out.data(), n * 4);
  ASSERT_TRUE(s.ok()) << where << ": " << s.to_string();
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a * x[i] + 1.0f) << where << " element " << i;
  ASSERT_TRUE(rt.free_ndarray(*hx).ok());
  ASSERT_TRUE(rt.free_ndarray(*hy).ok());
  ASSERT_TRUE(rt.unregister_kernel(*k).ok());
}

void expect_no_validation_messages(Runtime& rt) {
  EXPECT_EQ(rt.device().validation_message_count(), 0u) << [&] {
    std::string all;
    for (const auto& m : rt.device().validation_messages()) all += m + "\n";
    return all;
  }();
}

// Restores VKAD_VALIDATION on scope exit (tests that need a runtime without validation).
class ScopedUnsetValidationEnv {
 public:
  ScopedUnsetValidationEnv() {
    if (const char* v = std::getenv("VKAD_VALIDATION")) saved_ = v, had_ = true;
    unsetenv("VKAD_VALIDATION");
  }
  ~ScopedUnsetValidationEnv() {
    if (had_) setenv("VKAD_VALIDATION", saved_.c_str(), 1);
  }

 private:
  std::string saved_;
  bool had_ = false;
};

#define CREATE_OR_SKIP(var, expr)                                                 \
  auto var##_result = (expr);                                                     \
  if (!var##_result.ok() && var##_result.status().code() == ErrorCode::kNoDevice) \
    GTEST_SKIP() << "SKIPPED: no Vulkan device";                                  \
  ASSERT_TRUE(var##_result.ok()) << var##_result.status().to_string();            \
  std::unique_ptr<Runtime> var = std::move(var##_result).value()

// The NVIDIA driver fails instance creation after ~30 instance lifetimes in one process; vkad
// shares one instance, so a DSL can create and destroy runtimes without limit.
TEST(ProcessWide, HundredRuntimesCreatedAndDestroyedInOneProcess) {
  for (int round = 0; round < 110; ++round) {
    CREATE_OR_SKIP(rt, make_runtime(true));
    if (round % 10 == 0) check_axpy(*rt, 2.0f, "round " + std::to_string(round));
    expect_no_validation_messages(*rt);
  }
}

// Runtime A without validation, runtime B with it: each device calls through its own function
// table. With volk's globals, B's creation redirected A's calls into the validation layer
// (a segfault at A's next vkCreateBuffer).
TEST(ProcessWide, RuntimesWithAndWithoutValidationKeepTheirOwnEntryPoints) {
  ScopedUnsetValidationEnv env;
  CREATE_OR_SKIP(plain, make_runtime(false));
  EXPECT_FALSE(plain->device().validation_enabled());
  check_axpy(*plain, 2.0f, "plain runtime before the validated one");
  {
    CREATE_OR_SKIP(validated, make_runtime(true));
    EXPECT_TRUE(validated->device().validation_enabled());
    check_axpy(*plain, 3.0f, "plain runtime beside the validated one");
    check_axpy(*validated, 4.0f, "validated runtime");
    expect_no_validation_messages(*validated);
  }
  check_axpy(*plain, 5.0f, "plain runtime after the validated one is gone");
  EXPECT_NE(plain->device().instance(), VK_NULL_HANDLE);
}

TEST(ProcessWide, RuntimesShareTheInstanceOfTheirValidationSetting) {
  CREATE_OR_SKIP(a, make_runtime(true));
  CREATE_OR_SKIP(b, make_runtime(true));
  EXPECT_EQ(a->device().instance(), b->device().instance());
  EXPECT_NE(a->device().handle(), b->device().handle());
}

// Distinct runtimes on distinct threads need no locking (the TSan job runs this).
TEST(ProcessWide, DistinctRuntimesOnDistinctThreads) {
  { CREATE_OR_SKIP(probe, make_runtime(true)); }
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> done{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &done] {
      for (int round = 0; round < 3; ++round) {
        auto rt = make_runtime(true);
        ASSERT_TRUE(rt.ok()) << rt.status().to_string();
        check_axpy(**rt, static_cast<float>(t + 1), "thread " + std::to_string(t));
        expect_no_validation_messages(**rt);
      }
      ++done;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(done.load(), kThreads);
}

// A semaphore from flush() may outlive its runtime: it holds the stream's shared link, not a
// raw pointer (this was a use-after-free, visible under ASan).
TEST(ProcessWide, SemaphoreFromFlushOutlivesItsRuntime) {
  rhi::StreamSemaphore sem;
  {
    CREATE_OR_SKIP(rt, make_runtime(true));
    std::vector<float> v(64, 1.0f);
    auto h = rt->create_ndarray(DType::kF32, {64});
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(rt->upload(*h, v.data(), v.size() * 4).ok());
    auto s = rt->flush();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    sem = *s;
    EXPECT_NE(sem.serial(), rhi::kNoSerial);
  }
  EXPECT_TRUE(sem.is_signaled());
  EXPECT_TRUE(sem.wait(0));
}

// Two threads on one runtime: every overlapping call is refused with a clear error and changes
// nothing; every accepted launch happened exactly once (y counts them).
TEST(ProcessWide, ConcurrentUseOfOneRuntimeIsRefusedNotCorrupting) {
  CREATE_OR_SKIP(rt, make_runtime(true));
  const uint32_t n = 64;
  std::vector<float> ones(n, 1.0f), zeros(n, 0.0f), out(n);
  auto hx = rt->create_ndarray(DType::kF32, {n}, "x");
  auto hy = rt->create_ndarray(DType::kF32, {n}, "y");
  ASSERT_TRUE(hx.ok() && hy.ok());
  ASSERT_TRUE(rt->upload(*hx, ones.data(), n * 4).ok());
  ASSERT_TRUE(rt->upload(*hy, zeros.data(), n * 4).ok());
  auto k = rt->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  std::atomic<int> accepted{0}, refused{0}, other{0};
  std::string other_error;
  auto worker = [&] {
    Arg args[] = {Arg::f32(1.0f), Arg::ndarray(*hx), Arg::ndarray(*hy)};
    for (int i = 0; i < 300; ++i) {
      Status s = rt->launch(*k, args);
      if (s.ok()) {
        ++accepted;
      } else if (s.code() == ErrorCode::kFailedPrecondition &&
                 s.message().find("externally synchronised") != std::string::npos) {
        ++refused;
      } else {
        ++other;
      }
      Status f = rt->flush().status();
      if (!f.ok() && f.code() != ErrorCode::kFailedPrecondition) ++other;
    }
  };
  std::thread a(worker), b(worker);
  a.join();
  b.join();
  EXPECT_EQ(other.load(), 0);
  ASSERT_TRUE(rt->download(*hy, out.data(), n * 4).ok());
  for (uint32_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], static_cast<float>(accepted.load())) << "element " << i;
  }
  expect_no_validation_messages(*rt);
}

// stats() is a call like the others: while another thread is inside the runtime it is refused
// (kFailedPrecondition), never a read racing the launch's writes (ThreadSanitizer runs this in
// CI: it reported the race when stats() bypassed the use guard).
TEST(ProcessWide, StatsDuringALaunchOnAnotherThreadIsRefusedNotRacing) {
  CREATE_OR_SKIP(rt, make_runtime(true));
  const uint32_t n = 64;
  std::vector<float> ones(n, 1.0f);
  auto hx = rt->create_ndarray(DType::kF32, {n}, "x");
  auto hy = rt->create_ndarray(DType::kF32, {n}, "y");
  ASSERT_TRUE(hx.ok() && hy.ok());
  ASSERT_TRUE(rt->upload(*hx, ones.data(), n * 4).ok());
  ASSERT_TRUE(rt->upload(*hy, ones.data(), n * 4).ok());
  auto k = rt->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  std::atomic<bool> done{false};
  std::atomic<int> launched{0}, read{0}, refused{0}, other{0};
  std::thread launcher([&] {
    Arg args[] = {Arg::f32(1.0f), Arg::ndarray(*hx), Arg::ndarray(*hy)};
    for (int i = 0; i < 300; ++i) {
      if (rt->launch(*k, args).ok()) ++launched;
      (void)rt->flush();
    }
    done = true;
  });
  while (!done) {
    Result<runtime::RuntimeStats> s = rt->stats();
    if (s.ok()) {
      ++read;
      if (s->launches > 300) ++other;  // a torn or garbage read
    } else if (s.status().code() == ErrorCode::kFailedPrecondition &&
               s.status().message().find("Runtime::stats called on thread") != std::string::npos) {
      ++refused;
    } else {
      ++other;
    }
  }
  launcher.join();
  EXPECT_EQ(other.load(), 0);
  auto final_stats = rt->stats();
  ASSERT_TRUE(final_stats.ok());
  EXPECT_EQ(final_stats->launches, static_cast<uint64_t>(launched.load()));
  expect_no_validation_messages(*rt);
}

}  // namespace
}  // namespace vkad::testing
