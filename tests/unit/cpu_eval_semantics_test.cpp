// The CPU reference against the "Operation semantics" table of docs/reference.md (and ir.h):
// the values below are the table's, written out by hand, not outputs of the evaluator.
// tests/gpu/operation_semantics_test.cpp checks that the device produces the same values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"

namespace vkad::codegen {
namespace {

constexpr double kIntMin = -2147483648.0, kIntMax = 2147483647.0, kUintMax = 4294967295.0;
const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Runs a kernel of rank-1 ndarray parameters: `inputs` fill the first ones (of the parameters'
// dtypes), the rest are outputs of the same length, returned in order.
std::vector<std::vector<double>> run(const std::string& text,
                                     const std::vector<std::vector<double>>& inputs) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return {};
  EXPECT_TRUE(verify(*k).ok()) << verify(*k).to_string();
  uint32_t n = static_cast<uint32_t>(inputs.front().size());
  std::vector<HostArray> arrays;
  for (size_t p = 0; p < k->params.size(); ++p) {
    arrays.emplace_back(k->params[p].dtype, std::vector<uint32_t>{n});
    if (p < inputs.size()) {
      for (uint32_t i = 0; i < n; ++i)
        arrays.back().data[i] = round_to(k->params[p].dtype, inputs[p][i]);
    }
  }
  std::vector<HostArg> args;
  for (HostArray& a : arrays) args.push_back(HostArg::of(a));
  auto r = evaluate(*k, args);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  std::vector<std::vector<double>> out;
  for (size_t p = inputs.size(); p < arrays.size(); ++p) out.push_back(arrays[p].data);
  return out;
}

struct DivRow {
  double a, b, div, mod, floordiv;
};

const char* kDivI32 =
    R"(kernel d(a: ndarray<i32, 1>, b: ndarray<i32, 1>, q: ndarray<i32, 1>, m: ndarray<i32, 1>, f: ndarray<i32, 1>) {
  task main parallel %i in [0, shape(a, 0)) {
    %a = load a[%i] : i32
    %b = load b[%i] : i32
    %q = div %a, %b : i32
    %m = mod %a, %b : i32
    %f = floordiv %a, %b : i32
    store q[%i], %q
    store m[%i], %m
    store f[%i], %f
  }
})";

TEST(CpuEvalSemantics, I32DivisionTable) {
  const std::vector<DivRow> rows = {
      // div truncates; mod and floordiv round toward -inf (mod takes the divisor's sign)
      {7, 2, 3, 1, 3},
      {-7, 2, -3, 1, -4},
      {7, -2, -3, -1, -4},
      {-7, -2, 3, -1, 3},
      {6, -3, -2, 0, -2},
      // by zero: div 0, mod the dividend, floordiv 0
      {7, 0, 0, 7, 0},
      {-7, 0, 0, -7, 0},
      {0, 0, 0, 0, 0},
      {kIntMin, 0, 0, kIntMin, 0},
      // INT_MIN / -1 wraps to INT_MIN, its remainder is 0
      {kIntMin, -1, kIntMin, 0, kIntMin},
      {kIntMin, 1, kIntMin, 0, kIntMin},
      {kIntMax, -1, -kIntMax, 0, -kIntMax},
      {kIntMin, kIntMin, 1, 0, 1},
      {kIntMax, kIntMin, 0, -1, -1},
      {-1, kIntMin, 0, -1, 0},
      {1, kIntMin, 0, kIntMin + 1, -1},
  };
  std::vector<double> as, bs;
  for (const DivRow& r : rows) as.push_back(r.a), bs.push_back(r.b);
  auto out = run(kDivI32, {as, bs});
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(std::to_string(rows[i].a) + " by " + std::to_string(rows[i].b));
    EXPECT_EQ(out[0][i], rows[i].div);
    EXPECT_EQ(out[1][i], rows[i].mod);
    EXPECT_EQ(out[2][i], rows[i].floordiv);
    // The identity the table keeps for every input: a == floordiv(a, b) * b + mod(a, b) (wrapping).
    double back = round_to(DType::kI32, out[2][i] * rows[i].b + out[1][i]);
    EXPECT_EQ(back, rows[i].a);
  }
}

TEST(CpuEvalSemantics, U32DivisionTable) {
  const std::vector<DivRow> rows = {
      {7, 2, 3, 1, 3},
      {7, 0, 0, 7, 0},
      {0, 0, 0, 0, 0},
      {kUintMax, 0, 0, kUintMax, 0},
      {kUintMax, 2, 2147483647, 1, 2147483647},
      {5, kUintMax, 0, 5, 0},
  };
  std::vector<double> as, bs;
  for (const DivRow& r : rows) as.push_back(r.a), bs.push_back(r.b);
  auto out = run(
      R"(kernel d(a: ndarray<u32, 1>, b: ndarray<u32, 1>, q: ndarray<u32, 1>, m: ndarray<u32, 1>, f: ndarray<u32, 1>) {
  task main parallel %i in [0, shape(a, 0)) {
    %a = load a[%i] : u32
    %b = load b[%i] : u32
    %q = div %a, %b : u32
    %m = mod %a, %b : u32
    %f = floordiv %a, %b : u32
    store q[%i], %q
    store m[%i], %m
    store f[%i], %f
  }
})",
      {as, bs});
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(std::to_string(rows[i].a) + " by " + std::to_string(rows[i].b));
    EXPECT_EQ(out[0][i], rows[i].div);
    EXPECT_EQ(out[1][i], rows[i].mod);
    EXPECT_EQ(out[2][i], rows[i].floordiv);
  }
}

TEST(CpuEvalSemantics, FloatToIntegerSaturatesAndNaNIsZero) {
  struct Row {
    double x, i32, u32;
  };
  const std::vector<Row> rows = {
      {kNan, 0, 0},
      {kInf, kIntMax, kUintMax},
      {-kInf, kIntMin, 0},
      {1e20, kIntMax, kUintMax},
      {-1e20, kIntMin, 0},
      {2147483648.0, kIntMax, 2147483648.0},
      {2147483520.0, 2147483520.0, 2147483520.0},  // the largest f32 below 2^31
      {-2147483648.0, kIntMin, 0},
      {-2147483904.0, kIntMin, 0},  // the next f32 below -2^31
      {4294967296.0, kIntMax, kUintMax},
      {4294967040.0, kIntMax, 4294967040.0},  // the largest f32 below 2^32
      {-0.5, 0, 0},
      {-0.99, 0, 0},
      {-1, -1, 0},
      {-3.7, -3, 0},
      {3.7, 3, 3},
      {0.99, 0, 0},
  };
  std::vector<double> xs;
  for (const Row& r : rows) xs.push_back(r.x);
  for (const char* ft : {"f32", "f64"}) {
    SCOPED_TRACE(ft);
    std::string text = std::string("kernel c(x: ndarray<") + ft +
                       R"(, 1>, i: ndarray<i32, 1>, u: ndarray<u32, 1>) {
  task main parallel %k in [0, shape(x, 0)) {
    %x = load x[%k] : )" +
                       ft + R"(
    %i = cast %x : i32
    %u = cast %x : u32
    store i[%k], %i
    store u[%k], %u
  }
})";
    auto out = run(text, {xs});
    ASSERT_EQ(out.size(), 2u);
    for (size_t i = 0; i < rows.size(); ++i) {
      SCOPED_TRACE("x = " + std::to_string(rows[i].x));
      EXPECT_EQ(out[0][i], rows[i].i32);
      EXPECT_EQ(out[1][i], rows[i].u32);
    }
  }
}

TEST(CpuEvalSemantics, FloatMinMaxAreCompareAndSelect) {
  // min(a, b) = a < b ? a : b; max(a, b) = a > b ? a : b: with a NaN operand the result is b.
  auto out = run(
      R"(kernel m(a: ndarray<f32, 1>, b: ndarray<f32, 1>, lo: ndarray<f32, 1>, hi: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(a, 0)) {
    %a = load a[%i] : f32
    %b = load b[%i] : f32
    %lo = min %a, %b : f32
    %hi = max %a, %b : f32
    store lo[%i], %lo
    store hi[%i], %hi
  }
})",
      {{kNan, 1, -0.0, 0.0, 1, 2}, {1, kNan, 0.0, -0.0, 2, 1}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0][0], 1);
  EXPECT_TRUE(std::isnan(out[0][1]));
  EXPECT_TRUE(out[0][2] == 0 && !std::signbit(out[0][2]));  // equal: b
  EXPECT_TRUE(out[0][3] == 0 && std::signbit(out[0][3]));
  EXPECT_EQ(out[0][4], 1);
  EXPECT_EQ(out[0][5], 1);
  EXPECT_EQ(out[1][0], 1);
  EXPECT_TRUE(std::isnan(out[1][1]));
  EXPECT_EQ(out[1][4], 2);
  EXPECT_EQ(out[1][5], 2);
}

TEST(CpuEvalSemantics, F64ToF32RoundsAndOverflowsToInfinity) {
  double max = std::numeric_limits<float>::max();
  EXPECT_EQ(round_to(DType::kF32, 1e300), kInf);
  EXPECT_EQ(round_to(DType::kF32, -1e300), -kInf);
  EXPECT_EQ(round_to(DType::kF32, max + 0x1p102), max);   // below the midpoint: FLT_MAX
  EXPECT_EQ(round_to(DType::kF32, max + 0x1p103), kInf);  // the midpoint ties to infinity
  EXPECT_EQ(round_to(DType::kF32, 1.0 + 0x1p-30), 1.0);
  EXPECT_TRUE(std::isnan(round_to(DType::kF32, kNan)));
  // Wrapping integer rounding, including values far outside the range.
  EXPECT_EQ(round_to(DType::kI32, 2147483648.0), kIntMin);
  EXPECT_EQ(round_to(DType::kU32, -1), kUintMax);
  EXPECT_EQ(round_to(DType::kI32, kNan), 0);
}

}  // namespace
}  // namespace vkad::codegen
