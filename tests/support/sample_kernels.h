// Hand-written SPIR-V kernels (text) shared by tests and benchmarks.
#pragma once

namespace vkad::testing {

// out[i] = in[i] * 2 + pc.add for i < pc.n. Bindings 0 (in), 1 (out) of u32; push constants
// {uint n, add, spin} (12 bytes); local size 64.
extern const char* kScaleAddSpirv;
// Like kScaleAddSpirv, but every invocation first runs a loop of pc.spin iterations, so a
// dispatch takes a controllable amount of device time. Same interface.
extern const char* kSpinScaleAddSpirv;

}  // namespace vkad::testing
