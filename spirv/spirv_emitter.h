// The SPIR-V emitter: one GLCompute module per task of a verified kernel, following the kernel
// ABI in abi/kernel_abi.h (args buffer at binding 0, ndarrays at 1.., adstack heaps
// after them, push constants {begin, end}, a grid-stride loop over the range).
//
// Lowering decisions worth knowing:
//   - ndarray accesses are bounds-checked (unsigned compare per index); an out-of-bounds
//     access reads 0 / writes nothing and sets the task's error word to kErrorOutOfBounds;
//   - float atomic add uses OpAtomicFAddEXT where `native_float_atomics` and the target allow,
//     otherwise a compare-and-swap loop on the element's bits (the ndarray is then declared as
//     an array of u32 / u64 in that module);
//   - f32 sin/cos/tan reduce their argument by 2*pi first (Vulkan bounds them only inside
//     [-pi, pi]); f64 transcendentals are computed in f64 from basic f64 operations
//     (f64_math.h: GLSL.std.450 defines them for 16/32-bit only);
//   - every operation is defined for every input (docs/reference.md, "Operation semantics").
//   - adstack slots are addressed in the target's adstack layout (thread-major rows or
//     slot-major `(offset + k) * T + t`, adstack/adstack_layout.h), from per-stack bases
//     computed once per invocation.
// Internal to spirv/; compile() (compiler.h) is the entry point.
#pragma once

#include <cstdint>
#include <vector>

#include "abi/kernel_abi.h"
#include "ir/ir.h"
#include "ir/target.h"

namespace vkad::codegen {

// A `for` loop in a task with adstacks whose max_trip is a constant up to this is emitted with
// the Unroll loop control: once a launch specializes its trip count (launch_spec.h) the driver
// unrolls it, and its stacks are then indexed by constants (registers, not local memory).
// NVIDIA's driver did not unroll the sin loop's 64-step adjoint on its own: unrolled it ran 1.4x
// faster on the H200 (docs/benchmarks-log.md). Segmented checkpointing's loops (checkpoint.h: the
// whole tape, each segment, the rest after the segments) are such loops.
inline constexpr int64_t kUnrollMaxTrips = 64;

struct EmitOptions {
  bool native_float_atomics = true;
  bool bounds_checks = true;
  uint32_t local_size = 64;
  // Elements per main-loop iteration of a parallel task whose body allows it (straight-line,
  // written arrays accessed only at the task index; see the emitter): more loads in flight per
  // thread. 1 turns it off.
  uint32_t unroll = 4;
  // Each float value stored or atomically added into an ndarray is checked: a NaN or an
  // infinity raises kErrorNonFinite with its site (finite_check_sites' index) and is still
  // stored. Off: nothing emitted.
  bool check_finite = false;
  bool read_only_buffers = false;  // CompileOptions::read_only_buffers
};

// The statements the finite checks cover in task `task` (float stores and atomic adds into
// ndarrays), in a pre-order walk of its body: the site numbers kErrorNonFinite carries.
std::vector<const Stmt*> finite_check_sites(const Kernel& k, size_t task);
// The ndarray accesses (loads, stores, atomics) of task `task` in the same walk: the site
// numbers an out-of-bounds error word carries (EmitOptions::bounds_checks).
std::vector<const Stmt*> access_sites(const Kernel& k, size_t task);
// The print and assert statements of task `task` in the same walk: their records' site numbers
// (CompiledTask::print_sites).
std::vector<const Stmt*> print_sites(const Kernel& k, size_t task);

// `layout` supplies the args-buffer offsets (its params must already be filled in).
std::vector<uint32_t> emit_task(const Kernel& k, size_t task, const abi::CompiledKernel& layout,
                                const Target& target, const EmitOptions& options);

}  // namespace vkad::codegen
