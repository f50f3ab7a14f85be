// The trip-counting kernel of make_adjoint_counted (reverse_mode.h): what sizes the adstacks of
// loops that have no derivable or stated trip bound.
#pragma once

#include <vector>

#include "ir/ir.h"

namespace vkad::codegen {

// A kernel with `forward`'s parameters (no gradients) and then `trips` (ndarray<i32, 1>,
// kTripSlots (abi/kernel_abi.h) elements per entry of `loops`, zeroed by the caller;
// loop j's count is the max of elements [j * kTripSlots, (j + 1) * kTripSlots). `loops`: result ids
// of for / while loops of `forward` (verified, without break / continue: lower_jumps first). Each
// task of `forward` holding one of them is kept, run with the forward's control flow and without
// its ndarray writes (stores and atomic adds: as the adjoint's replay runs it, on the arrays the
// forward left), and keeps per thread the largest trip count of each such loop over its instances
// (`end - begin` before a for loop, `i + 1` in a while loop's body), which it atomic_max-es
// into trips[j * kTripSlots + (task index / slot_run) mod kTripSlots] at the end (spread so
// that a large launch's threads do not all contend for one word). `slot_run` > 1 (e.g.
// kTripSlotRun, for targets with subgroup arithmetic) gives runs of that many consecutive
// indices one word, so that the emitter can combine a subgroup's atomic_max into one
// (spirv_emitter.cpp, atomic_max); 1 spreads neighbours over different words, the better
// choice where every thread issues its own atomic. Other tasks are dropped. New ids come from
// forward.next_id.
Kernel trip_counter_kernel(const Kernel& forward, const std::vector<ValueId>& loops,
                           uint32_t slot_run = 1);

// The counting forward: `forward` itself (every task, every statement, its ndarray writes and
// gradient flags) with `trips` appended as for trip_counter_kernel, and each task that holds one
// of `loops` recording their trip counts the same way: the same locals raised at the same points,
// atomic_max-ed at the end of the task's body into the same slots (same `slot_run`). So it
// writes bit for bit what `forward` writes, and counts the loops on the arrays as `forward`
// reads them, where trip_counter_kernel, run after `forward`, counts them on the arrays as
// `forward` left them. The two leave the same words in `trips` when the forward's writes do not
// change what a counted loop's bounds or test read; reverse mode's rules on arrays both read and
// written (reverse_mode.h) hold that for every value the adjoint's replay needs. Recording the
// counts inside the forward launch a user runs anyway costs a few instructions per loop and one
// atomic per counted loop and thread (or subgroup), where the separate counter re-runs every
// load and loop of the forward (issue 27). Name: forward.name + "_counting". New ids come from
// forward.next_id.
Kernel counting_forward_kernel(const Kernel& forward, const std::vector<ValueId>& loops,
                               uint32_t slot_run = 1);

// The slot_run make_adjoint_counted uses on targets with subgroup arithmetic: at least the
// largest subgroup size Vulkan allows (128), so that an aligned subgroup's indices share a word.
inline constexpr uint32_t kTripSlotRun = 128;

}  // namespace vkad::codegen
