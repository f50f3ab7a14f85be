// runtime/ on a real device, validation on, timeline and fence modes.
#include "runtime/runtime.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "abi/spirv_tools.h"
#include "gpu/gpu_test.h"
#include "rhi/vk_check.h"
#include "support/sample_kernels.h"

namespace vkad::testing {
namespace {

using runtime::Arg;
using runtime::DType;
using runtime::Runtime;

class RuntimeTest : public ::testing::TestWithParam<rhi::SyncMode> {
 protected:
  void SetUp() override { rt_ = make(3); }
  std::unique_ptr<Runtime> make(size_t depth) {
    runtime::RuntimeOptions o;
    o.device.enable_validation = true;
    o.sync_mode = GetParam();
    // Both binding paths run: push descriptors with timelines, descriptor sets with fences.
    o.device.push_descriptors = GetParam() != rhi::SyncMode::kFence;
    o.retirement_depth = depth;
    // Deterministic batching: only explicit flushes and the dispatch-count trigger (the age
    // trigger has its own test).
    o.max_list_age_us = 1e12;
    auto r = Runtime::create(o);
    if (!r.ok() && r.status().code() == ErrorCode::kNoDevice) {
      skipped_ = true;
      return nullptr;
    }
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  void TearDown() override {
    if (!rt_) return;
    EXPECT_EQ(rt_->device().validation_message_count(), 0u) << [&] {
      std::string all;
      for (const auto& m : rt_->device().validation_messages()) all += m + "\n";
      return all;
    }();
  }
  runtime::NdArrayHandle array(const std::vector<float>& v, const std::string& name) {
    auto h = rt_->create_ndarray(DType::kF32, {static_cast<uint32_t>(v.size())}, name);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    EXPECT_TRUE(rt_->upload(*h, v.data(), v.size() * 4).ok());
    return *h;
  }
  std::vector<float> read(runtime::NdArrayHandle h, size_t n) {
    std::vector<float> out(n);
    Status s = rt_->download(h, out.data(), n * 4);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out;
  }
  bool skipped_ = false;
  std::unique_ptr<Runtime> rt_;
};

// Skips without a device; fails (instead of dereferencing null) when creation failed otherwise.
#define SKIP_IF_NO_DEVICE()                                  \
  if (skipped_) GTEST_SKIP() << "SKIPPED: no Vulkan device"; \
  ASSERT_NE(rt_, nullptr) << "Runtime::create failed (see above)"

TEST_P(RuntimeTest, AxpyMatchesCpu) {
  SKIP_IF_NO_DEVICE();
  const uint32_t n = 10000;
  std::vector<float> x(n), y(n);
  for (uint32_t i = 0; i < n; ++i) {
    x[i] = 0.5f * i;
    y[i] = 1.0f + i;
  }
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  Arg args[] = {Arg::f32(3.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  auto out = read(hy, n);
  for (uint32_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(out[i], 3.0f * x[i] + y[i]) << i;
}

// The benchmarks' bandwidth references copy every element (a copy that skipped elements
// would read as impossibly fast): the scalar and the 16-byte variant, over many workgroups.
TEST_P(RuntimeTest, ReferenceCopyKernelsCopyEveryElement) {
  SKIP_IF_NO_DEVICE();
  const uint32_t n = 4 * 70001;
  std::vector<uint32_t> src(n), zero(n, 0);
  for (uint32_t i = 0; i < n; ++i) src[i] = i * 2654435761u + 1;
  auto mk = [&](const char* name, const std::vector<uint32_t>& v) {
    auto h = rt_->create_ndarray(DType::kU32, {n}, name).value();
    EXPECT_TRUE(rt_->upload(h, v.data(), 4ull * n).ok());
    return h;
  };
  auto x = mk("x", src), y = mk("y", zero), y4 = mk("y4", zero);
  runtime::CompiledKernel scalar;
  scalar.name = "copy";
  scalar.params = {{"x", runtime::ParamKind::kNdArray, DType::kU32, 1, false},
                   {"y", runtime::ParamKind::kNdArray, DType::kU32, 1, true}};
  scalar.tasks.push_back({"main",
                          codegen::assemble_spirv(kCopyU32Spirv).value(),
                          128,
                          runtime::RangeBound::constant(0),
                          runtime::RangeBound::array_dim(0, 0),
                          false,
                          {}});
  auto ks = rt_->register_kernel(scalar);
  auto k4 = rt_->register_kernel(make_copy_u32x4_kernel());
  ASSERT_TRUE(ks.ok()) << ks.status().to_string();
  ASSERT_TRUE(k4.ok()) << k4.status().to_string();
  Arg as[] = {Arg::ndarray(x), Arg::ndarray(y)};
  Arg a4[] = {Arg::u32(n / 4), Arg::ndarray(x), Arg::ndarray(y4)};
  ASSERT_TRUE(rt_->launch(*ks, as).ok());
  ASSERT_TRUE(rt_->launch(*k4, a4).ok());
  std::vector<uint32_t> got(n), got4(n);
  ASSERT_TRUE(rt_->download(y, got.data(), 4ull * n).ok());
  ASSERT_TRUE(rt_->download(y4, got4.data(), 4ull * n).ok());
  for (uint32_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], src[i]) << "scalar copy, element " << i;
    ASSERT_EQ(got4[i], src[i]) << "uvec4 copy, element " << i;
  }
}

TEST_P(RuntimeTest, GridStrideCoversRangesBeyondTheGroupCap) {
  SKIP_IF_NO_DEVICE();
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.sync_mode = GetParam();
  o.max_groups = 3;
  o.max_list_age_us = 1e12;  // 192 threads for 5000 elements
  auto rt = Runtime::create(o);
  ASSERT_TRUE(rt.ok());
  rt_.reset();
  rt_ = std::move(rt).value();
  std::vector<float> x(5000, 2.0f), y(5000, 1.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  for (float v : read(hy, 5000)) ASSERT_EQ(v, 3.0f);
}

TEST_P(RuntimeTest, HundredThousandFlushesStayBoundedWithoutDeviceWideWaits) {
  SKIP_IF_NO_DEVICE();
  const uint32_t n = 64;
  std::vector<float> x(n, 1.0f), y(n, 0.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(rt_->synchronize().ok());
  auto base = *rt_->stats();
  const int launches = 100000;
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  int64_t max_buffers = 0, max_sets = 0;
  for (int i = 0; i < launches; ++i) {
    ASSERT_TRUE(rt_->launch(*k, args).ok());
    ASSERT_TRUE(rt_->flush().ok());
    auto s = *rt_->stats();
    max_buffers = std::max(max_buffers, s.live.buffers);
    max_sets = std::max<int64_t>(max_sets, static_cast<int64_t>(s.live_descriptor_sets));
    ASSERT_LE(s.retirement.entries, rt_->retirement_depth());
    // One 16-byte args buffer per flush: never more than `depth` flushes' worth held.
    ASSERT_LE(s.retirement.bytes, rt_->retirement_depth() * 16);
  }
  auto s = *rt_->stats();
  EXPECT_EQ(s.flushes - base.flushes, static_cast<uint64_t>(launches));
  EXPECT_LE(s.retirement.high_water_entries, rt_->retirement_depth() + 1);
  // Each flush holds one args buffer: live buffers never exceed the arrays + depth + 1.
  EXPECT_LE(max_buffers, base.live.buffers + static_cast<int64_t>(rt_->retirement_depth()) + 1);
  // High water (inside push, before the depth is enforced) is (depth + 1) flushes, unless the
  // setup flush (the uploads) already set it higher.
  EXPECT_LE(s.retirement.high_water_bytes, std::max<uint64_t>(base.retirement.high_water_bytes,
                                                              (rt_->retirement_depth() + 1) * 16));
  EXPECT_LE(s.live.command_buffers, static_cast<int64_t>(rt_->retirement_depth()) + 2);
  EXPECT_LE(max_sets, 2 * static_cast<int64_t>(rhi::DescriptorAllocator::kSetsPerPool));
  if (rt_->caps().push_descriptor) {
    EXPECT_EQ(max_sets, 0) << "push descriptors: no descriptor set per launch";
    EXPECT_EQ(s.live.descriptor_pools, 0);
  }
  // Every retirement was by polling or by waiting for the oldest entry; the stream's only
  // blocking waits were those forced waits (no readback, no device-wide wait).
  EXPECT_EQ(s.retirement.retired_by_drain, base.retirement.retired_by_drain);
  EXPECT_EQ(s.retirement.retired_by_polling + s.retirement.retired_by_forced_wait +
                s.retirement.retired_by_drain + s.retirement.entries,
            s.retirement.pushed);
  for (float v : read(hy, n)) ASSERT_EQ(v, static_cast<float>(launches));
}

TEST_P(RuntimeTest, ReadbackEmptiesRetirementQueueAndCtxBuffers) {
  SKIP_IF_NO_DEVICE();
  auto r = make(8);
  ASSERT_TRUE(r);
  rt_ = std::move(r);
  std::vector<float> x(256, 1.0f), y(256, 0.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(rt_->launch(*k, args).ok());
    ASSERT_TRUE(rt_->flush().ok());
  }
  ASSERT_TRUE(rt_->launch(*k, args).ok());  // recorded, not flushed
  EXPECT_GT(rt_->stats()->ctx_bytes_recording, 0u);
  auto out = read(hy, 256);
  EXPECT_EQ(out[0], 7.0f);
  auto s = *rt_->stats();
  EXPECT_EQ(s.retirement.entries, 0u);
  EXPECT_EQ(s.retirement.bytes, 0u);
  EXPECT_EQ(s.ctx_bytes_recording, 0u);
  EXPECT_EQ(s.live.buffers, 2 + static_cast<int64_t>(s.ring_chunks_held))
      << "only the two ndarrays and the rings' own chunks remain";
  EXPECT_EQ(s.live_descriptor_sets, 0u);
}

TEST_P(RuntimeTest, FreeWhileInFlightIsDeferredNotEarlyNorLeaked) {
  SKIP_IF_NO_DEVICE();
  const uint32_t n = 4096;
  std::vector<float> x(n), y(n, 1.0f);
  for (uint32_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  auto hx = array(x, "x (freed early)"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(2.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  int64_t buffers = rt_->stats()->live.buffers;
  ASSERT_TRUE(rt_->free_ndarray(hx).ok());
  EXPECT_EQ(rt_->stats()->live.buffers, buffers) << "recorded use: not released yet";
  EXPECT_EQ(rt_->free_ndarray(hx).code(), ErrorCode::kNotFound) << "double free is an error";
  ASSERT_TRUE(rt_->flush().ok());
  auto out = read(hy, n);
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * i + 1.0f);
  EXPECT_EQ(rt_->stats()->live.buffers, 1 + static_cast<int64_t>(rt_->stats()->ring_chunks_held))
      << "x's memory came back after completion";
  Status s = rt_->launch(*k, args);
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
}

TEST_P(RuntimeTest, TwoVariantsOfOneKernelNameInFlight) {
  SKIP_IF_NO_DEVICE();
  std::vector<float> x(128, 2.0f), y(128, 10.0f);
  auto hx = array(x, "x"), y1 = array(y, "y1"), y2 = array(y, "y2");
  auto add = rt_->register_kernel(make_axpy_kernel("axpy", "OpFAdd"));
  auto sub = rt_->register_kernel(make_axpy_kernel("axpy", "OpFSub"));
  ASSERT_TRUE(add.ok() && sub.ok());
  EXPECT_EQ(rt_->stats()->pipelines_cached, 2u);
  Arg a1[] = {Arg::f32(3.0f), Arg::ndarray(hx), Arg::ndarray(y1)};
  Arg a2[] = {Arg::f32(3.0f), Arg::ndarray(hx), Arg::ndarray(y2)};
  ASSERT_TRUE(rt_->launch(*add, a1).ok());
  ASSERT_TRUE(rt_->flush().ok());
  ASSERT_TRUE(rt_->launch(*sub, a2).ok());
  // Dropping the variants while their launches are queued must not destroy their pipelines.
  ASSERT_TRUE(rt_->unregister_kernel(*add).ok());
  ASSERT_TRUE(rt_->unregister_kernel(*sub).ok());
  ASSERT_TRUE(rt_->flush().ok());
  EXPECT_EQ(read(y1, 128)[0], 16.0f);
  EXPECT_EQ(read(y2, 128)[0], -4.0f);
  // Same content again: a cache hit, not a new pipeline.
  auto again = rt_->register_kernel(make_axpy_kernel("axpy", "OpFAdd"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(rt_->stats()->pipeline_cache_hits, 1u);
}

TEST_P(RuntimeTest, EvictedPipelinesOutliveTheirQueuedLaunches) {
  SKIP_IF_NO_DEVICE();
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.sync_mode = GetParam();
  o.pipeline_cache_capacity = 0;
  o.max_list_age_us = 1e12;  // evict as soon as unreferenced
  auto rt = Runtime::create(o);
  ASSERT_TRUE(rt.ok());
  rt_.reset();
  rt_ = std::move(rt).value();
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(5.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  ASSERT_TRUE(rt_->unregister_kernel(*k).ok());
  EXPECT_EQ(rt_->stats()->pipelines_cached, 0u);
  EXPECT_EQ(rt_->stats()->live.pipelines, 1) << "evicted but still recorded: deferred";
  EXPECT_EQ(read(hy, 64)[0], 5.0f);
  EXPECT_EQ(rt_->stats()->live.pipelines, 0);
}

TEST_P(RuntimeTest, IdlePauseThenEmptyFlushRetiresEverythingWithoutForcedWait) {
  SKIP_IF_NO_DEVICE();
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(rt_->synchronize().ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(rt_->launch(*k, args).ok());
    ASSERT_TRUE(rt_->flush().ok());
  }
  uint64_t forced = rt_->stats()->retirement.forced_waits;
  // Longer than the GPU work takes; then a flush with nothing new only polls.
  auto sem = rt_->flush();
  ASSERT_TRUE(sem.ok());
  for (int i = 0; i < 200 && !sem->is_signaled(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(sem->is_signaled());
  ASSERT_TRUE(rt_->flush().ok());
  auto s = *rt_->stats();
  EXPECT_EQ(s.retirement.entries, 0u);
  EXPECT_EQ(s.retirement.forced_waits, forced);
  EXPECT_EQ(s.live.buffers, 2 + static_cast<int64_t>(s.ring_chunks_held));
}

TEST_P(RuntimeTest, LoweringDepthAtRunTimeRetiresDownToIt) {
  SKIP_IF_NO_DEVICE();
  auto r = make(8);
  ASSERT_TRUE(r);
  rt_ = std::move(r);
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(rt_->launch(*k, args).ok());
    ASSERT_TRUE(rt_->flush().ok());
  }
  ASSERT_TRUE(rt_->set_retirement_depth(1).ok());
  EXPECT_LE(rt_->stats()->retirement.entries, 1u);
  EXPECT_EQ(rt_->retirement_depth(), 1u);
}

// The command buffers (and in fence mode the fences) for the submissions a retirement depth
// lets be in flight are made when the runtime starts and when the depth rises, so that a loop
// creates none at whatever iteration a slow device first lets that many pile up; launching as
// deep as the depth allows then makes no more.
TEST_P(RuntimeTest, TheCommandBuffersADepthNeedsAreMadeUpFront) {
  SKIP_IF_NO_DEVICE();
  const int64_t at_start = rt_->stats()->live.command_buffers;
  EXPECT_EQ(at_start, static_cast<int64_t>(rt_->retirement_depth()) + 2);
  ASSERT_TRUE(rt_->set_retirement_depth(6).ok());
  const runtime::RuntimeStats deeper = *rt_->stats();
  EXPECT_EQ(deeper.live.command_buffers, 8);
  if (GetParam() == rhi::SyncMode::kFence) {
    EXPECT_GE(deeper.live.fences, 8);
  }
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());  // the first makes the descriptor pool (fence mode)
  ASSERT_TRUE(rt_->flush().ok());
  const uint64_t created = rt_->stats()->live.created;
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(rt_->launch(*k, args).ok());
    ASSERT_TRUE(rt_->flush().ok());
  }
  const runtime::RuntimeStats after = *rt_->stats();
  EXPECT_EQ(after.live.command_buffers, 8);
  EXPECT_EQ(after.live.created, created);
  // Lowering the depth keeps what was made (freed with the stream).
  ASSERT_TRUE(rt_->set_retirement_depth(1).ok());
  EXPECT_EQ(rt_->stats()->live.command_buffers, 8);
}

TEST_P(RuntimeTest, BadLaunchesAreClearErrorsAndRecordNothing) {
  SKIP_IF_NO_DEVICE();
  std::vector<float> x(64, 1.0f);
  auto hx = array(x, "x"), hy = array(x, "y");
  auto h2 = rt_->create_ndarray(DType::kF32, {8, 8}, "matrix");
  auto hi = rt_->create_ndarray(DType::kI32, {64}, "ints");
  ASSERT_TRUE(h2.ok() && hi.ok());
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(rt_->synchronize().ok());
  auto before = *rt_->stats();
  auto expect_error = [&](std::vector<Arg> args, ErrorCode code, const char* needle) {
    Status s = rt_->launch(*k, args);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  expect_error({Arg::f32(1.0f), Arg::ndarray(hx)}, ErrorCode::kInvalidArgument,
               "2 arguments given, the kernel takes 3");
  expect_error({Arg::i32(1), Arg::ndarray(hx), Arg::ndarray(hy)}, ErrorCode::kInvalidArgument,
               "argument 0 ('a'): expected f32, got i32");
  expect_error({Arg::f32(1.0f), Arg::f32(1.0f), Arg::ndarray(hy)}, ErrorCode::kInvalidArgument,
               "expected an ndarray, got a scalar");
  expect_error({Arg::f32(1.0f), Arg::ndarray(*h2), Arg::ndarray(hy)}, ErrorCode::kInvalidArgument,
               "expected a rank-1 f32 ndarray, got 'matrix' f32(8, 8)");
  expect_error({Arg::f32(1.0f), Arg::ndarray(*hi), Arg::ndarray(hy)}, ErrorCode::kInvalidArgument,
               "got 'ints' i32(64)");
  expect_error({Arg::f32(1.0f), Arg::ndarray({999}), Arg::ndarray(hy)}, ErrorCode::kNotFound,
               "was freed or never existed");
  Arg ok_args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  Status s = rt_->launch({12345}, ok_args);
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  auto after = *rt_->stats();
  EXPECT_EQ(after.launches, before.launches);
  EXPECT_EQ(after.ctx_bytes_recording, 0u) << "nothing recorded";
  std::vector<float> wrong(3);
  EXPECT_EQ(rt_->download(hy, wrong.data(), 12).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rt_->create_ndarray(DType::kF32, {0}, "empty").status().code(),
            ErrorCode::kInvalidArgument);
  // Still usable.
  ASSERT_TRUE(rt_->launch(*k, ok_args).ok());
  EXPECT_EQ(read(hy, 64)[0], 2.0f);
}

TEST_P(RuntimeTest, DeviceErrorFlagSurfacesAtReadbackNamingKernelAndTask) {
  SKIP_IF_NO_DEVICE();
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  x[17] = -1.0f;
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("flagging_axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  ASSERT_TRUE(rt_->flush().ok());
  std::vector<float> out(64);
  Status s = rt_->download(hy, out.data(), 256);
  EXPECT_EQ(s.code(), ErrorCode::kDeviceError);
  EXPECT_NE(s.message().find("kernel 'flagging_axpy', task 'axpy'"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("error code 7"), std::string::npos);
  EXPECT_NE(
      s.message().find("(in launch #" + std::to_string(rt_->next_launch_id().value - 1) + ")"),
      std::string::npos)
      << s.message();
  // Reported once; the runtime stays usable.
  EXPECT_TRUE(rt_->download(hy, out.data(), 256).ok());
  EXPECT_EQ(out[0], 1.0f);
}

TEST_P(RuntimeTest, AutoFlushBoundsCommandListLength) {
  SKIP_IF_NO_DEVICE();
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.sync_mode = GetParam();
  o.max_dispatches_per_list = 10;
  o.max_list_age_us = 1e12;
  auto rt = Runtime::create(o);
  ASSERT_TRUE(rt.ok());
  rt_.reset();
  rt_ = std::move(rt).value();
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  for (int i = 0; i < 35; ++i) ASSERT_TRUE(rt_->launch(*k, args).ok());
  EXPECT_EQ(rt_->stats()->auto_flushes, 3u);
  EXPECT_EQ(read(hy, 64)[0], 35.0f);
}

TEST_P(RuntimeTest, AutoFlushesAListOlderThanTheAgeLimit) {
  SKIP_IF_NO_DEVICE();
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.sync_mode = GetParam();
  o.max_list_age_us = 20000;
  auto rt = Runtime::create(o);
  ASSERT_TRUE(rt.ok());
  rt_.reset();
  rt_ = std::move(rt).value();
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  auto hx = array(x, "x"), hy = array(y, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(rt_->synchronize().ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  // A launch that leaves its list open: on a loaded machine (a Debug build under validation in
  // CI) recording one may itself take past the limit and flush it, and the next then opens a
  // fresh list. Its age counts from its opening, so the launch after the sleep finds it old.
  for (int i = 0; i < 10 && rt_->stats()->ctx_bytes_recording == 0; ++i) {
    ASSERT_TRUE(rt_->launch(*k, args).ok());
  }
  ASSERT_GT(rt_->stats()->ctx_bytes_recording, 0u);
  const uint64_t before = rt_->stats()->auto_flushes;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  EXPECT_EQ(rt_->stats()->auto_flushes, before + 1);
  EXPECT_EQ(rt_->stats()->ctx_bytes_recording, 0u);
}

TEST_P(RuntimeTest, DeviceLossIsReportedByEveryLaterCall) {
  SKIP_IF_NO_DEVICE();
  std::vector<float> x(64, 1.0f);
  auto hx = array(x, "x"), hy = array(x, "y");
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  Arg args[] = {Arg::f32(1.0f), Arg::ndarray(hx), Arg::ndarray(hy)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  rhi::FaultInjection::arm("vkQueueSubmit", VK_ERROR_DEVICE_LOST);
  EXPECT_EQ(rt_->flush().status().code(), ErrorCode::kDeviceLost);
  rhi::FaultInjection::disarm_all();
  EXPECT_EQ(rt_->launch(*k, args).code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->synchronize().code(), ErrorCode::kDeviceLost);
  std::vector<float> out(64);
  EXPECT_EQ(rt_->download(hy, out.data(), 256).code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(rt_->create_ndarray(DType::kF32, {4}).status().code(), ErrorCode::kDeviceLost);
  // Destruction in TearDown/the fixture must be clean and not hang.
}

TEST(RuntimeCreate, FailedCreationIsAnErrorNotACrash) {
  runtime::RuntimeOptions o;
  o.device.device = "no-such-device-name";
  auto r = Runtime::create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().code() == ErrorCode::kNotFound ||
              r.status().code() == ErrorCode::kNoDevice)
      << r.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Modes, RuntimeTest,
                         ::testing::Values(rhi::SyncMode::kTimeline, rhi::SyncMode::kFence),
                         [](const auto& info) {
                           return std::string(rhi::sync_mode_name(info.param));
                         });

}  // namespace
}  // namespace vkad::testing
