// Launching an adjoint whose adstack capacities are counted on the device
// (codegen::make_adjoint_counted): the counting kernel runs first, its per-loop maxima are read
// back, and the adjoint is launched with them as its trailing trips_ arguments, so every
// stack is exactly as deep as the launch needs.
//
// A blocking point: the readback waits for the device to finish everything recorded so far
// (Runtime::download flushes and waits), because the capacities decide the adjoint's row
// layout and heap sizes before it can be recorded. Launches before it are flushed; the adjoint
// itself is recorded as usual (not flushed).
#pragma once

#include <span>

#include "runtime/runtime.h"

namespace vkad::runtime {

using abi::kTripSlots;  // abi/kernel_abi.h

// `counter` and `adjoint`: the registered CountedAdjoint kernels; `counted`: its count (0:
// the adjoint is launched as is). `args`: the adjoint's arguments without the trips_ scalars
// (the forward's arguments, then the gradient arrays); the counting kernel gets the first
// `forward_params` of them and a zeroed i32 array of `counted` x kTripSlots elements, freed
// after use.
// Errors: kInvalidArgument when `counted` plus args.size() exceeds kMaxKernelParams (no adjoint
// takes that many trips_ arguments) or forward_params > args.size(); those of launch / download (a
// device error of the counting kernel, e.g. an out-of-bounds read, is reported by its readback,
// naming it); a count past INT32_MAX cannot occur (trip counts are i32).
Status launch_counted(Runtime& rt, KernelHandle counter, KernelHandle adjoint, uint32_t counted,
                      size_t forward_params, std::span<const Arg> args, LaunchId* id = nullptr);

}  // namespace vkad::runtime
