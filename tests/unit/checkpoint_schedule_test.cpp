// The checkpoint schedule of a budgeted tape (graph/checkpoint_schedule.h): its byte formula,
// and that plan_checkpoints picks the fewest levels that fit, within the budget, refusing
// below the least it names.
#include "graph/checkpoint_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vkad::codegen {
namespace {

TEST(CheckpointSchedule, BytesFollowTheFormula) {
  // Two levels {K, 1}: the end state, ceil(n / K) segment starts, K launches' copies.
  EXPECT_EQ(checkpoint_bytes(100, {10, 1}, 800, 400), 800 + 10 * 800 + 10 * 400);
  EXPECT_EQ(checkpoint_bytes(101, {10, 1}, 800, 400), 800 + 11 * 800 + 10 * 400);
  // Three levels {24, 8, 1}: 2 starts at level 0, 3 at level 1, 8 launches' copies.
  EXPECT_EQ(checkpoint_bytes(41, {24, 8, 1}, 804, 404), 804 + 2 * 804 + 3 * 804 + 8 * 404);
  // A segment longer than the recording is the recording.
  EXPECT_EQ(checkpoint_bytes(5, {64, 1}, 10, 1), 10 + 10 + 5);
}

TEST(CheckpointSchedule, WithoutABudgetTwoLevelsOfTheLeastBytes) {
  for (uint32_t n : {1u, 2u, 7u, 100u, 1000u}) {
    auto p = plan_checkpoints(n, 800, 400, 0, 0, "t");
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    ASSERT_EQ(p->segments.size(), 2u);
    EXPECT_EQ(p->recompute, 2u);
    EXPECT_EQ(p->segments.back(), 1u);
    EXPECT_EQ(p->peak_bytes, checkpoint_bytes(n, p->segments, 800, 400));
    for (uint32_t k = 1; k <= n; ++k) {  // no K holds less
      ASSERT_LE(p->peak_bytes, checkpoint_bytes(n, {k, 1}, 800, 400)) << "n " << n << " K " << k;
    }
  }
  // A level 0 the recording fixed is kept.
  auto p = plan_checkpoints(1000, 800, 400, 0, 7, "t");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->segments, (std::vector<uint32_t>{7, 1}));
}

TEST(CheckpointSchedule, ASmallerBudgetTakesMoreLevelsAndNeverMoreBytes) {
  const uint32_t n = 10240;
  const uint64_t big = 8 << 20, small = 4 << 20;  // a state of 8 MiB, 4 MiB per launch
  auto none = plan_checkpoints(n, big, small, 1, 0, "tape.backward");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ErrorCode::kInvalidArgument);
  const std::string& m = none.status().message();
  EXPECT_EQ(m.rfind("tape.backward: the memory budget of 1 B is below", 0), 0u) << m;
  const size_t at = m.find("at least ");
  ASSERT_NE(at, std::string::npos) << m;
  const uint64_t least = std::stoull(m.substr(at + 9));
  uint32_t levels = 0;
  uint64_t peak = UINT64_MAX;
  for (uint64_t budget = uint64_t{64} << 30; budget >= least; budget = budget * 2 / 3) {
    auto p = plan_checkpoints(n, big, small, budget, 0, "t");
    ASSERT_TRUE(p.ok()) << budget << ": " << p.status().to_string();
    EXPECT_LE(p->peak_bytes, budget);
    EXPECT_EQ(p->peak_bytes, checkpoint_bytes(n, p->segments, big, small));
    EXPECT_EQ(p->recompute, p->segments.size());
    EXPECT_EQ(p->min_bytes, least);
    EXPECT_GE(p->recompute, levels) << p->to_string();
    if (p->recompute == levels) {
      EXPECT_LE(p->peak_bytes, peak) << p->to_string();
    }
    for (size_t i = 1; i < p->segments.size(); ++i) EXPECT_LE(p->segments[i], p->segments[i - 1]);
    levels = p->recompute;
    peak = p->peak_bytes;
  }
  EXPECT_GE(levels, 4u);  // the tightest budgets need several levels
  auto at_least = plan_checkpoints(n, big, small, least, 0, "t");
  ASSERT_TRUE(at_least.ok());
  EXPECT_EQ(at_least->peak_bytes, least);
  EXPECT_FALSE(plan_checkpoints(n, big, small, least - 1, 0, "t").ok());
  // Under ~30x the state where the whole tape of states would take 10,240x.
  EXPECT_LT(least, 30 * big);
}

TEST(CheckpointSchedule, APlanSaysWhatItIs) {
  CheckpointPlan p;
  p.launches = 1024;
  p.segments = {64, 8, 1};
  p.peak_bytes = 3 << 20;
  p.recompute = 3;
  EXPECT_EQ(p.to_string(),
            "3 levels {64, 8, 1}: 3 MiB of copies at most, every launch run 3 times (1024 "
            "launches)");
  EXPECT_EQ(format_bytes(312), "312 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
}

}  // namespace
}  // namespace vkad::codegen
