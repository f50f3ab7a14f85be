// N-d parallel tasks on a device against the CPU reference (validation on): 2-d and 3-d
// boxes with odd extents (every point once, hits counted atomically), the 3-d kernel against
// its flattened twin, a stencil's adjoint (an N-d task itself), and a launch whose bounds
// evaluate out of range.
#include <gtest/gtest.h>

#include "autodiff/reverse_mode.h"
#include "gpu/kernel_harness.h"
#include "ir/text.h"
#include "support/ad_check.h"
#include "support/nd_kernels.h"

namespace vkad::testing {
namespace {

using namespace codegen;  // NOLINT

using NdRangeDevice = KernelTest;

void expect_device_matches(KernelRunner& runner, const Kernel& k, HostArgs dev,
                           std::vector<size_t> outputs) {
  HostArgs cpu = dev;
  auto view = cpu.view();
  auto ref = evaluate(k, view);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  Status st = runner.run(k, dev);
  ASSERT_TRUE(st.ok()) << st.to_string() << "\n" << print(k);
  for (size_t p : outputs)
    EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p]), "") << k.params[p].name;
}

TEST_F(NdRangeDevice, TwoDimensions) {
  Kernel k = nd2_kernel();
  for (uint32_t cols : {5u, 67u}) {
    expect_device_matches(
        *runner_, k,
        make_args(k,
                  {ArgSpec::of(6), ArgSpec::array({7, cols}), ArgSpec::array({7, cols}, 0, 0),
                   ArgSpec::array({7, cols}, 0, 0)},
                  cols),
        {2, 3});
  }
}

TEST_F(NdRangeDevice, ThreeDimensionsAndTheFlattenedTwin) {
  for (bool flat : {false, true}) {
    Kernel k = nd3_kernel(flat);
    expect_device_matches(
        *runner_, k, make_args(k, {ArgSpec::array({3, 5, 7}), ArgSpec::array({3, 5, 7}, 0, 0)}, 2),
        {1});
    // More points than one dispatch's threads cover at once: the grid-stride loop.
    expect_device_matches(
        *runner_, k,
        make_args(k, {ArgSpec::array({9, 61, 83}), ArgSpec::array({9, 61, 83}, 0, 0)}, 3), {1});
  }
}

TEST_F(NdRangeDevice, StencilAdjointMatchesTheReference) {
  Kernel k = stencil_kernel();
  auto adj = make_adjoint(k, runner_->target());
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  HostArgs fwd = make_args(
      k, {ArgSpec::array({13, 17}), ArgSpec::array({13, 17}), ArgSpec::array({13, 17}, 0, 0)}, 9);
  HostValues base;
  base.arrays = fwd.arrays;
  base.scalars = fwd.scalars;
  HostValues a = adjoint_args(k, base, random_seeds(k, base, 4));
  HostArgs dev;
  dev.arrays = a.arrays;
  dev.scalars = a.scalars;
  HostArgs cpu = dev;
  auto view = cpu.view();
  ASSERT_TRUE(evaluate(*adj, view).ok());
  ASSERT_TRUE(runner_->run(*adj, dev).ok());
  for (size_t p = 3; p < 5; ++p) {  // u_grad, c_grad
    EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p], 1e-12), "") << adj->params[p].name;
  }
}

TEST_F(NdRangeDevice, OutOfRangeBoundsFailTheLaunch) {
  auto k = parse(R"(kernel neg(n: i32, x: ndarray<f32, 2>) {
  task t parallel %i in [0, n), %j in [add(n, -5), n) {
    %f = const 1.0 : f32
    store x[%i, %j], %f
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  HostArgs a = make_args(*k, {ArgSpec::of(3), ArgSpec::array({4, 4}, 0, 0)}, 1);
  Status st = runner_->run(*k, a);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("task 't': dimension 1's range [-2, 3) is out of bounds"),
            std::string::npos)
      << st.to_string();
}

}  // namespace
}  // namespace vkad::testing
