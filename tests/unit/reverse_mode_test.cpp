// Reverse mode, text in / CHECK-style text out (no device): which stacks the pass makes, how
// loads and stores of differentiable ndarrays turn around, and the kernels it rejects.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <sstream>

#include "codegen/builder.h"
#include "codegen/reverse_mode.h"
#include "codegen/text.h"
#include "codegen/verifier.h"

namespace vkad::codegen {
namespace {

// The adjoint's text, after checking that it verifies.
std::string adjoint_text(const std::string& forward) {
  auto k = parse(forward);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return "";
  auto a = make_adjoint(*k);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  if (!a.ok()) return a.status().message();
  Status v = verify(*a);
  EXPECT_TRUE(v.ok()) << v.to_string() << "\n" << print(*a);
  return print(*a);
}

// CHECK: each pattern appears, in order. CHECK-NOT: handled by the callers with find().
void check_in_order(const std::string& text, const std::vector<std::string>& patterns) {
  size_t at = 0;
  for (const std::string& p : patterns) {
    size_t found = text.find(p, at);
    ASSERT_NE(found, std::string::npos) << "CHECK: '" << p << "' not found after offset " << at << " in\n" << text;
    at = found + p.size();
  }
}

const char* kHeader = "kernel k(n: i32, x: ndarray<f32, 1> grad, w: ndarray<f32, 1>, y: ndarray<f32, 1> grad) {\n"
                      "  task main parallel %i in [0, shape(x, 0)) {\n";

TEST(ReverseModePass, StraightLineLoadsBecomeAtomicAddsAndStoresReadSeeds) {
  std::string t = adjoint_text(std::string(kHeader) +
                               "    %x = load x[%i] : f32\n    %s = sin %x : f32\n    store y[%i], %s\n  }\n}\n");
  check_in_order(t, {"kernel k_adjoint(n: i32, x: ndarray<f32, 1>, w: ndarray<f32, 1>, y: ndarray<f32, 1>, "
                     "x_grad: ndarray<f32, 1>, y_grad: ndarray<f32, 1>)",
                     "task main_adjoint parallel", "= load x[", "= sin ",  // replay
                     "= load y_grad[",                                     // the seed
                     "= cos ",                                             // d sin
                     "atomic_add x_grad["});
  EXPECT_EQ(t.find("stack_alloc"), std::string::npos) << "no loop, no stack";
  EXPECT_EQ(t.find("store y["), std::string::npos) << "the adjoint writes no primal output";
}

TEST(ReverseModePass, LinearAccumulationNeedsNoStack) {
  std::string t = adjoint_text(std::string(kHeader) +
                               "    %acc = alloca : f32\n    %z = const 0 : i32\n    %n = arg n : i32\n"
                               "    for %k in [%z, %n) {\n      %xv = load x[%k] : f32\n      %wv = load w[%k] : f32\n"
                               "      %p = mul %xv, %wv : f32\n      %a = load_local %acc : f32\n"
                               "      %s = add %a, %p : f32\n      store_local %acc, %s\n    }\n"
                               "    %o = load_local %acc : f32\n    store y[%i], %o\n  }\n}\n");
  EXPECT_EQ(t.find("stack_alloc"), std::string::npos) << t;
  check_in_order(t, {"for ", "for ", "atomic_add x_grad["});
}

TEST(ReverseModePass, NonlinearRecurrenceCheckpointsTheCarriedLocal) {
  std::string t = adjoint_text(std::string(kHeader) +
                               "    %v = alloca : f32\n    %x = load x[%i] : f32\n    store_local %v, %x\n"
                               "    %z = const 0 : i32\n    %n = arg n : i32\n"
                               "    for %k in [%z, %n) {\n      %a = load_local %v : f32\n      %s = sin %a : f32\n"
                               "      store_local %v, %s\n    }\n"
                               "    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n");
  check_in_order(t, {"= stack_alloc cap(n) : f32",  // one stack, sized by the loop's trip count
                     "for ", "stack_push ",          // forward: checkpoint each iteration
                     "for ", "= stack_top ",         // reverse: restore, recompute, backprop
                     "= cos ", "stack_pop ", "atomic_add x_grad["});
}

TEST(ReverseModePass, NestedLoopStacksAreSizedPerLoopNotByTheProduct) {
  std::string t = adjoint_text(std::string(kHeader) +
                               "    %v = alloca : f32\n    %x = load x[%i] : f32\n    store_local %v, %x\n"
                               "    %z = const 0 : i32\n    %n = arg n : i32\n    %m = shape w 0 : i32\n"
                               "    for %k in [%z, %n) {\n      for %l in [%k, %m) {\n"
                               "        %a = load_local %v : f32\n        %s = sin %a : f32\n        store_local %v, %s\n"
                               "      }\n    }\n"
                               "    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n");
  check_in_order(t, {"= stack_alloc cap(n) : f32", "= stack_alloc cap(shape(w, 0)) : f32"});
}

TEST(ReverseModePass, CarriedIntegerIndexGoesOnAnIntegerStack) {
  std::string t;
  t = adjoint_text(std::string(kHeader) +
                   "    %v = alloca : f32\n    %j = alloca : i32\n    %x = load x[%i] : f32\n"
                   "    store_local %v, %x\n    %z = const 0 : i32\n    %n = arg n : i32\n    %one = const 1 : i32\n"
                   "    for %k in [%z, %n) {\n      %jv = load_local %j : i32\n      %wv = load w[%jv] : f32\n"
                   "      %a = load_local %v : f32\n      %p = mul %a, %wv : f32\n      store_local %v, %p\n"
                   "      %jn = add %jv, %one : i32\n      store_local %j, %jn\n    }\n"
                   "    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n");
  check_in_order(t, {"= stack_alloc cap(n) : i32"});
}

// Found by the fuzzer (seeds 49, 114): the index of a loop with a stated max_trip bounds the
// loops nested in it, so a triangular inner loop needs no max_trip of its own.
TEST(ReverseModePass, TriangularLoopInsideAStatedBoundLoopIsBounded) {
  std::string t = adjoint_text(
      "kernel k(c: ndarray<i32, 1>, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task main parallel %i in [0, shape(x, 0)) {\n"
      "    %v = alloca : f32\n    %x = load x[%i] : f32\n    store_local %v, %x\n"
      "    %z = const 0 : i32\n    %three = const 3 : i32\n    %n = load c[%i] : i32\n"
      "    for %k in [%z, %n) max_trip(4) {\n      %one = const 1 : i32\n      %e = add %k, %one : i32\n"
      "      for %l in [%z, %e) {\n        %a = load_local %v : f32\n        %s = sin %a : f32\n"
      "        store_local %v, %s\n      }\n    }\n"
      "    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n");
  check_in_order(t, {"= stack_alloc cap(4) : f32", "= stack_alloc cap("});
}

// make_adjoint verifies its result against the target: a forward kernel that only reads an
// f64 gradient array verifies on a device without f64 atomics, but its adjoint atomically adds
// into x_grad, which that device cannot do: an error naming the statement, not IR that fails
// later in compile().
TEST(ReverseModePass, AdjointIsVerifiedAgainstTheTarget) {
  auto k = parse("kernel k(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {\n"
                 "  task main parallel %i in [0, shape(x, 0)) {\n"
                 "    %x = load x[%i] : f64\n    %s = sin %x : f64\n    store y[%i], %s\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  Target no_f64_atomics;
  no_f64_atomics.device_name = "test device";
  no_f64_atomics.atomic_float64_add = false;
  no_f64_atomics.atomic_int64 = false;
  ASSERT_TRUE(verify(*k, no_f64_atomics).ok());
  auto a = make_adjoint(*k, no_f64_atomics);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::kUnsupported) << a.status().to_string();
  EXPECT_NE(a.status().message().find("the adjoint of kernel 'k'"), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("statement `atomic_add x_grad[%"), std::string::npos) << a.status().message();
}

// An adjoint that does not verify is reported as vkad's own bug, naming the statement.
TEST(ReverseModePass, VerifyAdjointReportsABrokenAdjointAsInternal) {
  auto k = parse(std::string(kHeader) + "    %x = load x[%i] : f32\n    %s = sin %x : f32\n    store y[%i], %s\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  auto a = make_adjoint(*k);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(verify_adjoint(*k, *a, {}).ok());
  // Break it: drop the replayed load, so the sin that follows uses an undefined id.
  Kernel broken = *a;
  auto& body = broken.tasks[0].body.stmts;
  auto load = std::find_if(body.begin(), body.end(), [](const Stmt& s) { return s.op == Op::kLoad; });
  ASSERT_NE(load, body.end());
  body.erase(load);
  Status st = verify_adjoint(*k, broken, {});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kInternal) << st.to_string();
  EXPECT_NE(st.message().find("reverse mode of kernel 'k' produced an adjoint that does not verify"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("statement `%"), std::string::npos) << st.message();
}

size_t count_stmts(const Block& b) {
  size_t n = 0;
  for (const Stmt& s : b.stmts) {
    ++n;
    for (const Block& c : s.blocks) n += count_stmts(c);
  }
  return n;
}

// `depth` ifs nested in each other, each on the carried value and updating it nonlinearly.
Kernel nested_ifs(int depth) {
  std::string t = "kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
                  "  task main parallel %i in [0, shape(x, 0)) {\n"
                  "    %v = alloca : f32\n    %x = load x[%i] : f32\n    store_local %v, %x\n"
                  "    %c = const -0.5 : f32\n";
  for (int d = 0; d < depth; ++d) {
    std::string n = std::to_string(d);
    t += "    %a" + n + " = load_local %v : f32\n    %p" + n + " = gt %a" + n + ", %c : bool\n    if %p" + n + " {\n" +
         "    %s" + n + " = sin %a" + n + " : f32\n    store_local %v, %s" + n + "\n";
  }
  for (int d = 0; d < depth; ++d) t += "    }\n";
  t += "    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n";
  auto k = parse(t);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : Kernel{};
}

// The same through the builder, which (unlike the parser) does not stop at the nesting limit:
// how a DSL could hand reverse mode a kernel deeper than the verifier allows.
Kernel nested_ifs_built(int depth) {
  KernelBuilder kb("k");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local v = kb.local(x(i));
    std::function<void(int)> nest = [&](int d) {
      if (d == depth) return;
      kb.if_(v.load() > -0.5, [&] {
        v.store(sin(v.load()));
        nest(d + 1);
      });
    };
    nest(0);
    y.store({i}, v.load());
  });
  return kb.finish();
}

// A hostile kernel of 160 nested ifs once gave a 26,426-line adjoint (each branch's reverse
// replayed its whole subtree): the adjoint's size must grow linearly with the nesting.
TEST(ReverseModePass, AdjointOfNestedIfsGrowsLinearly) {
  static_assert(kMaxAdjointNesting >= 60);
  auto a30 = make_adjoint(nested_ifs(30));
  auto a60 = make_adjoint(nested_ifs(60));
  ASSERT_TRUE(a30.ok()) << a30.status().to_string();
  ASSERT_TRUE(a60.ok()) << a60.status().to_string();
  size_t n30 = count_stmts(a30->tasks[0].body), n60 = count_stmts(a60->tasks[0].body);
  EXPECT_LT(static_cast<double>(n60), 2.5 * static_cast<double>(n30)) << n30 << " statements at depth 30, " << n60 << " at 60";
  EXPECT_LT(n60, 10u * count_stmts(nested_ifs(60).tasks[0].body)) << "a constant factor over the forward";
}

TEST(ReverseModePass, RejectsNestingDeeperThanTheLimitNamingTheStatement) {
  EXPECT_TRUE(make_adjoint(nested_ifs(kMaxAdjointNesting)).ok());
  Kernel k = nested_ifs_built(kMaxAdjointNesting + 1);
  const Stmt* innermost = nullptr;
  for (const Block* b = &k.tasks[0].body; b;) {
    const Block* next = nullptr;
    for (const Stmt& s : b->stmts) {
      if (s.op == Op::kIf) innermost = &s, next = &s.blocks[0];
    }
    b = next;
  }
  ASSERT_NE(innermost, nullptr);
  auto a = make_adjoint(k);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("statement `" + print_stmt(k, *innermost) + "`"), std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find(std::to_string(kMaxAdjointNesting)), std::string::npos)
      << a.status().message();
}

TEST(ReverseModePass, RejectsAnArrayBothReadAndWritten) {
  auto k = parse("kernel k(x: ndarray<f32, 1> grad) {\n  task main parallel %i in [0, shape(x, 0)) {\n"
                 "    %v = load x[%i] : f32\n    %s = sin %v : f32\n    store x[%i], %s\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  auto a = make_adjoint(*k);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("reverse mode of kernel 'k', task 'main', statement `store x[%"), std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find("ndarray 'x' (grad) is both read and written in task 'main'"), std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find("move the stores into an earlier task than the reads"), std::string::npos)
      << a.status().message();
}

// An ndarray read and written by one kernel: accepted where the adjoint's replay provably reads
// what the forward read; rejected otherwise, naming the array, the task and why.
Result<Kernel> adjoint_of(const std::string& text) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return k.status();
  return make_adjoint(*k);
}

TEST(ReverseModePass, AcceptsAGradArrayWrittenInAnEarlierTaskThanItsReads) {
  auto a = adjoint_of(
      "kernel k(x: ndarray<f32, 1> grad, t: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task first parallel %i in [0, shape(x, 0)) {\n"
      "    %v = load x[%i] : f32\n    %s = sin %v : f32\n    store t[%i], %s\n  }\n"
      "  task second parallel %j in [0, shape(x, 0)) {\n"
      "    %w = load t[%j] : f32\n    %m = mul %w, %w : f32\n    store y[%j], %m\n  }\n}\n");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::string text = print(*a);
  // second's adjoint (adds into t_grad) comes before first's (reads t_grad as its seed).
  check_in_order(text, {"task second_adjoint", "atomic_add t_grad[", "task first_adjoint", "= load t_grad["});
}

TEST(ReverseModePass, RejectsAGradArrayReadBeforeALaterTaskWritesIt) {
  auto a = adjoint_of(
      "kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task first parallel %i in [0, shape(x, 0)) {\n"
      "    %v = load x[%i] : f32\n    store y[%i], %v\n  }\n"
      "  task second parallel %j in [0, shape(x, 0)) {\n"
      "    %c = const 1 : f32\n    store x[%j], %c\n  }\n}\n");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("task 'second', statement `store x["), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("ndarray 'x' (grad) is read in task 'first' and written by the later task 'second'"),
            std::string::npos)
      << a.status().message();
}

TEST(ReverseModePass, AcceptsAScratchArrayWhoseReadsTheReverseSweepDoesNotNeed) {
  // A counter without gradient, read and written in one task: nothing the reverse needs.
  auto a = adjoint_of(
      "kernel k(cnt: ndarray<i32, 1>, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task main parallel %i in [0, shape(x, 0)) {\n"
      "    %z = const 0 : i32\n    %one = const 1 : i32\n"
      "    %c = load cnt[%z] : i32\n    %c1 = add %c, %one : i32\n    store cnt[%z], %c1\n"
      "    %v = load x[%i] : f32\n    %s = sin %v : f32\n    store y[%i], %s\n  }\n}\n");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(print(*a).find("store cnt["), std::string::npos) << "the adjoint writes no primal ndarray";
}

TEST(ReverseModePass, RejectsAScratchArrayWhoseReadTheReverseSweepNeeds) {
  // idx is read and rewritten in one task, and used as an index of a differentiable load.
  auto a = adjoint_of(
      "kernel k(idx: ndarray<i32, 1>, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task main parallel %i in [0, shape(x, 0)) {\n"
      "    %j = load idx[%i] : i32\n    %v = load x[%j] : f32\n    store y[%i], %v\n"
      "    %z = const 0 : i32\n    store idx[%i], %z\n  }\n}\n");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("task 'main', statement `%"), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("= load idx["), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("ndarray 'idx' is read and written in task 'main'"), std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find("the reverse sweep needs the value this load read"), std::string::npos)
      << a.status().message();
}

TEST(ReverseModePass, AcceptsAnIndexTableFilledByAnEarlierTask) {
  auto a = adjoint_of(
      "kernel k(idx: ndarray<i32, 1>, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task fill parallel %i in [0, shape(x, 0)) {\n"
      "    %n = shape x 0 : i32\n    %one = const 1 : i32\n    %a = add %i, %one : i32\n"
      "    %m = mod %a, %n : i32\n    store idx[%i], %m\n  }\n"
      "  task use parallel %k in [0, shape(x, 0)) {\n"
      "    %j = load idx[%k] : i32\n    %v = load x[%j] : f32\n    %s = sin %v : f32\n    store y[%k], %s\n  }\n}\n");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
}

TEST(ReverseModePass, RejectsDifferentiableValuesCarriedThroughAnArrayWithoutGradient) {
  auto a = adjoint_of(
      "kernel k(x: ndarray<f32, 1> grad, t: ndarray<f32, 1>, y: ndarray<f32, 1> grad) {\n"
      "  task first parallel %i in [0, shape(x, 0)) {\n"
      "    %v = load x[%i] : f32\n    store t[%i], %v\n  }\n"
      "  task second parallel %j in [0, shape(x, 0)) {\n"
      "    %w = load t[%j] : f32\n    store y[%j], %w\n  }\n}\n");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("task 'first', statement `store t["), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("ndarray 't' has no gradient"), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("Mark it grad"), std::string::npos) << a.status().message();
}

TEST(ReverseModePass, RejectsAnUnboundableLoopNamingIt) {
  auto k = parse("kernel k(c: ndarray<i32, 1>, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
                 "  task main parallel %i in [0, shape(x, 0)) {\n"
                 "    %v = alloca : f32\n    %x = load x[%i] : f32\n    store_local %v, %x\n"
                 "    %z = const 0 : i32\n    %n = load c[%i] : i32\n"
                 "    for %k in [%z, %n) {\n      %a = load_local %v : f32\n      %s = sin %a : f32\n"
                 "      store_local %v, %s\n    }\n    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  auto a = make_adjoint(*k);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("statement `for %"), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("max_trip"), std::string::npos) << a.status().message();
}

TEST(ReverseModePass, RejectsStackStatementsInTheForwardKernel) {
  auto k = parse("kernel k(n: i32) {\n  task main parallel %i in [0, 1) {\n    %s = stack_alloc cap(n) : f32\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  auto a = make_adjoint(*k);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("adstack statements cannot be differentiated"), std::string::npos);
}

}  // namespace
}  // namespace vkad::codegen
