// Gradients with respect to scalar parameters on a device (validation on): the adjoint's
// per-iteration contributions, reduced with atomic adds across every thread of the launch,
// against the CPU reference's adjoint and, for saxpy, the closed form sum_i w[i] x[i].
#include <gtest/gtest.h>

#include "autodiff/reverse_mode.h"
#include "gpu/kernel_harness.h"
#include "support/ad_check.h"
#include "support/scalar_grad_kernels.h"

namespace vkad::testing {
namespace {

using namespace codegen;  // NOLINT

using ScalarGradDevice = KernelTest;

// Runs k's adjoint on the device and on the reference; returns the device's arguments.
HostArgs run_adjoint(KernelRunner& runner, const Kernel& k, const HostArgs& fwd, double tol) {
  auto adj = make_adjoint(k, runner.target());
  EXPECT_TRUE(adj.ok()) << adj.status().to_string();
  if (!adj.ok()) return {};
  HostValues base;
  base.arrays = fwd.arrays;
  base.scalars = fwd.scalars;
  HostValues a = adjoint_args(k, base, random_seeds(k, base, 3));
  HostArgs dev;
  dev.arrays = a.arrays;
  dev.scalars = a.scalars;
  HostArgs cpu = dev;
  auto view = cpu.view();
  EXPECT_TRUE(evaluate(*adj, view).ok());
  Status st = runner.run(*adj, dev);
  EXPECT_TRUE(st.ok()) << st.to_string();
  for (size_t p = k.params.size(); p < adj->params.size(); ++p) {
    EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p], tol), "") << adj->params[p].name;
  }
  return dev;
}

TEST_F(ScalarGradDevice, SaxpyReducesAcrossThreads) {
  for (DType t : {DType::kF32, DType::kF64}) {
    Kernel k = saxpy_grad_kernel(t);
    const uint32_t n = 5000;  // many workgroups adding into one element
    HostArgs fwd = make_args(
        k, {ArgSpec::of(0.5), ArgSpec::array({n}), ArgSpec::array({n}), ArgSpec::array({n}, 0, 0)},
        8);
    HostArgs dev = run_adjoint(*runner_, k, fwd, t == DType::kF32 ? 1e-4 : 1e-10);
    if (HasFailure()) return;
    // Closed form: d (w . out) / d a = sum_i w[i] x[i]; w is out_grad (index 6: a, x, y, out,
    // a_grad, x_grad, out_grad), x index 1.
    double want = 0;
    for (uint32_t i = 0; i < n; ++i) want += dev.arrays[6].data[i] * fwd.arrays[1].data[i];
    EXPECT_NEAR(dev.arrays[4].data[0], want,
                (t == DType::kF32 ? 1e-4 : 1e-10) * std::max(1.0, std::fabs(want)));
  }
}

TEST_F(ScalarGradDevice, ScalarsInsideALoop) {
  Kernel k = loop_grad_kernel();
  HostArgs fwd = make_args(k,
                           {ArgSpec::of(4), ArgSpec::of(0.6), ArgSpec::of(0.8),
                            ArgSpec::array({19, 23}), ArgSpec::array({19, 23}, 0, 0)},
                           2);
  run_adjoint(*runner_, k, fwd, 1e-10);
}

}  // namespace
}  // namespace vkad::testing
