// Launching an adjoint whose adstack capacities are counted on the device
// (codegen::make_adjoint_counted), two ways:
//
//  - launch_counted: the separate counting kernel (CountedAdjoint::counter) runs first, on the
//    arrays as they are now (after the forward, as the adjoint's replay sees them), its per-loop
//    maxima are read back, and the adjoint is launched with them as its trailing trips_
//    arguments. For a caller who ran the forward long ago, or not through vkad. The counter
//    re-runs the forward's loads and loops: about what the adjoint costs (docs/benchmarks-log.md).
//  - launch_forward_counted, then launch_counted_adjoint: the counts are recorded inside the
//    forward launch the caller runs anyway (CountedAdjoint::counting_forward in place of the
//    forward), into a trips array that the pair hands over; the adjoint then only reads them.
//    Costs a few instructions per loop and one atomic per thread (or subgroup) in the forward.
//
// Either way every stack is exactly as deep as the launch needs, and the maxima are read back
// at a blocking point: the readback waits for the device to finish everything recorded so far
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

// Launches the counting forward: makes an i32 array of `counted` x kTripSlots elements named
// "trips", zeroes it (one upload, ordered before the launch) and launches
// `counting_forward` (the registered CountedAdjoint::counting_forward) with `forward_args` (the
// forward's arguments) and that array. Asynchronous like launch: nothing waits. It writes what
// the forward writes, so it replaces the caller's forward launch. On success `*trips` receives
// the array, which the caller owns until launch_counted_adjoint takes it (or frees it with
// free_ndarray when it drops the adjoint); `id` receives the forward's LaunchId.
// `counted` == 0 (CountedAdjoint::counting_forward is empty then): `counting_forward` is the
// caller's plain forward, launched with `forward_args` as is, and `*trips` is set to the null
// handle {}, which launch_counted_adjoint takes with `counted` == 0.
// Errors: kInvalidArgument for a null `trips`, or `counted` plus forward_args.size() past
// kMaxKernelParams (no adjoint takes that many trips_ arguments); kFailedPrecondition while a
// graph capture is open (the per-call trips array cannot be captured; the upload refuses it);
// those of create_ndarray, upload and launch (a dead or foreign kernel handle, arguments that do
// not match the kernel: for example the forward's kernel given in place of its counting forward,
// one parameter short). On every error nothing is launched, the array is freed and `*trips` is
// unchanged.
Status launch_forward_counted(Runtime& rt, KernelHandle counting_forward, uint32_t counted,
                              std::span<const Arg> forward_args, NdArrayHandle* trips,
                              LaunchId* id = nullptr);

// Reads the counts that a launch_forward_counted recorded into `trips` (the blocking point
// above: it waits for that forward and everything recorded before this call), frees `trips`,
// and launches `adjoint` (the registered CountedAdjoint::adjoint) with `args` (its arguments
// without the trips_ scalars: the forward's, then the gradient arrays) and one trips_ scalar
// per counted loop, the largest trip count over the array's words for that loop.
// The counts are those of the arrays as the forward read them. The adjoint replays the forward
// on the arrays as they are at its launch: if a launch in between changed what a counted loop's
// bounds or test read, its trips may differ from those counted; more than counted is reported
// as an adstack overflow at the next readback / synchronize (never a wrong gradient in
// silence). launch_counted counts on the arrays as they are, for that case.
// `counted` == 0 with the null `trips` {}: the adjoint is launched as is.
// `trips` is freed on every path, error or not, wherever it is an array of `rt`.
// Errors: kInvalidArgument when `counted` plus args.size() exceeds kMaxKernelParams, or when
// `trips` is not an i32 array of `counted` x kTripSlots elements (the message says for how many
// counted loops it was made: the wrong `counted`, or another array); kNotFound /
// kInvalidArgument for a freed, made-up or other runtime's `trips` (dead_handle's message); those
// of download (a device error of the forward, e.g. an out-of-bounds read, is reported by this
// readback, naming it; the adjoint is not launched) and of launch (arguments that do not match
// the adjoint, a dead or foreign kernel handle).
Status launch_counted_adjoint(Runtime& rt, KernelHandle adjoint, uint32_t counted,
                              NdArrayHandle trips, std::span<const Arg> args,
                              LaunchId* id = nullptr);

}  // namespace vkad::runtime
