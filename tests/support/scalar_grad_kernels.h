// Kernels with differentiable scalar parameters, shared by the unit tests (finite differences
// on the CPU reference) and the GPU tests (the device adjoint against the reference's).
#pragma once

#include "ir/builder.h"

namespace vkad::testing {

// out[i] = a * x[i] + y[i]: d loss / d a = sum_i w[i] x[i] over every thread.
inline codegen::Kernel saxpy_grad_kernel(codegen::DType t = codegen::DType::kF64) {
  using namespace codegen;  // NOLINT
  KernelBuilder kb("saxpy");
  Scalar a = kb.scalar("a", t, /*needs_grad=*/true);
  Array x = kb.ndarray("x", t, 1, {.needs_grad = true, .read_only = true});
  Array y = kb.ndarray("y", t, 1, {.read_only = true});
  Array out = kb.ndarray("out", t, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { out.at(i) = a * x(i) + y(i); });
  return kb.finish();
}

// The scalars inside a loop (read on every iteration, and in an N-d task's neighbour):
// v <- v * s + sin(a * v) for n steps, then out[i, j] = v + a * x[i, j].
inline codegen::Kernel loop_grad_kernel() {
  using namespace codegen;  // NOLINT
  KernelBuilder kb("scalar_loop");
  Scalar n = kb.scalar("n", DType::kI32);
  Scalar a = kb.scalar("a", DType::kF64, true);
  Scalar s = kb.scalar("s", DType::kF64, true);
  Array x = kb.ndarray("x", DType::kF64, 2, {.needs_grad = true, .read_only = true});
  Array out = kb.ndarray("out", DType::kF64, 2, {.needs_grad = true});
  kb.parallel_for("main", {0, x.dim(0)}, {0, x.dim(1)}, [&](Value i, Value j) {
    Local v = kb.local(x(i, j));
    kb.for_range(kb.i32(0), n, [&](Value) { v.store(v * s + sin(a * v)); });
    out.at(i, j) = v + a * x(i, j);
  });
  return kb.finish();
}

}  // namespace vkad::testing
