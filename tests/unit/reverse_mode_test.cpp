// Reverse mode without a device: what needs more than a kernel file with CHECK lines (targets,
// built kernels, counts, the owned-array analysis, the CPU evaluator, the emitted modules). The
// text-in / CHECK-out cases (which stacks the pass makes, how loads and stores of differentiable
// ndarrays turn around, the kernels it rejects) are tests/kernels/adjoint*.vkir, run by
// tests/unit/vkir_check_test.cpp.
#include "autodiff/reverse_mode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <sstream>
#include <unordered_set>

#include "abi/spirv_tools.h"
#include "ir/builder.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "ir/walk.h"
#include "reference/cpu_eval.h"
#include "spirv/compiler.h"
#include "support/ad_regressions.h"

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

const char* kHeader =
    "kernel k(n: i32, x: ndarray<f32, 1> grad, w: ndarray<f32, 1>, y: ndarray<f32, 1> grad) {\n"
    "  task main parallel %i in [0, shape(x, 0)) {\n";

// Issue 13: the training example's adjoint checkpointed its positions too, doubling its heap.
// A local whose needed loads all come from the replay that pushes another local's checkpoint
// (not from an iteration's own reverse sweep) needs no stack: one stack here (the velocity).
TEST(ReverseModePass, LinearlyCarriedLocalIsNotCheckpointed) {
  std::string t = adjoint_text(testing::kLinearlyCarriedPosition);
  size_t stacks = 0;
  for (size_t at = t.find("stack_alloc"); at != std::string::npos;
       at = t.find("stack_alloc", at + 1))
    ++stacks;
  EXPECT_EQ(stacks, 1u) << t;
  // The swap regressions still checkpoint both swapped locals.
  for (const char* k : {testing::kSwappedFloatLocals, testing::kSwappedIntegerIndexLocals}) {
    std::string s = adjoint_text(k);
    size_t n = 0;
    for (size_t at = s.find("stack_alloc"); at != std::string::npos;
         at = s.find("stack_alloc", at + 1))
      ++n;
    EXPECT_GE(n, 2u) << s;
  }
}

// make_adjoint verifies its result against the target: a forward kernel that only reads an
// f64 gradient array verifies on a device without f64 atomics, but its adjoint atomically adds
// into x_grad (a gather: x[%i + 1] is not owned), which that device cannot do: an error naming
// the statement, not IR that fails later in compile().
TEST(ReverseModePass, AdjointIsVerifiedAgainstTheTarget) {
  auto k = parse(
      "kernel k(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {\n"
      "  task main parallel %i in [0, shape(y, 0)) {\n"
      "    %one = const 1 : i32\n    %j = add %i, %one : i32\n"
      "    %x = load x[%j] : f64\n    %s = sin %x : f64\n    store y[%i], %s\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  Target no_f64_atomics = Target::host();
  no_f64_atomics.device_name = "test device";
  no_f64_atomics.atomic_float64_add = false;
  no_f64_atomics.atomic_int64 = false;
  ASSERT_TRUE(verify(*k, no_f64_atomics).ok());
  auto a = make_adjoint(*k, no_f64_atomics);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), ErrorCode::kUnsupported) << a.status().to_string();
  EXPECT_NE(a.status().message().find("the adjoint of kernel 'k'"), std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find("statement `atomic_add x_grad[%"), std::string::npos)
      << a.status().message();
}

// An adjoint that does not verify is reported as vkad's own bug, naming the statement.
TEST(ReverseModePass, VerifyAdjointReportsABrokenAdjointAsInternal) {
  auto k = parse(std::string(kHeader) +
                 "    %x = load x[%i] : f32\n    %s = sin %x : f32\n    store y[%i], %s\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  auto a = make_adjoint(*k);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(verify_adjoint(*k, *a, {}).ok());
  // Break it: drop the replayed load, so the sin that follows uses an undefined id.
  Kernel broken = *a;
  auto& body = broken.tasks[0].body.stmts;
  auto load =
      std::find_if(body.begin(), body.end(), [](const Stmt& s) { return s.op == Op::kLoad; });
  ASSERT_NE(load, body.end());
  body.erase(load);
  Status st = verify_adjoint(*k, broken, {});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kInternal) << st.to_string();
  EXPECT_NE(
      st.message().find("reverse mode of kernel 'k' produced an adjoint that does not verify"),
      std::string::npos)
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
  std::string t =
      "kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task main parallel %i in [0, shape(x, 0)) {\n"
      "    %v = alloca : f32\n    %x = load x[%i] : f32\n    store_local %v, %x\n"
      "    %c = const -0.5 : f32\n";
  for (int d = 0; d < depth; ++d) {
    std::string n = std::to_string(d);
    t += "    %a" + n + " = load_local %v : f32\n    %p" + n + " = gt %a" + n +
         ", %c : bool\n    if %p" + n + " {\n" + "    %s" + n + " = sin %a" + n +
         " : f32\n    store_local %v, %s" + n + "\n";
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
  EXPECT_LT(static_cast<double>(n60), 2.5 * static_cast<double>(n30))
      << n30 << " statements at depth 30, " << n60 << " at 60";
  EXPECT_LT(n60, 10u * count_stmts(nested_ifs(60).tasks[0].body))
      << "a constant factor over the forward";
}

// A second write of an element would hand the overwritten value the element's seed too (the
// adjoint reads the seed without clearing it): y[i] = x * x; y[i] = sin(x) gave 2x + cos x.
// Refused, naming the store and the earlier write; writes apart by constant indices (a vector's
// components), a store before atomic adds, and a loop's store at its own index stay accepted.
TEST(ReverseModePass, RefusesAStoreOverAnEarlierWriteOfTheSameElement) {
  auto refused = [](const std::string& body, const std::string& what) {
    auto k = parse(std::string("kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad, "
                               "z: ndarray<f32, 2> grad) {\n"
                               "  task main parallel %i in [0, shape(x, 0)) {\n"
                               "    %x = load x[%i] : f32\n") +
                   body + "  }\n}\n");
    EXPECT_TRUE(k.ok()) << k.status().to_string();
    if (!k.ok()) return;
    auto a = make_adjoint(*k);
    if (what.empty()) {
      EXPECT_TRUE(a.ok()) << a.status().to_string() << "\n" << body;
      return;
    }
    ASSERT_FALSE(a.ok()) << body;
    EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find(what), std::string::npos) << a.status().message();
  };
  // Twice at [i]: refused, both statements named.
  refused(
      "    %a = mul %x, %x : f32\n    store y[%i], %a\n    %b = sin %x : f32\n"
      "    store y[%i], %b\n",
      "ndarray 'y' (grad) is stored over an element that the earlier `store y[");
  // An atomic add, then a store over it: refused.
  refused("    atomic_add y[%i], %x\n    %b = sin %x : f32\n    store y[%i], %b\n",
          "is stored over an element that the earlier `atomic_add y[");
  // A store, then atomic adds into it: y = a + b, each term gets the seed. Accepted.
  refused("    %a = mul %x, %x : f32\n    store y[%i], %a\n    atomic_add y[%i], %x\n", "");
  // A vector's two components: apart. Accepted.
  refused(
      "    %c0 = const 0 : i32\n    %c1 = const 1 : i32\n    store z[%i, %c0], %x\n"
      "    %s = sin %x : f32\n    store z[%i, %c1], %s\n",
      "");
  // In a loop: at the loop's index, one element per iteration (accepted); at [i], every
  // iteration overwrites the last (refused).
  refused(
      "    %lo = const 0 : i32\n    %hi = const 4 : i32\n    for %k in [%lo, %hi) {\n"
      "      %f = cast %k : f32\n      %v = mul %x, %f : f32\n      store z[%i, %k], %v\n"
      "    }\n",
      "");
  refused(
      "    %lo = const 0 : i32\n    %hi = const 4 : i32\n    for %k in [%lo, %hi) {\n"
      "      %f = cast %k : f32\n      %v = mul %x, %f : f32\n      store y[%i], %v\n"
      "    }\n",
      "is stored in every iteration of an enclosing loop at the same element");
  // Row 0, then a loop over rows 1..3: apart by their ranges (a recurrence's start and its
  // steps). Accepted; the same loop from row 0 overlaps the first store (refused).
  for (const char* lo : {"1", "0"}) {
    refused(std::string("    %c0 = const 0 : i32\n    store z[%i, %c0], %x\n    %lo = const ") +
                lo +
                " : i32\n    %hi = const 4 : i32\n    for %k in [%lo, %hi) {\n"
                "      %f = cast %k : f32\n      %v = mul %x, %f : f32\n"
                "      store z[%i, %k], %v\n    }\n",
            std::string(lo) == "1" ? "" : "is stored over an element that the earlier `store z[");
  }
  // The two branches of an if: one runs. Accepted.
  refused(
      "    %z0 = const 0.0 : f32\n    %neg = lt %x, %z0 : bool\n    if %neg {\n"
      "      store y[%i], %x\n    } else {\n      %s = sin %x : f32\n"
      "      store y[%i], %s\n    }\n",
      "");
  // An early exit (the front end's `return`: `continue` in a loop of one trip): the store
  // before it does not reach the store after the if. Accepted; in a loop of four trips the
  // next iteration's store would overwrite it (refused).
  for (const char* hi : {"1", "4"}) {
    refused(std::string("    %lo = const 0 : i32\n    %hi = const ") + hi +
                " : i32\n    for %k in [%lo, %hi) {\n      %five = const 5.0 : f32\n"
                "      %big = gt %x, %five : bool\n      if %big {\n"
                "        %a = mul %x, %x : f32\n        store y[%i], %a\n        continue\n"
                "      }\n      %s = sin %x : f32\n      store y[%i], %s\n    }\n",
            std::string(hi) == "1" ? "" : "is stored");
  }
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
  EXPECT_NE(a.status().message().find("statement `" + print_stmt(k, *innermost) + "`"),
            std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find(std::to_string(kMaxAdjointNesting)), std::string::npos)
      << a.status().message();
}

// ---- owned outputs: which arrays a thread provably owns (owned_ndarrays) ----

// owned_ndarrays of the first task of the parsed kernel, as "name:0/1" per ndarray parameter.
std::string owned_of(const std::string& text, size_t task = 0) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return "";
  std::vector<bool> o = owned_ndarrays(*k, k->tasks[task]);
  EXPECT_EQ(o.size(), k->params.size());
  std::string r;
  for (size_t p = 0; p < o.size(); ++p) {
    if (k->params[p].kind != ParamKind::kNdArray) {
      EXPECT_FALSE(o[p]) << "a scalar is never owned";
      continue;
    }
    r += (r.empty() ? "" : " ") + k->params[p].name + ":" + (o[p] ? "1" : "0");
  }
  return r;
}

const char* kOwnHeader =
    "kernel k(n: i32, x: ndarray<f32, 1> grad, idx: ndarray<i32, 1>, y: ndarray<f32, 1> grad) {\n"
    "  task main parallel %i in [0, shape(y, 0)) {\n";

TEST(OwnedNdarrays, ExactTaskIndexEverywhereIsOwned) {
  // x read three times at [%i] (once inside a loop, once in a branch), y stored at [%i]:
  // both owned; idx and w are never accessed, so nothing is proven about them.
  EXPECT_EQ(
      owned_of(
          std::string(kOwnHeader) +
          "    %a = load x[%i] : f32\n    %z = const 0 : i32\n    %n = arg n : i32\n"
          "    %v = alloca : f32\n    store_local %v, %a\n"
          "    for %k in [%z, %n) {\n      %b = load x[%i] : f32\n      %c = load_local %v : f32\n"
          "      %d = mul %b, %c : f32\n      store_local %v, %d\n    }\n"
          "    %zf = const 0 : f32\n    %p = gt %a, %zf : bool\n"
          "    if %p {\n      %e = load x[%i] : f32\n      store_local %v, %e\n    } else {\n    "
          "}\n"
          "    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n"),
      "x:1 idx:0 y:1");
}

TEST(OwnedNdarrays, IndexArithmeticIsNotOwned) {
  EXPECT_EQ(owned_of(std::string(kOwnHeader) +
                     "    %one = const 1 : i32\n    %j = add %i, %one : i32\n"
                     "    %a = load x[%j] : f32\n    store y[%i], %a\n  }\n}\n"),
            "x:0 idx:0 y:1");
  // i + 0 is i, but the analysis proves nothing through arithmetic.
  EXPECT_EQ(owned_of(std::string(kOwnHeader) +
                     "    %zero = const 0 : i32\n    %j = add %i, %zero : i32\n"
                     "    %a = load x[%j] : f32\n    store y[%j], %a\n  }\n}\n"),
            "x:0 idx:0 y:0");
}

TEST(OwnedNdarrays, ACopyOfTheIndexThroughALocalIsNotOwned) {
  EXPECT_EQ(owned_of(std::string(kOwnHeader) +
                     "    %l = alloca : i32\n    store_local %l, %i\n    %j = load_local %l : i32\n"
                     "    %a = load x[%j] : f32\n    store y[%i], %a\n  }\n}\n"),
            "x:0 idx:0 y:1");
}

TEST(OwnedNdarrays, GatherAndScatterAreNotOwned) {
  // x[idx[i]]: idx is read at [%i] (owned), x through its contents (not).
  EXPECT_EQ(
      owned_of(
          std::string(kOwnHeader) +
          "    %j = load idx[%i] : i32\n    %a = load x[%j] : f32\n    store y[%i], %a\n  }\n}\n"),
      "x:0 idx:1 y:1");
  // A scatter: y[idx[i]] += x[i].
  EXPECT_EQ(owned_of(std::string(kOwnHeader) + "    %j = load idx[%i] : i32\n    %a = load x[%i] : "
                                               "f32\n    atomic_add y[%j], %a\n  }\n}\n"),
            "x:1 idx:1 y:0");
}

TEST(OwnedNdarrays, TwoDifferentIndicesAreNotOwned) {
  // x[i] and x[k] in one task: thread i reads x[k] that thread k owns.
  EXPECT_EQ(
      owned_of(
          std::string(kOwnHeader) +
          "    %a = load x[%i] : f32\n    %v = alloca : f32\n    store_local %v, %a\n"
          "    %z = const 0 : i32\n    %n = arg n : i32\n"
          "    for %k in [%z, %n) {\n      %b = load x[%k] : f32\n      %c = load_local %v : f32\n"
          "      %d = add %b, %c : f32\n      store_local %v, %d\n    }\n"
          "    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n"),
      "x:0 idx:0 y:1");
}

TEST(OwnedNdarrays, RankTwoIsNotOwned) {
  // [i, j] over a rank-2 array: the index tuple is not exactly the task's (one) index.
  EXPECT_EQ(
      owned_of(
          "kernel k(a: ndarray<f32, 2> grad, y: ndarray<f32, 2> grad) {\n"
          "  task main parallel %i in [0, shape(a, 0)) {\n"
          "    %z = const 0 : i32\n    %m = shape a 1 : i32\n"
          "    for %j in [%z, %m) {\n      %v = load a[%i, %j] : f32\n      %s = sin %v : f32\n"
          "      store y[%i, %j], %s\n    }\n  }\n}\n"),
      "a:0 y:0");
  // The flattened form, [i / m, i mod m], is not proven either.
  EXPECT_EQ(
      owned_of("kernel k(a: ndarray<f32, 2> grad, y: ndarray<f32, 1> grad) {\n"
               "  task main parallel %i in [0, shape(y, 0)) {\n"
               "    %m = const 4 : i32\n    %r = div %i, %m : i32\n    %c = mod %i, %m : i32\n"
               "    %v = load a[%r, %c] : f32\n    store y[%i], %v\n  }\n}\n"),
      "a:0 y:1");
}

TEST(OwnedNdarrays, SerialTasksAndOtherTasksAreNotOwned) {
  EXPECT_EQ(owned_of("kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
                     "  task main serial %i in [0, shape(x, 0)) {\n"
                     "    %a = load x[%i] : f32\n    store y[%i], %a\n  }\n}\n"),
            "x:0 y:0");
  // Per task: x is owned in the first task, gathered in the second.
  std::string two =
      "kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad, z: ndarray<f32, 1> grad) {\n"
      "  task first parallel %i in [0, shape(x, 0)) {\n"
      "    %a = load x[%i] : f32\n    store y[%i], %a\n  }\n"
      "  task second parallel %t in [0, shape(x, 0)) {\n"
      "    %zero = const 0 : i32\n    %b = load x[%zero] : f32\n    store z[%t], %b\n  }\n}\n";
  EXPECT_EQ(owned_of(two, 0), "x:1 y:1 z:0");
  EXPECT_EQ(owned_of(two, 1), "x:0 y:0 z:1");
}

// An owned f64 gradient needs no f64 atomics: the adjoint verifies on a device without them
// (AdjointIsVerifiedAgainstTheTarget is the gather, which does not).
TEST(ReverseModePass, OwnedF64GradientNeedsNoAtomics) {
  auto k = parse(
      "kernel k(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {\n"
      "  task main parallel %i in [0, shape(x, 0)) {\n"
      "    %x = load x[%i] : f64\n    %s = sin %x : f64\n    store y[%i], %s\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  Target no_f64_atomics = Target::host();
  no_f64_atomics.device_name = "test device";
  no_f64_atomics.atomic_float64_add = false;
  no_f64_atomics.atomic_int64 = false;
  auto a = make_adjoint(*k, no_f64_atomics);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
}

// Load-add-store adds onto what the gradient array holds, as atomic_add does: the CPU
// evaluator's adjoint with x_grad pre-filled gives the pre-filled values plus the gradient.
TEST(ReverseModePass, OwnedAccumulationAddsOntoTheGradientArray) {
  auto k = parse(
      "kernel k(n: i32, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {\n"
      "  task main parallel %i in [0, shape(x, 0)) {\n"
      "    %v = alloca : f64\n    %x = load x[%i] : f64\n    store_local %v, %x\n"
      "    %z = const 0 : i32\n    %n = arg n : i32\n"
      "    for %k in [%z, %n) {\n      %a = load_local %v : f64\n      %b = load x[%i] : f64\n"
      "      %s = sin %a : f64\n      %m = mul %s, %b : f64\n      store_local %v, %m\n    }\n"
      "    %o = load_local %v : f64\n    store y[%i], %o\n  }\n}\n");
  ASSERT_TRUE(k.ok());
  auto a = make_adjoint(*k);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_EQ(owned_ndarrays(*k, k->tasks[0]), (std::vector<bool>{false, true, true}));
  auto run = [&](double prefill) {
    HostArray x(DType::kF64, {5}), y(DType::kF64, {5}), xg(DType::kF64, {5}), yg(DType::kF64, {5});
    for (size_t e = 0; e < 5; ++e) {
      x.data[e] = 0.2 * static_cast<double>(e) - 0.3;
      xg.data[e] = prefill * static_cast<double>(e + 1);
      yg.data[e] = 1.0;
    }
    std::vector<HostArg> args = {HostArg::of(3), HostArg::of(x), HostArg::of(y), HostArg::of(xg),
                                 HostArg::of(yg)};
    auto r = evaluate(*a, args);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return xg.data;
  };
  std::vector<double> g0 = run(0), g1 = run(0.5);
  for (size_t e = 0; e < 5; ++e) {
    EXPECT_NE(g0[e], 0) << e;
    EXPECT_NEAR(g1[e], g0[e] + 0.5 * static_cast<double>(e + 1), 1e-12) << e;
  }
}

// Atomic instructions (OpAtomic*) in disassembly `dis` whose pointer is an OpAccessChain into
// the variable named `var` (the error word's compare-exchange goes into %args, not counted).
int atomics_on(const std::string& dis, const std::string& var) {
  std::unordered_set<std::string> ptrs;
  int n = 0;
  std::istringstream in(dis);
  for (std::string line; std::getline(in, line);) {
    std::istringstream w(line);
    std::vector<std::string> tok;
    for (std::string t; w >> t;) tok.push_back(t);
    // `%r = OpAccessChain %type %base ...` / `%r = OpAtomicX %type %ptr ...` / `OpAtomicStore %ptr
    // ...`
    if (tok.size() >= 5 && tok[2] == "OpAccessChain" && tok[4] == "%" + var) ptrs.insert(tok[0]);
    if (tok.size() >= 5 && tok[2].rfind("OpAtomic", 0) == 0 && ptrs.count(tok[4])) ++n;
    if (tok.size() >= 2 && tok[0].rfind("OpAtomic", 0) == 0 && ptrs.count(tok[1])) ++n;
  }
  return n;
}

// The emitted modules: the sin loop's adjoint (x read at [%i] only) has no atomic on x_grad in
// either lowering of a float atomic add (OpAtomicFAddEXT, or a load and compare-exchange loop
// on the bits); the same loop reading x[idx[i]] keeps them.
TEST(ReverseModePass, OwnedSinLoopAdjointEmitsNoAtomics) {
  auto sin_loop = [](const std::string& index_stmts, const std::string& index) {
    return "kernel sin_loop(steps: i32, x: ndarray<f32, 1> grad, idx: ndarray<i32, 1>, y: "
           "ndarray<f32, 1> grad) {\n"
           "  task main parallel %i in [0, shape(y, 0)) {\n" +
           index_stmts + "    %v = alloca : f32\n    %x = load x[" + index +
           "] : f32\n    store_local %v, %x\n"
           "    %z = const 0 : i32\n    %n = arg steps : i32\n    %c9 = const 0.9 : f32\n    %c1 = "
           "const 0.1 : f32\n"
           "    for %k in [%z, %n) {\n      %a = load_local %v : f32\n      %s = sin %a : f32\n"
           "      %m = mul %s, %c9 : f32\n      %u = add %m, %c1 : f32\n      store_local %v, %u\n "
           "   }\n"
           "    %o = load_local %v : f32\n    store y[%i], %o\n  }\n}\n";
  };
  auto float_atomics = [](const std::string& text, bool native) -> int {
    auto k = parse(text);
    EXPECT_TRUE(k.ok()) << k.status().to_string();
    if (!k.ok()) return -1;
    auto a = make_adjoint(*k);
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    if (!a.ok()) return -1;
    CompileOptions o;
    o.native_float_atomics = native;
    auto c = compile(*a, Target::host(), o);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return -1;
    int n = 0;
    for (const auto& t : c->tasks) n += atomics_on(disassemble_spirv(t.spirv), "x_grad");
    return n;
  };
  std::string owned = sin_loop("", "%i"), gather = sin_loop("    %j = load idx[%i] : i32\n", "%j");
  for (bool native : {true, false}) {
    EXPECT_EQ(float_atomics(owned, native), 0) << "native float atomics: " << native;
    EXPECT_GT(float_atomics(gather, native), 0) << "native float atomics: " << native;
  }
}

// Issue 55: the IR carries where each statement was written (Stmt::loc, `@"..."`); the
// adjoint's statements carry the location of the forward statement they derive from, and the
// compiled kernel's error records quote them: an out-of-bounds add into a gradient and an
// adstack overflow name the user's line, not vkad's IR.
TEST(ReverseModePass, AdjointStatementsKeepTheForwardsSourceLocations) {
  const std::string text =
      "kernel located(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task main parallel %i in [0, shape(x, 0)) {\n"
      "    %u = alloca : f32 @\"sim.py:3:5\"\n"
      "    %x0 = load x[%i] : f32 @\"sim.py:3:5\"\n"
      "    store_local %u, %x0 @\"sim.py:3:5\"\n"
      "    %zero = const 0 : i32 @\"sim.py:4:5\"\n"
      "    %n = arg n : i32 @\"sim.py:4:5\"\n"
      "    for %k in [%zero, %n) max_trip(n) @\"sim.py:4:5\" {\n"
      "      %uv = load_local %u : f32 @\"sim.py:5:9\"\n"
      "      %s = sin %uv : f32 @\"sim.py:5:9\"\n"
      "      store_local %u, %s @\"sim.py:5:9\"\n"
      "    }\n"
      "    %o = load_local %u : f32 @\"sim.py:6:5\"\n"
      "    store y[%i], %o @\"sim.py:6:5\"\n"
      "  }\n"
      "}\n";
  auto k = parse(text);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto a = make_adjoint(*k);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const uint32_t load_at = intern_source_location("sim.py:3:5");
  const uint32_t loop_at = intern_source_location("sim.py:4:5");
  const uint32_t sin_at = intern_source_location("sim.py:5:9");
  const uint32_t x_grad = static_cast<uint32_t>(a->find_param("x_grad"));
  int adds = 0, stacks = 0, cosines = 0;
  for_each_stmt(a->tasks[0].body, [&](const Stmt& s) {
    // x's gradient: a plain load-add-store where each thread owns its element, else an atomic.
    if ((s.op == Op::kAtomicAdd || s.op == Op::kStore) && s.param == x_grad) {
      ++adds;
      EXPECT_EQ(s.loc, load_at) << print_stmt(*a, s);
    }
    if (s.op == Op::kStackAlloc) {
      ++stacks;
      EXPECT_EQ(s.loc, loop_at) << print_stmt(*a, s);
    }
    if (s.op == Op::kCos) {  // sin's derivative
      ++cosines;
      EXPECT_EQ(s.loc, sin_at) << print_stmt(*a, s);
    }
  });
  EXPECT_EQ(adds, 1) << print(*a);
  EXPECT_EQ(stacks, 1) << print(*a);
  EXPECT_GE(cosines, 1) << print(*a);
  // The adjoint's text round-trips with its locations.
  auto again = parse(print(*a));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(print(*again), print(*a));

  CompileOptions o;
  o.bounds_checks = true;
  auto c = compile(*a, Target::host(), o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->tasks[0].adstacks.size(), 1u);
  EXPECT_NE(c->tasks[0].adstacks[0].name.find("of the loop @\"sim.py:4:5\""), std::string::npos)
      << c->tasks[0].adstacks[0].name;
  bool named = false;
  for (const std::string& site : c->tasks[0].access_sites)
    named = named || (site.find(" x_grad[") != std::string::npos &&
                      site.find("@\"sim.py:3:5\"") != std::string::npos);
  EXPECT_TRUE(named) << "no access site quotes the write of x_grad with its location";
}

}  // namespace
}  // namespace vkad::codegen
