// Reverse mode against finite differences on the CPU evaluator (no device): named regression
// kernels whose gradients were once wrong without an error. tests/gpu/reverse_mode_test.cpp runs
// the same kernels on the device.
#include <gtest/gtest.h>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "support/ad_check.h"
#include "support/ad_regressions.h"

namespace vkad::testing {
namespace {

using codegen::HostArray;
using codegen::Kernel;

// Parses, verifies and gradient-checks `text` with `base` arguments; every element checked.
void expect_gradients_match(const std::string& text, const HostValues& base, int min_checked) {
  auto k = codegen::parse(text);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(codegen::verify(*k).ok()) << codegen::verify(*k).to_string();
  auto r = check_gradients_cpu(*k, base, 7);
  ASSERT_TRUE(r.ok()) << r.status().to_string() << "\n"
                      << codegen::print(*codegen::make_adjoint(*k));
  EXPECT_EQ(r->failure, "") << text;
  EXPECT_GE(r->checked, min_checked) << "skipped " << r->skipped;
}

HostArray array_of(codegen::DType t, std::vector<double> v) {
  HostArray a(t, {static_cast<uint32_t>(v.size())});
  a.data = std::move(v);
  return a;
}

// The issue-12 repro: p and q swap through t every iteration, so the q read after `q = p + q`
// depends on p's value at the start of the iteration, which must be checkpointed too.
TEST(ReverseModeGradient, SwappedFloatLocalsRegression) {
  HostValues v;
  v.arrays = {array_of(codegen::DType::kF64, {0.3, 0.7, 1.1, -0.4}),
              HostArray(codegen::DType::kF64, {4})};
  v.scalars = {0, 0};
  expect_gradients_match(kSwappedFloatLocals, v, 4);
}

// The integer variant: two i32 locals swapped every iteration index a read-only differentiable
// array; with an unrestored local the gradient went to the wrong elements of w.
TEST(ReverseModeGradient, SwappedIntegerIndexLocalsRegression) {
  HostValues v;
  v.arrays = {array_of(codegen::DType::kF64, {0.3, 0.7, 1.1, -0.4, 0.9, -0.2}),
              array_of(codegen::DType::kF64, {0.8, -0.6, 1.2, 0.5, -0.9, 0.4, 0.7}),
              HostArray(codegen::DType::kF64, {6})};
  v.scalars = {0, 0, 0};
  expect_gradients_match(kSwappedIntegerIndexLocals, v, 13);
}

// The training example's shape: a linearly carried position beside a nonlinear velocity. Only
// the velocity is checkpointed (ReverseModePass.LinearlyCarriedLocalIsNotCheckpointed); the
// gradients must still be right.
TEST(ReverseModeGradient, LinearlyCarriedPositionNeededValues) {
  HostValues v;
  v.arrays = {HostArray{}, HostArray{}, array_of(codegen::DType::kF64, {0.3, -0.7, 1.1, 0.4}),
              array_of(codegen::DType::kF64, {0.5, -0.2, 0.1, -0.6}),
              HostArray(codegen::DType::kF64, {4})};
  v.scalars = {6, 0.1, 0, 0, 0};
  expect_gradients_match(kLinearlyCarriedPosition, v, 8);
}

}  // namespace
}  // namespace vkad::testing
