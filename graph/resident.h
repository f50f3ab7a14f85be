// Resident kernels: a captured step loop of small launches rolled into one kernel that runs as a
// single workgroup, its launches separated by workgroup barriers instead of dispatches.
//
// Why: a differentiable simulation of a few hundred particles or springs (DiffTaichi's
// mass_spring: ranges of 1 to ~60) launches thousands of tiny dependent kernels per iteration.
// On a GPU each dependent dispatch costs its barrier and drain (~3 us on an H100) while the
// work is a few hundred instructions. One workgroup that walks the loop itself pays a
// workgroup barrier per launch instead (tens of nanoseconds), at the price of running on one
// compute unit: right for small ranges only (the graph compiler picks the launches;
// api/graph_compiler.cpp).
//
// The loop is what the capture shows: a period of launches repeated `reps` times with the same
// kernels and arrays, each integer scalar argument changing by a fixed step per repetition
// (DiffTaichi's step index t) and every other scalar unchanged. The rolled kernel has one
// parallel task over [0, local_size) with that local size (exactly one workgroup); its body:
//
//   for r in [0, reps):
//     for each member launch m, each task of its kernel:
//       for k in [0, ceil(range / local_size)):     (no loop when one pass covers the range)
//         i = begin + k * local_size + invocation
//         if i < end: member body with index i and scalars s + r * step
//       barrier
//
// Ranges are the capture's (constants: the arrays are fixed and a rolled launch's scalar that
// decides a range must not step), so the kernel states every loop's trip count. An N-d task
// (a small grid) is walked the same way over its box's points in row-major order (the last
// dimension fastest), each point's indices computed from the walk's element. A serial task (one
// invocation over its range, in order: DiffTaichi's kernels of top-level statements) is walked
// by invocation 0 alone, in order, then the barrier.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"

namespace vkad::codegen {

// One launch of the repeated period, as launched in the first repetition.
struct ResidentMember {
  const Kernel* kernel = nullptr;
  // Per parameter: the identity of the array bound to it (nonzero, equal exactly for equal
  // arrays), 0 for a scalar.
  std::vector<uint64_t> arrays;
  // Per parameter: what an i32 scalar argument gains per repetition (0 otherwise).
  std::vector<int64_t> step;
  // Per task of the kernel: its evaluated range [begin, end) (the same in every repetition);
  // an N-d task's is [0, its box's points) (box_range), the box itself in `boxes`.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  // Per task: empty for a 1-d task, an N-d task's evaluated box (per dimension [begin, end)).
  // Empty altogether where every task is 1-d.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> boxes;
};

// [0, the number of points of `box`): an N-d task's range as a resident walk takes it (an empty
// dimension: none).
std::pair<int64_t, int64_t> box_range(std::span<const std::pair<int64_t, int64_t>> box);

// A launch's values: parameter p's integer scalar, and array parameter p's extent along axis d
// (nullopt where unknown).
using ScalarOf = std::function<std::optional<int64_t>(uint32_t p)>;
using ExtentOf = std::function<std::optional<int64_t>(uint32_t p, uint32_t d)>;
// An N-d task's box for a launch (per dimension [begin, end)); nullopt where a value is unknown.
std::optional<std::vector<std::pair<int64_t, int64_t>>> task_box(const Task& t,
                                                                 const ScalarOf& scalar,
                                                                 const ExtentOf& extent);
// A launch's ranges and boxes as a resident walk takes them (ResidentMember's `ranges` and
// `boxes`); nullopt where a value is unknown or a range is wider than `max_range`.
struct LaunchShapes {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> boxes;  // empty: every task 1-d
  bool operator==(const LaunchShapes&) const = default;
};
std::optional<LaunchShapes> launch_shapes(const Kernel& k, const ScalarOf& scalar,
                                          const ExtentOf& extent, int64_t max_range);

// Whether launches of `k` may be rolled: every task a parallel task (1-d or N-d) or a serial one
// (run by one invocation of the walk), no adstack statement, no stated trip bound, no barrier.
bool residable(const Kernel& k);

// The rolled kernel of `period` repeated `reps` times (see the file comment). Parameters: one
// per distinct array (first use), one per scalar parameter of each member; the launch passes
// the first repetition's scalars. `param_map[m][p]`: the rolled parameter of member m's
// parameter p. Errors: an empty period, a member not residable, a stepping scalar that is not
// i32, local_size 0.
struct ResidentKernel {
  Kernel kernel;
  std::vector<std::vector<uint32_t>> param_map;
};
Result<ResidentKernel> roll_launches(std::span<const ResidentMember> period, uint32_t reps,
                                     uint32_t local_size, const std::string& name);

// The loop passes one invocation of a rolled kernel makes, as the runtime counts them before a
// launch on a device that cuts loops (ir/loop_passes.h's model: the repetitions, grid-stride and
// serial walks, float atomics that are compare-and-swap loops per `cas_f32` / `cas_f64`);
// UINT64_MAX where a member's body has a loop whose trip count a scalar decides. What a plan
// checks against the cap once the kernel is made (graph_rework.h's resident_loop_passes is
// the estimate that decides whether to make it).
uint64_t rolled_loop_passes(const ResidentKernel& rk, bool cas_f32, bool cas_f64);

}  // namespace vkad::codegen
