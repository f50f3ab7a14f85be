// Reverse mode: the adjoint kernel of a forward kernel.
//
// Parameters of the adjoint: the forward kernel's parameters, unchanged and in order, then one
// gradient ndarray per parameter marked `grad`, called `<name>_grad`, same dtype and shape (a
// scalar's: shape {1}).
// For an ndarray the forward kernel reads, the adjoint adds dL/d(element) into its gradient
// (onto what the gradient array holds): with atomic_add, or with a plain load, add and store
// where owned_ndarrays() proves each thread touches only its own element; for one it writes
// (store or atomic_add), the adjoint reads the seeded dL/d(output) from its gradient. The
// adjoint writes no primal ndarray.
//
// Scheme, per parallel iteration (docs/architecture.md has the full story):
//   - replay the forward computation, checkpointing onto adstacks, at the start of every
//     iteration of every loop, the mutable locals whose values the
//     reverse sweep needs. "Needs" is computed: a local only updated linearly (acc += x) is
//     never checkpointed; integer locals used as indices, bounds or conditions are (on integer
//     stacks);
//   - walk the statements backwards accumulating adjoints. A loop runs reversed over the same
//     bounds; each reversed iteration restores its checkpoint, recomputes the iteration
//     (checkpointing its own inner loops), then walks it backwards. A branch is not replayed
//     in reverse: the values its reverse reads were kept in locals by the replay that
//     preceded it, and it tests the same condition value, so it takes the forward path.
//   Adjoint size is linear in the forward's for branches; each loop body is replayed once
//   per enclosing loop level, hence kMaxAdjointNesting.
//   Stack memory per thread is the sum over loops of their trip bounds (not the product):
//   nested loops are recomputed instead of stored.
//
// While loops reverse like for loops over [0, n), n being the trip count the replay of the
// loop's frame counted into a local (no trip-count stack: the frame's replay immediately
// precedes its reverse). Their checkpoint stacks are sized by the stated `max_trip`.
// A kernel with break / continue is differentiated as rewritten by lower_jumps (jumps.h).
//
// Adstack capacities are symbolic trip bounds derived from loop bounds (constants, scalar
// parameters, ndarray shapes, enclosing indices; sums, products, max). A loop whose bounds
// depend on ndarray contents or on mutable locals, and every while loop, needs a stated bound
// (`max_trip`), otherwise reverse mode fails naming the loop. A launch that exceeds a stated bound
// reports an adstack overflow (never a wrong gradient in silence).
//
// The adjoint must run on the arrays as the forward left them (it reads an array that the
// forward writes in its final state). An ndarray both read and written by the kernel is
// accepted when that is provably what the forward read: written only in tasks before every task
// that reads it (grad or not); or proven by disjoint_access (disjoint_access.h) never to write,
// in a read's task or a later one, an element that the read reads -- one axis indexed by
// launch-uniform values a non-zero constant apart, DiffTaichi's `x[f + 1, p] = x[f, p] + ...`
// (grad or not); or, without gradient, when the reverse sweep needs none of the values read
// from it (docs/architecture.md has the rules).
//
// The gradient of an ndarray that is read and written: the adjoint of a store or atomic_add
// reads its element's gradient as the seed and leaves it there (no clearing, as for any
// output): afterwards `x_grad` at an element the kernel wrote holds d loss / d (the value
// written) -- the seed plus what the adjoints of the reads after the write added -- not
// d loss / d (the element before the launch), which the kernel overwrote unread. The adjoint of
// a load adds into the element read. So a program of launches (one per time step, reading row
// f and writing row f + 1) is differentiated by launching the adjoints in reverse order on the
// arrays as the last forward launch left them: step f's adjoint reads as its seed the
// x_grad[f + 1] that step f + 1's adjoint (and the loss's) added into. That holds when, over the
// program, each element is written at most once and not read before it is written (Taichi's
// global data access rule; not checked across launches). A task whose adjoint reads seeds from
// one gradient array and adds into it touches disjoint elements for the two (the proof covers
// the same indices), and adds with atomic_add: such a task both reads and writes the array, so
// the proof needed launch-uniform indices on one axis, and owned_ndarrays (the task index on
// every axis) is false for it there. No add is a plain load-add-store that could race with
// another thread or read a seed.
//
// A load of the element the same invocation stored earlier in the same block is not a read of
// the array: forward_stores.h replaces it with the stored value first (DiffTaichi's billiards,
// `v[t, i] = ...; x[t, i] = ... v[t, i]`).
// Rejected with kInvalidArgument naming the statement: other ndarrays both read and written
// (the error says which case and what to do), a differentiable value carried through an array
// without gradient, adstack statements in the forward kernel, and loops with no derivable or
// stated trip bound.
//
// A scalar f32 / f64 parameter marked grad gets a 1-element gradient ndarray `<name>_grad`:
// each iteration sums d loss / d scalar over every use into a local, then atomically adds it
// into element 0 (onto what the array holds, like every gradient), so the launch's threads
// reduce into it.
#pragma once

#include <vector>

#include "autodiff/adjoint_plan.h"
#include "base/status.h"
#include "ir/ir.h"
#include "ir/pass.h"
#include "ir/target.h"

namespace vkad::codegen {

// Loops and branches nested deeper than this in a forward kernel are rejected
// (kInvalidArgument naming the first statement past the limit). The adjoint is linear in the
// forward's size for branches, but replays each loop body once per enclosing loop level.
inline constexpr int kMaxAdjointNesting = static_cast<int>(kMaxNestingDepth);  // ir.h

// The forward kernel must verify. The adjoint is verified (against `target`) before it is
// returned, so a caller never receives IR that the compiler would reject later: a failure is
// kUnsupported when the adjoint needs what the target lacks (e.g. atomic_add into an f64
// gradient on a device without f64 or 64-bit integer atomics), otherwise kInternal (a bug in
// reverse mode); both name the adjoint's statement.
// Segmented checkpointing follows `options` (adjoint_plan.h).
Result<Kernel> make_adjoint(const Kernel& forward, const Target& target = Target::host(),
                            const AdjointOptions& options = {});

// make_adjoint's kernel, except that the adjoint of a (non-atomic) store also writes 0 into the
// gradient at the stored element after reading it: the element's earlier contents, which the
// store replaced, get no part of that seed. For a tape that reuses arrays (checkpoint_every,
// api/tape.h), where one gradient array holds, in turn, the seeds of several versions of its
// array. Same parameters as make_adjoint's.
Result<Kernel> make_clearing_adjoint(const Kernel& forward, const Target& target = Target::host(),
                                     const AdjointOptions& options = {});

// Exact stack sizing without max_trip: as make_adjoint, but a loop with no derivable or stated
// trip bound (a while loop without max_trip, a for loop whose bounds depend on ndarray contents
// or locals) gets a counted one instead of an error: `adjoint` has, after make_adjoint's
// parameters, one i32 scalar `trips_<loop id>` per such loop (its stacks' capacity), and
// `counter` (trip_counter.h) is a kernel that measures them: the forward's parameters, then `trips`
// (ndarray<i32, 1> of `counted` x kTripSlots elements, zeroed by the caller), into which it
// atomic_max-es each loop's largest trip count over all instances and threads (trip_counter.h
// says where), running the forward's control
// flow without its ndarray writes, as the adjoint's replay does (so it runs, like the adjoint,
// on the arrays as the forward left them). `counting_forward` (trip_counter.h,
// counting_forward_kernel) is the forward itself with the same trips parameter appended: it
// writes what the forward writes and records the same counts into the same words as it runs, so
// a user who launches it in place of the forward has the counts without running `counter`
// (issue 27: the counter re-runs the forward's loads and loops, as costly as the adjoint on an
// H100). It is the forward as given when that has no break / continue, else the lowered forward
// (jumps.h) that reverse mode differentiates, which computes the same values.
// runtime/counted_launch.h runs them: launch_counted (counter, then adjoint) or
// launch_forward_counted then launch_counted_adjoint. `max_trip` still overrides. With
// `counted` == 0, `counter` and `counting_forward` are empty and `adjoint` is make_adjoint's.
// `clear_seeds`: the adjoint is make_clearing_adjoint's instead (what a checkpointed tape runs);
// `counter` and `counting_forward` are the same either way.
struct CountedAdjoint {
  Kernel adjoint;
  Kernel counter;
  Kernel counting_forward;
  uint32_t counted = 0;
};
Result<CountedAdjoint> make_adjoint_counted(const Kernel& forward,
                                            const Target& target = Target::host(),
                                            const AdjointOptions& options = {},
                                            bool clear_seeds = false);

// Which ndarray parameters of `k` each invocation of `task` (one of k's tasks) owns: flag p is
// true when the task is parallel and every load, store and atomic_add of parameter p in it
// (inside loops and branches too) indexes exactly [task index] -- the task's own index value,
// not a copy through a local, a cast or any arithmetic -- and it has at least one. Distinct
// iterations of a parallel task then touch distinct elements of p (and of p's gradient, which
// the adjoint indexes the same way), so the adjoint accumulates p's gradient with load-add-
// store instead of atomic_add. Tasks run one after another (a barrier between dispatches),
// so the proof is per task. False for serial tasks, scalars and anything unproven (gathers,
// scatters, index arithmetic, rank > 1 in a 1-d task). An N-d task owns the elements
// [i, j(, k)] indexed by exactly its own indices in order (rank = its dimension count).
// Result: one flag per parameter of k. The proof is
// per parameter: it assumes the launch binds distinct ndarrays to distinct gradient
// parameters (one ndarray bound as both x_grad and w_grad would mix plain and atomic adds).
std::vector<bool> owned_ndarrays(const Kernel& k, const Task& task);

// make_adjoint as a pipeline of passes (ir/pass.h), each of which a .vkir test may run alone:
//   verify -> accumulate-stores (accumulations.h) -> check-overwrites -> lower-jumps (jumps.h)
//   -> forward-stores (forward_stores.h) -> segment-loops -> reverse-mode
// (make_adjoint_counted leaves accumulate-stores out: its counting forward is the kernel as
// written.)
// segment-loops: the loops plan_adjoint selects for segmented checkpointing split by
// segment_loops (checkpoint.h); the kernel unchanged when options.checkpoint_segment is 0.
// reverse-mode ("clearing-reverse-mode" with clear_seeds): plan_adjoint, then the adjoint that
// applies the plan, verified by verify_adjoint; it refuses a kernel with break / continue.
Pass segment_loops_pass(const AdjointOptions& options);
Pass reverse_mode_pass(const Target& target, const AdjointOptions& options,
                       bool clear_seeds = false);
Pipeline adjoint_pipeline(const Target& target, const AdjointOptions& options,
                          bool clear_seeds = false);

// The check make_adjoint runs on its result: verify(adjoint, target), with a failure reworded
// as above. Exposed for its unit test.
Status verify_adjoint(const Kernel& forward, const Kernel& adjoint, const Target& target);

}  // namespace vkad::codegen
