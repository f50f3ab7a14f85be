// N-d task kernels shared by the unit tests (CPU reference) and the GPU tests (device against
// the reference): each with its flattened 1-d twin where one exists.
#pragma once

#include "ir/builder.h"

namespace vkad::testing {

// out[i, j] = 1000 * i + j + x[i, j] over i in [1, n), j in [0, shape(x, 1) - 1), and a
// per-point count in hits[i, j] (atomic), so a point visited twice or never shows.
inline codegen::Kernel nd2_kernel() {
  using namespace codegen;  // NOLINT
  KernelBuilder kb("nd2");
  Scalar n = kb.scalar("n", DType::kI32);
  Array x = kb.ndarray("x", DType::kF32, 2, {.read_only = true});
  Array out = kb.ndarray("out", DType::kF32, 2);
  Array hits = kb.ndarray("hits", DType::kI32, 2);
  kb.parallel_for("main", {1, n}, {0, Bound(x.dim(1)) - 1}, [&](Value i, Value j) {
    out.at(i, j) = cast(i * 1000 + j, DType::kF32) + x(i, j);
    hits.atomic_add({i, j}, kb.i32(1));
  });
  return kb.finish();
}

// y[i, j, k] = x[i, j, k] * (i - j) + k over the full box of x, in 3-d (`flat` false) or as
// one range of shape0 * shape1 * shape2 delinearized with floordiv / mod (the long way).
inline codegen::Kernel nd3_kernel(bool flat) {
  using namespace codegen;  // NOLINT
  KernelBuilder kb(flat ? "nd3_flat" : "nd3");
  Array x = kb.ndarray("x", DType::kF32, 3, {.read_only = true});
  Array y = kb.ndarray("y", DType::kF32, 3);
  auto body = [&](Value i, Value j, Value k) {
    y.at(i, j, k) = x(i, j, k) * cast(i - j, DType::kF32) + cast(k, DType::kF32);
  };
  if (flat) {
    kb.parallel_for("main", 0, Bound(x.dim(0)) * x.dim(1) * x.dim(2), [&](Value t) {
      Value d1 = x.dim(1), d2 = x.dim(2);
      body(floordiv(t, d1 * d2), mod(floordiv(t, d2), d1), mod(t, d2));
    });
  } else {
    kb.parallel_for("main", {0, x.dim(0)}, {0, x.dim(1)}, {0, x.dim(2)}, body);
  }
  return kb.finish();
}

// A 5-point stencil over the interior of u: out[i, j] = sin(u[i, j]) * (sum of the four
// neighbours) + c[i, j]^2, differentiable in u and c.
inline codegen::Kernel stencil_kernel() {
  using namespace codegen;  // NOLINT
  KernelBuilder kb("stencil");
  Array u = kb.ndarray("u", DType::kF64, 2, {.needs_grad = true, .read_only = true});
  Array c = kb.ndarray("c", DType::kF64, 2, {.needs_grad = true, .read_only = true});
  Array out = kb.ndarray("out", DType::kF64, 2, {.needs_grad = true});
  kb.parallel_for("main", {1, Bound(u.dim(0)) - 1}, {1, Bound(u.dim(1)) - 1},
                  [&](Value i, Value j) {
                    Value nb = u(i - 1, j) + u(i + 1, j) + u(i, j - 1) + u(i, j + 1);
                    Value cv = c(i, j);
                    out.at(i, j) = sin(u(i, j)) * nb + cv * cv;
                  });
  return kb.finish();
}

}  // namespace vkad::testing
