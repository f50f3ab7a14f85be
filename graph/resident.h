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
// dimension fastest), each point's indices computed from the walk's element.
//
// Windows (`shared_bytes` > 0): each phase reads what the phase before it wrote, so on a GPU a
// phase waits on the memory hierarchy two or three times (the stores made visible at the
// barrier, the loads after it) while its arithmetic is a few dozen instructions. Where the
// members' accesses allow, an array the loop reads keeps the rows it touches in workgroup
// shared memory, a *window*:
//   - sliding: every access's first index is a stepping i32 scalar plus a constant, all
//     stepping by +1 or by -1 per repetition (DiffTaichi's x[t, i], x[t - 1, i] forwards and
//     the same backwards): the rows repetition r touches are r * step + K for the accesses'
//     constants K, W of them; the window holds W + 1 rows, row R in slot R mod (W + 1), and
//     each repetition first loads the row the next one adds from global memory into the slot
//     no repetition touches meanwhile (one barrier away from its first use);
//   - whole: an array small enough is held whole, whatever its indices.
// Loads of a windowed array read the window (an access outside the array's extents takes the
// global path and reports its out-of-bounds error as before); stores go to global memory as
// before and to the window (write-through), so nothing is written back and the window never
// holds a row the loop did not read from, or write to, global memory itself. Arrays the loop
// adds to atomically stay in global memory. The windows fit `shared_bytes` together (smallest
// first); their rows are loaded before the first repetition, behind one extra barrier.
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
  // Per parameter: the first repetition's integer scalar argument (0 for the others). Only
  // the differences between stepping scalars shape the kernel (the launch passes the values).
  // Empty: unknown (no sliding window).
  std::vector<int64_t> first;
  // Per parameter: the bound array's extents; empty where unknown or a scalar (that array
  // gets no window).
  std::vector<std::vector<int64_t>> shapes;
};

// The shared memory a resident kernel's windows may take by default: the 16 KiB every Vulkan
// device has (graph passes: `roll{shared=B}`).
inline constexpr uint32_t kResidentSharedBytes = 16384;
// The most loop passes the windows add to a resident kernel (its loads before the first
// repetition): where a device caps loop passes per invocation, callers keep this much spare.
inline constexpr uint64_t kResidentWindowPasses = 40;

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
// Array parameter `p`'s extents (ResidentMember::shapes); empty where one is unknown or `p` is
// a scalar.
std::vector<int64_t> array_shape(const Kernel& k, uint32_t p, const ExtentOf& extent);

// Whether launches of `k` may be rolled: every task a parallel task (1-d or N-d; not serial), no
// adstack statement, no stated trip bound, no barrier.
bool residable(const Kernel& k);

// The rolled kernel of `period` repeated `reps` times (see the file comment). Parameters: one
// per distinct array (first use), one per scalar parameter of each member; the launch passes
// the first repetition's scalars. `param_map[m][p]`: the rolled parameter of member m's
// parameter p. Errors: an empty period, a member not residable, a stepping scalar that is not
// i32, local_size 0. `shared_bytes`: what its windows may take (0: none; see the file comment).
struct ResidentKernel {
  Kernel kernel;
  std::vector<std::vector<uint32_t>> param_map;
  uint32_t windows = 0;  // arrays held in shared memory
};
Result<ResidentKernel> roll_launches(std::span<const ResidentMember> period, uint32_t reps,
                                     uint32_t local_size, const std::string& name,
                                     uint32_t shared_bytes = 0);
// With VKAD_GRAPH_TRACE set: one line on stderr naming the kernel and its windows.
void trace_windows(const ResidentKernel& rk);

}  // namespace vkad::codegen
