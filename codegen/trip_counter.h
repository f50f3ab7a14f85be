// The trip-counting kernel of make_adjoint_counted (reverse_mode.h): what sizes the adstacks of
// loops that have no derivable or stated trip bound.
#pragma once

#include <vector>

#include "codegen/ir.h"

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

// The slot_run make_adjoint_counted uses on targets with subgroup arithmetic: at least the
// largest subgroup size Vulkan allows (128), so that an aligned subgroup's indices share a word.
inline constexpr uint32_t kTripSlotRun = 128;

}  // namespace vkad::codegen
