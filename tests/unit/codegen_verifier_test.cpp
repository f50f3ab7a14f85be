// The verifier: one test per error kind, each asserting the message names the kernel, the
// task, the statement (its printed form) and what is wrong.
#include <gtest/gtest.h>

#include "ir/builder.h"
#include "ir/text.h"
#include "ir/verifier.h"

namespace vkad::codegen {
namespace {

std::string verify_text(const std::string& body,
                        const std::string& params = "x: ndarray<f32, 1>, n: i32",
                        const Target& t = Target::host()) {
  std::string text =
      "kernel k(" + params + ") {\n  task main parallel %0 in [0, 4) {\n" + body + "  }\n}\n";
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return "parse failed";
  Status s = verify(*k, t);
  return s.ok() ? "ok" : s.message();
}

void expect_error(const std::string& got, const std::string& stmt, const std::string& what) {
  EXPECT_NE(got.find("kernel 'k', task 'main', statement `" + stmt + "`: "), std::string::npos)
      << got;
  EXPECT_NE(got.find(what), std::string::npos) << got;
}

TEST(CodegenVerifier, TypeMismatch) {
  expect_error(verify_text("    %1 = const 1.0 : f32\n    %2 = add %1, %0 : f32\n"),
               "%2 = add %1, %0 : f32", "type mismatch: operands are f32 and i32");
  expect_error(verify_text("    %1 = const 1.0 : f32\n    store x[%0], %0\n"), "store x[%0], %0",
               "ndarray 'x' holds f32, the value is i32");
  expect_error(verify_text("    %1 = sqrt %0 : i32\n"), "%1 = sqrt %0 : i32",
               "sqrt takes f32 or f64, got i32");
  expect_error(verify_text("    %1 = load x[%0] : f64\n"), "%1 = load x[%0] : f64",
               "the result is f64 but the operation yields f32");
  expect_error(verify_text("    if %0 {\n    }\n"), "if %0", "the condition is i32, expected bool");
}

TEST(CodegenVerifier, UseBeforeDefinition) {
  expect_error(verify_text("    %1 = add %2, %0 : i32\n    %2 = const 1 : i32\n"),
               "%1 = add %2, %0 : i32", "use of %2 before its definition");
  expect_error(verify_text("    %1 = add %7, %0 : i32\n"), "%1 = add %7, %0 : i32",
               "%7 is not defined");
}

// A value of the loop's body used after it:
// tests/kernels/verify_error_value_outside_its_scope.vkir.
TEST(CodegenVerifier, LoopIndexUsedOutsideItsScope) {
  std::string got = verify_text(
      "    %1 = const 0 : i32\n    for %2 in [%1, %0) {\n    }\n    %4 = add %2, %1 : i32\n");
  expect_error(got, "%4 = add %2, %1 : i32", "%2 is used outside its scope");
}

TEST(CodegenVerifier, StoreToReadOnlyParameter) {
  expect_error(
      verify_text("    %1 = const 1.0 : f32\n    store x[%0], %1\n", "x: ndarray<f32, 1> readonly"),
      "store x[%0], %1", "store to ndarray 'x', which is declared read-only");
  // A scalar parameter is read-only too (the builder can express the attempt).
  KernelBuilder kb("k");
  Scalar a = kb.scalar("a", DType::kF32);
  kb.parallel_for("main", 0, 4, [&](Value i) {
    Stmt s;
    s.op = Op::kStore;
    s.param = a.param();
    s.args = {i.id(), Value(a).id()};
    kb.emit(s);
  });
  Status st = verify(kb.finish());
  EXPECT_NE(st.message().find("store to scalar parameter 'a', which is read-only"),
            std::string::npos)
      << st.message();
}

TEST(CodegenVerifier, IndexRankMismatch) {
  expect_error(verify_text("    %1 = load x[%0] : f32\n", "x: ndarray<f32, 2>"),
               "%1 = load x[%0] : f32",
               "index rank mismatch: ndarray 'x' has rank 2, got 1 index(es)");
  expect_error(verify_text("    %1 = const 1.0 : f32\n    %2 = load x[%1] : f32\n"),
               "%2 = load x[%1] : f32", "index 0 is f32, expected i32 or u32");
}

TEST(CodegenVerifier, UnsupportedDtypeOnDevice) {
  Target t = Target::host();
  t.float64 = false;
  t.device_name = "llvmpipe-like";
  std::string got = verify_text("    %1 = const 1.0 : f64\n", "x: ndarray<f32, 1>", t);
  expect_error(got, "%1 = const 1.0 : f64",
               "dtype f64 is not supported on this device (llvmpipe-like");
  Target no_atomics = Target::host();
  no_atomics.atomic_float64_add = false;
  no_atomics.atomic_int64 = false;
  got = verify_text("    %1 = const 1.0 : f64\n    atomic_add y[%0], %1\n", "y: ndarray<f64, 1>",
                    no_atomics);
  expect_error(got, "atomic_add y[%0], %1", "atomic_add on f64 needs shaderBufferFloat64AtomicAdd");
}

TEST(CodegenVerifier, OperandKindsAndCounts) {
  expect_error(verify_text("    %1 = load_local %0 : i32\n"), "%1 = load_local %0 : i32",
               "%0 is a value, expected a local (alloca)");
  expect_error(verify_text("    %1 = alloca : f32\n    %2 = add %1, %1 : f32\n"),
               "%2 = add %1, %1 : f32", "%1 is a local (alloca), expected a value");
  expect_error(verify_text("    %1 = const 1 : i32\n    %1 = const 2 : i32\n"),
               "%1 = const 2 : i32", "%1 is defined twice");
}

TEST(CodegenVerifier, ParametersAndBounds) {
  auto k = parse("kernel k(x: ndarray<i32, 1> grad) {\n  task t parallel %0 in [0, 1) {\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  EXPECT_NE(verify(*k).message().find(
                "kernel 'k': parameter 'x' is marked grad, but only float ndarrays"),
            std::string::npos);
  k = parse("kernel k(a: f32) {\n  task t parallel %0 in [0, a) {\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  EXPECT_NE(verify(*k).message().find(
                "kernel 'k', task 't': range end uses 'a', which is not an i32 or u32 scalar"),
            std::string::npos)
      << verify(*k).message();
}

TEST(CodegenVerifier, NeverCrashesOnMalformedStatements) {
  // Hand-built statements with missing operands or blocks give errors, not crashes.
  Kernel k;
  k.name = "k";
  k.params.push_back({"x", ParamKind::kNdArray, DType::kF32, 1, false, false});
  Task t;
  t.name = "main";
  t.index = k.fresh();
  Stmt s;
  s.op = Op::kAdd;
  s.result = k.fresh();
  t.body.stmts.push_back(s);
  k.tasks.push_back(t);
  EXPECT_NE(verify(k).message().find("add takes 2 operand(s), got 0"), std::string::npos)
      << verify(k).message();
  k.tasks[0].body.stmts[0] = Stmt{};
  k.tasks[0].body.stmts[0].op = Op::kFor;
  k.tasks[0].body.stmts[0].result = 1;
  EXPECT_NE(verify(k).message().find("malformed blocks"), std::string::npos) << verify(k).message();
  k.tasks[0].body.stmts[0] = Stmt{};
  k.tasks[0].body.stmts[0].op = Op::kLoad;
  k.tasks[0].body.stmts[0].result = 1;
  k.tasks[0].body.stmts[0].param = 7;
  EXPECT_NE(verify(k).message().find("parameter 7 does not exist"), std::string::npos)
      << verify(k).message();
}

}  // namespace
}  // namespace vkad::codegen
