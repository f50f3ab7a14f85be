// Build a kernel, differentiate it, launch forward and adjoint, read the gradient -- through the
// front door (vkad.h), checking every error.
#include <cstdio>
#include <vector>

#include "vkad.h"

using namespace vkad;
using namespace vkad::codegen;

static int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return 1;
}

int main() {
  auto session = Session::create();  // a GPU if there is one, else lavapipe
  if (!session.ok()) return fail("no session", session.status());
  Session& s = **session;

  // y[i] = x[i]^3 / 3, computed by a loop that carries a mutable local.
  KernelBuilder kb("cube");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local acc = kb.local(kb.f32(1));
    kb.for_range(kb.i32(0), kb.i32(3), [&](Value) { acc.store(acc.load() * x(i)); });
    y.store({i}, acc.load() / 3.0);
  });
  auto cube = s.differentiate(kb.finish());  // forward, adjoint, and which array is whose gradient
  if (!cube.ok()) return fail("differentiate", cube.status());

  const std::vector<float> xs = {1, 2, 3, 4};
  std::vector<float> grad(xs.size());
  auto hx = s.ndarray(DType::kF32, {4}, "x"), hy = s.ndarray(DType::kF32, {4}, "y");
  auto hxg = s.ndarray(DType::kF32, {4}, "x_grad"), hyg = s.ndarray(DType::kF32, {4}, "y_grad");
  for (auto* a : {&hx, &hy, &hxg, &hyg}) {
    if (!a->ok()) return fail("ndarray", a->status());
  }
  const Arg fargs[] = {Arg::ndarray(*hx), Arg::ndarray(*hy)};
  const NdArrayHandle grads[] = {*hxg, *hyg};  // in the order of cube->gradients
  auto aargs = cube->adjoint_args(fargs, grads);
  if (!aargs.ok()) return fail("adjoint_args", aargs.status());
  // Everything below is recorded asynchronously; download() is the one wait.
  Status st;
  if (!(st = s.upload(*hx, std::span<const float>(xs))).ok()) return fail("upload", st);
  if (!(st = s.zero(*hxg)).ok()) return fail("zero", st);
  if (!(st = s.fill(*hyg, 1.0)).ok()) return fail("fill", st);  // seed dL/dy = 1
  if (!(st = s.launch(cube->forward, fargs)).ok()) return fail("forward", st);
  if (!(st = s.launch(cube->adjoint, *aargs)).ok()) return fail("adjoint", st);
  if (!(st = s.download(*hxg, std::span<float>(grad))).ok()) return fail("download", st);
  for (size_t i = 0; i < xs.size(); ++i) std::printf("x=%g  dL/dx=%g\n", xs[i], grad[i]);
  return grad[3] == 16.0f ? 0 : 1;  // dL/dx = x^2
}
