// reference/precision.h: the carried bounds contain every perturbed result, and the CPU
// reference's per-element bounds contain what a device allowed Vulkan's errors could compute
// (simulated here by perturbing each transcendental within its row's bound).
#include "reference/precision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"

namespace vkad::codegen {
namespace {

double apply(Op op, double a, double b) {
  switch (op) {
    case Op::kSqrt: return std::sqrt(a);
    case Op::kRsqrt: return 1 / std::sqrt(a);
    case Op::kExp: return std::exp(a);
    case Op::kLog: return std::log(a);
    case Op::kSin: return std::sin(a);
    case Op::kCos: return std::cos(a);
    case Op::kTan: return std::tan(a);
    case Op::kTanh: return std::tanh(a);
    case Op::kAsin: return std::asin(a);
    case Op::kAcos: return std::acos(a);
    case Op::kFloor: return std::floor(a);
    case Op::kPow: return std::pow(a, b);
    case Op::kAtan2: return std::atan2(a, b);
    case Op::kMul: return a * b;
    case Op::kDiv: return a / b;
    default: return a + b;
  }
}

// For random operands and operand errors, every result from operands inside the error box
// lies within carried_error of the unperturbed result.
TEST(Precision, CarriedErrorContainsEveryPerturbedResult) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-3, 3), unit(-1, 1), mag(0, 1);
  const Op ops[] = {Op::kSqrt,  Op::kRsqrt, Op::kExp,   Op::kLog,  Op::kSin,
                    Op::kCos,   Op::kTan,   Op::kTanh,  Op::kAsin, Op::kAcos,
                    Op::kFloor, Op::kPow,   Op::kAtan2, Op::kMul,  Op::kDiv};
  for (Op op : ops) {
    SCOPED_TRACE(op_info(op).name);
    int checked = 0;
    for (int trial = 0; trial < 2000; ++trial) {
      double a = u(rng), b = u(rng);
      if (op == Op::kSqrt || op == Op::kRsqrt || op == Op::kLog || op == Op::kPow)
        a = std::fabs(a) + 0.01;
      if (op == Op::kAsin || op == Op::kAcos) a = unit(rng);
      double ea = std::pow(10, -1 - 5 * mag(rng)),
             eb = op == Op::kPow || op == Op::kAtan2 || op == Op::kMul || op == Op::kDiv
                      ? std::pow(10, -1 - 5 * mag(rng))
                      : 0;
      double r = apply(op, a, b);
      double bound = carried_error(op, DType::kF64, a, ea, b, eb, r);
      if (std::isinf(bound)) continue;
      ++checked;
      for (int k = 0; k < 20; ++k) {
        double pa = a + ea * unit(rng), pb = b + eb * unit(rng);
        double pr = apply(op, pa, pb);
        ASSERT_LE(std::fabs(pr - r), bound * (1 + 1e-9) + 1e-15)
            << "a=" << a << " +- " << ea << ", b=" << b << " +- " << eb;
      }
    }
    EXPECT_GT(checked, 1000) << "most random cases should have a finite bound";
  }
}

TEST(Precision, UndefinedInputsAreUnbounded) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(local_error(Op::kSqrt, DType::kF32, -1, 0, std::nan("")), inf);
  EXPECT_EQ(local_error(Op::kLog, DType::kF32, 0, 0, -inf), inf);
  EXPECT_EQ(local_error(Op::kAsin, DType::kF32, 1.5, 0, std::nan("")), inf);
  EXPECT_EQ(local_error(Op::kAtan2, DType::kF32, 0, 0, 0), inf);
  EXPECT_EQ(local_error(Op::kDiv, DType::kF32, 1, 0x1p-127, 0x1p127), inf);   // |y| < 2^-126
  EXPECT_EQ(local_error(Op::kSin, DType::kF32, 1e6, 0, std::sin(1e6)), inf);  // past the reduction
  // Exact operations stay exact, also on infinities.
  EXPECT_EQ(local_error(Op::kFloor, DType::kF32, 2.5, 0, 2), 0);
  EXPECT_EQ(local_error(Op::kNeg, DType::kF32, inf, 0, -inf), 0);
  EXPECT_EQ(local_error(Op::kMul, DType::kF32, 3, 5, 15), 0);
}

// A device whose sin is off by up to Vulkan's 2^-11 at every step of a loop stays inside the
// reference's bound for the loop's result (here the amplifying a <- 0.9 a + sin a of the
// corpus' loop_argument_trip, simulated with the extreme error of either sign at every step).
TEST(Precision, EvaluatorBoundContainsALoopOfWorstCaseSinErrors) {
  auto k = parse(R"(kernel la(n: i32, x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %x = load x[%i] : f32
    %acc = alloca : f32
    store_local %acc, %x
    %b = const 0 : i32
    %n = arg n : i32
    %k9 = const 0.9 : f32
    for %k in [%b, %n) {
      %a = load_local %acc : f32
      %m = mul %a, %k9 : f32
      %s = sin %a : f32
      %nv = add %m, %s : f32
      store_local %acc, %nv
    }
    %r = load_local %acc : f32
    store y[%i], %r
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(verify(*k).ok());
  const int n = 6;
  HostArray x(DType::kF32, {64}), y(DType::kF32, {64});
  for (size_t i = 0; i < x.size(); ++i)
    x.data[i] = round_to(DType::kF32, -1 + 2.0 * static_cast<double>(i) / 63);
  std::vector<HostArg> args = {HostArg::of(n), HostArg::of(x), HostArg::of(y)};
  ASSERT_TRUE(evaluate(*k, args).ok());
  ASSERT_EQ(y.error.size(), y.size());
  std::mt19937 rng(11);
  for (size_t i = 0; i < x.size(); ++i) {
    for (int trial = 0; trial < 16; ++trial) {
      float acc = static_cast<float>(x.data[i]);
      for (int s = 0; s < n; ++s) {
        float d = (rng() & 1 ? 1.0f : -1.0f) * 0x1p-11f;
        acc = acc * 0.9f + (std::sin(acc) + d);
      }
      EXPECT_LE(std::fabs(acc - y.data[i]), y.error[i]) << "x = " << x.data[i];
    }
  }
}

}  // namespace
}  // namespace vkad::codegen
