// Gather recompute: a launch that gathers from an array an earlier launch wrote element by
// element computes the elements it reads itself, from that launch's inputs, so it no longer
// waits for it (the recompute pass, graph/recompute_pass.cpp, before scheduling; docs/graphs.md,
// "Gather recompute").
//
// Why: on a GPU every dependent launch costs a barrier (2.95 us on an H100) however little it
// does, and a step of a grid-based simulation is scatter -> element-wise grid update -> gather
// (diffmpm's p2g -> grid_op -> g2p, and the reverse in its adjoint): three dependent launches.
// The gather reading grid_op's output at 9 cells per particle can as well compute grid_op at
// those cells from grid_op's inputs, and the barrier between them goes away: grid_op still runs
// (its output may be read later, by the adjoint or the user), beside the gather.
//
// The producer qualifies when its kernel is one parallel task (1-d or N-d) whose body is
// straight-line (no loops, branches, adstack or barrier), every array access of which touches
// only the element its invocation owns (each task index on one axis, every other axis
// launch-uniform), which writes with store or atomic_add only, to arrays it does not read,
// and whose range covers every such axis whole (begin 0, end the extent, equal for all its
// arrays) -- so it is a function from inputs at [row, i, j] to outputs at [row', i, j] that
// any index of the output's extent can evaluate. Outputs written by atomic_add count only where
// the caller knows them zero before the producer (a captured zero fill, no other writer of
// the rows since): the element is then the sum of the producer's adds.
//
// The consumer qualifies when it gathers (some load of a producer output is not at its own
// index: element-wise chains are launch fusion's), writes nothing the producer reads or writes,
// and every load it makes of a producer output matches a write of the producer: its launch-uniform
// axes (the row, a vector's component) evaluate to the written ones. Each such load becomes a copy
// of the producer's body (its writes left out) evaluated at the load's indices; copies at the same
// indices in one scope are shared. Loads out of the output's extent stay out of bounds: the copy's
// loads use the same indices on arrays of the same extents.
//
// Pure: kernels and evaluated launch facts in, a kernel out.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/ir.h"
#include "ir/launch_access.h"

namespace vkad::codegen {

// One launch as recompute needs it.
struct GatherLaunch {
  const Kernel* kernel = nullptr;
  std::vector<uint64_t> arrays;  // per parameter: the array's identity, 0 for a scalar
  // Per parameter and axis: the bound array's extents (empty for a scalar).
  std::vector<std::vector<uint32_t>> extents;
  // The launch-uniform values of the kernel evaluated for this launch
  // (launch_uniform_words).
  UniformWords uniform;
  // The producer's evaluated range per dimension of its task ({[begin, end)} for 1-d).
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

// At most this many ndarray parameters in a rewritten consumer (as many as a fused kernel
// may have: the args buffer and the adstack heaps share the 32 push descriptors).
inline constexpr size_t kMaxRecomputeArrays = 24;

// Whether `k` can be a producer at all (the conditions above that need no launch).
bool recompute_producer(const Kernel& k);

struct Recomputed {
  Kernel kernel;  // the consumer's parameters, then the added ones
  // Per added parameter: the producer's parameter whose argument the launch passes for it.
  std::vector<uint32_t> producer_param;
};

// The consumer rewritten to compute what it loads of the producer's outputs, or nullopt when
// the pair does not qualify (above) or the consumer loads none of them. `zero_outputs`: the
// producer's atomic_add outputs known to hold zeros when it starts (array identities).
std::optional<Recomputed> recompute_gathers(const GatherLaunch& consumer,
                                            const GatherLaunch& producer,
                                            std::span<const uint64_t> zero_outputs);

}  // namespace vkad::codegen
