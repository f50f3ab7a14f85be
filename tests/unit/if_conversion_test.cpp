// If-conversion (graph/if_conversion.h): a kernel whose ifs only compute, rewritten without them,
// must store exactly what the kernel as written stores on the CPU evaluator -- for inputs that
// take every side of every branch, nested ones too -- verify, and make gather recompute take
// it as a producer; a branch that touches an array or loops is not converted.
#include "graph/if_conversion.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "graph/gather_recompute.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"

namespace vkad::testing {
namespace {

using codegen::DType;
using codegen::HostArg;
using codegen::HostArray;
using codegen::Kernel;

Kernel parse(const std::string& text) {
  auto k = codegen::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : Kernel{};
}

// DiffTaichi's walls as diffmpm_simple writes them: a local velocity, zeroed where it moves into
// a wall (i < 3 and v < 0, i > n - 4 and v > 0), then an else side and a nested branch that
// scale it, a float division on a side (speculated where the branch would not run it).
constexpr const char* kWalls = R"(
kernel walls(x: ndarray<f32, 1> readonly, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %a = alloca : f32
    store_local %a, %v
    %three = const 3 : i32
    %near = lt %i, %three : bool
    %cur = load_local %a : f32
    %zero = const 0.0 : f32
    %neg = lt %cur, %zero : bool
    %stop = and %near, %neg : bool
    if %stop {
      %z = const 0.0 : f32
      store_local %a, %z
    }
    %n = shape x 0 : i32
    %four = const 4 : i32
    %top = sub %n, %four : i32
    %far = gt %i, %top : bool
    %cur2 = load_local %a : f32
    %pos = gt %cur2, %zero : bool
    if %far {
      if %pos {
        %z2 = const 0.0 : f32
        store_local %a, %z2
      }
    } else {
      %half = const 0.5 : f32
      %big = gt %cur2, %half : bool
      if %big {
        %q = div %half, %cur2 : f32
        store_local %a, %q
      } else {
        %two = const 2.0 : f32
        %d = mul %cur2, %two : f32
        store_local %a, %d
      }
    }
    %out = load_local %a : f32
    store y[%i], %out
  }
}
)";

TEST(IfConversion, TheConvertedKernelStoresWhatTheBranchesDo) {
  const Kernel k = parse(kWalls);
  ASSERT_TRUE(codegen::verify(k).ok());
  EXPECT_FALSE(codegen::recompute_producer(k));  // branches: not straight-line as written
  std::optional<Kernel> c = codegen::if_converted(k);
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE(codegen::verify(*c).ok()) << codegen::verify(*c).to_string() << codegen::print(*c);
  EXPECT_EQ(codegen::print(*c).find(" if "), std::string::npos) << codegen::print(*c);
  EXPECT_TRUE(codegen::recompute_producer(*c));
  // 16 cells: the walls at 0..2 and 13..15, values of both signs and on both sides of 0.5 (0
  // itself too), so every side of every branch runs somewhere.
  constexpr uint32_t n = 16;
  HostArray x(DType::kF32, {n}), want(DType::kF32, {n}), got(DType::kF32, {n});
  for (uint32_t i = 0; i < n; ++i) x.data[i] = i % 4 == 3 ? 0.0 : std::sin(1.7 * i + 0.3);
  for (uint32_t i = 0; i < n; ++i) want.data[i] = got.data[i] = 99.0;
  ASSERT_TRUE(codegen::evaluate(k, std::vector<HostArg>{HostArg::of(x), HostArg::of(want)}).ok());
  ASSERT_TRUE(codegen::evaluate(*c, std::vector<HostArg>{HostArg::of(x), HostArg::of(got)}).ok());
  int zeroed = 0, divided = 0, doubled = 0;
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(got.data[i], want.data[i]) << "cell " << i;  // the same operations: bit-equal
    zeroed += want.data[i] == 0.0 && x.data[i] != 0.0;
    divided += x.data[i] > 0.5 && i <= n - 4;
    doubled += x.data[i] <= 0.5 && i <= n - 4 && !(i < 3 && x.data[i] < 0);
  }
  EXPECT_GT(zeroed, 0);  // the inputs reach each side
  EXPECT_GT(divided, 0);
  EXPECT_GT(doubled, 0);
}

// An integer local set on one side, and a local declared inside the branch (hoisted, its stores
// through selects too): odd cells get 3 + 2 = 5 added, even ones 0.
constexpr const char* kLocals = R"(
kernel locals(x: ndarray<f32, 1> readonly, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %k = alloca : i32
    %c0 = const 0 : i32
    store_local %k, %c0
    %two = const 2 : i32
    %m = mod %i, %two : i32
    %odd = ne %m, %c0 : bool
    if %odd {
      %b = alloca : f32
      %h = const 3.0 : f32
      store_local %b, %h
      %bb = load_local %b : f32
      %bi = cast %bb : i32
      %kk = add %bi, %two : i32
      store_local %k, %kk
    }
    %kv = load_local %k : i32
    %kf = cast %kv : f32
    %o = add %v, %kf : f32
    store y[%i], %o
  }
}
)";

TEST(IfConversion, IntegerLocalsAndLocalsDeclaredInABranchKeepTheirValues) {
  const Kernel k = parse(kLocals);
  std::optional<Kernel> c = codegen::if_converted(k);
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE(codegen::verify(*c).ok()) << codegen::verify(*c).to_string() << codegen::print(*c);
  constexpr uint32_t n = 6;
  HostArray x(DType::kF32, {n}), want(DType::kF32, {n}), got(DType::kF32, {n});
  for (uint32_t i = 0; i < n; ++i) x.data[i] = 0.25 * i;
  ASSERT_TRUE(codegen::evaluate(k, std::vector<HostArg>{HostArg::of(x), HostArg::of(want)}).ok());
  ASSERT_TRUE(codegen::evaluate(*c, std::vector<HostArg>{HostArg::of(x), HostArg::of(got)}).ok());
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(got.data[i], want.data[i]) << "cell " << i;
    EXPECT_EQ(want.data[i], x.data[i] + (i % 2 ? 5.0 : 0.0)) << "cell " << i;
  }
}

std::string branch_with(const std::string& side) {
  return "kernel b(x: ndarray<f32, 1>, m: ndarray<i32, 1>) {\n"
         "  task main parallel %i in [0, shape(x, 0)) {\n"
         "    %a = alloca : f32\n    %z = const 0.0 : f32\n    store_local %a, %z\n"
         "    %c0 = const 0 : i32\n    %c = gt %i, %c0 : bool\n"
         "    if %c {\n" +
         side +
         "    }\n"
         "    %r = load_local %a : f32\n    store x[%i], %r\n  }\n}\n";
}

TEST(IfConversion, BranchesThatTouchArraysOrLoopAreLeftAlone) {
  // The kernel converts with a side that only computes -- an integer division too (x / 0 is 0
  // in the IR, so it may run where the branch guards against a zero) ...
  for (const std::string& side :
       {std::string("      %h = const 0.5 : f32\n      store_local %a, %h\n"),
        std::string("      %q = div %c0, %i : i32\n      %f = cast %q : f32\n"
                    "      store_local %a, %f\n")}) {
    EXPECT_TRUE(codegen::if_converted(parse(branch_with(side))).has_value()) << side;
  }
  // ... and not with one that loads (the branch may guard the index), stores or adds to an
  // array, or loops.
  const std::vector<std::string> sides = {
      "      %l = load x[%i] : f32\n      store_local %a, %l\n",
      "      %h = const 0.5 : f32\n      store x[%i], %h\n",
      "      %h = const 0.5 : f32\n      atomic_add x[%i], %h\n",
      "      %one = const 1 : i32\n      for %k in [%c0, %one) {\n      }\n",
  };
  for (const std::string& side : sides) {
    const Kernel k = parse(branch_with(side));
    ASSERT_TRUE(codegen::verify(k).ok()) << side << codegen::verify(k).to_string();
    EXPECT_FALSE(codegen::if_converted(k).has_value()) << side;
  }
  // Nothing to convert: no if.
  EXPECT_FALSE(codegen::if_converted(parse(R"(
kernel n(x: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %h = const 0.5 : f32
    store x[%i], %h
  }
}
)"))
                   .has_value());
}

}  // namespace
}  // namespace vkad::testing
