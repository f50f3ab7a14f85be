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
//   n = max(b - a, 0)
//   if (n <= W) {
//     for j in [a, b) max_trip(W) body(j)                       (the whole tape)
//   } else {
//     full = n / K
//     for s in [0, full) {
//       base = a + s * K
//       for jj in [0, K) max_trip(K) { j = base + jj; body(j) }
//     }
//     for j in [a + full * K, b) max_trip(K - 1) body(j)
//   }
//
// (each copy of the body but the segments' with fresh ids) runs the same iterations in the same
// order with the same index values (so the forward, and every float it computes, is unchanged).
// Past W trips its adjoint keeps one checkpoint per segment on the adstack (the outer loop's)
// and the per-iteration values of only the segment it is reversing (the inner loop's stacks, K
// entries: small enough for the private tier, and with a constant trip count the driver can
// unroll the segment and index them by constants). The price is one more replay of the body
// per iteration (the segment is recomputed from its checkpoint before it is reversed); what it
// buys is K times fewer adstack bytes, which is what bounds a long loop's adjoint on a GPU
// (docs/architecture.md, "Segmented checkpointing").
//
// Up to W trips the loop keeps every iteration's values (W per stack), as without segments:
// W * values per iteration stays within kWholeTapeValues, so the tape fits in registers once
// a launch specializes the trip count and the driver unrolls the loop (the emitter asks it to:
// spirv_emitter.cpp, kUnrollMaxTrips). That saves the replay: on the H200 the sin loop's adjoint
// at 64 steps ran 1.5x faster whole than in four segments. W is at least 2K - 1 (one segment
// and its remainder would only add a replay: 1.6x slower at 16 steps) and at most 4K.
//
// make_adjoint applies it (its segment-loops pass) when AdjointOptions::checkpoint_segment is
// non-zero, to the loops plan_adjoint selects (adjoint_plan.cpp: innermost `for` loops that
// checkpoint something, with derivable i32 bounds, no stated max_trip, room for two more
// nesting levels, and not a constant trip count <= W).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "ir/ir.h"

namespace vkad::codegen {

// The most iterations one segment may hold (AdjointOptions::checkpoint_segment's upper limit):
// the inner loop's stacks hold this many entries per thread.
inline constexpr uint32_t kMaxCheckpointSegment = 4096;

// Values per thread a whole tape may hold (W * the values a loop checkpoints per iteration):
// 64 floats stay in registers on the H200 (its hand-written private tape of 64 steps does).
inline constexpr uint32_t kWholeTapeValues = 64;

// W for a loop that checkpoints `values` locals per iteration, with segments of `segment`:
// kWholeTapeValues / values, clamped to [2 * segment - 1, 4 * segment].
uint32_t whole_tape_trips(uint32_t segment, size_t values);

// `k` with each `for` loop whose result id is a key of `loops` split as above into segments of
// `segment` (>= 2) iterations, with the whole tape up to the mapped W (>= 2 * segment - 1)
// trips. The loops must have i32 bounds and no stated max_trip; ids that name no such loop are
// ignored. In the segments the loop's index id is the value base + jj, so the body is
// unchanged; the other copies of the body have fresh ids (from k.next_id).
Kernel segment_loops(const Kernel& k, const std::unordered_map<ValueId, uint32_t>& loops,
                     uint32_t segment);

}  // namespace vkad::codegen
