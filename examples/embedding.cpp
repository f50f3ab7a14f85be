// Build a kernel, get its adjoint, launch both, read the gradient.
#include <cstdio>
#include <vector>

#include "vkad.h"

using namespace vkad;
using namespace vkad::codegen;

int main() {
  auto rt = runtime::Runtime::create().value();  // a GPU if there is one, else lavapipe
  // y[i] = x[i]^3 / 3, computed by a loop that carries a mutable local.
  KernelBuilder kb("cube");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local acc = kb.local(kb.f32(1));
    kb.for_range(kb.i32(0), kb.i32(3), [&](Value) { acc.store(acc.load() * x(i)); });
    y.store({i}, acc.load() / 3.0);
  });
  Kernel forward = kb.finish();
  Target target = target_from_caps(rt->caps());
  Kernel adjoint = make_adjoint(forward, target).value();  // params: x, y, x_grad, y_grad
  auto fwd = rt->register_kernel(compile(forward, target).value()).value();
  auto adj = rt->register_kernel(compile(adjoint, target).value()).value();

  std::vector<float> xs = {1, 2, 3, 4}, ones(4, 1.0f), zeros(4, 0.0f), grad(4);
  auto make = [&](const std::vector<float>& v) {
    auto a = rt->create_ndarray(runtime::DType::kF32, {4}).value();
    (void)rt->upload(a, v.data(), 4 * v.size());
    return a;
  };
  auto hx = make(xs), hy = make(zeros), hxg = make(zeros), hyg = make(ones);  // seed dL/dy = 1
  using runtime::Arg;
  Arg fargs[] = {Arg::ndarray(hx), Arg::ndarray(hy)};
  Arg aargs[] = {Arg::ndarray(hx), Arg::ndarray(hy), Arg::ndarray(hxg), Arg::ndarray(hyg)};
  (void)rt->launch(fwd, fargs);  // asynchronous: nothing waits until the readback
  (void)rt->launch(adj, aargs);
  Status s = rt->download(hxg, grad.data(), 4 * grad.size());  // dL/dx = x^2
  for (int i = 0; i < 4; ++i) std::printf("x=%g  dL/dx=%g\n", xs[i], grad[i]);
  return s.ok() && grad[3] == 16.0f ? 0 : 1;
}
