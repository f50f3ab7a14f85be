// Limits of the IR front end: literals that do not fit their field or type, and nesting past
// kMaxNestingDepth, are errors with a position (never a silently changed value, never a stack
// overflow).
#include <gtest/gtest.h>

#include <string>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"
#include "spirv/compiler.h"

namespace vkad::codegen {
namespace {

void expect_parse_error(const std::string& text, const std::string& needle) {
  auto k = parse(text);
  ASSERT_FALSE(k.ok()) << "accepted:\n" << text << "\nas:\n" << print(*k);
  EXPECT_EQ(k.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(k.status().message().find(needle), std::string::npos)
      << k.status().message() << "\nwanted: " << needle;
}

std::string const_kernel(const std::string& literal, const std::string& type) {
  return "kernel c(y: ndarray<" + type +
         ", 1>) {\n  task t parallel %0 in [0, 1) {\n    %1 = const " + literal + " : " + type +
         "\n    store y[%0], %1\n  }\n}\n";
}

TEST(CodegenLimits, OutOfRangeFieldLiteralsAreRejected) {
  expect_parse_error("kernel k(x: ndarray<f32, 4294967297>) {\n}\n",
                     "line 1, column 26: a rank out of range (0 to 4294967295)");
  expect_parse_error(
      "kernel k(x: ndarray<f32, 1>) {\n  task t parallel %0 in [0, shape(x, 4294967296)) {\n  "
      "}\n}\n",
      "line 2, column 38: a dimension out of range");
  expect_parse_error(
      "kernel k(x: ndarray<f32, 1>) {\n  task t parallel %0 in [0, 4) {\n    %1 = shape x "
      "4294967296 : i32\n  }\n}\n",
      "line 3, column 18: a dimension out of range");
  expect_parse_error(
      "kernel k(x: ndarray<f32, 1>) {\n  task t parallel %0 in [0, 4) local_size 4294967360 {\n  "
      "}\n}\n",
      "line 2, column 43: a local size out of range");
  expect_parse_error(
      "kernel k(x: ndarray<f32, 1>) {\n  task t parallel %0 in [0, 99999999999999999999) {\n  "
      "}\n}\n",
      "an integer bound out of range");
}

TEST(CodegenLimits, ConstantsThatDoNotFitTheirTypeAreRejected) {
  expect_parse_error(const_kernel("inf", "u32"),
                     "line 3, column 16: constant inf is not exactly representable as u32");
  expect_parse_error(const_kernel("1.9", "i32"),
                     "constant 1.9 is not exactly representable as i32");
  expect_parse_error(const_kernel("1e19", "i32"),
                     "constant 1e19 is not exactly representable as i32");
  expect_parse_error(const_kernel("9.3e18", "i32"),
                     "not exactly representable");  // >= 2^63: UB before
  expect_parse_error(const_kernel("-1", "u32"),
                     "constant -1 is out of range for u32 (0 to 4294967295)");
  expect_parse_error(const_kernel("4294967296", "u32"), "out of range for u32");
  expect_parse_error(const_kernel("2147483648", "i32"), "out of range for i32");
  expect_parse_error(const_kernel("99999999999999999999", "i32"), "constant out of range");
  expect_parse_error(const_kernel("1e999", "f64"), "constant out of range");
  expect_parse_error(const_kernel("1e39", "f32"), "constant 1e39 is out of range for f32");
  expect_parse_error(const_kernel("2", "bool"), "constant 2 is not a bool");
  expect_parse_error(const_kernel("true", "i32"), "constant true is a bool, not i32");
}

TEST(CodegenLimits, ExactLiteralsStillParse) {
  struct Case {
    const char* literal;
    const char* type;
    int64_t i;
  } cases[] = {{"4294967295", "u32", 4294967295},
               {"-2147483648", "i32", INT32_MIN},
               {"3.0", "i32", 3},
               {"1e3", "u32", 1000},
               {"true", "bool", 1},
               {"0", "bool", 0}};
  for (const Case& c : cases) {
    auto k = parse(const_kernel(c.literal, c.type));
    ASSERT_TRUE(k.ok()) << c.literal << ": " << k.status().to_string();
    EXPECT_EQ(k->tasks[0].body.stmts[0].iimm, c.i) << c.literal;
  }
  auto f = parse(const_kernel("1e-50", "f32"));  // underflow rounds to 0, as floats do
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->tasks[0].body.stmts[0].fimm, 0.0);
}

// `depth` nested for loops around one store.
std::string nested_loops(uint32_t depth) {
  std::string t =
      "kernel deep(n: i32, y: ndarray<f32, 1>) {\n  task t parallel %0 in [0, 1) {\n"
      "    %1 = const 0 : i32\n    %2 = arg n : i32\n";
  for (uint32_t i = 0; i < depth; ++i) t += "for %l" + std::to_string(i) + " in [%1, %2) {\n";
  t += "%c = const 1.0 : f32\nstore y[%0], %c\n";
  for (uint32_t i = 0; i < depth; ++i) t += "}\n";
  return t + "  }\n}\n";
}

TEST(CodegenLimits, NestingPastTheLimitIsAParseErrorNotACrash) {
  auto at_limit = parse(nested_loops(kMaxNestingDepth));
  ASSERT_TRUE(at_limit.ok()) << at_limit.status().to_string();
  EXPECT_TRUE(verify(*at_limit).ok());
  // 16,000 levels overflowed the stack of the release build before the limit.
  for (uint32_t depth : {kMaxNestingDepth + 1, 16000u}) {
    expect_parse_error(nested_loops(depth), "for / if bodies nest deeper than " +
                                                std::to_string(kMaxNestingDepth) +
                                                " (kMaxNestingDepth)");
  }
  expect_parse_error(nested_loops(kMaxNestingDepth + 1),
                     "line " + std::to_string(5 + kMaxNestingDepth) + ", column 1:");
  std::string size = "1";
  for (int i = 0; i < 20000; ++i) size = "add(" + size;
  expect_parse_error(
      "kernel k(y: ndarray<f32, 1>) {\n  task t parallel %0 in [0, 1) {\n    %1 = stack_alloc "
      "cap(" +
          size + ") : f32\n  }\n}\n",
      "size expressions nest deeper than");
}

// The same through the builder's data structure, which the parser's limit does not see.
Kernel deep_kernel(uint32_t depth) {
  auto k = parse(nested_loops(1));
  EXPECT_TRUE(k.ok());
  Kernel out = *k;
  Block* body = &out.tasks[0].body;
  Stmt loop = body->stmts[2];  // the for
  Stmt inner = loop;
  for (uint32_t i = 1; i < depth; ++i) {
    Stmt wrap = loop;
    wrap.result = out.fresh();
    wrap.blocks[0].stmts.clear();
    wrap.blocks[0].stmts.push_back(std::move(inner));
    inner = std::move(wrap);
  }
  body->stmts[2] = std::move(inner);
  return out;
}

TEST(CodegenLimits, VerifierAndCompileCacheRejectDeepBuiltKernels) {
  Kernel ok = deep_kernel(kMaxNestingDepth);
  EXPECT_TRUE(verify(ok).ok()) << verify(ok).to_string();
  for (uint32_t depth : {kMaxNestingDepth + 1, 20000u}) {
    Kernel k = deep_kernel(depth);
    Status v = verify(k);
    EXPECT_EQ(v.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(v.message().find("kernel 'deep', task 't', statement `for %"), std::string::npos)
        << v.message();
    EXPECT_NE(v.message().find("nest deeper than"), std::string::npos) << v.message();
    CompileCache cache;
    EXPECT_EQ(cache.compile(k, Target::host()).status().code(), ErrorCode::kInvalidArgument);
  }
  // A size expression nested 20,000 deep (printing it would recurse as deep).
  Kernel k = deep_kernel(1);
  Stmt& loop = k.tasks[0].body.stmts[2];
  SizeExpr e = SizeExpr::scalar(0);
  for (int i = 0; i < 20000; ++i) {
    SizeExpr outer;
    outer.kind = SizeExpr::Kind::kAdd;
    outer.operands.push_back(std::move(e));  // (an initializer list would copy the subtree)
    outer.operands.push_back(SizeExpr::constant(1));
    e = std::move(outer);
  }
  loop.cap = std::move(e);
  loop.has_cap = true;
  Status v = verify(k);
  EXPECT_NE(v.message().find("size expression nests add/mul/max deeper than"), std::string::npos)
      << v.message();
}

// A kernel built in memory 200,000 levels deep (the parser refuses such text; a builder or a
// program editing Stmts does not) is copied, assigned, printed, evaluated, differentiated and
// destroyed in bounded stack: copy and destruction are iterative (base/tree_children.h), the
// printer bounded, the evaluator and reverse mode refuse it by name. This crashed (a stack
// overflow in has_jumps, the evaluator, and in Debug builds the recursive destructor).
TEST(CodegenLimits, DeepBuiltKernelsAreCopiedPrintedAndRefusedInBoundedStack) {
  constexpr uint32_t kDepth = 200000;
  Kernel k = deep_kernel(kDepth);
  Kernel copy = k;  // iterative copy
  uint32_t depth = 0;
  for (const Block* b = &copy.tasks[0].body; !b->stmts.empty();) {
    const Stmt& last = b->stmts.size() > 2 ? b->stmts[2] : b->stmts.back();
    if (last.blocks.empty()) break;
    ++depth;
    b = &last.blocks[0];
  }
  EXPECT_EQ(depth, kDepth) << "the copy has every level";
  Kernel assigned = deep_kernel(3);
  assigned = copy;            // copy assignment frees the old tree and copies the deep one
  assigned = deep_kernel(2);  // move assignment frees the deep tree iteratively
  const std::string text = print(k);
  EXPECT_NE(text.find("..."), std::string::npos);
  EXPECT_LT(text.size(), 200000u) << "printing stops at the verifier's depth";
  HostArray ya;
  ya.dtype = DType::kF32;
  ya.shape = {1};
  ya.data.assign(1, 0.0);
  const HostArg args[] = {HostArg::of(1.0), HostArg::of(ya)};
  auto e = evaluate(k, args);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("nest deeper than"), std::string::npos)
      << e.status().message();
  k.params[1].needs_grad = true;
  auto a = make_adjoint(k);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("nest deeper than"), std::string::npos)
      << a.status().message();
  // A size expression 200,000 deep: copied, compared and freed iteratively, printed bounded.
  SizeExpr deep = SizeExpr::scalar(0);
  for (uint32_t i = 0; i < kDepth; ++i) {
    SizeExpr outer;
    outer.kind = SizeExpr::Kind::kAdd;
    outer.operands.push_back(std::move(deep));
    outer.operands.push_back(SizeExpr::constant(1));
    deep = std::move(outer);
  }
  SizeExpr twin = deep;
  EXPECT_EQ(twin.operands.size(), 2u);
  EXPECT_LT(print_size(k, twin).size(), 10000u);
}

TEST(CodegenLimits, AdjointOfAKernelAtTheLimitIsAnErrorOrVerifies) {
  // Reverse mode may need deeper nesting than its forward kernel; past the limit it must
  // report that, never emit an unverifiable kernel.
  // A carried nonlinear local in the innermost loop, so every level is reversed with stacks.
  for (uint32_t depth : {kMaxNestingDepth - 1, kMaxNestingDepth}) {
    std::string t =
        "kernel deep(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
        "  task t parallel %0 in [0, 1) {\n    %1 = const 0 : i32\n    %2 = arg n : i32\n"
        "    %v = alloca : f32\n    %x = load x[%0] : f32\n    store_local %v, %x\n";
    for (uint32_t i = 0; i < depth; ++i) t += "for %l" + std::to_string(i) + " in [%1, %2) {\n";
    t += "%a = load_local %v : f32\n%s = sin %a : f32\nstore_local %v, %s\n";
    for (uint32_t i = 0; i < depth; ++i) t += "}\n";
    t += "    %o = load_local %v : f32\n    store y[%0], %o\n  }\n}\n";
    auto k = parse(t);
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    ASSERT_TRUE(verify(*k).ok());
    auto a = make_adjoint(*k);
    if (a.ok()) {
      EXPECT_TRUE(verify(*a).ok()) << verify(*a).to_string();
    } else {
      EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument) << a.status().to_string();
      EXPECT_NE(a.status().message().find("nest"), std::string::npos) << a.status().message();
    }
  }
}

TEST(CodegenLimits, AdjointOfTrivialDeepKernelVerifies) {
  auto k = parse(nested_loops(kMaxNestingDepth));
  ASSERT_TRUE(k.ok());
  auto a = make_adjoint(*k);
  if (a.ok()) {
    EXPECT_TRUE(verify(*a).ok()) << verify(*a).to_string();
  } else {
    EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument) << a.status().to_string();
  }
}

}  // namespace
}  // namespace vkad::codegen
