// The registry of the compiler's passes by name (ir/pass.h), so a pipeline can be written as
// text: tests/kernels/*.vkir name the one they run in their RUN line
// (`// RUN: verify, lower-jumps, adjoint`), as SPIRV-Tools' and MLIR's tests do.
//
// Registered (docs/architecture.md, "Passes", has what each does):
//   verify, text-roundtrip                       (ir/)
//   lower-jumps, forward-stores, segment-loops{segment=K}, reverse-mode, clearing-reverse-mode,
//   adjoint{segment=K}, clearing-adjoint{segment=K}, jvp    (autodiff/)
// `segment` is AdjointOptions::checkpoint_segment (0, the default: off).
#pragma once

#include "ir/pass.h"

namespace vkad::codegen {

// The registry above; built once, read-only afterwards (thread-safe).
const PassRegistry& compiler_passes();

}  // namespace vkad::codegen
