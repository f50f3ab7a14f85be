// kernel_access and evaluate (ir/launch_access.h): which accesses each ndarray parameter
// has, which of their indices are launch-uniform, and the rows those give for a launch's
// arguments. The tape's use of it is tests/gpu/tape_hazards_test.cpp.
#include "ir/launch_access.h"

#include <gtest/gtest.h>

#include <climits>
#include <functional>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "ir/text.h"
#include "ir/verifier.h"
#include "ir/walk.h"

namespace vkad::codegen {
namespace {

using Kind = ArrayAccess::Kind;

KernelAccess analyse(const std::string& text) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string() << "\n" << text;
  if (!k.ok()) return {};
  Status v = verify(*k);
  EXPECT_TRUE(v.ok()) << v.to_string() << "\n" << text;
  return kernel_access(*k);
}

const ParamAccess* find(const KernelAccess& a, const std::string& name) {
  for (const ParamAccess& p : a.params) {
    if (a.names[p.param] == name) return &p;
  }
  return nullptr;
}

// Inputs from a map of scalar values and one extent for every shape query.
UniformInputs inputs(std::map<uint32_t, int64_t> scalars, std::optional<uint32_t> extent = 16) {
  return {[scalars](uint32_t p) { return scalars.count(p) ? scalars.at(p) : 0; },
          [extent](uint32_t, uint32_t) { return extent; }};
}

// The row on `axis` of access `i` of `p`, for scalars `s`; nullopt when not launch-uniform.
std::optional<uint32_t> row(const KernelAccess& a, const ParamAccess& p, size_t i, size_t axis,
                            const UniformInputs& in) {
  const uint32_t e = p.accesses.at(i).rows.at(axis);
  if (e == ArrayAccess::kNotUniform) return std::nullopt;
  return evaluate(a.exprs.at(e), in);
}

// used_loads: a load counts where its value reaches an effect -- here a store (through
// arithmetic), a branch's condition, a loop's bound and a local's store -- and not where it
// feeds only values nothing uses (the dead load of `d`, the sum of `e` that is never stored).
TEST(LaunchAccess, UsedLoadsAreThoseWhoseValuesReachAnEffect) {
  auto k = parse(R"(
kernel k(a: ndarray<f32, 1>, b: ndarray<f32, 1>, c: ndarray<i32, 1>, d: ndarray<f32, 1>,
         e: ndarray<f32, 1>, l: ndarray<f32, 1>, n: ndarray<i32, 1>, out: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(a, 0)) {
    %av = load a[%i] : f32
    %two = const 2 : f32
    %m = mul %av, %two : f32
    store out[%i], %m
    %bv = load b[%i] : f32
    %zero = const 0 : f32
    %pos = gt %bv, %zero : bool
    if %pos {
      %z = const 0 : f32
      store out[%i], %z
    }
    %dv = load d[%i] : f32
    %ev = load e[%i] : f32
    %s = add %ev, %two : f32
    %loc = alloca : f32
    %lv = load l[%i] : f32
    store_local %loc, %lv
    %z0 = const 0 : i32
    %nv = load n[%i] : i32
    for %j in [%z0, %nv) {
      %cv = load c[%j] : i32
    }
  }
}
)");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(verify(*k).ok());
  // a (stored), b (a branch's condition), l (a local's store), n (a loop's bound); not c
  // (loaded in the loop, unused), d, e.
  EXPECT_EQ(used_loads(*k), (std::vector<uint32_t>{0, 1, 5, 6}));
}

// whole_stores: DiffTaichi's grid_op shape -- an N-d task over (i, j), a row g = 0 * f (launch-
// uniform), a vector's two components -- is a whole store of v_out; an array also loaded, one
// stored in a branch, one stored from index 1, and two constant axes varying together are not.
TEST(LaunchAccess, WholeStoresAreTopLevelStoresCoveringEveryAxis) {
  auto k = parse(R"(
kernel k(f: i32, m: ndarray<f32, 3>, v_out: ndarray<f32, 4>, both: ndarray<f32, 1>,
         cond: ndarray<f32, 1>, diag: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(m, 1)), %j in [0, shape(m, 2)) {
    %f = arg f : i32
    %z = const 0 : i32
    %g = mul %z, %f : i32
    %mv = load m[%g, %i, %j] : f32
    %one = const 1 : i32
    store v_out[%g, %i, %j, %z], %mv
    store v_out[%g, %i, %j, %one], %mv
    %b = load both[%i] : f32
    store both[%i], %mv
    %c = gt %mv, %b : bool
    if %c {
      store cond[%i], %mv
    }
    store diag[%z, %z], %mv
    store diag[%one, %one], %mv
  }
}
)");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(verify(*k).ok());
  const std::vector<WholeStore> w = whole_stores(*k);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].param, 2u);  // v_out
  ASSERT_EQ(w[0].axes.size(), 4u);
  using Kind = WholeStore::Axis::Kind;
  EXPECT_EQ(w[0].axes[0].kind, Kind::kUniform);
  EXPECT_EQ(w[0].axes[1].kind, Kind::kTaskDim);
  EXPECT_EQ(w[0].axes[1].end, SizeExpr::array_dim(1, 1));  // shape(m, 1)
  EXPECT_EQ(w[0].axes[2].kind, Kind::kTaskDim);
  EXPECT_EQ(w[0].axes[2].end, SizeExpr::array_dim(1, 2));
  EXPECT_EQ(w[0].axes[3].kind, Kind::kConst);
  EXPECT_EQ(w[0].axes[3].consts, (std::vector<int64_t>{0, 1}));
  // A task from 1 covers nothing whole.
  auto from1 = parse(R"(
kernel k(a: ndarray<f32, 1>, b: ndarray<f32, 1>) {
  task main parallel %i in [1, shape(a, 0)) {
    %v = load a[%i] : f32
    store b[%i], %v
  }
}
)");
  ASSERT_TRUE(from1.ok());
  EXPECT_TRUE(whole_stores(*from1).empty());
}

TEST(LaunchAccess, TimeAxisStepReadsRowFAndWritesRowFPlusOne) {
  const KernelAccess a = analyse(R"(
kernel step(x: ndarray<f32, 2> grad, w: ndarray<f32, 1>, f: i32) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %xv = load x[%f, %p] : f32
    %wv = load w[%p] : f32
    %nx = mul %xv, %wv : f32
    store x[%f1, %p], %nx
  }
})");
  EXPECT_EQ(a.kernel, "step");
  ASSERT_EQ(a.params.size(), 2u);
  const ParamAccess* x = find(a, "x");
  ASSERT_NE(x, nullptr);
  EXPECT_TRUE(x->needs_grad);
  EXPECT_EQ(x->rank, 2u);
  ASSERT_EQ(x->accesses.size(), 2u);
  EXPECT_EQ(x->accesses[0].kind, Kind::kRead);
  EXPECT_EQ(x->accesses[1].kind, Kind::kOverwrite);
  const UniformInputs in = inputs({{2, 7}});
  EXPECT_EQ(row(a, *x, 0, 0, in), 7u);
  EXPECT_EQ(row(a, *x, 1, 0, in), 8u);
  EXPECT_EQ(row(a, *x, 0, 1, in), std::nullopt) << "the task index is not launch-uniform";
  EXPECT_EQ(row(a, *x, 1, 1, in), std::nullopt);
  const ParamAccess* w = find(a, "w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->accesses.size(), 1u);
  EXPECT_EQ(w->accesses[0].kind, Kind::kRead);
  EXPECT_FALSE(w->needs_grad);
}

TEST(LaunchAccess, AtomicsLoopsLoadedIndicesAndUnusedParameters) {
  const KernelAccess a = analyse(R"(
kernel k(x: ndarray<f32, 1>, idx: ndarray<i32, 1>, loss: ndarray<f32, 1> grad, m: ndarray<i32, 1>, unused: ndarray<f32, 1>, n: i32) {
  task main parallel %i in [0, shape(x, 0)) {
    %zero = const 0 : i32
    %j = load idx[%i] : i32
    %v = load x[%j] : f32
    atomic_add loss[%zero], %v
    %n = arg n : i32
    for %t in [%zero, %n) {
      %c = const 1 : i32
      atomic_max m[%t], %c
    }
  }
})");
  EXPECT_EQ(find(a, "unused"), nullptr) << "a parameter never accessed is not listed";
  const ParamAccess* x = find(a, "x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(row(a, *x, 0, 0, inputs({})), std::nullopt) << "a loaded index";
  const ParamAccess* loss = find(a, "loss");
  ASSERT_NE(loss, nullptr);
  ASSERT_EQ(loss->accesses.size(), 1u);
  EXPECT_EQ(loss->accesses[0].kind, Kind::kAccumulate);
  EXPECT_EQ(row(a, *loss, 0, 0, inputs({})), 0u);
  const ParamAccess* m = find(a, "m");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->accesses[0].kind, Kind::kOverwrite);
  EXPECT_EQ(row(a, *m, 0, 0, inputs({})), std::nullopt) << "a loop index";
}

TEST(LaunchAccess, IdenticalAccessesAreListedOnceAndExpressionsShared) {
  const KernelAccess a = analyse(R"(
kernel k(x: ndarray<f32, 2> grad, f: i32) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %a = load x[%f, %p] : f32
    %f2 = arg f : i32
    %b = load x[%f2, %p] : f32
    %s = add %a, %b : f32
    %one = const 1 : i32
    %g = add %f, %one : i32
    store x[%g, %p], %s
  }
})");
  const ParamAccess* x = find(a, "x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->accesses.size(), 2u) << "two loads at the same launch-uniform row are one";
  EXPECT_EQ(a.exprs.size(), 2u);
}

TEST(LaunchAccess, EvaluatesWithTheIrSemantics) {
  // Each statement is stored at its own row of `out` so each is one access.
  const KernelAccess a = analyse(R"(
kernel k(out: ndarray<f32, 1>, f: i32, u: u32, b: bool) {
  task main serial %i in [0, 1) {
    %f = arg f : i32
    %u = arg u : u32
    %b = arg b : bool
    %z = const 0 : i32
    %m3 = const -3 : i32
    %two = const 2 : i32
    %big = const 4294967295 : u32
    %n = shape out 0 : i32
    %v = const 1.0 : f32
    %e0 = floordiv %f, %two : i32
    store out[%e0], %v
    %e1 = mod %f, %m3 : i32
    store out[%e1], %v
    %e2 = div %f, %z : i32
    store out[%e2], %v
    %e3 = add %u, %big : u32
    store out[%e3], %v
    %e4 = sub %n, %f : i32
    store out[%e4], %v
    %c = lt %f, %z : bool
    %e5 = select %b, %e0, %e4 : i32
    store out[%e5], %v
    %e6 = cast %c : i32
    store out[%e6], %v
    %e7 = neg %f : i32
    %e8 = cast %e7 : u32
    store out[%e8], %v
    %e9 = min %e0, %e4 : i32
    store out[%e9], %v
  }
})");
  const ParamAccess* out = find(a, "out");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(out->accesses.size(), 9u);
  const UniformInputs in = inputs({{1, -7}, {2, 5}, {3, 1}}, 10);
  auto at = [&](size_t i) { return row(a, *out, i, 0, in); };
  EXPECT_EQ(at(0), static_cast<uint32_t>(-4)) << "floordiv(-7, 2) rounds toward -inf";
  EXPECT_EQ(at(1), static_cast<uint32_t>(-1)) << "mod(-7, -3) has the divisor's sign";
  EXPECT_EQ(at(2), 0u) << "x / 0 = 0";
  EXPECT_EQ(at(3), 4u) << "u32 wraps";
  EXPECT_EQ(at(4), 17u) << "shape(out, 0) - f";
  EXPECT_EQ(at(5), static_cast<uint32_t>(-4)) << "select takes its first value when true";
  EXPECT_EQ(at(6), 1u) << "bool -> i32";
  EXPECT_EQ(at(7), 7u) << "i32 -> u32 keeps the bits";
  EXPECT_EQ(at(8), static_cast<uint32_t>(-4));
  EXPECT_EQ(row(a, *out, 4, 0, inputs({{1, -7}}, std::nullopt)), std::nullopt)
      << "an unknown extent makes the value unknown";
  const UniformInputs min_case = inputs({{1, INT32_MIN}, {2, 0}, {3, 0}}, 10);
  EXPECT_EQ(row(a, *out, 0, 0, min_case), static_cast<uint32_t>(INT32_MIN / 2));
  EXPECT_EQ(row(a, *out, 7, 0, min_case), static_cast<uint32_t>(INT32_MIN)) << "-INT_MIN wraps";
}

// table_index_values: an index loaded from an integer array, and integer arithmetic of it with
// launch-uniform values, is a table index; a task or loop index or a float mixed in is not.
// Each atomic_add's last index, in order, tells which the analysis put where.
TEST(LaunchAccess, TableIndicesAreLoadsOfIntegerArraysAndUniformArithmeticOfThem) {
  auto k = parse(R"(
kernel k(ids: ndarray<i32, 1>, x: ndarray<f32, 1>, g: ndarray<f32, 2>, f: i32) {
  task main parallel %i in [0, shape(x, 0)) {
    %zero = const 0 : i32
    %one = const 1 : i32
    %v = load x[%i] : f32
    %f = arg f : i32
    %id = load ids[%i] : i32
    %clamped = max %zero, %id : i32
    %shifted = add %clamped, %f : i32
    %none = eq %id, %one : bool
    %picked = select %none, %zero, %shifted : i32
    %mixed = add %id, %i : i32
    %cell = cast %v : i32
    %n = shape x 0 : i32
    atomic_add g[%f, %id], %v
    atomic_add g[%f, %clamped], %v
    atomic_add g[%zero, %picked], %v
    atomic_add g[%f, %mixed], %v
    atomic_add g[%f, %cell], %v
    atomic_add g[%f, %i], %v
    atomic_add g[%f, %n], %v
    for %t in [%zero, %n) {
      %u = add %id, %t : i32
      atomic_add g[%f, %u], %v
    }
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(verify(*k).ok());
  const std::unordered_set<ValueId> table = table_index_values(*k);
  std::vector<bool> got;
  std::function<void(const Block&)> walk = [&](const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kAtomicAdd) got.push_back(table.count(s.args[1]) > 0);
      for (const Block& c : s.blocks) walk(c);
    }
  };
  walk(k->tasks[0].body);
  // loaded, max with a constant, select of uniform arithmetic of it; then the task index
  // mixed in, a float cast, the task index, a shape (uniform, not a table), a loop index mixed in
  EXPECT_EQ(got, (std::vector<bool>{true, true, true, false, false, false, false, false}));
}

// masked_values: the values atomic adds skip zeros of. Kept: a select with a zero arm, a bool
// cast, an integer flag local (constants, 0 among them) cast, products with them, a reverse-mode
// accumulator of them (a local adding to itself), a sum of two. Not: a load, a product of
// loads, a cast task index, a local one store of which is a load, a sum with an unmasked term.
TEST(LaunchAccess, MaskedValuesAreZeroBehindAConditionOrAFlag) {
  auto k = parse(R"(
kernel k(x: ndarray<f32, 1>, g: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %zi = const 0 : i32
    %oi = const 1 : i32
    %z = const 0.0 : f32
    %v = load x[%i] : f32
    %w = load x[%zi] : f32
    %in = lt %v, %w : bool
    %sel = select %in, %v, %z : f32
    %b = cast %in : f32
    %flag = alloca : i32
    store_local %flag, %zi
    if %in {
      store_local %flag, %oi
    } else {
    }
    %fl = load_local %flag : i32
    %ff = cast %fl : f32
    %prod = mul %v, %ff : f32
    %acc = alloca : f32
    store_local %acc, %z
    %a0 = load_local %acc : f32
    %a1 = add %a0, %prod : f32
    store_local %acc, %a1
    %a2 = load_local %acc : f32
    %two = add %sel, %b : f32
    %vw = mul %v, %w : f32
    %ci = cast %i : f32
    %bad = alloca : f32
    store_local %bad, %sel
    store_local %bad, %v
    %b2 = load_local %bad : f32
    %mix = add %sel, %v : f32
    atomic_add g[%i], %sel
    atomic_add g[%i], %b
    atomic_add g[%i], %ff
    atomic_add g[%i], %prod
    atomic_add g[%i], %a2
    atomic_add g[%i], %two
    atomic_add g[%i], %v
    atomic_add g[%i], %vw
    atomic_add g[%i], %ci
    atomic_add g[%i], %b2
    atomic_add g[%i], %mix
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(verify(*k).ok());
  const std::unordered_set<ValueId> masked = masked_values(*k);
  std::vector<bool> got;
  for (const Stmt& s : k->tasks[0].body.stmts) {
    if (s.op == Op::kAtomicAdd) got.push_back(masked.count(s.args[1]) > 0);
  }
  EXPECT_EQ(got, (std::vector<bool>{true, true, true, true, true, true, false, false, false, false,
                                    false}));
}

// masked_values, locals only a branch changes: zero from the alloca, stored inside an `if` the
// alloca is not in (an adjoint accumulated inside a contact's branch) -- kept, whether the store
// adds to the local or replaces it. Not: a local also stored an unmasked value at its alloca's
// depth, a local
// allocated inside the same `if` as its store (a rolled kernel's range guard around a whole
// body), a conditional store of a value also stored unconditionally into the same local.
TEST(LaunchAccess, MaskedValuesIncludeLocalsOnlyABranchChanges) {
  auto k = parse(R"(
kernel k(x: ndarray<f32, 1>, g: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %zi = const 0 : i32
    %w = load x[%zi] : f32
    %in = lt %v, %w : bool
    %acc = alloca : f32
    %rep = alloca : f32
    %both = alloca : f32
    %same = alloca : f32
    if %in {
      %a0 = load_local %acc : f32
      %a1 = add %a0, %v : f32
      store_local %acc, %a1
      store_local %rep, %v
      store_local %both, %v
      store_local %same, %w
      %inner = alloca : f32
      store_local %inner, %v
      %n = load_local %inner : f32
      atomic_add g[%i], %n
    } else {
    }
    store_local %both, %w
    store_local %same, %w
    %la = load_local %acc : f32
    %lr = load_local %rep : f32
    %lb = load_local %both : f32
    %ls = load_local %same : f32
    atomic_add g[%i], %la
    atomic_add g[%i], %lr
    atomic_add g[%i], %lb
    atomic_add g[%i], %ls
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(verify(*k).ok());
  const std::unordered_set<ValueId> masked = masked_values(*k);
  std::vector<bool> got;
  for_each_stmt(*k, [&](const Stmt& s) {
    if (s.op == Op::kAtomicAdd) got.push_back(masked.count(s.args[1]) > 0);
  });
  // The inner local's add (in the branch, its alloca there too), then acc, rep, both, same.
  EXPECT_EQ(got, (std::vector<bool>{false, true, true, false, false}));
}

}  // namespace
}  // namespace vkad::codegen
