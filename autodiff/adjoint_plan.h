// Reverse mode's plan: what the adjoint of a kernel stores, where, and how big -- decided
// before any adjoint statement is written, from the forward kernel alone. reverse_mode.cpp
// applies it (replay, checkpoints, reverse sweep); reverse_mode.h has the scheme.
//
// Per task:
//   - which forward values carry a derivative (activity), and which primals the reverse sweep
//     reads (the operands its derivative rules use, and whatever a loop body uses, since a
//     loop's reversal replays the body);
//   - the checkpoints: for each loop, the mutable locals pushed onto adstacks at the start of
//     each of its iterations (a local only updated linearly is never pushed; integer locals
//     used as indices, bounds or conditions are), and the stacks' capacity, the loop's
//     symbolic trip bound (derived from its bounds, stated with max_trip, or counted);
//   - which loops segmented checkpointing (checkpoint.h) should split, and into how long a
//     whole tape;
//   - which ndarrays each invocation owns (owned_ndarrays: load-add-store instead of atomics,
//     except a gradient of an array the forward only reads where the device has hardware
//     float atomics of the type: AdjointOptions::atomic_f32_add).
// Per kernel: the gradient parameters and the counted trip bounds (`trips_<loop id>`
// parameters, in the order the adjoint declares them).
//
// The plan also carries the checks that refuse a forward kernel (reverse_mode.h lists them):
// planning a kernel reverse mode would reject fails with the same error make_adjoint returns.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"

namespace vkad::codegen {

// Options of reverse mode that are not facts about the device (Target has those).
struct AdjointOptions {
  // Segmented checkpointing (checkpoint.h): innermost loops that checkpoint something are split
  // into segments of this many iterations. 0: off (every iteration checkpointed), else 2 to
  // kMaxCheckpointSegment; anything else is refused (kInvalidArgument). api/device_target.h's
  // adjoint_options_from_caps turns it on for GPUs (kGpuCheckpointSegment), off for CPU devices.
  uint32_t checkpoint_segment = 0;
  // The device adds f32 / f64 atomically in hardware (adjoint_options_from_caps says so from
  // the device). Reverse mode then adds into the gradient of an array the forward kernel only
  // reads, where each invocation alone touches its element (owned_ndarrays: a parameter's
  // gradient, bias_grad[i]), with atomic_add as well, not with a load-add-store. Adds commute,
  // so the adjoint launches of one kernel into one parameter's gradient need no order among
  // themselves and a graph may move and batch them; a load-add-store chains each launch to the
  // last (diffmpm's 1,023 compute_actuation_adjoint launches each waited for the one before,
  // and sat between the steps' launches). The gradient of an array the forward also writes
  // (a state, x[f + 1, i] from x[f, i]) keeps its load-add-store: the next adjoint in the
  // chain reads it, and a fused chain forwards stores to loads, not atomic adds (made atomic,
  // a step loop's fused adjoint lost that: 3.98 -> 22.67 ms a replay, docs/benchmarks-log.md).
  // Without hardware float atomics an atomic add is a compare-and-swap loop: the
  // load-add-store stays.
  bool atomic_f32_add = false;
  bool atomic_f64_add = false;
  // Parameters whose stores' adjoints also clear the seed they read, as make_clearing_adjoint's
  // do for every parameter: an array a kernel updates in place, differentiated as the rewrite
  // in_place.h makes (its loads read a copy; the gradient of the copy is bound to the array's
  // own, so the element's new seed must be gone before the old value's gradient is added).
  std::vector<uint32_t> clear_seeds_of;
};

// adjoint_options_from_caps's segment length on GPUs (docs/benchmarks-log.md,
// "Segmented checkpointing").
inline constexpr uint32_t kGpuCheckpointSegment = 16;

// kInvalidArgument naming the option when options.checkpoint_segment is out of range.
Status check_adjoint_options(const AdjointOptions& options);

// One loop's checkpoint: the locals pushed at the start of each of its iterations, one adstack
// each, in this order, all of capacity `capacity`.
struct LoopCheckpoint {
  const Stmt* loop = nullptr;   // a for / while statement of the planned kernel
  std::vector<ValueId> locals;  // forward ids of kAlloca statements
  SizeExpr capacity;            // the loop's trip bound
};

struct TaskPlan {
  std::unordered_set<ValueId> active;        // forward values with a derivative
  std::unordered_set<ValueId> read;          // forward primals the reverse sweep reads
  std::unordered_map<ValueId, DType> types;  // forward value -> its type (task indices: i32)
  std::vector<LoopCheckpoint> checkpoints;   // statement order (the adjoint's stack order)
  std::vector<ValueId> active_locals;        // float locals with an adjoint, ascending
  std::vector<bool> owned;  // per parameter: owned_ndarrays(k, task), less AdjointOptions' atomics
  // Loop (forward id) -> the whole tape's trips W, for segment_loops; empty unless
  // checkpoint_segment is on.
  std::unordered_map<ValueId, uint32_t> segmentable;

  const LoopCheckpoint* checkpoint_of(const Stmt* loop) const;
  size_t stack_count() const;  // adstacks the task's adjoint allocates
};

struct AdjointPlan {
  // Per forward parameter: its gradient parameter's index in the adjoint, or UINT32_MAX.
  std::vector<uint32_t> grad_param;
  uint32_t param_count = 0;     // the adjoint's parameters: forward, gradients, then trips_
  std::vector<TaskPlan> tasks;  // per forward task, in forward order
  // Loops whose trip bound is counted (counting only), in the order of the trips_ parameters
  // that follow the gradients.
  std::vector<const Stmt*> counted_loops;
};

// The union of the primals (derivative_rules.h's PrimalRead bits) that the partials of `s`'s
// operands in `active` read: what the reverse sweep reads of `s`, and what the adjoint emits.
uint8_t adjoint_primal_reads(const Stmt& s, const std::unordered_set<ValueId>& active);

// Refuses (kInvalidArgument naming the statement) a store into a grad ndarray over an element
// an earlier write of the same launch may have written, or in every iteration of a loop at one
// element: the adjoint hands each store the element's seed without clearing it, so the
// overwritten value would get it too (a silently wrong gradient). Writes apart by their index
// ranges, in the two branches of an if, or before an early exit (break; continue in a loop of
// one trip) are told apart. On the kernel as written, before lower_jumps (which turns early
// exits into flags the check cannot follow): the first step of the adjoint pipelines.
Status check_overwrites(const Kernel& forward);

// The plan for `forward`, which must verify and hold no break / continue (lower_jumps first).
// `counting`: a loop with no derivable or stated trip bound gets a counted one
// (make_adjoint_counted) instead of an error. The plan points into `forward` (LoopCheckpoint::
// loop, counted_loops), so it is valid while `forward` lives unchanged. Errors: the refusals of
// reverse_mode.h (kInvalidArgument naming the statement), an out-of-range option.
Result<AdjointPlan> plan_adjoint(const Kernel& forward, const AdjointOptions& options = {},
                                 bool counting = false);

}  // namespace vkad::codegen
