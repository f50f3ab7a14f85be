// Launch fusion: consecutive launches of a captured graph that touch shared arrays only at the
// element their own invocation owns, merged into one kernel, so a replay runs them as one
// dispatch with no barrier between them.
//
// Why: a differentiable simulation's substep loop is a chain of small dependent launches, and
// on a GPU a dependent dispatch costs its barrier (the device drains between them) whatever its
// size: on an H100 a 16,384-element step costs ~3.4 us of which the arithmetic is a fraction.
// Merged launches keep their order inside one invocation, so what one wrote at element i is
// what the next reads at i, from a register (the fused body forwards a stored value to a later
// load of the same element) instead of from memory after a barrier.
//
// Which launches merge (`fusion_groups`): each is a kernel of one parallel task (not serial,
// no adstack statements, no loop with a stated trip bound), and all have the same workgroup
// size and, but where they run side by side (below), the same evaluated range (an N-d task:
// the same box). An array written by one member and
// accessed by another is accessed by every member
// only at elements the invocation owns (loads, stores and atomics alike): one index is the
// task's own index value, on the same axis in every access, and the others are launch-uniform
// (x[index]; x[f, index] of a state with a time axis, f built from scalar arguments, constants
// and shapes: ir/launch_access.h; x[f, index, 0], a vector's component), so invocation t
// touches only elements whose coordinate on that axis is t, in every member, and no
// invocation reads what another writes. Arrays only read, or touched by one member alone, may
// be indexed any way. Ranges must not depend on scalar parameters, so a graph update of a
// scalar never changes what was merged. (The fused body forwards stores to loads and reads
// known zeros only for rank-1 arrays at [index]: rows of other members may differ.) In an
// N-d task no access is one invocation's own -- (i, j) and (i, j') both touch x[i] -- so its
// launches merge only where the arrays they share are read-only or touched at known, different
// rows: a visible per-step output of a cell kernel (DiffTaichi's grid_op, launched beside the
// steps' chain), kMaxNdMembers launches in one dispatch, the fused body forwarding nothing.

#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"

namespace vkad::codegen {

// The most N-d launches one run merges: they are independent (nothing forwarded), so a run
// saves only dispatches (~0.5 us each without a barrier on an H100), while its kernel's size,
// and the driver's compile of it at a graph's first replay, grows with every member. With 32
// members diffmpm's rework took 30-80 ms longer than with 8 (H100, warm caches).
inline constexpr uint32_t kMaxNdMembers = 8;

// The most ranges one run holds (launches of other ranges side by side, below).
inline constexpr uint32_t kMaxRunBoxes = 4;

// One launch: its kernel, and per parameter the identity of the array bound to it (any
// nonzero number equal exactly for equal arrays; 0 for scalar parameters), and the launch's
// evaluated task range.
struct FusionLaunch {
  static constexpr int64_t kAnyRow = INT64_MIN;
  const Kernel* kernel = nullptr;
  std::vector<uint64_t> arrays;
  int64_t begin = 0, end = 0;
  // An N-d task's box, [begin, end) per dimension (empty for a 1-d task): members of one
  // range have equal boxes (side by side, several ranges).
  std::vector<std::pair<int64_t, int64_t>> dims;
  // Per parameter: the one row (first axis, a launch-uniform index evaluated for this launch)
  // that every access of the parameter touches, kAnyRow where it is not one known row. Empty:
  // no rows known. Members touching a shared written array at known, different rows are
  // disjoint there however they index the other axes (a step's gather of row f beside the
  // next step's scatter into row f + 1).
  std::vector<int64_t> rows;
};

// Whether `k` may take part in a fusion at all (see the file comment).
bool fusible(const Kernel& k);
// Whether two launches have one range (1-d) or box (N-d).
bool same_box(const FusionLaunch& a, const FusionLaunch& b);

// Splits `launches` into runs of consecutive launches, [first, first + count) each, in order
// and covering all; a run of two or more may be fused. A run stops before a launch that is
// not fusible, has another workgroup size, would make an access unsafe (an array written by
// one member and touched by another, neither pointwise along one axis of one range nor at
// known different rows), or would take the fused kernel past `max_arrays` distinct arrays,
// `max_launches` members or kMaxNdMembers N-d ones.
//
// Launches of other ranges run side by side (where `max_ranges` > 1; the fuse pass's
// `side` option): a run may hold up to `max_ranges` ranges where
// an array one member writes is touched from no other range (but at known different rows), so
// the members of one range share nothing written with the others'. The fused kernel then runs
// max(size) invocations, each range's members under a guard `index < its size`, an N-d box's
// coordinates taken from the index (row-major): what a graph would run as independent
// dispatches between the same barriers -- a ring's fill over a grid's cells beside the next
// particle step, a gradient's clear beside an adjoint -- is one dispatch. Kernels with a
// workgroup barrier or shared memory never run beside another range (a guard would leave
// invocations out of the workgroup's barrier).
struct FusionRun {
  size_t first = 0, count = 0;
};
// `rows_used`, when given, is set when some run of two or more is only safe because of rows:
// its launches' scalar arguments must then not change without the graph as captured.
// `max_ranges`: how many ranges a run may hold side by side (1: one range, none beside it;
// at most kMaxRunBoxes).
std::vector<FusionRun> fusion_groups(std::span<const FusionLaunch> launches, uint32_t max_arrays,
                                     uint32_t max_launches, bool* rows_used = nullptr,
                                     uint32_t max_ranges = 1);

// The fused kernel of a run (every member fusible; fusion_groups' conditions hold; members of
// several ranges as fusion_groups describes, their ranges' sizes taken from `run`). Its
// parameters: one per distinct array (in order of first use; name "l<member>_<param>"), one per
// scalar parameter of each member. `param_map[m][p]`: the fused parameter of member m's
// parameter p. Named `name`.
//
// `zero_arrays`: arrays the caller knows hold zeros when the run starts (a captured fill with
// 0 is the last step that touched them): a load at [index] before anything else touched the
// array is the constant 0. `overwritten`: those of them the fused body stores at [index]
// unconditionally before any other access than such loads -- when the range is the whole
// (rank-1) array, every element is written, so the fill before the run changes nothing and
// may be left out (Session does).
struct FusedKernel {
  Kernel kernel;
  std::vector<std::vector<uint32_t>> param_map;
  std::vector<uint64_t> overwritten;  // sorted
};
// The merged kernel `f`'s parameter for parameter `kp` of member `member`: an ndarray bound
// to `array` (its identity) already seen in `array_param` is that parameter; otherwise a new
// one named "l<member>_<name>", neither needing a gradient nor read-only (another member may
// write what this one reads). Shared by fuse_launches and roll_launches (graph/resident.h).
uint32_t merged_param(Kernel& f, std::map<uint64_t, uint32_t>& array_param, const Param& kp,
                      uint64_t array, size_t member);

// Copies statements of one member kernel into a merged kernel (fuse_launches, roll_launches):
// every id the member defines renumbered from the merged kernel's fresh ids (a parsed kernel
// numbers named values from 2^30, so shifting ids by a base would wrap a uint32 after a few
// members), its task index replaced by `new_index`, parameters renamed through `param_map`,
// and an `arg` of a parameter in `param_values` replaced by that merged value. Definitions
// precede uses in a verified kernel, so one pass suffices; a use of a value the copy has not
// seen becomes kNoValue, which fails verification rather than aliasing.
class MemberCopier {
 public:
  MemberCopier(Kernel& into, ValueId old_index, const std::vector<uint32_t>& param_map,
               const std::unordered_map<uint32_t, ValueId>* param_values = nullptr)
      : into_(into), old_index_(old_index), pm_(param_map), param_values_(param_values) {}
  ValueId new_index = kNoValue;
  // The merged value a use of member value `v` reads.
  ValueId value(ValueId v) const;
  // From now on a use of member value `v` reads merged value `to` (a load forwarded).
  void substitute(ValueId v, ValueId to) { subst_[v] = to; }
  // `src` and its nested blocks, renumbered.
  Stmt copy(const Stmt& src);
  // Appends the copies of `from`'s statements to `to`.
  void copy_block(const Block& from, Block& to);

 private:
  Kernel& into_;
  ValueId old_index_;
  const std::vector<uint32_t>& pm_;
  const std::unordered_map<uint32_t, ValueId>* param_values_;
  std::unordered_map<ValueId, ValueId> subst_;
};

Result<FusedKernel> fuse_launches(std::span<const FusionLaunch> run, const std::string& name,
                                  std::span<const uint64_t> zero_arrays = {});

}  // namespace vkad::codegen
