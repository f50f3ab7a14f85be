// Forward mode (JVP) on a device (validation on): the tangent kernel of a loop-carried N-d
// kernel with differentiable scalars, and of a stencil, against the CPU reference.
#include "autodiff/forward_mode.h"

#include <gtest/gtest.h>

#include "gpu/kernel_harness.h"
#include "support/nd_kernels.h"
#include "support/scalar_grad_kernels.h"

namespace vkad::testing {
namespace {

using namespace codegen;  // NOLINT

using ForwardModeDevice = KernelTest;

void expect_jvp_matches(KernelRunner& runner, const Kernel& k, const std::vector<ArgSpec>& specs) {
  auto jvp = make_jvp(k, runner.target());
  ASSERT_TRUE(jvp.ok()) << jvp.status().to_string();
  HostArgs dev = make_args(*jvp, specs, 4), cpu = dev;
  auto view = cpu.view();
  ASSERT_TRUE(evaluate(*jvp, view).ok());
  Status st = runner.run(*jvp, dev);
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (size_t p = 0; p < jvp->params.size(); ++p) {
    if (jvp->params[p].kind != ParamKind::kNdArray) continue;
    EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p], 1e-10), "") << jvp->params[p].name;
  }
}

TEST_F(ForwardModeDevice, LoopWithScalars) {
  // n, a, s, x, out, then a_dot, s_dot, x_dot, out_dot.
  expect_jvp_matches(*runner_, loop_grad_kernel(),
                     {ArgSpec::of(4), ArgSpec::of(0.6), ArgSpec::of(0.8), ArgSpec::array({19, 23}),
                      ArgSpec::array({19, 23}, 0, 0), ArgSpec::of(0.3), ArgSpec::of(-0.7),
                      ArgSpec::array({19, 23}), ArgSpec::array({19, 23}, 0, 0)});
}

TEST_F(ForwardModeDevice, Stencil) {
  expect_jvp_matches(
      *runner_, stencil_kernel(),
      {ArgSpec::array({13, 17}), ArgSpec::array({13, 17}), ArgSpec::array({13, 17}, 0, 0),
       ArgSpec::array({13, 17}), ArgSpec::array({13, 17}), ArgSpec::array({13, 17}, 0, 0)});
}

}  // namespace
}  // namespace vkad::testing
