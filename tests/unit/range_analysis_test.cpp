// RangeAnalysis (ir/range_analysis.h): the one symbolic range analysis that reverse mode sizes
// adstacks with and the lavapipe loop-pass bound counts with. Reverse mode used to give every
// integer scalar a lower bound of 0 and every difference one of 0, so a loop whose begin was a
// negative i32 (or `i - 1` at i = 0) got an adstack too small for its iterations; the loop-pass
// bound gave a signed scalar no lower bound at all. Settled: a signed scalar n is >= 0 - neg(n)
// (SizeExpr::neg_scalar, max(-n, 0), evaluated per launch), so such loops keep a symbolic trip
// bound that is right for negative values too.
#include "ir/range_analysis.h"

#include <gtest/gtest.h>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "ir/walk.h"
#include "support/ad_check.h"

namespace vkad::testing {
namespace {

using codegen::DType;
using codegen::HostArray;
using codegen::Kernel;
using codegen::RangeAnalysis;
using codegen::Stmt;
using codegen::ValueId;

Kernel parse_ok(const std::string& text) {
  auto k = codegen::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : Kernel{};
}

// The id the text names `%name` (the printer keeps names as ids in order of definition, so
// find the statement by its op and position instead): the n-th statement of op `op`.
const Stmt* nth(const Kernel& k, codegen::Op op, int n) {
  const Stmt* found = nullptr;
  codegen::for_each_stmt(k.tasks[0].body, [&](const Stmt& s) {
    if (s.op == op && n-- == 0) found = &s;
  });
  return found;
}

int64_t eval(const codegen::SizeExpr& e, std::vector<int64_t> scalars) {
  adstack::SizeInputs in{[&](uint32_t p) { return scalars.at(p); },
                         [](uint32_t, uint32_t) { return int64_t{8}; }};
  auto v = adstack::evaluate(e, in);
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  return v.ok() ? *v : -1;
}

TEST(RangeAnalysis, SignedScalarsHaveNoLowerBoundUnsignedOnesStartAtZero) {
  Kernel k = parse_ok(R"(kernel k(n: i32, m: u32, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(y, 0)) {
    %n = arg n : i32
    %m = arg m : u32
    %one = const 1 : i32
    %d = sub %i, %one : i32
    %c = cast %n : u32
  }
})");
  RangeAnalysis r(k, k.tasks[0]);
  const Stmt* n = nth(k, codegen::Op::kArg, 0);
  const Stmt* m = nth(k, codegen::Op::kArg, 1);
  const Stmt* d = nth(k, codegen::Op::kSub, 0);
  const Stmt* c = nth(k, codegen::Op::kCast, 0);
  ASSERT_TRUE(n && m && d && c);
  EXPECT_EQ(r.range(n->result).lo, 0);
  EXPECT_EQ(r.range(n->result).neg, codegen::SizeExpr::neg_scalar(0))
      << "an i32 scalar may be negative: its lower bound is 0 - neg(n)";
  EXPECT_FALSE(r.range(n->result).non_negative());
  ASSERT_TRUE(r.range(n->result).up);
  EXPECT_EQ(r.range(m->result).lo, 0);
  EXPECT_TRUE(r.range(m->result).non_negative());
  // i in [0, 8): i - 1 in [-1, 6].
  EXPECT_EQ(r.range(d->result).lo, -1);
  ASSERT_TRUE(r.range(d->result).up);
  EXPECT_EQ(eval(*r.range(d->result).up, {0, 0}), 6);
  EXPECT_FALSE(r.range(c->result).lo) << "a cast of a maybe-negative i32 to u32 may wrap";
  EXPECT_FALSE(r.range(c->result).up);
}

// A loop from a negative i32 scalar to 4: its stack holds 4 + neg(n) entries, 7 at n = -3 (it
// used to hold 4 - 0, and the adjoint overflowed), and the gradient matches finite differences.
TEST(RangeAnalysis, LoopFromANegativeI32GetsAStackOfItsTrips) {
  Kernel k = parse_ok(R"(kernel pow(n: i32, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %one = const 1 : f64
    store_local %v, %one
    %n = arg n : i32
    %e = const 4 : i32
    for %j in [%n, %e) {
      %a = load_local %v : f64
      %b = load x[%i] : f64
      %c = mul %a, %b : f64
      store_local %v, %c
    }
    %o = load_local %v : f64
    store y[%i], %o
  }
})");
  auto adjoint = codegen::make_adjoint(k);
  ASSERT_TRUE(adjoint.ok()) << adjoint.status().to_string();
  const Stmt* stack = nullptr;
  codegen::for_each_stmt(adjoint->tasks[0].body, [&](const Stmt& s) {
    if (s.op == codegen::Op::kStackAlloc) stack = &s;
  });
  ASSERT_NE(stack, nullptr);
  EXPECT_EQ(eval(stack->cap, {-3, 0, 0}), 7);
  EXPECT_EQ(eval(stack->cap, {2, 0, 0}), 4) << "a non-negative begin counts as 0 (an upper bound)";
  for (double n : {-3.0, 0.0, 2.0}) {
    HostValues base;
    base.arrays = {HostArray(), HostArray(DType::kF64, {3}), HostArray(DType::kF64, {3})};
    base.arrays[1].data = {0.9, -1.1, 1.05};
    base.scalars = {n, 0, 0};
    auto fd = check_gradients_cpu(k, base, 5);
    ASSERT_TRUE(fd.ok()) << "n = " << n << ": " << fd.status().to_string();
    EXPECT_EQ(fd->failure, "") << "n = " << n;
    EXPECT_GE(fd->checked, 3);
  }
}

// A begin of `i - 1` is -1 at i = 0: the loop runs 4 times there, not 3, and make_adjoint sizes
// its stack from the lower bound -1 (it used to take 0 and overflow at i = 0).
TEST(RangeAnalysis, BeginBelowZeroByArithmeticSizesTheStack) {
  Kernel k = parse_ok(R"(kernel k(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %b = load x[%i] : f64
    store_local %v, %b
    %one = const 1 : i32
    %s = sub %i, %one : i32
    %e = const 3 : i32
    for %j in [%s, %e) {
      %a = load_local %v : f64
      %c = sin %a : f64
      store_local %v, %c
    }
    %o = load_local %v : f64
    store y[%i], %o
  }
})");
  HostValues base;
  base.arrays = {HostArray(DType::kF64, {3}), HostArray(DType::kF64, {3})};
  base.arrays[0].data = {0.4, -0.7, 1.3};
  base.scalars = {0, 0};
  auto fd = check_gradients_cpu(k, base, 3);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_EQ(fd->failure, "");
  EXPECT_GE(fd->checked, 3);
}

// neg(n) in the text form: printed and parsed back, refused in a task dimension and on a
// non-integer scalar.
TEST(RangeAnalysis, NegOfAScalarRoundTripsThroughTheTextForm) {
  const std::string text = R"(kernel k(n: i32, x: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %s = stack_alloc cap(add(4, neg(n))) : f32
  }
}
)";
  Kernel k = parse_ok(text);
  EXPECT_NE(codegen::print(k).find("cap(add(4, neg(n)))"), std::string::npos) << codegen::print(k);
  EXPECT_EQ(codegen::print(parse_ok(codegen::print(k))), codegen::print(k));
  auto dim = codegen::parse(R"(kernel k(n: i32, x: ndarray<f32, 1>) {
  task main parallel %i in [0, add(shape(x, 0), neg(n))), %j in [0, 2) {
  }
}
)");
  ASSERT_TRUE(dim.ok()) << dim.status().to_string();
  Status s = codegen::verify(*dim);
  EXPECT_NE(s.to_string().find("neg() is not allowed in a task dimension"), std::string::npos)
      << s.to_string();
}

}  // namespace
}  // namespace vkad::testing
