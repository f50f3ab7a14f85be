// rhi on a real Vulkan device (lavapipe in CI), validation layer on, in timeline and fence mode.
#include <volk.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "gpu/gpu_test.h"
#include "rhi/vk_check.h"

namespace vkad::testing {
namespace {

using rhi::Barrier;
using rhi::Buffer;
using rhi::MemoryUsage;
using rhi::SyncMode;

struct ScaleAddPush {
  uint32_t n, add, spin;
};

class RhiTest : public GpuTest, public ::testing::WithParamInterface<SyncMode> {
 protected:
  void SetUp() override {
    // Both binding paths run: push descriptors in timeline/auto mode, descriptor sets in fence
    // mode (the device is made again with the option).
    if (GetParam() == SyncMode::kFence) {
      rhi::DeviceOptions o;
      o.push_descriptors = false;
      auto d = make_device(o);
      if (!d.ok() && d.status().code() == ErrorCode::kNoDevice) {
        GTEST_SKIP() << "SKIPPED: no Vulkan device";
      }
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      device_ = std::move(d).value();
      ASSERT_FALSE(device_->caps().push_descriptor);
    } else {
      GpuTest::SetUp();
    }
    if (!device_) return;
    auto s = device_->create_stream({GetParam(), "test stream"});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    stream_ = std::move(s).value();
  }
  void TearDown() override {
    stream_.reset();
    GpuTest::TearDown();
  }
  rhi::ComputePipeline pipeline(const char* spirv, const char* name) {
    rhi::ComputePipelineDesc desc;
    desc.spirv = assemble(spirv);
    desc.storage_buffer_count = 2;
    desc.push_constant_bytes = sizeof(ScaleAddPush);
    desc.name = name;
    auto p = device_->create_compute_pipeline(desc);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    return std::move(p).value();
  }
  // A host-signalled gate: work submitted behind it cannot start until open_gate().
  VkSemaphore make_gate() {
    VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo sci{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    sci.pNext = &type;
    VkSemaphore s = VK_NULL_HANDLE;
    EXPECT_EQ(device_->fn().vkCreateSemaphore(device_->handle(), &sci, nullptr, &s), VK_SUCCESS);
    return s;
  }
  void open_gate(VkSemaphore gate) {
    VkSemaphoreSignalInfo info{VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO};
    info.semaphore = gate;
    info.value = 1;
    EXPECT_EQ(device_->fn().vkSignalSemaphore(device_->handle(), &info), VK_SUCCESS);
  }
  std::unique_ptr<rhi::Stream> stream_;
};

TEST_P(RhiTest, UploadDispatchReadbackMatches) {
  const uint32_t n = 1000;
  std::vector<uint32_t> input(n);
  for (uint32_t i = 0; i < n; ++i) input[i] = i * 7 + 1;
  Buffer in = upload_u32(*device_, *stream_, input, "in");
  auto out = device_->create_buffer({n * 4, MemoryUsage::kDeviceLocal, "out"});
  ASSERT_TRUE(out.ok());
  auto p = pipeline(kScaleAddSpirv, "scale_add");
  auto list = stream_->begin();
  ASSERT_TRUE(list.ok());
  list->bind_pipeline(p);
  Buffer* bufs[] = {&in, &*out};
  ASSERT_TRUE(list->bind_buffers(p, bufs).ok());
  ScaleAddPush pc{n, 5, 0};
  list->push_constants(p, &pc, sizeof(pc));
  list->dispatch((n + 63) / 64);
  auto sem = stream_->submit(*list);
  ASSERT_TRUE(sem.ok()) << sem.status().to_string();
  auto result = download_u32(*device_, *stream_, *out);
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(result[i], input[i] * 2 + 5) << "at " << i;
  EXPECT_EQ(stream_->mode(), GetParam() == SyncMode::kAuto ? SyncMode::kTimeline : GetParam());
}

TEST_P(RhiTest, IsSignaledOnlyAfterCompletion) {
  VkSemaphore gate = make_gate();
  auto list = stream_->begin();
  ASSERT_TRUE(list.ok());
  list->fill(*device_->create_buffer({256, MemoryUsage::kDeviceLocal, "scratch"}), 1);
  rhi::Stream::TimelineWait wait{gate, 1};
  auto sem = stream_->submit(*list, {&wait, 1});
  ASSERT_TRUE(sem.ok()) << sem.status().to_string();
  EXPECT_FALSE(sem->is_signaled());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(sem->is_signaled()) << "the gate is closed: the work cannot have run";
  EXPECT_FALSE(sem->wait(1'000'000)) << "1 ms wait must time out";
  EXPECT_LT(stream_->completed_cached(), sem->serial());
  open_gate(gate);
  EXPECT_TRUE(sem->wait());
  EXPECT_TRUE(sem->is_signaled());
  EXPECT_GE(stream_->completed_cached(), sem->serial());
  device_->fn().vkDestroySemaphore(device_->handle(), gate, nullptr);
}

TEST_P(RhiTest, DestroyAfterReportedLossWaitsForRunningWork) {
  // A loss reported (here: marked) while work is still queued: destroying the stream must wait
  // in the driver for that work before freeing its command pool, not trust the sticky flag.
  VkSemaphore gate = make_gate();
  auto scratch = device_->create_buffer({256, MemoryUsage::kDeviceLocal, "scratch"});
  ASSERT_TRUE(scratch.ok());
  auto list = stream_->begin();
  ASSERT_TRUE(list.ok());
  list->fill(*scratch, 1);
  rhi::Stream::TimelineWait wait{gate, 1};
  ASSERT_TRUE(stream_->submit(*list, {&wait, 1}).ok());
  device_->mark_lost();
  std::atomic<bool> opened{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    opened = true;
    open_gate(gate);
  });
  stream_.reset();
  EXPECT_TRUE(opened.load()) << "the stream was destroyed while its work was still queued";
  opener.join();
  device_->fn().vkDestroySemaphore(device_->handle(), gate, nullptr);
}

TEST_P(RhiTest, ManySubmissionsPolledOutOfOrder) {
  VkSemaphore gate = make_gate();
  auto scratch = device_->create_buffer({4096, MemoryUsage::kDeviceLocal, "scratch"});
  ASSERT_TRUE(scratch.ok());
  std::vector<rhi::StreamSemaphore> sems;
  for (int i = 0; i < 64; ++i) {
    auto list = stream_->begin();
    ASSERT_TRUE(list.ok());
    // Orders this fill after the previous submission's (write-after-write on one buffer: a
    // hazard synchronization validation reports at queue submit without it).
    list->barrier(Barrier::kTransferToTransfer);
    list->fill(*scratch, static_cast<uint32_t>(i));
    rhi::Stream::TimelineWait wait{gate, 1};
    auto sem = i == 0 ? stream_->submit(*list, {&wait, 1}) : stream_->submit(*list);
    ASSERT_TRUE(sem.ok());
    EXPECT_EQ(sem->serial().value(), static_cast<uint64_t>(i + 1)) << "serials increase by one";
    sems.push_back(*sem);
  }
  std::vector<size_t> order(sems.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i : order) EXPECT_FALSE(sems[i].is_signaled()) << "submission " << i;
  open_gate(gate);
  ASSERT_TRUE(sems[40].wait());
  // In-order completion: once 40 is done, everything before it is, whatever the polling order.
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i : order) {
    if (i <= 40) {
      EXPECT_TRUE(sems[i].is_signaled()) << "submission " << i;
    }
  }
  ASSERT_TRUE(stream_->wait_idle().ok());
  for (size_t i : order) EXPECT_TRUE(sems[i].is_signaled());
  stream_->recycle();
  EXPECT_LE(stream_->counters().command_buffers_created, 64u);
  EXPECT_EQ(stream_->command_buffers_in_flight(), 0u);
  device_->fn().vkDestroySemaphore(device_->handle(), gate, nullptr);
}

TEST_P(RhiTest, CommandBuffersAndFencesAreRecycled) {
  auto scratch = device_->create_buffer({4096, MemoryUsage::kDeviceLocal, "scratch"});
  ASSERT_TRUE(scratch.ok());
  for (int i = 0; i < 200; ++i) {
    auto list = stream_->begin();
    ASSERT_TRUE(list.ok());
    list->fill(*scratch, 3);
    auto sem = stream_->submit(*list);
    ASSERT_TRUE(sem.ok());
    ASSERT_TRUE(sem->wait());
  }
  // Each submission completed before the next began: one buffer (and fence) served them all.
  EXPECT_EQ(stream_->counters().command_buffers_created, 1u);
  if (stream_->mode() == SyncMode::kFence) {
    EXPECT_EQ(stream_->counters().fences_created, 1u);
  }
  EXPECT_EQ(stream_->counters().submits, 200u);
}

// A capture's recording threads (rhi::Stream::side_threads): a side bundle the owner releases
// while they record is freed by the thread of its pool at that thread's next begin, not on the
// owner's thread (Vulkan: a pool has one user at a time), and what is left when they stop by
// side_threads(false). Each bundle's fill runs (the buffer holds the second's value).
TEST_P(RhiTest, SideBundlesReleasedWhileThreadsRecordAreFreedByTheirThread) {
  auto scratch = device_->create_buffer({256, MemoryUsage::kDeviceLocal, "scratch"});
  ASSERT_TRUE(scratch.ok());
  ASSERT_TRUE(stream_->ensure_side_pools(1).ok());
  ASSERT_TRUE(stream_->settle_side_bundles().ok());
  stream_->side_threads(true);
  auto record = [&](uint32_t value) {
    rhi::Bundle out;
    std::thread t([&] {  // the pool's thread
      auto l = stream_->begin_side_bundle(0);
      EXPECT_TRUE(l.ok()) << l.status().to_string();
      if (!l.ok()) return;
      l->fill(*scratch, value);
      auto b = stream_->end_side_bundle(*l);
      EXPECT_TRUE(b.ok()) << b.status().to_string();
      if (b.ok()) out = std::move(*b);
    });
    t.join();
    return out;
  };
  auto run = [&](rhi::Bundle& b) {
    auto list = stream_->begin();
    ASSERT_TRUE(list.ok());
    list->execute(b);
    auto sem = stream_->submit(*list);
    ASSERT_TRUE(sem.ok());
    ASSERT_TRUE(sem->wait());
  };
  rhi::Bundle first = record(1);
  ASSERT_TRUE(first.valid());
  EXPECT_EQ(stream_->side_bundles_live(), 1);
  run(first);
  first.reset();
  stream_->recycle();
  EXPECT_EQ(stream_->side_bundles_live(), 1) << "handed to the pool's thread, not freed here";
  rhi::Bundle second = record(2);  // its begin frees the first
  ASSERT_TRUE(second.valid());
  EXPECT_EQ(stream_->side_bundles_live(), 1);
  EXPECT_EQ(stream_->side_bundles_peak(), 1) << "the first was freed before the second was made";
  run(second);
  second.reset();
  stream_->recycle();
  EXPECT_EQ(stream_->side_bundles_live(), 1);
  stream_->side_threads(false);
  EXPECT_EQ(stream_->side_bundles_live(), 0) << "freed when the threads stop";
  auto got = download_u32(*device_, *stream_, *scratch);
  for (uint32_t v : got) ASSERT_EQ(v, 2u);
}

TEST_P(RhiTest, ObjectsReleasedRightAfterRecordingSurviveUntilCompletion) {
  const uint32_t n = 4096;
  std::vector<uint32_t> input(n);
  for (uint32_t i = 0; i < n; ++i) input[i] = i;
  Buffer in = upload_u32(*device_, *stream_, input, "in (released early)");
  auto out = device_->create_buffer({n * 4, MemoryUsage::kDeviceLocal, "out"});
  ASSERT_TRUE(out.ok());
  int64_t buffers_before = device_->live().buffers;
  VkSemaphore gate = make_gate();
  {
    auto p = pipeline(kSpinScaleAddSpirv, "spin (released early)");
    auto list = stream_->begin();
    ASSERT_TRUE(list.ok());
    list->bind_pipeline(p);
    Buffer* bufs[] = {&in, &*out};
    ASSERT_TRUE(list->bind_buffers(p, bufs).ok());
    ScaleAddPush pc{n, 1, 2000};
    list->push_constants(p, &pc, sizeof(pc));
    list->dispatch(n / 64);
    // Drop the input and the pipeline before the work has even been submitted.
    in.reset();
    p.reset();
    EXPECT_EQ(device_->live().buffers, buffers_before) << "destroyed too early";
    EXPECT_EQ(device_->live().pipelines, 1);
    rhi::Stream::TimelineWait wait{gate, 1};
    ASSERT_TRUE(stream_->submit(*list, {&wait, 1}).ok());
  }
  stream_->recycle();
  EXPECT_EQ(device_->live().buffers, buffers_before) << "still in flight behind the gate";
  EXPECT_EQ(device_->live().pipelines, 1);
  open_gate(gate);
  auto result = download_u32(*device_, *stream_, *out);
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(result[i], i * 2 + 1);
  stream_->recycle();
  EXPECT_EQ(device_->live().buffers, buffers_before - 1) << "released after completion";
  EXPECT_EQ(device_->live().pipelines, 0);
  EXPECT_EQ(device_->garbage_pending(), 0u);
  device_->fn().vkDestroySemaphore(device_->handle(), gate, nullptr);
}

TEST_P(RhiTest, DescriptorPoolsAreRecycledPastOnePool) {
  auto p = pipeline(kScaleAddSpirv, "scale_add");
  auto a = device_->create_buffer({256, MemoryUsage::kDeviceLocal, "a"});
  auto b = device_->create_buffer({256, MemoryUsage::kDeviceLocal, "b"});
  ASSERT_TRUE(a.ok() && b.ok());
  Buffer* bufs[] = {&*a, &*b};
  // 3 pools' worth of sets in one list forces retirement of full pools mid-recording.
  auto list = stream_->begin();
  ASSERT_TRUE(list.ok());
  list->bind_pipeline(p);
  ScaleAddPush pc{64, 1, 0};
  list->push_constants(p, &pc, sizeof(pc));
  for (uint32_t i = 0; i < 3 * rhi::DescriptorAllocator::kSetsPerPool; ++i) {
    ASSERT_TRUE(list->bind_buffers(p, bufs).ok());
    list->dispatch(1);
  }
  if (p.push_descriptors()) {
    // Push descriptors live in the command buffer: no set, no pool, whatever the count.
    EXPECT_EQ(stream_->live_descriptor_sets(), 0u);
    EXPECT_EQ(device_->live().descriptor_pools, 0);
    ASSERT_TRUE(stream_->submit(*list).ok());
    ASSERT_TRUE(stream_->wait_idle().ok());
    return;
  }
  auto sem = stream_->submit(*list);
  ASSERT_TRUE(sem.ok());
  int64_t pools = device_->live().descriptor_pools;
  EXPECT_GE(pools, 3);
  ASSERT_TRUE(sem->wait());
  stream_->recycle();
  EXPECT_EQ(stream_->live_descriptor_sets(), 0u);
  // The next big batch reuses the recycled pools instead of creating new ones.
  auto list2 = stream_->begin();
  ASSERT_TRUE(list2.ok());
  list2->bind_pipeline(p);
  list2->push_constants(p, &pc, sizeof(pc));
  for (uint32_t i = 0; i < 3 * rhi::DescriptorAllocator::kSetsPerPool; ++i) {
    ASSERT_TRUE(list2->bind_buffers(p, bufs).ok());
    list2->dispatch(1);
  }
  ASSERT_TRUE(stream_->submit(*list2).ok());
  EXPECT_EQ(device_->live().descriptor_pools, pools);
  ASSERT_TRUE(stream_->wait_idle().ok());
}

TEST_P(RhiTest, BindBuffersRejectsWrongCount) {
  auto p = pipeline(kScaleAddSpirv, "scale_add");
  auto a = device_->create_buffer({256, MemoryUsage::kDeviceLocal, "a"});
  auto list = stream_->begin();
  ASSERT_TRUE(list.ok());
  Buffer* one[] = {&*a};
  Status s = list->bind_buffers(p, one);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expects 2 buffers, got 1"), std::string::npos) << s.message();
}

TEST_P(RhiTest, OnlyOneOpenListPerStream) {
  auto first = stream_->begin();
  ASSERT_TRUE(first.ok());
  auto second = stream_->begin();
  EXPECT_EQ(second.status().code(), ErrorCode::kFailedPrecondition);
  *first = rhi::CommandList();  // abandoning returns the command buffer
  EXPECT_TRUE(stream_->begin().ok());
}

TEST_P(RhiTest, InjectedAllocateMemoryFailureIsOutOfMemoryAndLeaksNothing) {
  rhi::LiveObjects before = device_->live();
  auto stats_before = device_->allocator().stats();
  // Ask for something larger than any existing block so a new vkAllocateMemory is needed.
  rhi::FaultInjection::arm("vkAllocateMemory", VK_ERROR_OUT_OF_DEVICE_MEMORY);
  auto b = device_->create_buffer({128ull << 20, MemoryUsage::kDeviceLocal, "big"});
  rhi::FaultInjection::disarm_all();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), ErrorCode::kOutOfDeviceMemory);
  EXPECT_NE(b.status().message().find("vkAllocateMemory"), std::string::npos);
  EXPECT_NE(b.status().message().find("big"), std::string::npos) << "names the buffer";
  EXPECT_EQ(device_->live().buffers, before.buffers);
  EXPECT_EQ(device_->live().memory_blocks, before.memory_blocks);
  EXPECT_EQ(device_->allocator().stats().used_bytes, stats_before.used_bytes);
  // Still usable.
  EXPECT_TRUE(device_->create_buffer({1024, MemoryUsage::kDeviceLocal, "after"}).ok());
}

TEST_P(RhiTest, MemoryLimitGivesOutOfMemory) {
  rhi::DeviceOptions opts;
  opts.memory_limit_bytes = 8ull << 20;
  opts.memory_block_bytes = 4ull << 20;
  auto dev = make_device(opts);
  ASSERT_TRUE(dev.ok());
  auto a = (*dev)->create_buffer({3ull << 20, MemoryUsage::kDeviceLocal, "a"});
  ASSERT_TRUE(a.ok());
  auto big = (*dev)->create_buffer({16ull << 20, MemoryUsage::kDeviceLocal, "too big"});
  EXPECT_EQ(big.status().code(), ErrorCode::kOutOfDeviceMemory);
  EXPECT_NE(big.status().message().find("limit"), std::string::npos);
}

TEST_P(RhiTest, EmptyBlocksBeyondTheSpareCountGoBackToTheDriver) {
  for (uint32_t spare : {0u, 1u, 2u}) {
    rhi::DeviceOptions opts;
    opts.memory_block_bytes = 4ull << 20;
    opts.spare_blocks_per_memory_type = spare;
    auto dev = make_device(opts);
    ASSERT_TRUE(dev.ok());
    rhi::Device& d = **dev;
    std::vector<Buffer> buffers;
    // Five shared blocks of one memory type: two 1.5 MiB buffers fit a 4 MiB block (a buffer
    // over half a block would get a dedicated block instead).
    for (int i = 0; i < 10; ++i) {
      auto b = d.create_buffer({3ull << 19, MemoryUsage::kDeviceLocal, "fill"});
      ASSERT_TRUE(b.ok());
      buffers.push_back(std::move(*b));
    }
    EXPECT_EQ(d.allocator().stats().blocks, 5u);
    buffers.clear();  // nothing was submitted: released at once
    d.collect_garbage();
    EXPECT_EQ(d.allocator().stats().used_bytes, 0u);
    EXPECT_EQ(d.allocator().stats().blocks, spare) << "spare blocks per type: " << spare;
    EXPECT_EQ(d.allocator().stats().block_bytes, spare * (4ull << 20));
  }
}

TEST_P(RhiTest, InjectedSubmitFailureGivesErrorAndLeaksNothing) {
  auto scratch = device_->create_buffer({4096, MemoryUsage::kDeviceLocal, "scratch"});
  ASSERT_TRUE(scratch.ok());
  rhi::Serial before = stream_->last_submitted();
  auto list = stream_->begin();
  ASSERT_TRUE(list.ok());
  list->fill(*scratch, 9);
  rhi::FaultInjection::arm("vkQueueSubmit", VK_ERROR_OUT_OF_HOST_MEMORY);
  auto sem = stream_->submit(*list);
  rhi::FaultInjection::disarm_all();
  ASSERT_FALSE(sem.ok());
  EXPECT_EQ(sem.status().code(), ErrorCode::kOutOfHostMemory);
  EXPECT_NE(sem.status().message().find("vkQueueSubmit"), std::string::npos);
  EXPECT_EQ(stream_->last_submitted(), before) << "a failed submit consumes no serial";
  EXPECT_FALSE(list->recording());
  // The stream keeps working and reuses the command buffer it got back.
  uint64_t created = stream_->counters().command_buffers_created;
  auto list2 = stream_->begin();
  ASSERT_TRUE(list2.ok());
  list2->fill(*scratch, 10);
  auto sem2 = stream_->submit(*list2);
  ASSERT_TRUE(sem2.ok());
  EXPECT_TRUE(sem2->wait());
  EXPECT_EQ(stream_->counters().command_buffers_created, created);
  scratch->reset();
  stream_->recycle();
  EXPECT_EQ(device_->live().buffers, 0);
}

TEST_P(RhiTest, DeviceLossIsStickyAndNothingHangs) {
  auto scratch = device_->create_buffer({4096, MemoryUsage::kDeviceLocal, "scratch"});
  ASSERT_TRUE(scratch.ok());
  auto list = stream_->begin();
  ASSERT_TRUE(list.ok());
  list->fill(*scratch, 1);
  rhi::FaultInjection::arm("vkQueueSubmit", VK_ERROR_DEVICE_LOST);
  auto sem = stream_->submit(*list);
  rhi::FaultInjection::disarm_all();
  EXPECT_EQ(sem.status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(device_->status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(stream_->begin().status().code(), ErrorCode::kDeviceLost);
  EXPECT_EQ(device_->create_buffer({64, MemoryUsage::kDeviceLocal, "x"}).status().code(),
            ErrorCode::kDeviceLost);
  // Destruction (stream, buffer, device) must be clean and must not hang.
}

TEST_P(RhiTest, TimestampsMeasureDispatches) {
  if (!device_->caps().timestamps) GTEST_SKIP() << "SKIPPED: device has no timestamps";
  auto q = device_->create_query_pool(2, "ts");
  ASSERT_TRUE(q.ok());
  auto scratch = device_->create_buffer({1 << 20, MemoryUsage::kDeviceLocal, "scratch"});
  auto list = stream_->begin();
  ASSERT_TRUE(list.ok());
  list->reset_queries(*q, 0, 2);
  list->write_timestamp(*q, 0);
  list->fill(*scratch, 1);
  list->write_timestamp(*q, 1);
  auto sem = stream_->submit(*list);
  ASSERT_TRUE(sem.ok() && sem->wait());
  uint64_t ts[2];
  ASSERT_TRUE(q->read(0, 2, ts).ok());
  EXPECT_LE(ts[0], ts[1]);
}

INSTANTIATE_TEST_SUITE_P(Modes, RhiTest, ::testing::Values(SyncMode::kTimeline, SyncMode::kFence),
                         [](const auto& info) {
                           return std::string(rhi::sync_mode_name(info.param));
                         });

TEST(RhiDevice, ForcedDeviceByName) {
  rhi::DeviceOptions opts;
  opts.enable_validation = true;
  auto probe = rhi::Device::create(opts);
  if (!probe.ok() && probe.status().code() == ErrorCode::kNoDevice)
    GTEST_SKIP() << "SKIPPED: no device";
  ASSERT_TRUE(probe.ok());
  std::string name = (*probe)->caps().device_name;
  probe = Result<std::unique_ptr<rhi::Device>>(make_error(ErrorCode::kInternal, "released"));
  opts.device = name.substr(0, 4);
  auto forced = rhi::Device::create(opts);
  ASSERT_TRUE(forced.ok()) << forced.status().to_string();
  EXPECT_EQ((*forced)->caps().device_name, name);
  opts.device = "no-such-gpu-xyz";
  auto missing = rhi::Device::create(opts);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no-such-gpu-xyz"), std::string::npos);
}

TEST(RhiDevice, MissingRequiredFeatureIsNamed) {
  rhi::DeviceOptions opts;
  opts.enable_validation = true;
  opts.required_features = {"float64", "not_a_feature"};
  auto d = rhi::Device::create(opts);
  if (!d.ok() && d.status().code() == ErrorCode::kNoDevice) GTEST_SKIP() << "SKIPPED: no device";
  EXPECT_EQ(d.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("not_a_feature"), std::string::npos);
}

}  // namespace
}  // namespace vkad::testing
