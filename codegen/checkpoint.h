// Segmented checkpointing of loops for reverse mode: a pure IR rewrite of the forward kernel.
//
// Reverse mode checkpoints, at the start of every iteration of a loop, the locals its reverse
// sweep needs, and recomputes everything else; nested loops are recomputed from their enclosing
// loop's checkpoint rather than stored (reverse_mode.h). So splitting a loop into segments,
//
//   for j in [a, b) body(j)
//
// into
//
//   n = max(b - a, 0); full = n >= 2K ? n / K : 0
//   for s in [0, full) {
//     base = a + s * K
//     for jj in [0, K) { j = base + jj; body(j) }
//   }
//   for j in [a + full * K, b) max_trip(2K - 1) body(j)     (a copy of the body, fresh ids)
//
// runs the same iterations in the same order with the same index values (so the forward, and
// every float it computes, is unchanged), while its adjoint keeps one checkpoint per segment on
// the adstack (the outer loop's) and the per-iteration values of only the segment it is
// reversing (the inner loop's stacks, K entries: small enough for the private tier, and with a
// constant trip count the driver can unroll the segment and index them by constants; the
// remainder's stacks hold fewer than 2K). A loop of fewer than 2K iterations runs wholly in the
// remainder, as it would without segments. The price is one more replay of the body per iteration
// (the segment is recomputed from its checkpoint before it is reversed); what it buys is K times
// fewer adstack bytes through memory, which is what bounds a long loop's adjoint on a GPU
// (docs/architecture.md, "Segmented checkpointing").
//
// make_adjoint applies it when Target::checkpoint_segment is non-zero, to the loops it selects
// (reverse_mode.cpp: innermost `for` loops that checkpoint something, with derivable i32 bounds,
// no stated max_trip, room for one more nesting level, and not a constant trip count < 2K).
#pragma once

#include <cstdint>
#include <unordered_set>

#include "codegen/ir.h"

namespace vkad::codegen {

// The most iterations one segment may hold (Target::checkpoint_segment's upper limit): the inner
// loop's stacks hold this many entries per thread.
inline constexpr uint32_t kMaxCheckpointSegment = 4096;

// `k` with each `for` loop whose result id is in `loops` split as above into segments of
// `segment` (>= 2) iterations. The loops must have i32 bounds and no stated max_trip; ids that
// name no such loop are ignored. In the segments the loop's index id is the value base + jj,
// so the body is unchanged; the remainder's copy of the body has fresh ids (from k.next_id).
Kernel segment_loops(const Kernel& k, const std::unordered_set<ValueId>& loops, uint32_t segment);

}  // namespace vkad::codegen
