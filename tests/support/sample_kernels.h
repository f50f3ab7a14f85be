// Hand-written SPIR-V kernels (text) shared by tests and benchmarks.
#pragma once

namespace vkad::testing {

// out[i] = in[i] * 2 + pc.add for i < pc.n. Bindings 0 (in), 1 (out) of u32; push constants
// {uint n, add, spin} (12 bytes); local size 64.
extern const char* kScaleAddSpirv;
// Like kScaleAddSpirv, but every invocation first runs a loop of pc.spin iterations, so a
// dispatch takes a controllable amount of device time. Same interface.
extern const char* kSpinScaleAddSpirv;
// The raw copy kernel the codegen benchmark compares generated code with, in the kernel ABI of
// abi/kernel_abi.h: y[i] = x[i] over u32 ndarrays x (binding 1) and y (binding 2),
// grid-stride, local size 128, no bounds checks.
extern const char* kCopyU32Spirv;

}  // namespace vkad::testing

#include <string>

#include "abi/kernel_abi.h"

namespace vkad::testing {

// A kernel following the runtime ABI (abi/kernel_abi.h):
//   params (a: f32, x: f32[n], y: f32[n] written); one task over [0, shape(x, 0)):
//   y[i] = a * x[i] OP y[i], where OP is "OpFAdd" or "OpFSub"; grid-stride loop.
//   If x[i] < 0 the task raises its error flag (error code 7).
runtime::CompiledKernel make_axpy_kernel(const std::string& name, const char* op = "OpFAdd");

// The bandwidth reference: kCopyU32Spirv with 16-byte (uvec4) accesses, as a kernel with params
// (n4: u32, x: u32[n], y: u32[n] written), one task over [0, n4); copies the first 4 * n4 elements
// of x to y.
runtime::CompiledKernel make_copy_u32x4_kernel();

}  // namespace vkad::testing
