// The pure steps of the graph rework at end_capture (session.h, "Launch fusion",
// "Resident step loops", "Graph scheduling"; the orchestration is api/graph_compiler.cpp):
// which captured launches roll into resident loops, the scheduled order, the runs that fuse,
// the fills a fused run makes redundant, and how the reworked graph's launches map back to
// the captured ones. Launches, array ids and shapes in; plans out. Nothing here compiles,
// registers or records: that is the Session's part.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "abi/handles.h"
#include "abi/kernel_abi.h"
#include "base/status.h"
#include "graph/graph_schedule.h"
#include "graph/launch_fusion.h"
#include "graph/resident.h"
#include "ir/ir.h"

namespace vkad {

using runtime::Arg;
using runtime::DType;
using runtime::KernelHandle;

// A step of a capture as the rework reads it (from the runtime's record,
// Runtime::Graphs::graph_record).
struct CapturedStep {
  bool launch = true;
  KernelHandle kernel;
  std::vector<Arg> args;  // a fill: args[0] is the array, `value` its value
  double value = 0;
};

// A launch of a kernel the rework made (a resident loop, a fused run): its members'
// parameters map to the kernel's through param_map[member][param].
struct MergedLaunch {
  KernelHandle kernel;
  std::vector<std::vector<uint32_t>> param_map;
  size_t params = 0;
};

// The shape of array `id`, std::nullopt where it is unknown.
using ShapeOf = std::function<std::optional<std::vector<uint32_t>>(uint64_t id)>;

// Calls fn(first, count) for each stretch of consecutive launches between fills (and the
// ends), launches numbered from 0 in step order; empty stretches included.
template <typename Fn>
void for_each_stretch(std::span<const CapturedStep> steps, Fn fn) {
  size_t launch = 0, first = 0;
  for (size_t i = 0; i <= steps.size(); ++i) {
    if (i < steps.size() && steps[i].launch) {
      ++launch;
      continue;
    }
    fn(first, launch - first);
    first = launch;
  }
}

// ---- Resident step loops (graph/resident.h) ----

// What rolling needs of one captured launch; kernel == nullptr: it cannot be rolled.
struct RollCandidate {
  const codegen::Kernel* kernel = nullptr;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // per task, [begin, end)
  // Per task, an N-d task's box (codegen::ResidentMember::boxes); empty where every task is 1-d.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> boxes;
};

// A run of `reps` repetitions of a period of `period` launches from launch `first`;
// steps[j][p] is how much i32 scalar p of the period's launch j grows per repetition.
struct RollSegment {
  size_t first = 0, period = 0, reps = 0;
  std::vector<std::vector<int64_t>> steps;
};

struct RollLimits {
  size_t max_period = 12;
  size_t min_reps = 4;
  size_t max_arrays = 31;  // the args buffer makes 32 push descriptors (roll_limits)
};

// A device's limits for resident step loops: RollLimits with max_arrays the most distinct arrays
// a resident kernel may bind where pipelines take `max_storage_buffers` storage buffers
// (rhi::Capabilities::max_storage_buffers; 0: not known): 31 where that is all it takes -- the 32
// push descriptors every device with them has, less the args buffer -- else up to 94 (the kernel
// then binds through a pooled descriptor set, and a graph holding it replays launch by launch
// rather than as recorded bundles: a resident kernel stands for hundreds of launches, so it pays).
// DiffTaichi's rigid_body's adjoint step reads 25 arrays and adds into 14 gradients.
RollLimits roll_limits(uint32_t max_storage_buffers);

// In each stretch between fills, left to right, the longest periodic runs (most launches
// covered): the same kernels and arrays at the same place of each repetition, ranges equal,
// i32 scalars stepping by a constant, other scalars equal. `launches` and `candidates` are
// per captured launch.
std::vector<RollSegment> find_roll_segments(std::span<const CapturedStep> captured,
                                            std::span<const CapturedStep* const> launches,
                                            std::span<const RollCandidate> candidates,
                                            const RollLimits& limits);

// Whether a block (a kernel's tasks) holds a for or while loop: where the device cuts long
// loops (lavapipe), such kernels stay out of resident kernels and fusion.
bool has_loops(const codegen::Block& b);
bool any_task_loops(const codegen::Kernel& k);

// Loop passes per invocation of a resident kernel over `members` (their ranges) repeated
// `reps` times in a workgroup of `local` invocations: what a device that cuts loops counts.
uint64_t resident_loop_passes(std::span<const codegen::ResidentMember> members, size_t reps,
                              uint32_t local);

// `captured` with each segment that has a kernel (`rolled[g]`) as one launch of it, its
// arguments its first repetition's. Per captured launch, `launch_index` gets its launch in
// `out` and `was_rolled` whether it is part of a resident launch.
void splice_rolled(std::span<const CapturedStep> captured, std::span<const RollSegment> segments,
                   std::span<const std::optional<MergedLaunch>> rolled,
                   std::vector<CapturedStep>* out, std::vector<uint32_t>* launch_index,
                   std::vector<bool>* was_rolled);

// ---- Scheduling and fusion ----

// Per launch of `steps`, the launch that runs in its place: each stretch between fills in
// scheduled order (graph_schedule.h) when `schedule`, else as captured.
std::vector<uint32_t> scheduled_order(std::span<const CapturedStep> steps,
                                      std::span<const ScheduleLaunch> launches, bool schedule);

// The runs of `launches` (in the order they run; `steps` their steps) that fuse, each stretch
// on its own (codegen::fusion_groups); every launch a run of its own when `fuse` is false.
// `rows_used` as fusion_groups sets it.
std::vector<codegen::FusionRun> fusion_runs(std::span<const CapturedStep> steps,
                                            std::span<const codegen::FusionLaunch> launches,
                                            bool fuse, uint32_t max_arrays, uint32_t max_launches,
                                            bool* rows_used = nullptr, uint32_t max_ranges = 1);

// Whether scheduling leaves out a barrier somewhere in `steps` (launches in run order).
bool any_barrier_relaxed(std::span<const CapturedStep> steps,
                         std::span<const ScheduleLaunch> launches);

// Per run, the arrays a fill with 0 (all bits) was the last step to touch before the run,
// by array id -> step index: a fused kernel reads them as zeros. Only 1-d arrays whose
// extent covers the run's range count (a load replaced by the constant carries no bounds
// check, so it must be one that was in bounds).
std::vector<std::unordered_map<uint64_t, size_t>> zero_fills_before_runs(
    std::span<const CapturedStep> steps, std::span<const codegen::FusionLaunch> launches,
    std::span<const codegen::FusionRun> runs, const ShapeOf& shape_of);

// The reworked graph before it is recorded: the steps in the order they run (`order[i]` the
// capture-order launch that runs i-th), per launch (in run order) what it touches and what
// fusion needs of it, the runs that fuse and their kernels, and the fills left out.
struct ReworkPlan {
  std::vector<CapturedStep> steps;
  std::vector<uint32_t> order;
  std::vector<ScheduleLaunch> sched;
  std::vector<codegen::FusionLaunch> launches;
  std::vector<codegen::FusionRun> runs;
  std::vector<MergedLaunch> planned;  // per run (runs of one launch: unused)
  std::vector<bool> dropped;          // per step
};

// Walks a plan's steps in order as they are launched: fill(i, kept) for each fill step i
// (kept: the plan records it; false where a fused run made it redundant); for each launch,
// member(launch number, its run's index in w.runs, its position in the run) -- launch numbers in
// the plan's order -- and, at the last member of its run, launch(kernel, args): the launch itself
// where the run has one member, else the run's merged kernel with every member's arguments at their
// parameters (MergedLaunch::param_map). Stops at the first error of fill or launch and returns it.
// A graph's instantiate (CompiledGraphs::instantiate_plan) and a reworked step loop
// (StepLoops::rework_loop) walk a plan this way.
template <typename Fill, typename Member, typename Launch>
Status walk_plan(const ReworkPlan& w, Fill&& fill, Member&& member, Launch&& launch) {
  std::vector<size_t> run_of(w.launches.size());
  for (size_t r = 0; r < w.runs.size(); ++r) {
    for (size_t m = 0; m < w.runs[r].count; ++m) run_of[w.runs[r].first + m] = r;
  }
  std::vector<Arg> args;
  size_t n = 0;
  for (size_t i = 0; i < w.steps.size(); ++i) {
    const CapturedStep& s = w.steps[i];
    if (!s.launch) {
      VKAD_TRY(fill(i, !w.dropped[i]));
      continue;
    }
    const size_t r = run_of[n];
    const codegen::FusionRun& run = w.runs[r];
    const size_t m = n - run.first;
    member(n++, r, m);
    if (run.count < 2) {
      VKAD_TRY(launch(s.kernel, std::span<const Arg>(s.args)));
      continue;
    }
    const MergedLaunch& merged = w.planned[r];
    if (m == 0) args.assign(merged.params, Arg{});
    const std::vector<uint32_t>& pm = merged.param_map[m];
    for (size_t p = 0; p < s.args.size(); ++p) args[pm[p]] = s.args[p];
    if (m + 1 == run.count) VKAD_TRY(launch(merged.kernel, std::span<const Arg>(args)));
  }
  return {};
}

// A fused run's kernel depends only on its members' kernels, which of their parameters share
// an array and which arrays are known zero -- and, where the run holds several ranges (side by
// side: launch_fusion.h), on the ranges, which its kernel holds as numbers: the key of that
// (arrays numbered by first use in the run, `ids` gets them in that order).
std::string fusion_signature(std::span<const codegen::FusionLaunch> members,
                             const std::unordered_map<uint64_t, size_t>& zero_fills,
                             std::vector<uint64_t>* ids);

}  // namespace vkad
