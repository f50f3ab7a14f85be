// While loops (issue 16): text form, verifier, CPU reference semantics, and reverse mode on the
// CPU evaluator against finite differences and closed forms. tests/gpu/while_loop_test.cpp
// runs the same kernels on the device.
#include <gtest/gtest.h>

#include <cmath>

#include "autodiff/reverse_mode.h"
#include "ir/builder.h"
#include "ir/loop_passes.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"
#include "support/ad_check.h"
#include "support/while_kernels.h"

namespace vkad::testing {
namespace {

using codegen::DType;
using codegen::HostArray;
using codegen::Kernel;

Kernel parse_ok(const std::string& text) {
  auto k = codegen::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return {};
  Status v = codegen::verify(*k);
  EXPECT_TRUE(v.ok()) << v.to_string();
  return *k;
}

HostArray array_of(DType t, std::vector<double> v) {
  HostArray a(t, {static_cast<uint32_t>(v.size())});
  a.data = std::move(v);
  return a;
}

TEST(WhileLoop, TextRoundTrips) {
  for (const WhileCase& c : while_cases()) {
    Kernel k = parse_ok(c.text);
    std::string once = codegen::print(k);
    auto again = codegen::parse(once);
    ASSERT_TRUE(again.ok()) << c.name << ": " << again.status().to_string() << "\n" << once;
    EXPECT_EQ(codegen::print(*again), once) << c.name;
  }
}

TEST(WhileLoop, BuilderMatchesText) {
  codegen::KernelBuilder kb("halve");
  codegen::Array x = kb.ndarray("x", DType::kF32, 1);
  codegen::Array n = kb.ndarray("n", DType::kI32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](codegen::Value i) {
    codegen::Local v = kb.local(x(i));
    codegen::Local c = kb.local(kb.i32(0));
    kb.while_([&] { return v.load() > 0.25; },
              [&] {
                v.store(v.load() * 0.5);
                c.store(c.load() + kb.i32(1));
              });
    n.store({i}, c.load());
  });
  Kernel k = kb.finish();
  ASSERT_TRUE(codegen::verify(k).ok()) << codegen::verify(k).to_string();
  HostArray xs = array_of(DType::kF32, {0.1, 0.3, 1.0, 7.5});
  HostArray ns(DType::kI32, {4});
  std::vector<codegen::HostArg> args = {codegen::HostArg::of(xs), codegen::HostArg::of(ns)};
  ASSERT_TRUE(codegen::evaluate(k, args).ok());
  for (size_t e = 0; e < 4; ++e) {
    int want = 0;
    for (float v = static_cast<float>(xs.data[e]); v > 0.25f; v *= 0.5f) ++want;
    EXPECT_EQ(ns.data[e], want) << "element " << e;
  }
  // The printed form parses back to the same kernel.
  auto again = codegen::parse(codegen::print(k));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(codegen::print(*again), codegen::print(k));
}

TEST(WhileLoop, VerifierRejectsImpureOrMistypedTests) {
  const std::string head = R"(kernel w(x: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
)";
  struct Bad {
    std::string body, expect;
  };
  std::vector<Bad> bad = {
      {R"(    while %k (%c) {
      %a = load_local %v : f32
      store_local %v, %a
      %c = const true : bool
    } do {
    })",
       "a while loop's test may compute and read, not store_local"},
      {R"(    while %k (%c) {
      %c = const 1 : i32
    } do {
    })",
       "the test is i32, expected bool"},
      {R"(    %c = const true : bool
    while %k (%c) {
      %z = const 0 : i32
    } do {
    })",
       "must be defined in the loop's test block"},
      {R"(    while %k (%c) {
      %c = const true : bool
    } do {
      %u = add %c, %c : bool
    })",
       "is used outside its scope"},
  };
  for (const Bad& b : bad) {
    auto k = codegen::parse(head + b.body + "\n  }\n}\n");
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    Status v = codegen::verify(*k);
    ASSERT_FALSE(v.ok()) << b.body;
    EXPECT_NE(v.message().find(b.expect), std::string::npos) << v.message();
  }
}

TEST(WhileLoop, ReferenceReportsALoopThatNeverEnds) {
  Kernel k = parse_ok(R"(kernel forever(x: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    while %k (%c) {
      %c = const true : bool
    } do {
    }
  }
})");
  HostArray xs(DType::kF32, {1});
  std::vector<codegen::HostArg> args = {codegen::HostArg::of(xs)};
  auto r = codegen::evaluate(k, args);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("while loop %"), std::string::npos) << r.status().to_string();
}

TEST(WhileLoop, AdjointNeedsABoundWithoutCounting) {
  Kernel k = parse_ok(kHalveUntilSmall);
  // Stripping the stated bound: make_adjoint must say which loop needs one.
  std::function<void(codegen::Block&)> strip = [&](codegen::Block& b) {
    for (codegen::Stmt& s : b.stmts) {
      if (s.op == codegen::Op::kWhile) s.has_cap = false;
      for (codegen::Block& c : s.blocks) strip(c);
    }
  };
  strip(k.tasks[0].body);
  auto a = codegen::make_adjoint(k);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("while %"), std::string::npos) << a.status().to_string();
  EXPECT_NE(a.status().message().find("max_trip"), std::string::npos) << a.status().to_string();
}

// Every while kernel's adjoint against finite differences on the reference.
TEST(WhileLoop, GradientsMatchFiniteDifferences) {
  for (const WhileCase& c : while_cases()) {
    Kernel k = parse_ok(c.text);
    HostValues base = c.args();
    auto r = check_gradients_cpu(k, base, 11);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().to_string();
    EXPECT_EQ(r->failure, "") << c.name << "\n"
                              << c.text << "\n"
                              << codegen::print(*codegen::make_adjoint(k));
    EXPECT_GE(r->checked, c.min_checked) << c.name << ": skipped " << r->skipped;
  }
}

// Newton's iteration for sqrt(a), run until converged (a data-dependent trip count): the
// adjoint of the iterates converges to d sqrt(a) / da = 1 / (2 sqrt(a)).
TEST(WhileLoop, NewtonSqrtGradientIsTheClosedForm) {
  Kernel k = parse_ok(kNewtonSqrt);
  HostValues v;
  // Not 1: Newton from 1 stops at once there (a flat piece: the program's derivative is 0).
  v.arrays = {array_of(DType::kF64, {0.25, 1.5, 2.0, 9.0, 30.0}), HostArray(DType::kF64, {5})};
  v.scalars = {0, 0};
  auto adj = codegen::make_adjoint(k);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  HostArray seed(DType::kF64, {5});
  for (double& s : seed.data) s = 1;
  HostValues a = adjoint_args(k, v, {HostArray{}, seed});
  auto view = a.view();
  auto r = codegen::evaluate(*adj, view);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (uint32_t f : r->error_flags) EXPECT_EQ(f, 0u);
  const HostArray& g = a.arrays[2];  // x_grad
  for (size_t e = 0; e < 5; ++e) {
    double x = v.arrays[0].data[e];
    // The last step's derivative is 1/(2 g) at the iterate before it, within ~1e-6 of sqrt.
    EXPECT_NEAR(g.data[e], 0.5 / std::sqrt(x), 1e-5 * 0.5 / std::sqrt(x)) << "x = " << x;
  }
}

// A launch past the stated bound reports an adstack overflow (never a silently wrong
// gradient).
TEST(WhileLoop, ExceedingMaxTripIsAnOverflow) {
  Kernel k = parse_ok(kHalveUntilSmall);
  HostValues v = while_cases()[0].args();
  v.arrays[0].data[0] = 1e30;  // ~100 halvings, past max_trip(64)
  auto adj = codegen::make_adjoint(k);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  HostValues a = adjoint_args(k, v, random_seeds(k, v, 3));
  auto view = a.view();
  auto r = codegen::evaluate(*adj, view);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->error_flags[0] & 0xff, runtime::kErrorAdstackOverflow);
}

}  // namespace
}  // namespace vkad::testing

namespace vkad::testing {
namespace {

// lavapipe's loop-pass model (loop_passes.h): a while loop's passes depend on data, so it is
// listed as unchecked and counted once.
TEST(WhileLoop, LoopPassesListItAsUnchecked) {
  auto k = codegen::parse(kHalveUntilSmall);
  ASSERT_TRUE(k.ok());
  codegen::LoopPassBound b = codegen::loop_pass_bound(*k, k->tasks[0], false, false);
  ASSERT_EQ(b.unchecked_loops.size(), 1u);
  EXPECT_EQ(b.idle, 1u);
}

}  // namespace
}  // namespace vkad::testing

namespace vkad::testing {
namespace {

TEST(BreakContinue, VerifierPlacesThem) {
  auto check = [](const std::string& body, const std::string& expect) {
    auto k = codegen::parse(R"(kernel j(x: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %z = const 0 : i32
    %n = const 4 : i32
)" + body + "\n  }\n}\n");
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    Status v = codegen::verify(*k);
    ASSERT_FALSE(v.ok()) << body;
    EXPECT_NE(v.message().find(expect), std::string::npos) << v.message();
  };
  check("    break", "break outside a for or while loop body");
  check("    %c = const true : bool\n    if %c {\n      continue\n    }",
        "continue outside a for or while loop body");
  check("    for %k in [%z, %n) {\n      break\n      %u = const 1 : i32\n    }",
        "break must be the last statement of its block");
  check("    while %k (%c) {\n      %c = const true : bool\n      break\n    } do {\n    }",
        "a while loop's test may compute and read, not break");
}

// The reference's semantics, against the same loops in C++: a for loop whose continue skips
// odd k and whose break leaves at the first k with k * x >= 3; a while loop likewise.
TEST(BreakContinue, ReferenceSemantics) {
  Kernel k = parse_ok(kJumpCounts);
  HostArray xs = array_of(DType::kF64, {0.1, 0.35, 0.5, 0.75, 1.2, 4.0});
  HostArray ys(DType::kI32, {6}), zs(DType::kI32, {6});
  std::vector<codegen::HostArg> args = {codegen::HostArg::of(xs), codegen::HostArg::of(ys),
                                        codegen::HostArg::of(zs)};
  ASSERT_TRUE(codegen::evaluate(k, args).ok());
  for (size_t e = 0; e < xs.size(); ++e) {
    int want = 0;
    for (int j = 0; j < 10; ++j) {
      if (j * xs.data[e] >= 3) break;
      if (j % 2 == 1) continue;
      ++want;
    }
    EXPECT_EQ(ys.data[e], want) << "x = " << xs.data[e];
    EXPECT_EQ(zs.data[e], want) << "x = " << xs.data[e];
  }
  // And the text form round-trips.
  auto again = codegen::parse(codegen::print(k));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(codegen::print(*again), codegen::print(k));
}

}  // namespace
}  // namespace vkad::testing
