// Memory comes back (issue 49, point 2): the stats tell the user's memory from the runtime's own
// (args ring, readback ring, adstack heaps, spare memory blocks), and release_idle_memory()
// returns the runtime's to the driver: after a program frees everything it made, live buffers
// and device memory blocks are where they were before its first launch.
#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "diffsim/diffsim.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

// The example's training loop (adstack heaps, launch args in the ring, a readback per
// iteration, a large upload staged in a buffer of its own), then everything freed.
TEST(IdleMemory, ReleaseIdleMemoryReturnsRuntimeMemoryAfterEverythingIsFreed) {
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.adstack_tier = runtime::AdstackTier::kHeap;  // the adjoint's stacks in heaps the runtime owns
  auto rt = runtime::Runtime::create(o);
  if (!rt.ok() && rt.status().code() == ErrorCode::kNoDevice)
    GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  runtime::Runtime& r = **rt;
  const runtime::RuntimeStats before = r.stats().value();
  {
    diffsim::Config c;
    c.particles = 1024;
    c.steps = 16;
    auto sim = diffsim::Simulation::create(r, c);
    ASSERT_TRUE(sim.ok()) << sim.status().to_string();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE((*sim)->step().ok());
      ASSERT_TRUE((*sim)->loss().ok());
    }
    const runtime::RuntimeStats mid = r.stats().value();
    EXPECT_GT(mid.user_bytes, 0u) << "the simulation's arrays are the user's";
    EXPECT_GT(mid.args_ring_bytes, 0u) << "launch args come from the args ring";
    EXPECT_GT(mid.adstack_heap_bytes, 0u) << "the adjoint's stacks live in the heaps";
  }  // the simulation frees its arrays and kernels
  // A large upload (a staging buffer of its own) and a readback through the ring, freed too.
  auto big = r.create_ndarray(runtime::DType::kF32, {1u << 20}, "big");
  ASSERT_TRUE(big.ok());
  std::vector<float> host(1u << 20, 2.0f);
  ASSERT_TRUE(r.upload(*big, host.data(), 4ull * host.size()).ok());
  float first[16];
  auto small = r.create_ndarray(runtime::DType::kF32, {16}, "small");
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE(r.download(*small, first, sizeof first).ok());
  ASSERT_TRUE(r.free_ndarray(*big).ok());
  ASSERT_TRUE(r.free_ndarray(*small).ok());
  ASSERT_TRUE(r.synchronize().ok());

  const runtime::RuntimeStats held = r.stats().value();
  EXPECT_EQ(held.user_bytes, 0u);
  EXPECT_GT(held.args_ring_bytes + held.readback_ring_bytes + held.adstack_heap_bytes +
                held.spare_block_bytes,
            0u)
      << "before the call the runtime still holds memory of its own";
  EXPECT_GT(held.live.buffers, before.live.buffers);

  ASSERT_TRUE(r.release_idle_memory().ok());
  const runtime::RuntimeStats after = r.stats().value();
  EXPECT_EQ(after.live.buffers, before.live.buffers);
  EXPECT_EQ(after.live.memory_blocks, before.live.memory_blocks);
  EXPECT_EQ(after.memory_block_bytes, before.memory_block_bytes);
  EXPECT_EQ(after.args_ring_bytes, 0u);
  EXPECT_EQ(after.readback_ring_bytes, 0u);
  EXPECT_EQ(after.adstack_heap_bytes, 0u);
  EXPECT_EQ(after.spare_block_bytes, 0u);
  EXPECT_EQ(r.device().validation_message_count(), 0u);
}

// The runtime stays usable: kernels registered before the call launch afterwards (the rings
// and heaps are made again), and the results are right.
TEST(IdleMemory, SessionWorksAfterReleasingIdleMemory) {
  bool skipped = false;
  std::unique_ptr<Session> s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(s != nullptr);
  auto k = s->compile(
      "kernel bump(a: f32, x: ndarray<f32, 1>) {\n"
      "  task main parallel %0 in [0, shape(x, 0)) {\n"
      "    %1 = load x[%0] : f32\n    %2 = arg a : f32\n    %3 = add %1, %2 : f32\n"
      "    store x[%0], %3\n  }\n}\n");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto x = s->ndarray(DType::kF32, {64}, "x");
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(s->zero(*x).ok());
  const Arg args[] = {Arg::f32(1.0f), Arg::ndarray(*x)};
  ASSERT_TRUE(s->launch(*k, args).ok());
  const SessionStats mid = s->stats().value();
  EXPECT_EQ(mid.user_bytes, 64u * 4);
  EXPECT_GT(mid.runtime_bytes, 0u);
  ASSERT_TRUE(s->release_idle_memory().ok());
  const SessionStats idle = s->stats().value();
  EXPECT_EQ(idle.user_bytes, 64u * 4) << "the user's arrays are kept";
  EXPECT_EQ(idle.runtime_bytes, 0u);
  ASSERT_TRUE(s->launch(*k, args).ok());
  std::vector<float> got(64);
  ASSERT_TRUE(s->download(*x, std::span<float>(got)).ok());
  for (float v : got) EXPECT_EQ(v, 2.0f);
  expect_no_validation_messages(*s);
}

}  // namespace
}  // namespace vkad::testing
