// Reverse mode against finite differences on the CPU evaluator (no device): named regression
// kernels whose gradients were once wrong without an error. tests/gpu/reverse_mode_test.cpp runs
// the same kernels on the device.
#include <gtest/gtest.h>

#include <functional>

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

// A contact as billiards' collide has it: the distance to a neighbour, its norm and the
// relative value, computed before the contact's `if` and used only inside it (and in its
// condition), in its then-side or (the parameter) its else-side. Their reverse sinks into the
// branch's (reverse_mode.cpp, plan_sinks): the gradients still match finite differences with some
// pairs in contact and some apart, and the adjoint adds into the neighbour's gradient only inside
// an `if`.
const char* kContact =
    R"(kernel contact(x: ndarray<f64, 1> grad, v: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, 7) {
    %one = const 1 : i32
    %seven = const 7 : i32
    %ip = add %i, %one : i32
    %j = min %ip, %seven : i32
    %a = load x[%i] : f64
    %b = load x[%j] : f64
    %d = sub %a, %b : f64
    %d2 = mul %d, %d : f64
    %n = sqrt %d2 : f64
    %va = load v[%i] : f64
    %vb = load v[%j] : f64
    %rel = sub %va, %vb : f64
    %r = const 0.5 : f64
    %close = lt %n, %r : bool
    %acc = alloca : f64
    if %close {
      %dir = div %d, %n : f64
      %p = mul %dir, %rel : f64
      %gap = sub %n, %r : f64
      %imp = mul %p, %gap : f64
      store_local %acc, %imp
    } else {
    }
    %out = load_local %acc : f64
    %own = mul %a, %va : f64
    %sum = add %out, %own : f64
    store y[%i], %sum
  }
})";

// The same contact written the other way round: `if apart {} else { contact }`.
std::string contact_in_else() {
  std::string t = kContact;
  auto swap = [&](const std::string& a, const std::string& b) {
    const size_t at = t.find(a);
    EXPECT_NE(at, std::string::npos) << a;
    if (at != std::string::npos) t.replace(at, a.size(), b);
  };
  swap("%close = lt %n, %r : bool", "%apart = ge %n, %r : bool");
  swap("if %close {", "if %apart {\n    } else {");
  swap("      store_local %acc, %imp\n    } else {\n    }", "      store_local %acc, %imp\n    }");
  return t;
}

class ReverseModeContact : public ::testing::TestWithParam<bool> {};

TEST_P(ReverseModeContact, AContactsValuesReverseInsideItsBranch) {
  const std::string text = GetParam() ? contact_in_else() : std::string(kContact);
  auto k = codegen::parse(text);
  ASSERT_TRUE(k.ok()) << k.status().to_string() << "\n" << text;
  // x: pairs 0-1, 2-3 and 4-5 within 0.5 of each other (in contact), the rest apart; the last
  // element is only a neighbour.
  HostValues v;
  v.arrays = {array_of(codegen::DType::kF64, {0.1, 0.3, 1.5, 1.8, 3.0, 2.9, 4.5, 6.0}),
              array_of(codegen::DType::kF64, {0.4, -0.3, 0.2, 0.7, -0.5, 0.6, 0.1, -0.2}),
              HostArray(codegen::DType::kF64, {8})};
  v.scalars = {0, 0, 0};
  auto r = check_gradients_cpu(*k, v, 7);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->failure, "");
  EXPECT_GE(r->checked, 12) << "skipped " << r->skipped;
  // Every atomic add into x's gradient but the one of x[i] itself (used outside the branch:
  // %own) lies inside an `if`.
  auto adj = codegen::make_adjoint(*k);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  const uint32_t x_grad = 3, v_grad = 4;  // after x, v, y
  int outside = 0, inside = 0;
  std::function<void(const codegen::Block&, int)> walk = [&](const codegen::Block& b, int ifs) {
    for (const codegen::Stmt& s : b.stmts) {
      if (s.op == codegen::Op::kAtomicAdd && (s.param == x_grad || s.param == v_grad)) {
        (ifs > 0 ? inside : outside) += 1;
      }
      for (const codegen::Block& c : s.blocks) walk(c, ifs + (s.op == codegen::Op::kIf ? 1 : 0));
    }
  };
  for (const codegen::Task& t : adj->tasks) walk(t.body, 0);
  EXPECT_EQ(outside, 2) << codegen::print(*adj);  // x[i] and v[i]: also used by %own
  EXPECT_EQ(inside, 2) << codegen::print(*adj);   // x[j] and v[j]: only the contact uses them
}

// Running sums kept in the arrays (autodiff/accumulations.h): x[i] = x[i] + sin(y_j^2 i) in a
// loop of a task that owns x, and s[0] = s[0] + y_k^2, s[1] = s[1] + exp(y_k) in a serial task.
// Reverse mode refused both ("both read and written"); their adjoints are atomic adds': every
// gradient -- of y, and of x and s as inputs (the seed passes through) -- against finite
// differences.
constexpr const char* kArrayAccumulations = R"(
kernel acc(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad, s: ndarray<f64, 1> grad) {
  task owned parallel %i in [0, shape(x, 0)) {
    %zero = const 0 : i32
    %n = shape y 0 : i32
    %fi = cast %i : f64
    for %j in [%zero, %n) {
      %xold = load x[%i] : f64
      %yj = load y[%j] : f64
      %t = mul %yj, %yj : f64
      %u = mul %t, %fi : f64
      %v = sin %u : f64
      %xnew = add %xold, %v : f64
      store x[%i], %xnew
    }
  }
  task running serial %k in [0, shape(y, 0)) {
    %c0 = const 0 : i32
    %c1 = const 1 : i32
    %yk = load y[%k] : f64
    %sq = mul %yk, %yk : f64
    %sold = load s[%c0] : f64
    %snew = add %sq, %sold : f64
    store s[%c0], %snew
    %e = exp %yk : f64
    %s1 = load s[%c1] : f64
    %s1n = add %s1, %e : f64
    store s[%c1], %s1n
  }
}
)";

TEST(ReverseModeGradient, RunningSumsKeptInArrays) {
  HostValues v;
  v.arrays = {array_of(codegen::DType::kF64, {0.3, -0.7, 1.1}),
              array_of(codegen::DType::kF64, {0.4, -0.9, 0.6, 1.3}),
              array_of(codegen::DType::kF64, {0.25, -1.5})};
  v.scalars = {0, 0, 0};
  expect_gradients_match(kArrayAccumulations, v, 4);  // y's (x and s are outputs too)
  // x and s as inputs: d(w . outputs) / d input is w (each output is its input plus terms that
  // do not read it), so their gradients after the adjoint are their seeds, unchanged.
  auto k = codegen::parse(kArrayAccumulations);
  ASSERT_TRUE(k.ok());
  auto adj = codegen::make_adjoint(*k);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  HostValues a = adjoint_args(*k, v, random_seeds(*k, v, 5));
  const uint32_t x_grad = 3, s_grad = 5;  // after x, y, s: x_grad, y_grad, s_grad
  const std::vector<double> x_seed = a.arrays[x_grad].data, s_seed = a.arrays[s_grad].data;
  ASSERT_NE(x_seed, std::vector<double>(x_seed.size(), 0.0));
  ASSERT_TRUE(codegen::evaluate(*adj, a.view()).ok());
  EXPECT_EQ(a.arrays[x_grad].data, x_seed);
  EXPECT_EQ(a.arrays[s_grad].data, s_seed);
}

// A nonlinear recurrence kept in the array (written_before_read, autodiff/disjoint_access.h):
// e[0] = x[0]; e[i] = a x[i] + (1 - a) sin(e[i - 1]); then f[i] = e[i + 1] e[i] read after
// the loop. Reverse mode refused it ("both read and written"); x's and a's gradients against
// finite differences.
constexpr const char* kRecurrenceInTheArray = R"(
kernel rec(x: ndarray<f64, 1> grad, a: f64 grad, e: ndarray<f64, 1> grad, f: ndarray<f64, 1> grad) {
  task main serial %t in [0, 1) {
    %c0 = const 0 : i32
    %x0 = load x[%c0] : f64
    store e[%c0], %x0
    %one = const 1 : i32
    %n = shape x 0 : i32
    %av = arg a : f64
    %f1 = const 1.0 : f64
    %b = sub %f1, %av : f64
    for %i in [%one, %n) {
      %xi = load x[%i] : f64
      %im = sub %i, %one : i32
      %prev = load e[%im] : f64
      %sp = sin %prev : f64
      %u = mul %av, %xi : f64
      %w = mul %b, %sp : f64
      %v = add %u, %w : f64
      store e[%i], %v
    }
    %c1 = const 1 : i32
    %e1 = load e[%c1] : f64
    %e0 = load e[%c0] : f64
    %p = mul %e1, %e0 : f64
    store f[%c0], %p
  }
}
)";

TEST(ReverseModeGradient, RecurrenceKeptInTheArray) {
  HostValues v;
  v.arrays = {array_of(codegen::DType::kF64, {0.3, -0.7, 1.1, 0.45, -0.2}), HostArray(),
              HostArray(codegen::DType::kF64, {5}), HostArray(codegen::DType::kF64, {1})};
  v.scalars = {0, 0.35, 0, 0};
  expect_gradients_match(kRecurrenceInTheArray, v, 6);  // x's 5 and a
}

INSTANTIATE_TEST_SUITE_P(ThenOrElse, ReverseModeContact, ::testing::Bool());

}  // namespace
}  // namespace vkad::testing
