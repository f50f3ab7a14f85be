// The launch-sequence passes (graph/program.h's contract), in the order a pipeline runs them:
//   rename              arrays filled whole again and again get a ring of buffers, one per
//                       lifetime in turn, and their fills become launches (rename_pass.cpp)
//   roll{max-range=N}   step loops of small launches (ranges of at most N) into resident kernels
//                       (graph/resident.h)
//   block{shared=B, min-tiles=T}
//                       runs of a stencil kernel's launches into blocked kernels, K steps a
//                       dispatch with the halo recomputed (graph/stencil_blocking.h)
//   recompute           a launch that gathers an earlier launch's element-wise output computes
//                       it itself (graph/gather_recompute.h)
//   prune               launches whose every write is overwritten whole before anything reads
//                       it are left out (rename_pass.cpp)
//   slice               a whole-array copy before a 1-d launch that touches the copy one slice
//                       per invocation copies over that launch's task (slice_pass.cpp)
//   hoist               a fill step moves up to the fills before it where nothing between
//                       touches its array (hoist_pass.cpp)
//   schedule            launches reordered by level; barriers only where an array is shared
//                       (graph/graph_schedule.h)
//   fuse                runs of element-wise launches of one range into one kernel
//                       (graph/launch_fusion.h)
// GraphPassRegistry::standard() makes them by name.
#pragma once

#include <memory>

#include "graph/program.h"

namespace vkad {

std::unique_ptr<GraphPass> make_rename_pass();
std::unique_ptr<GraphPass> make_roll_pass(uint32_t max_range);
std::unique_ptr<GraphPass> make_block_pass(uint32_t shared_bytes, uint32_t min_tiles);
std::unique_ptr<GraphPass> make_recompute_pass();
std::unique_ptr<GraphPass> make_prune_pass();
std::unique_ptr<GraphPass> make_slice_pass();
std::unique_ptr<GraphPass> make_hoist_pass();
std::unique_ptr<GraphPass> make_schedule_pass();
std::unique_ptr<GraphPass> make_fuse_pass(uint32_t side = 1);

// The pipeline's limits the session reads back (GraphSwitches): the roll pass's largest range,
// 0 where the pipeline has no roll pass.
uint32_t roll_max_range(const GraphPipeline& pipeline);

}  // namespace vkad
