// Gradients with respect to scalar parameters: the adjoint's 1-element `<name>_grad`, reduced
// over every iteration of the launch, against finite differences on the CPU reference.
#include <gtest/gtest.h>

#include <cmath>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "support/ad_check.h"
#include "support/scalar_grad_kernels.h"

namespace vkad::testing {
namespace {

using namespace codegen;  // NOLINT

HostArray ramp(DType t, std::vector<uint32_t> shape, double a, double b) {
  HostArray h(t, std::move(shape));
  for (size_t e = 0; e < h.size(); ++e)
    h.data[e] = round_to(t, std::sin(a * static_cast<double>(e) + b));
  return h;
}

TEST(ScalarGrad, AdjointHasAOneElementGradient) {
  Kernel k = saxpy_grad_kernel();
  ASSERT_TRUE(verify(k).ok()) << verify(k).to_string();
  auto adj = make_adjoint(k);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  int g = adj->find_param("a_grad");
  ASSERT_GE(g, 0);
  EXPECT_EQ(adj->params[g].kind, ParamKind::kNdArray);
  EXPECT_EQ(adj->params[g].rank, 1u);
  EXPECT_EQ(adj->params[g].dtype, DType::kF64);
  // One atomic add per iteration, not one per use.
  std::string text = print(*adj);
  size_t first = text.find("atomic_add a_grad");
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find("atomic_add a_grad", first + 1), std::string::npos) << text;
  // The text form carries the flag.
  auto back = parse(print(k));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->params[0].needs_grad);
  EXPECT_NE(print(k).find("(a: f64 grad, "), std::string::npos) << print(k);
}

TEST(ScalarGrad, SaxpyMatchesFiniteDifferences) {
  Kernel k = saxpy_grad_kernel();
  HostValues v;
  v.scalars = {0.75, 0, 0, 0};
  v.arrays = {HostArray{}, ramp(DType::kF64, {37}, 0.9, 0.1), ramp(DType::kF64, {37}, 1.3, 0.4),
              HostArray(DType::kF64, {37})};
  auto r = check_gradients_cpu(k, v, 5);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->failure, "");
  EXPECT_EQ(r->checked, 38);  // 37 elements of x and a
}

TEST(ScalarGrad, ScalarsInsideALoopMatchFiniteDifferences) {
  Kernel k = loop_grad_kernel();
  ASSERT_TRUE(verify(k).ok()) << verify(k).to_string();
  HostValues v;
  v.scalars = {5, 0.6, 0.8, 0, 0};
  v.arrays = {HostArray{}, HostArray{}, HostArray{}, ramp(DType::kF64, {3, 4}, 0.7, 0.2),
              HostArray(DType::kF64, {3, 4})};
  auto r = check_gradients_cpu(k, v, 6);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->failure, "");
  EXPECT_EQ(r->checked, 14);  // 12 elements of x, a and s
}

TEST(ScalarGrad, OnlyFloatScalarsHaveGradients) {
  auto k = parse(R"(kernel k(n: i32 grad, y: ndarray<f32, 1>) {
  task t parallel %i in [0, n) {
    %f = const 1.0 : f32
    store y[%i], %f
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  Status st = verify(*k);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(
                "parameter 'n' is marked grad, but only float ndarrays and scalars have gradients"),
            std::string::npos)
      << st.to_string();
}

}  // namespace
}  // namespace vkad::testing
