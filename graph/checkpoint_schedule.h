// The schedule of a checkpointed tape's backward (api/tape.h, Tape::set_memory_budget): how many
// levels of checkpoints, and how long their segments are, so that the copies fit a memory budget
// with the least recomputation.
//
// A recording of n launches that overwrite state (DiffTaichi's ring of arrays, a grid cleared
// and refilled every step) is reversed from copies. Level 0 cuts the recording into segments of
// S[0] launches and copies, while recording, what each segment writes at its start; backward
// takes the segments last first, puts one back at its start and reverses it. A segment of a
// deeper level i is cut into segments of S[i] launches the same way, the copies taken while
// its launches run again; the last level has S = 1: every launch's written arrays are copied
// before it runs again, so its adjoint finds them as the launch did. Every level below the
// recording runs the forward once more: L levels run every launch L times (recompute = L),
// twice for the classic two levels {K, 1}.
//
// Bytes held at once (a copy per array a segment writes; W bounds what a segment writes, w
// what one launch writes): W (the recording's end state, put back after backward) +
// ceil(n / S[0]) W + sum over 0 < i < L - 1 of ceil(S[i - 1] / S[i]) W + S[L - 2] w.
//
// plan_checkpoints picks, for a budget, the fewest levels whose best cut fits (segments in a
// geometric progression between n and 1, refined around it), then that cut's least bytes. A
// binomial (Revolve) schedule reverses more launches per byte for the same number of forward
// runs where the budget is tight; this one keeps every level uniform, which is what lets a
// capture replay it as a fixed sequence of launches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace vkad::codegen {

struct CheckpointPlan {
  uint32_t launches = 0;           // n: the recording's
  std::vector<uint32_t> segments;  // S: launches per segment per level, outermost first, last 1
  uint64_t state_bytes = 0;        // W
  uint64_t launch_bytes = 0;       // w
  uint64_t peak_bytes = 0;         // the copies held at once, at most (the formula above)
  uint64_t min_bytes = 0;          // the least any plan of up to kMaxLevels levels holds
  uint32_t recompute = 0;          // forward runs of every launch, the recording's included: L
  // "3 levels {64, 8, 1}: 1.2 MB of copies at most, every launch run 3 times (n = 1024)".
  std::string to_string() const;
};

// More levels than this buy no memory: a level of segments of 2 already halves its parent.
inline constexpr uint32_t kMaxCheckpointLevels = 24;

// The bytes a plan with `segments` holds (the formula above); `segments` outermost first and
// ending in 1, each at most its parent.
uint64_t checkpoint_bytes(uint32_t launches, const std::vector<uint32_t>& segments,
                          uint64_t state_bytes, uint64_t launch_bytes);

// The plan for n launches within `budget` bytes (0: no budget, the least memory of two levels).
// `top`, when not 0, is level 0's segment length already fixed (the recording cut it). Fails
// with kInvalidArgument, naming the least bytes any plan needs, when none fits; `what` leads
// the message ("tape.backward").
Result<CheckpointPlan> plan_checkpoints(uint32_t launches, uint64_t state_bytes,
                                        uint64_t launch_bytes, uint64_t budget, uint32_t top,
                                        const std::string& what);

// "1.5 MB", "312 B": bytes for messages.
std::string format_bytes(uint64_t bytes);

}  // namespace vkad::codegen
