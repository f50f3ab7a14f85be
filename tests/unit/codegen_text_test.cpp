// The IR text form: round trips over every statement kind, parse errors with positions, and
// the builder producing what its text says.
#include <gtest/gtest.h>

#include "ir/builder.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"
#include "unit/codegen_kernels.h"

namespace vkad::codegen {
namespace {

TEST(CodegenText, RoundTripEveryStatementKind) {
  auto k = parse(testing::kEveryStatementKernel);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  std::string once = print(*k);
  EXPECT_EQ(once, testing::kEveryStatementKernel);
  auto again = parse(once);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(print(*again), once);
  Status v = verify(*k);
  EXPECT_TRUE(v.ok()) << v.to_string();
}

TEST(CodegenText, FloatConstantsRoundTripExactly) {
  const char* text = R"(kernel c(y: ndarray<f64, 1>) {
  task t parallel %0 in [0, 1) {
    %1 = const 0.1 : f64
    %2 = const 3.0 : f64
    %3 = const -inf : f64
    store y[%0], %1
  }
}
)";
  auto k = parse(text);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(k->tasks[0].body.stmts[0].fimm, 0.1);
  EXPECT_EQ(print(*k), text);
}

TEST(CodegenText, ParseErrorsGiveLineAndColumn) {
  struct Case {
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"kernel k(a: f32) {\n  task t parallel %0 in [0, 1) {\n    %1 = bogus %0 : f32\n  }\n}",
       "line 3, column 10: unknown operation, got 'bogus'"},
      {"kernel k(a: f33) {}", "line 1, column 13: expected a type"},
      {"kernel k(x: ndarray<f32, 1>) {\n  task t parallel %0 in [0, shape(y, 0)) {\n  }\n}",
       "line 2, column 35: expected the name of an ndarray parameter, got 'y'"},
      {"kernel k() {\n  task t parallel %0 in [0, 1) {\n    %1 = const 2 : i32\n",
       "expected '}', got end of text"},
      {"kernel k() {\n  task t parallel %0 in [0, 1) {\n    store_local %1 %2\n  }\n}",
       "line 3, column 20: expected ','"},
      {"kernel k() {\n  task t parallel %0 in [0, 1) {\n    %3 = store_local %1, %2\n  }\n}",
       "line 3, column 10: this operation has no result"},
  };
  for (const Case& c : cases) {
    auto k = parse(c.text);
    ASSERT_FALSE(k.ok()) << c.text;
    EXPECT_NE(k.status().message().find(c.expect), std::string::npos)
        << "got: " << k.status().message() << "\nwant: " << c.expect;
  }
}

// Source locations (Stmt::loc) round-trip, print_stmt quotes them, and the builder stamps
// the location set when a statement was appended.
TEST(CodegenText, SourceLocationsRoundTrip) {
  const char* text = R"(kernel at(x: ndarray<f32, 1>) {
  task t parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32 @"sim.py:2:9"
    %2 = const 0 : i32
    %3 = const 3 : i32 @"sim.py:3:5"
    for %4 in [%2, %3) @"sim.py:3:5" {
      %5 = gt %1, %1 : bool @"sim.py:4:9"
      if %5 @"sim.py:4:9" {
        break @"sim.py:5:13"
      }
    }
    store x[%0], %1 @"sim.py:6:5"
  }
}
)";
  auto k = parse(text);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(print(*k), text);
  const Stmt& load = k->tasks[0].body.stmts[0];
  EXPECT_EQ(source_location(load.loc), "sim.py:2:9");
  EXPECT_EQ(k->tasks[0].body.stmts[1].loc, 0u);
  EXPECT_EQ(print_stmt(*k, k->tasks[0].body.stmts.back()), "store x[%0], %1 @\"sim.py:6:5\"");
  EXPECT_EQ(intern_source_location("sim.py:2:9"), load.loc);  // interned once
  EXPECT_EQ(intern_source_location(""), 0u);
  EXPECT_EQ(source_location(intern_source_location("a\"b\\c\nd")), "a'b'c d");

  auto bad = parse(
      "kernel k(x: ndarray<f32, 1>) {\n  task t parallel %0 in [0, 1) {\n"
      "    %1 = load x[%0] : f32 @sim\n  }\n}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 3, column 28: expected a quoted source location"),
            std::string::npos)
      << bad.status().to_string();

  KernelBuilder kb("stamped");
  Array x = kb.ndarray("x", DType::kF32, 1);
  kb.parallel_for("t", 0, x.dim(0), [&](Value i) {
    kb.set_location("model.dsl:7:1");
    Value v = x.load({i});
    kb.set_location("");
    x.store({i}, v * 2.0);
  });
  Kernel built = kb.finish();
  const auto& body = built.tasks[0].body.stmts;
  ASSERT_GE(body.size(), 3u);
  EXPECT_EQ(source_location(body[0].loc), "model.dsl:7:1") << print(built);
  EXPECT_EQ(body.back().loc, 0u) << print(built);
}

// print and assert (issue 56): their text round-trips, and the verifier checks their operands.
TEST(CodegenText, PrintAndAssertRoundTripAndVerify) {
  const char* text = R"(kernel p(x: ndarray<f32, 1>) {
  task t parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    print "x[{}] = {}", %0, %1 @"sim.py:3:9"
    %2 = gt %1, %1 : bool
    assert "x grows", %2, %1
    print "done"
  }
}
)";
  auto k = parse(text);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(print(*k), text);
  EXPECT_TRUE(verify(*k).ok()) << verify(*k).to_string();
  EXPECT_EQ(source_location(static_cast<uint32_t>(k->tasks[0].body.stmts[1].iimm)), "x[{}] = {}");

  auto not_bool = parse(R"(kernel p(x: ndarray<f32, 1>) {
  task t parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    assert "x", %1
  }
}
)");
  ASSERT_TRUE(not_bool.ok());
  Status v = verify(*not_bool);
  EXPECT_NE(v.message().find("assert's condition is a bool, got f32"), std::string::npos)
      << v.to_string();
  std::string many =
      "kernel p(x: ndarray<f32, 1>) {\n  task t parallel %0 in [0, 1) {\n"
      "    print \"many\"";
  for (int i = 0; i < 17; ++i) many += ", %0";
  many += "\n  }\n}\n";
  auto too_many = parse(many);
  ASSERT_TRUE(too_many.ok()) << too_many.status().to_string();
  v = verify(*too_many);
  EXPECT_NE(v.message().find("print records at most 16 values, got 17"), std::string::npos)
      << v.to_string();
  EXPECT_FALSE(
      parse("kernel p() {\n  task t parallel %0 in [0, 1) {\n    print %0\n  }\n}\n").ok());
}

TEST(CodegenBuilder, BuildsWhatItsTextSays) {
  KernelBuilder kb("saxpy");
  Scalar a = kb.scalar("a", DType::kF32);
  Array x = kb.ndarray("x", DType::kF32, 1, {.read_only = true});
  Array y = kb.ndarray("y", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { y.store({i}, a * x(i) + y(i)); });
  Kernel k = kb.finish();
  ASSERT_TRUE(verify(k).ok()) << verify(k).to_string();
  // C++ leaves the order of operand evaluation open, so the statement order may vary; the
  // computation may not.
  std::string text = print(k);
  EXPECT_NE(text.find("kernel saxpy(a: f32, x: ndarray<f32, 1> readonly, y: ndarray<f32, 1>)"),
            std::string::npos);
  EXPECT_NE(text.find("task main parallel %0 in [0, shape(x, 0))"), std::string::npos);
  HostArray xs(DType::kF32, {3}), ys(DType::kF32, {3});
  xs.data = {1, 2, 3};
  ys.data = {10, 20, 30};
  std::vector<HostArg> args = {HostArg::of(2.0), HostArg::of(xs), HostArg::of(ys)};
  auto r = evaluate(k, args);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(ys.data, (std::vector<double>{12, 24, 36}));
}

TEST(CodegenBuilder, LoopsBranchesAndLocals) {
  KernelBuilder kb("tri");
  Scalar n = kb.scalar("n", DType::kI32);
  Array out = kb.ndarray("out", DType::kF32, 1);
  kb.parallel_for("main", 0, n, [&](Value i) {
    Local acc = kb.local(kb.f32(0));
    kb.for_range(kb.i32(0), i, [&](Value j) {
      kb.if_(
          mod(j, kb.i32(2)) < kb.i32(1), [&] { acc.store(acc.load() + cast(j, DType::kF32)); },
          [&] { acc.store(acc.load() - 1.0); });
    });
    out.store({i}, acc.load());
  });
  Kernel k = kb.finish();
  Status v = verify(k);
  ASSERT_TRUE(v.ok()) << v.to_string();
  auto re = parse(print(k));
  ASSERT_TRUE(re.ok()) << re.status().to_string();
  EXPECT_EQ(print(*re), print(k));
}

}  // namespace
}  // namespace vkad::codegen
