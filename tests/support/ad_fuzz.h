// The reverse-mode fuzzer's kernel generator: random well-typed kernels built to stress the
// adjoint's replay and checkpointing, with arguments that keep them in bounds and smooth.
//
// A kernel: one parallel task over x's elements (f64), with
//   - several f64 and i32 locals (some declared inside branches and loop bodies) carried
//     across nested serial loops (constant, scalar-argument,
//     triangular, and data-dependent bounds with a stated max_trip) and while loops (a carried
//     counter below a table entry, sometimes also a carried float above a threshold), updated
//     in random orders; inside loop bodies, branches that end in break or continue;
//     plain updates, swaps and rotations (reads after writes inside an iteration), conditional
//     updates, and a linear accumulator;
//   - branches on carried float and integer values and on loop indices;
//   - integer index arithmetic (kept in bounds with mod by a positive extent) into a read-only
//     differentiable ndarray w, into x, and into an i32 table;
//   - every differentiable op, on operands kept inside its smooth domain: every float value has
//     |v| <= 2 by construction (each op is wrapped so it maps that range into itself);
//   - outputs: y[i] = a mix of the locals, and atomic adds into y2 at computed indices.
// Kinks (abs, min, max, floor, ceil, select and branches on floats, float -> int casts) are
// left in: the gradient check skips points where the loss is not smooth at the scale of h.
//
// Deterministic: the same seed gives the same kernel and arguments on every platform
// (std::mt19937 draws only through integer arithmetic here).
#pragma once

#include <cstdint>
#include <string>

#include "ir/ir.h"
#include "support/ad_check.h"

namespace vkad::testing {

struct AdFuzzCase {
  codegen::Kernel kernel;
  HostValues args;
};

AdFuzzCase random_ad_kernel(uint32_t seed);

// VKAD_AD_FUZZ_SEED (first seed) and VKAD_AD_FUZZ_COUNT from the environment, or the fallbacks.
uint32_t env_or(const char* name, uint32_t fallback);

}  // namespace vkad::testing
