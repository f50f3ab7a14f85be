// adstack/ sizing without a device: symbolic sizes, their folding, and row planning, in
// particular that 64-bit overflow is an error naming the stack, never a wrapped capacity.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "adstack/adstack_layout.h"
#include "adstack/size_expr.h"

namespace vkad::adstack {
namespace {

using K = SizeExpr::Kind;

SizeInputs scalars(int64_t n) {
  return {[n](uint32_t) { return n; }, [n](uint32_t, uint32_t) { return n; }};
}

SizeExpr cube(SizeExpr x) {
  return SizeExpr::combine(K::kMul, x, SizeExpr::combine(K::kMul, x, x));
}

TEST(AdstackSize, EvaluatesSumsProductsAndMaxima) {
  SizeExpr n = SizeExpr::scalar(0);
  SizeExpr e =
      SizeExpr::combine(K::kAdd, cube(n), SizeExpr::combine(K::kMax, n, SizeExpr::constant(7)));
  auto v = evaluate(e, scalars(10));
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(*v, 10 * 10 * 10 + 10);
}

TEST(AdstackSize, ProductPast64BitsIsAnErrorNotAWrappedValue) {
  // n*n*n with n = 3,000,000 is 2.7e19 > 2^63.
  auto v = evaluate(cube(SizeExpr::scalar(0)), scalars(3'000'000));
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("overflows 64 bits"), std::string::npos)
      << v.status().message();
}

TEST(AdstackSize, SumPast64BitsIsAnError) {
  SizeExpr big = SizeExpr::scalar(0);
  auto v =
      evaluate(SizeExpr::combine(K::kAdd, big, big), scalars(std::numeric_limits<int64_t>::max()));
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("overflows 64 bits"), std::string::npos);
}

TEST(AdstackSize, ConstantFoldingKeepsOverflowingProductsSymbolic) {
  SizeExpr c = SizeExpr::constant(int64_t{3} << 40);
  SizeExpr folded = SizeExpr::combine(K::kMul, c, c);  // 9 * 2^80: does not fit
  EXPECT_NE(folded.kind, K::kConst) << "folded to the wrapped value " << folded.value;
  EXPECT_FALSE(evaluate(folded, scalars(0)).ok());
  // A product that fits is still folded.
  SizeExpr small =
      SizeExpr::combine(K::kMul, SizeExpr::constant(1 << 20), SizeExpr::constant(1 << 20));
  ASSERT_EQ(small.kind, K::kConst);
  EXPECT_EQ(small.value, int64_t{1} << 40);
}

TEST(AdstackSize, PlanRowNamesTheStackWhoseCapacityOverflows) {
  StackDesc ok{"%3 (carried f32 local %1)", Heap::kF32, SizeExpr::scalar(0)};
  StackDesc bad{"%9 (carried f32 local %2)", Heap::kF32, cube(SizeExpr::scalar(0))};
  StackDesc stacks[] = {ok, bad};
  auto row = plan_row(stacks, scalars(3'000'000));
  ASSERT_FALSE(row.ok());
  EXPECT_EQ(row.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(row.status().message().find("adstack %9 (carried f32 local %2)"), std::string::npos)
      << row.status().message();
  EXPECT_NE(row.status().message().find("overflows 64 bits"), std::string::npos);
}

TEST(AdstackSize, PlanRowRejectsCapacitiesPast32BitRows) {
  StackDesc s{"%5", Heap::kF32, SizeExpr::scalar(0)};
  auto row = plan_row({&s, 1}, scalars(int64_t{1} << 31));
  ASSERT_FALSE(row.ok());
  EXPECT_NE(row.status().message().find("adstack %5"), std::string::npos);
}

}  // namespace
}  // namespace vkad::adstack
