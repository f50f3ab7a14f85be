// Graph scheduling's pure part (graph/graph_schedule.h): levels, order and barriers from what
// each launch reads and writes.
#include "graph/graph_schedule.h"

#include <gtest/gtest.h>

#include <vector>

namespace vkad {
namespace {

using Kind = codegen::ArrayAccess::Kind;

ScheduleAccess read(uint64_t array, int64_t row = ScheduleAccess::kAnyRow) {
  return {array, Kind::kRead, row};
}
ScheduleAccess write(uint64_t array, int64_t row = ScheduleAccess::kAnyRow) {
  return {array, Kind::kOverwrite, row};
}
ScheduleAccess add(uint64_t array, int64_t row = ScheduleAccess::kAnyRow) {
  return {array, Kind::kAccumulate, row};
}
ScheduleLaunch launch(std::vector<ScheduleAccess> a) { return {true, std::move(a)}; }

TEST(GraphSchedule, ADependentChainClimbsALevelPerLaunchAndIndependentOnesStayAtZero) {
  // 1: writes A; 2: reads A, writes B; 3: writes C; 4: reads B; 5: reads C.
  const std::vector<ScheduleLaunch> l = {launch({write(1)}), launch({read(1), write(2)}),
                                         launch({write(3)}), launch({read(2)}), launch({read(3)})};
  // The fifth reads what the third wrote: level 1. Both it and the fourth are sinks (nothing
  // after them conflicts): the last level, 2.
  EXPECT_EQ(schedule_levels(l), (std::vector<uint32_t>{0, 1, 0, 2, 2}));
  EXPECT_EQ(schedule_order(schedule_levels(l), l), (std::vector<uint32_t>{0, 2, 1, 3, 4}));
}

TEST(GraphSchedule, WithinALevelTheChainsNextStepFollowsIt) {
  // A chain a -> b (shape 1) with a side launch s (shape 2) that also reads what a wrote:
  // b and s share a level; b, of a's shape, goes first so it may fuse with a.
  std::vector<ScheduleLaunch> l = {launch({write(1)}), launch({read(1), write(3)}),
                                   launch({read(1), write(2)}), launch({read(2), read(3)})};
  l[0].shape = 1, l[1].shape = 2, l[2].shape = 1, l[3].shape = 1;
  const std::vector<uint32_t> levels = schedule_levels(l);
  EXPECT_EQ(levels, (std::vector<uint32_t>{0, 1, 1, 2}));
  EXPECT_EQ(schedule_order(levels, l), (std::vector<uint32_t>{0, 2, 1, 3}));
}

TEST(GraphSchedule, EveryKindOfConflictOrdersAndOnlyReadsOrAddsTogetherCommute) {
  auto level_of_second = [](ScheduleAccess a, ScheduleAccess b) {
    // A third launch that conflicts with both keeps them from being sinks.
    const std::vector<ScheduleLaunch> l = {launch({a}), launch({b}), launch({write(1), write(2)})};
    return schedule_levels(l)[1];
  };
  EXPECT_EQ(level_of_second(read(1), read(1)), 0u);
  EXPECT_EQ(level_of_second(add(1), add(1)), 0u);
  EXPECT_EQ(level_of_second(write(1), read(1)), 1u);   // read after write
  EXPECT_EQ(level_of_second(read(1), write(1)), 1u);   // write after read
  EXPECT_EQ(level_of_second(write(1), write(1)), 1u);  // write after write
  EXPECT_EQ(level_of_second(add(1), read(1)), 1u);
  EXPECT_EQ(level_of_second(read(1), add(1)), 1u);
  EXPECT_EQ(level_of_second(add(1), write(1)), 1u);
  EXPECT_EQ(level_of_second(write(1), add(1)), 1u);
  EXPECT_EQ(level_of_second(write(1), read(2)), 0u);  // another array
}

TEST(GraphSchedule, DifferentKnownRowsDoNotConflictAndAnUnknownRowMeetsEveryRow) {
  const std::vector<ScheduleLaunch> l = {
      launch({write(1, 0)}),  // row 0
      launch({write(1, 1)}),  // row 1: independent of row 0
      launch({read(1, 0)}),   // after the first
      launch({write(1)}),     // any row: after all three
      launch({read(1, 5)}),   // row 5 meets the write at any row
  };
  EXPECT_EQ(schedule_levels(l), (std::vector<uint32_t>{0, 0, 1, 2, 3}));
  // Without the write at any row, the row-1 writer and the reader of row 5 are sinks.
  const std::vector<ScheduleLaunch> m = {launch({write(1, 0)}), launch({write(1, 1)}),
                                         launch({read(1, 0)}), launch({read(1, 5)})};
  EXPECT_EQ(schedule_levels(m), (std::vector<uint32_t>{0, 1, 1, 1}));
}

TEST(GraphSchedule, RowsFarApartOrWalkedBackwardsKeepTheirOwnMarks) {
  // Rows are kept in a window of consecutive rows and a map for those far outside it: a row
  // walked down from 3000, rows 2^16 and 2^31 past it, and row 0 must each meet only
  // accesses of that row.
  std::vector<ScheduleLaunch> l;
  for (int64_t r = 3000; r >= 2990; --r) l.push_back(launch({write(1, r)}));
  const int64_t far = 3000 + (int64_t{1} << 16), farther = int64_t{1} << 31;
  l.push_back(launch({write(1, far)}));      // 11: independent of all before
  l.push_back(launch({write(1, farther)}));  // 12: likewise
  l.push_back(launch({read(1, far)}));       // 13: after 11 only
  l.push_back(launch({read(1, 2995)}));      // 14: after the writer of row 2995 only
  l.push_back(launch({read(1, farther)}));   // 15: after 12 only
  l.push_back(launch({write(1, 0)}));        // 16: a row below every other: independent
  l.push_back(launch({read(1, 0)}));         // 17: after 16
  l.push_back(launch({write(1, far)}));      // 18: after 11 and its reader 13
  const std::vector<uint32_t> levels = schedule_levels(l);
  // Sinks go to the last level (2): every launch that nothing later conflicts with.
  for (size_t i = 0; i < 11; ++i) {
    EXPECT_EQ(levels[i], i == 5 ? 0u : 2u) << "launch " << i;  // row 2995's writer is read
  }
  EXPECT_EQ(levels[11], 0u);
  EXPECT_EQ(levels[12], 0u);
  EXPECT_EQ(levels[13], 1u);
  EXPECT_EQ(levels[14], 2u);
  EXPECT_EQ(levels[15], 2u);
  EXPECT_EQ(levels[16], 0u);
  EXPECT_EQ(levels[17], 2u);
  EXPECT_EQ(levels[18], 2u);
  // Barriers in capture order: only before a launch that meets a row touched since the last
  // barrier (13 meets 11; 14 and 15 meet rows written before it; 17 meets 16, row 0 noted
  // after the barrier beside row 3000 + 2^16).
  const std::vector<bool> b = schedule_barriers(l);
  for (size_t i = 0; i < l.size(); ++i) {
    const bool want = i == 13 || i == 17;
    EXPECT_EQ(b[i], want) << "launch " << i;
  }
}

TEST(GraphSchedule, ALaunchOfUnknownAccessesIsAFenceNothingCrosses) {
  std::vector<ScheduleLaunch> l = {launch({read(1)}), launch({read(2)}), ScheduleLaunch{},
                                   launch({read(3)})};
  l[2].known = false;
  EXPECT_EQ(schedule_levels(l), (std::vector<uint32_t>{0, 0, 1, 2}));  // no sink crosses it
  const std::vector<bool> b = schedule_barriers(l);
  EXPECT_EQ(b, (std::vector<bool>{false, false, true, true}));
}

TEST(GraphSchedule, ABarrierComesOnlyBeforeALaunchThatConflictsWithOneSinceTheLast) {
  // Two writers of distinct arrays, a reader of the first (barrier), a writer of the second
  // array's other row (nothing since the barrier touched it), a reader of that row (barrier),
  // a writer of the first array (barrier: read since).
  const std::vector<ScheduleLaunch> l = {
      launch({write(1)}),    launch({write(2, 0)}),         launch({read(1)}),
      launch({write(2, 1)}), launch({read(1), read(2, 1)}), launch({write(1)})};
  EXPECT_EQ(schedule_barriers(l), (std::vector<bool>{false, false, true, false, true, true}));
  BarrierTracker t;
  EXPECT_FALSE(t.next(l[0]));
  EXPECT_TRUE(t.next(l[2]));
  t.clear();  // a fill between
  EXPECT_FALSE(t.next(l[5]));
}

// The capture's tracker (whole arrays, kinds as bits): reads together and atomic adds together
// need no barrier; a write after anything, a read after an add, an add after a read do; a
// launch that may touch anything needs one after any launch and makes the next one need one.
TEST(GraphSchedule, TheCapturesTrackerJudgesWholeArraysByKind) {
  const uint8_t r = kind_bit(Kind::kRead), a = kind_bit(Kind::kAccumulate),
                w = kind_bit(Kind::kOverwrite);
  auto one = [](uint64_t array, uint8_t kinds) { return std::vector<ArrayKinds>{{array, kinds}}; };
  ArrayBarrierTracker t;
  EXPECT_FALSE(t.next(one(1, w), true)) << "never before the first";
  EXPECT_FALSE(t.next(one(2, r), true)) << "another array";
  EXPECT_TRUE(t.next(one(1, r), true)) << "reads what was written";
  EXPECT_FALSE(t.next(one(1, r), true)) << "two reads";
  EXPECT_TRUE(t.next(one(1, a), true)) << "adds to what was read";
  EXPECT_FALSE(t.next(one(1, a), true)) << "two adds commute";
  EXPECT_TRUE(t.next(one(1, r), true)) << "reads what was added to";
  EXPECT_FALSE(t.next(one(3, r | w), true));
  EXPECT_TRUE(t.next(one(3, r), true)) << "kinds of one launch are summed";
  EXPECT_TRUE(t.next({}, false)) << "may touch anything";
  EXPECT_TRUE(t.next(one(4, r), true)) << "after one that may touch anything";
  t.clear();  // a fill between
  EXPECT_FALSE(t.next(one(4, w), true));
}

TEST(GraphSchedule, WithinALevelLaunchesOfOneShapeGoTogether) {
  // A loop's sinks reach the last level alternating: a per-step parameter gradient's adjoint
  // (shape 2, adds into 9) beside a visible output's (shape 3), each step's reading what the
  // chain (shape 1) wrote at its row. They are grouped by shape in order of first appearance,
  // so each kind fuses with its own.
  std::vector<ScheduleLaunch> l;
  for (int64_t f = 0; f < 3; ++f) {
    l.push_back(launch({read(1, f), write(1, f + 1)}));
    l.back().shape = 1;
    l.push_back(launch({read(1, f + 1), add(9)}));
    l.back().shape = 2;
    l.push_back(launch({read(1, f + 1), write(2, f)}));
    l.back().shape = 3;
  }
  const std::vector<uint32_t> levels = schedule_levels(l);
  EXPECT_EQ(levels, (std::vector<uint32_t>{0, 3, 3, 1, 3, 3, 2, 3, 3}));
  EXPECT_EQ(schedule_order(levels, l), (std::vector<uint32_t>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
}

}  // namespace
}  // namespace vkad
