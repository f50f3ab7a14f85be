// A training loop in its steady state makes no Vulkan object and no device allocation per
// iteration (issue: whole programs at the speed of their kernels): launch args, small uploads
// and readbacks come from the runtime's host rings (runtime/host_ring.h), whose chunks are
// recycled through the retirement queue; descriptors are pushed or pooled; command buffers
// and fences are pooled.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "diffsim/diffsim.h"
#include "runtime/runtime.h"

namespace vkad::testing {
namespace {

struct Counters {
  uint64_t created, block_bytes, chunks_created;
  int64_t buffers;
  bool operator==(const Counters&) const = default;
};
Counters counters(const runtime::Runtime& rt) {
  auto s = rt.stats();
  EXPECT_TRUE(s.ok());
  return {s->live.created, s->memory_block_bytes, s->ring_chunks_created, s->live.buffers};
}
std::string show(const Counters& c) {
  return "created " + std::to_string(c.created) + ", block bytes " + std::to_string(c.block_bytes) +
         ", ring chunks created " + std::to_string(c.chunks_created) + ", live buffers " +
         std::to_string(c.buffers);
}

// The example's training loop (forward, adjoint with adstacks, update; the loss read back every
// iteration, i.e. an upload-free readback each time): after two warm-up iterations, ten more
// create nothing: no Vulkan object, no memory block, no ring chunk.
TEST(SteadyState, TrainingIterationsCreateNoVulkanObjectsOrAllocations) {
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  auto rt = runtime::Runtime::create(o);
  if (!rt.ok() && rt.status().code() == ErrorCode::kNoDevice)
    GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  diffsim::Config c;
  c.particles = 1024;
  c.steps = 16;
  auto sim = diffsim::Simulation::create(**rt, c);
  ASSERT_TRUE(sim.ok()) << sim.status().to_string();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*sim)->step().ok());
    ASSERT_TRUE((*sim)->loss().ok());
  }
  // Specialized pipelines the warm-up started on another thread are taken in now: one that
  // finished late on a loaded machine would otherwise count as a later iteration's.
  (*rt)->finish_pipelines();
  const Counters warm = counters(**rt);
  const uint64_t launches = (*rt)->stats()->launches;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE((*sim)->step().ok());
    auto loss = (*sim)->loss();
    ASSERT_TRUE(loss.ok()) << loss.status().to_string();
    EXPECT_EQ(counters(**rt), warm)
        << "iteration " << i << ": " << show(counters(**rt)) << " vs warm " << show(warm);
  }
  EXPECT_GE((*rt)->stats()->launches, launches + 30) << "the loop did launch";
  EXPECT_EQ((*rt)->device().validation_message_count(), 0u);
}

}  // namespace
}  // namespace vkad::testing
