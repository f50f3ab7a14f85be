// The pure steps of the Session's graph rework (graph/graph_rework.h): which captured launches
// roll into resident loops, how the rolled steps map back, which fills a fused run reads as
// zeros, and when two runs share a fused kernel.
#include "graph/graph_rework.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace vkad::testing {
namespace {

using runtime::NdArrayHandle;

CapturedStep launch(uint64_t kernel, std::vector<Arg> args) {
  CapturedStep s;
  s.kernel = KernelHandle{kernel};
  s.args = std::move(args);
  return s;
}

CapturedStep fill(uint64_t array, double value) {
  CapturedStep s;
  s.launch = false;
  s.args = {Arg::ndarray(NdArrayHandle{array})};
  s.value = value;
  return s;
}

Arg array(uint64_t id) { return Arg::ndarray(NdArrayHandle{id}); }

// A step loop: per step f, kernel 1 (x, v, f) then kernel 2 (v, x, f), `reps` times, with f
// stepping by `step` (and at `break_at`, if set, by one more).
std::vector<CapturedStep> step_loop(size_t reps, int32_t step,
                                    std::optional<size_t> break_at = {}) {
  std::vector<CapturedStep> out;
  int32_t f = 3;
  for (size_t r = 0; r < reps; ++r) {
    out.push_back(launch(1, {array(10), array(11), Arg::i32(f)}));
    out.push_back(launch(2, {array(11), array(10), Arg::i32(f)}));
    f += step + (break_at && *break_at == r ? 1 : 0);
  }
  return out;
}

struct Rolling {
  std::vector<const CapturedStep*> launches;
  std::vector<RollCandidate> candidates;
};

Rolling candidates_for(const std::vector<CapturedStep>& steps, const codegen::Kernel& k) {
  Rolling r;
  for (const CapturedStep& s : steps) {
    if (!s.launch) continue;
    r.launches.push_back(&s);
    r.candidates.push_back({&k, {{0, 64}}});
  }
  return r;
}

TEST(GraphRework, AStepLoopIsOneSegmentWithItsScalarSteps) {
  const codegen::Kernel k;
  const std::vector<CapturedStep> steps = step_loop(6, 2);
  Rolling r = candidates_for(steps, k);
  const std::vector<RollSegment> segs =
      find_roll_segments(steps, r.launches, r.candidates, RollLimits{});
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].first, 0u);
  EXPECT_EQ(segs[0].period, 2u);
  EXPECT_EQ(segs[0].reps, 6u);
  ASSERT_EQ(segs[0].steps.size(), 2u);
  EXPECT_EQ(segs[0].steps[0], (std::vector<int64_t>{0, 0, 2}));
  EXPECT_EQ(segs[0].steps[1], (std::vector<int64_t>{0, 0, 2}));
}

TEST(GraphRework, AnUnevenStepAFillOrAnUnrollableLaunchEndsASegment) {
  const codegen::Kernel k;
  {  // f steps by 2 except once: the repetitions on either side, each long enough, roll apart
    const std::vector<CapturedStep> steps = step_loop(10, 2, 4);
    Rolling r = candidates_for(steps, k);
    const auto segs = find_roll_segments(steps, r.launches, r.candidates, RollLimits{});
    ASSERT_EQ(segs.size(), 2u);
    EXPECT_EQ(segs[0].reps, 5u);
    EXPECT_EQ(segs[1].first, 10u);
    EXPECT_EQ(segs[1].reps, 5u);
  }
  {  // a fill between repetitions 3 and 4: too few repetitions on the short side
    std::vector<CapturedStep> steps = step_loop(7, 1);
    steps.insert(steps.begin() + 6, fill(10, 0.0));
    Rolling r = candidates_for(steps, k);
    const auto segs = find_roll_segments(steps, r.launches, r.candidates, RollLimits{});
    ASSERT_EQ(segs.size(), 1u);
    EXPECT_EQ(segs[0].first, 6u);
    EXPECT_EQ(segs[0].reps, 4u);
  }
  {  // a launch whose range is too wide (no candidate) splits the loop
    const std::vector<CapturedStep> steps = step_loop(9, 1);
    Rolling r = candidates_for(steps, k);
    r.candidates[8] = RollCandidate{};
    const auto segs = find_roll_segments(steps, r.launches, r.candidates, RollLimits{});
    ASSERT_EQ(segs.size(), 2u);
    EXPECT_EQ(segs[0].reps, 4u);
    EXPECT_EQ(segs[1].first, 9u);
    EXPECT_EQ(segs[1].reps, 4u);
  }
}

// What a device that cuts loops (lavapipe: 65,535 passes per invocation) counts of a resident
// kernel: per repetition one pass, plus a grid-stride loop's passes and exit per member task
// wider than the workgroup; and the repetition loop's exit.
TEST(GraphRework, ResidentLoopPassesCountTheGridStrideLoopsOfWideMembers) {
  codegen::ResidentMember narrow, wide;
  narrow.ranges = {{0, 200}};           // one pass of 256: no loop
  wide.ranges = {{0, 1000}, {10, 10}};  // 4 passes (a loop: 4 + exit); an empty range: none
  const std::vector<codegen::ResidentMember> members = {narrow, wide};
  EXPECT_EQ(resident_loop_passes(members, 10, 256), 10u * (1 + 5) + 1);
  EXPECT_EQ(resident_loop_passes(std::span(members).first(1), 7, 256), 7u * 1 + 1);
  EXPECT_EQ(resident_loop_passes(std::span(members).first(1), 7, 64), 7u * (1 + 5) + 1);
  // A serial task's walk is one invocation's: a pass per element (a loop: 200 + exit), one
  // element no loop.
  codegen::Kernel serial;
  serial.tasks.emplace_back().serial = true;
  codegen::ResidentMember walk, once;
  walk.kernel = once.kernel = &serial;
  walk.ranges = {{0, 200}};
  once.ranges = {{0, 1}};
  EXPECT_EQ(resident_loop_passes(std::vector<codegen::ResidentMember>{walk}, 3, 256),
            3u * (1 + 201) + 1);
  EXPECT_EQ(resident_loop_passes(std::vector<codegen::ResidentMember>{once}, 3, 256), 3u * 1 + 1);
}

TEST(GraphRework, SplicingMapsEachCapturedLaunchToItsResidentLaunch) {
  const codegen::Kernel k;
  std::vector<CapturedStep> steps = {launch(7, {array(1)})};
  for (const CapturedStep& s : step_loop(4, 1)) steps.push_back(s);
  steps.push_back(fill(1, 0.0));
  steps.push_back(launch(7, {array(1)}));
  Rolling r = candidates_for(steps, k);
  const std::vector<RollSegment> segs = {{1, 2, 4, {{0, 0, 1}, {0, 0, 1}}}};
  // The resident kernel's parameters: x, v, f of member 0; f of member 1.
  const std::vector<std::optional<MergedLaunch>> rolled = {
      MergedLaunch{KernelHandle{99}, {{0, 1, 2}, {1, 0, 3}}, 4}};
  std::vector<CapturedStep> out;
  std::vector<uint32_t> index;
  std::vector<bool> was_rolled;
  splice_rolled(steps, segs, rolled, &out, &index, &was_rolled);
  ASSERT_EQ(out.size(), 4u);  // launch, resident launch, fill, launch
  EXPECT_EQ(out[1].kernel.id, 99u);
  ASSERT_EQ(out[1].args.size(), 4u);
  EXPECT_EQ(out[1].args[0].array.id, 10u);
  EXPECT_EQ(out[1].args[1].array.id, 11u);
  EXPECT_EQ(out[1].args[2].i, 3);  // the first repetition's f
  EXPECT_EQ(out[1].args[3].i, 3);
  EXPECT_FALSE(out[2].launch);
  EXPECT_EQ(index, (std::vector<uint32_t>{0, 1, 1, 1, 1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(was_rolled,
            (std::vector<bool>{false, true, true, true, true, true, true, true, true, false}));
  // A segment whose kernel could not be built stays as captured.
  const std::vector<std::optional<MergedLaunch>> none = {std::nullopt};
  splice_rolled(steps, segs, none, &out, &index, &was_rolled);
  EXPECT_EQ(out.size(), steps.size());
  EXPECT_EQ(std::count(was_rolled.begin(), was_rolled.end(), true), 0);
}

TEST(GraphRework, AZeroFillBeforeARunIsKnownOnlyWhereItCoversTheRunAndIsAllZeroBits) {
  const codegen::Kernel k;
  const std::vector<CapturedStep> steps = {fill(1, 0.0),
                                           fill(2, -0.0),
                                           fill(3, 0.0),
                                           fill(4, 0.0),
                                           launch(5, {array(1), array(2)}),
                                           launch(5, {array(3), array(4)})};
  const std::vector<codegen::FusionLaunch> launches = {{&k, {1, 2}, 0, 8}, {&k, {3, 4}, 0, 8}};
  const std::vector<codegen::FusionRun> runs = {{0, 2}};
  const ShapeOf shape_of = [](uint64_t id) -> std::optional<std::vector<uint32_t>> {
    if (id == 3) return std::vector<uint32_t>{4};     // shorter than the range
    if (id == 4) return std::vector<uint32_t>{8, 2};  // not 1-d
    return std::vector<uint32_t>{8};
  };
  const auto zeros = zero_fills_before_runs(steps, launches, runs, shape_of);
  ASSERT_EQ(zeros.size(), 1u);
  EXPECT_EQ(zeros[0].size(), 1u);
  ASSERT_TRUE(zeros[0].count(1));
  EXPECT_EQ(zeros[0].at(1), 0u);  // the fill's step
}

TEST(GraphRework, RunsShareAFusedKernelExactlyWhenTheirArraysShareAlike) {
  const codegen::Kernel a, b;
  const std::vector<codegen::FusionLaunch> run1 = {{&a, {1, 2, 0}, 0, 8}, {&b, {2, 3}, 0, 8}};
  const std::vector<codegen::FusionLaunch> run2 = {{&a, {7, 8, 0}, 0, 8}, {&b, {8, 9}, 0, 8}};
  const std::vector<codegen::FusionLaunch> run3 = {{&a, {7, 8, 0}, 0, 8}, {&b, {9, 8}, 0, 8}};
  std::vector<uint64_t> ids1, ids2, ids3;
  const std::string s1 = fusion_signature(run1, {}, &ids1);
  EXPECT_EQ(s1, fusion_signature(run2, {}, &ids2));
  EXPECT_EQ(ids2, (std::vector<uint64_t>{7, 8, 9}));
  EXPECT_NE(s1, fusion_signature(run3, {}, &ids3));
  std::vector<uint64_t> ids4;
  EXPECT_NE(s1, fusion_signature(run1, {{3, 0}}, &ids4)) << "a known-zero array changes the kernel";
}

}  // namespace
}  // namespace vkad::testing
