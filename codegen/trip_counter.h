// The trip-counting kernel of make_adjoint_counted (reverse_mode.h): what sizes the adstacks of
// loops that have no derivable or stated trip bound.
#pragma once

#include <vector>

#include "codegen/ir.h"

namespace vkad::codegen {

// A kernel with `forward`'s parameters (no gradients) and then `trips` (ndarray<i32, 1>,
// kTripSlots (abi/kernel_abi.h) elements per entry of `loops`, zeroed by the caller;
// loop j's count is the max of elements [j * kTripSlots, (j + 1) * kTripSlots). `loops`: result ids of for / while loops
// of `forward` (verified, without break / continue: lower_jumps first). Each task of `forward`
// holding one of them is kept, run with the forward's control flow and without its ndarray
// writes (stores and atomic adds: as the adjoint's replay runs it, on the arrays the forward
// left), and keeps per thread the largest trip count of each such loop over its instances
// (`end - begin` before a for loop, `i + 1` in a while loop's body), which it atomic_max-es
// into trips[j * kTripSlots + task index mod kTripSlots] at the end (spread so that a large
// launch's threads do not all contend for one word). Other tasks are dropped. New ids come from forward.next_id.
Kernel trip_counter_kernel(const Kernel& forward, const std::vector<ValueId>& loops);

}  // namespace vkad::codegen
