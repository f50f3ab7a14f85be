// loop_pass_bound (ir/loop_passes.h): the loop passes of one range iteration, evaluated
// for given scalars and shapes, against the model's closed form for each kernel shape.
#include "ir/loop_passes.h"

#include <gtest/gtest.h>

#include "ir/text.h"

namespace vkad::codegen {
namespace {

struct Counted {
  int64_t passes = -1;
  uint64_t idle = 0;
  std::vector<std::string> unchecked;
};

// `scalars`: the value of each scalar parameter by index; every ndarray extent is `extent`.
Counted count(const std::string& text, std::vector<int64_t> scalars, int64_t extent = 10,
              bool cas32 = false) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return {};
  LoopPassBound b = loop_pass_bound(*k, k->tasks[0], cas32, false);
  adstack::SizeInputs in{[&](uint32_t p) { return scalars.at(p); },
                         [&](uint32_t, uint32_t) { return extent; }};
  auto v = adstack::evaluate(b.per_iteration, in);
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  return {v.ok() ? *v : -1, b.idle, b.unchecked_loops};
}

std::string kernel(const std::string& params, const std::string& body) {
  return "kernel k(" + params + ") {\n  task main parallel %i in [0, shape(y, 0)) {\n" +
         "    %z = const 0 : i32\n" + body + "  }\n}\n";
}

TEST(LoopPasses, StraightLineMakesNone) {
  Counted c =
      count(kernel("y: ndarray<f32, 1>", "    %c = const 1 : f32\n    store y[%i], %c\n"), {0});
  EXPECT_EQ(c.passes, 0);
  EXPECT_EQ(c.idle, 0u);
}

TEST(LoopPasses, OneLoopOfScalarBoundMakesTripsPlusOne) {
  std::string k = kernel("n: i32, y: ndarray<f32, 1>",
                         "    %n = arg n : i32\n    for %k in [%z, %n) {\n    }\n");
  for (int64_t n : {0, 1, 7, 1000}) EXPECT_EQ(count(k, {n, 0}).passes, n + 1) << n;
  EXPECT_EQ(count(k, {-5, 0}).passes, 1) << "a negative trip count runs no iteration";
  EXPECT_EQ(count(k, {5, 0}).idle, 1u);
}

// A signed scalar begin is bounded below by 0 - neg(n) (ir/range_analysis.h): such a loop is
// checked, with its trips counted from a negative begin too.
TEST(LoopPasses, SignedScalarBeginIsCountedFromBelowZero) {
  std::string k = kernel("n: i32, y: ndarray<f32, 1>",
                         "    %n = arg n : i32\n    %e = const 4 : i32\n"
                         "    for %k in [%n, %e) {\n    }\n");
  EXPECT_TRUE(count(k, {-3, 0}).unchecked.empty());
  EXPECT_EQ(count(k, {-3, 0}).passes, 7 + 1);
  // From 2 the bound stays 4 - 0 (a non-negative begin counts as 0): an upper bound.
  EXPECT_GE(count(k, {2, 0}).passes, 2 + 1);
}

TEST(LoopPasses, NestedLoopsMultiplyAndTheOuterLastPassRunsTheInnerOnce) {
  std::string k = kernel("m: i32, n: i32, y: ndarray<f32, 1>",
                         "    %m = arg m : i32\n    %n = arg n : i32\n"
                         "    for %j in [%z, %m) {\n      for %k in [%z, %n) {\n      }\n    }\n"
                         "    %c = const 3 : i32\n    for %l in [%c, %n) {\n    }\n");
  for (auto [m, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 9}, {1, 9}, {4, 6}, {100, 600}}) {
    // outer: m (1 + (n + 1)) + 1 + 1; the loop after it: (n - 3) + 1.
    EXPECT_EQ(count(k, {m, n, 0}).passes, m * (n + 2) + 2 + (n - 3) + 1) << m << " " << n;
  }
  EXPECT_EQ(count(k, {2, 2, 0}).idle, 3u);
  // n = 1: the loop after the nest ends below its begin; it runs no iteration and takes no
  // passes from the nest (which it would if its trip count went negative).
  EXPECT_EQ(count(k, {4, 1, 0}).passes, 4 * (1 + 1 + 1) + 2 + 1);
}

TEST(LoopPasses, TriangularBoundsUseTheEnclosingIndexMaximum) {
  std::string k = kernel("n: i32, y: ndarray<f32, 1>",
                         "    %n = arg n : i32\n    %one = const 1 : i32\n"
                         "    for %j in [%z, %n) {\n      %e = add %j, %one : i32\n"
                         "      for %k in [%z, %e) {\n      }\n    }\n");
  // j + 1 <= n: each inner loop is bounded by n trips.
  EXPECT_EQ(count(k, {5, 0}).passes, 5 * (1 + 5 + 1) + 1 + 1);
}

TEST(LoopPasses, BranchesCountBothSides) {
  std::string k = kernel("n: i32, y: ndarray<f32, 1>",
                         "    %n = arg n : i32\n    %c = lt %i, %n : bool\n    if %c {\n"
                         "      for %k in [%z, %n) {\n      }\n    } else {\n"
                         "      %t = const 4 : i32\n      for %l in [%z, %t) {\n      }\n    }\n");
  EXPECT_EQ(count(k, {10, 0}).passes, (10 + 1) + (4 + 1));
}

TEST(LoopPasses, DataDependentBoundsAreCountedOnceAndNamed) {
  std::string k = kernel("cnt: ndarray<i32, 1>, y: ndarray<f32, 1>",
                         "    %c = load cnt[%i] : i32\n    for %k in [%z, %c) {\n"
                         "      %t = const 8 : i32\n      for %l in [%z, %t) {\n      }\n    }\n");
  Counted c = count(k, {0, 0});
  EXPECT_EQ(c.passes, 1 + 1) << "the loop's last pass, running the inner loop once";
  ASSERT_EQ(c.unchecked.size(), 1u);
  EXPECT_EQ(c.unchecked[0], "%" + std::to_string(parse(k)->tasks[0].body.stmts[2].result));
}

TEST(LoopPasses, CompareAndSwapAtomicsCountOnlyWhenLowered) {
  std::string k = kernel("n: i32, y: ndarray<f32, 1>",
                         "    %n = arg n : i32\n    for %k in [%z, %n) {\n"
                         "      %v = const 1 : f32\n      atomic_add y[%i], %v\n    }\n");
  EXPECT_EQ(count(k, {10, 0}, 10, /*cas32=*/false).passes, 10 + 1);
  EXPECT_EQ(count(k, {10, 0}, 10, /*cas32=*/true).passes, 10 * 2 + 1 + 1);
  EXPECT_EQ(count(k, {10, 0}, 10, /*cas32=*/true).idle, 2u);
}

TEST(LoopPasses, ShapeBoundsAndIndexArithmetic) {
  std::string k =
      kernel("y: ndarray<f32, 1>",
             "    %s = shape y 0 : i32\n    %two = const 2 : i32\n    %e = mul %s, %two : i32\n"
             "    for %k in [%z, %e) {\n      %m = const 3 : i32\n      %r = mod %k, %m : i32\n"
             "      for %l in [%z, %r) {\n      }\n    }\n");
  // extent 10: 20 outer trips, each inner loop at most 2 trips.
  EXPECT_EQ(count(k, {0}, 10).passes, 20 * (1 + 3) + 1 + 1);
}

}  // namespace
}  // namespace vkad::codegen
