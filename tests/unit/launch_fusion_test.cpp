// Launch fusion (graph/launch_fusion.h): which runs of launches merge, and that a fused
// kernel computes, on the CPU evaluator, exactly what its members compute one by one.
#include "graph/launch_fusion.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"

namespace vkad::testing {
namespace {

using codegen::FusionLaunch;
using codegen::HostArg;
using codegen::HostArray;
using codegen::Kernel;

Kernel parse(const std::string& text) {
  auto k = codegen::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : Kernel{};
}

// b = sin(a) * c + 0.1 at [i]: a substep.
const char* kStep = R"(
kernel step(a: ndarray<f32, 1> grad, b: ndarray<f32, 1> grad, c: f32) {
  task main parallel %i in [0, shape(a, 0)) {
    %x = load a[%i] : f32
    %s = sin %x : f32
    %k = arg c : f32
    %m = mul %s, %k : f32
    %c1 = const 0.1 : f32
    %y = add %m, %c1 : f32
    store b[%i], %y
  }
}
)";

// b[i] = a[i + 1]: reads a neighbour's element.
const char* kShift = R"(
kernel shift(a: ndarray<f32, 1>, b: ndarray<f32, 1>) {
  task main parallel %i in [0, 7) {
    %one = const 1 : i32
    %j = add %i, %one : i32
    %x = load a[%j] : f32
    store b[%i], %x
  }
}
)";

// b[i] = a[i] * 2 over a range given by a scalar.
const char* kScalarRange = R"(
kernel scaled(a: ndarray<f32, 1>, b: ndarray<f32, 1>, n: i32) {
  task main parallel %i in [0, n) {
    %x = load a[%i] : f32
    %two = const 2.0 : f32
    %y = mul %x, %two : f32
    store b[%i], %y
  }
}
)";

FusionLaunch launch(const Kernel& k, std::vector<uint64_t> arrays, int64_t end) {
  return {&k, std::move(arrays), 0, end};
}

TEST(LaunchFusion, AnElementWiseChainMergesUpToTheArrayLimit) {
  Kernel step = parse(kStep);
  ASSERT_TRUE(codegen::fusible(step));
  std::vector<FusionLaunch> chain;
  for (uint64_t j = 1; j <= 10; ++j) chain.push_back(launch(step, {j, j + 1, 0}, 8));
  auto runs = codegen::fusion_groups(chain, 24, 32);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].count, 10u);
  // 5 distinct arrays at most: runs of 4 launches (x1..x5), 4, then 2.
  runs = codegen::fusion_groups(chain, 5, 32);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].count, 4u);
  EXPECT_EQ(runs[1].first, 4u);
  EXPECT_EQ(runs[2].count, 2u);
  runs = codegen::fusion_groups(chain, 24, 3);  // the member limit
  EXPECT_EQ(runs.size(), 4u);
}

TEST(LaunchFusion, RunsStopAtUnsafeAccessesOtherRangesAndUnfusibleKernels) {
  Kernel step = parse(kStep), shift = parse(kShift), scaled = parse(kScalarRange);
  EXPECT_FALSE(codegen::fusible(scaled));  // its range depends on a scalar
  // shift reads a[i + 1] of what step just wrote: another invocation's element.
  std::vector<FusionLaunch> l = {launch(step, {1, 2, 0}, 7), launch(shift, {2, 3}, 7)};
  auto runs = codegen::fusion_groups(l, 24, 32);
  EXPECT_EQ(runs.size(), 2u);
  // The same neighbour read of an array nobody in the run writes is safe.
  l = {launch(step, {1, 2, 0}, 7), launch(shift, {1, 3}, 7)};
  runs = codegen::fusion_groups(l, 24, 32);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].count, 2u);
  // ...but not once a later member writes it: the reader would race with the writer.
  l = {launch(shift, {1, 3}, 7), launch(step, {2, 1, 0}, 7)};
  EXPECT_EQ(codegen::fusion_groups(l, 24, 32).size(), 2u);
  // Another range.
  l = {launch(step, {1, 2, 0}, 8), launch(step, {2, 3, 0}, 9)};
  EXPECT_EQ(codegen::fusion_groups(l, 24, 32).size(), 2u);
  // One array bound as two element types.
  Kernel ints = parse(R"(
kernel ints(a: ndarray<i32, 1>) {
  task main parallel %i in [0, 8) {
    %x = load a[%i] : i32
    store a[%i], %x
  }
}
)");
  l = {launch(step, {1, 2, 0}, 8), launch(ints, {2}, 8)};
  EXPECT_EQ(codegen::fusion_groups(l, 24, 32).size(), 2u);
}

TEST(LaunchFusion, AdjointsOfLoopsWithAdstacksAreNotFused) {
  Kernel loop = parse(R"(
kernel loop(a: ndarray<f32, 1> grad, b: ndarray<f32, 1> grad, n: i32) {
  task main parallel %i in [0, shape(a, 0)) {
    %acc = alloca : f32
    %x = load a[%i] : f32
    store_local %acc, %x
    %zero = const 0 : i32
    %nn = arg n : i32
    for %k in [%zero, %nn) {
      %v = load_local %acc : f32
      %s = sin %v : f32
      store_local %acc, %s
    }
    %r = load_local %acc : f32
    store b[%i], %r
  }
}
)");
  auto adj = codegen::make_adjoint(loop);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  EXPECT_FALSE(codegen::fusible(*adj));
}

// Runs each member on `arrays` one by one, and the fused kernel on a copy; both must agree
// exactly (the fused body performs the same f32 operations in the same order).
void expect_same(const std::vector<const Kernel*>& members,
                 const std::vector<std::vector<uint64_t>>& binds,
                 const std::vector<std::vector<double>>& scalars, std::vector<HostArray> arrays,
                 int64_t end) {
  std::vector<FusionLaunch> l;
  for (size_t m = 0; m < members.size(); ++m) l.push_back({members[m], binds[m], 0, end});
  auto runs = codegen::fusion_groups(l, 24, 32);
  ASSERT_EQ(runs.size(), 1u) << "the members should form one run";
  auto fused = codegen::fuse_launches(l, "fused");
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  ASSERT_TRUE(codegen::verify(fused->kernel).ok()) << codegen::print(fused->kernel);
  std::vector<HostArray> one = arrays;
  for (size_t m = 0; m < members.size(); ++m) {
    std::vector<HostArg> args;
    size_t s = 0;
    for (size_t p = 0; p < binds[m].size(); ++p) {
      args.push_back(binds[m][p] ? HostArg::of(one[binds[m][p] - 1])
                                 : HostArg::of(scalars[m][s++]));
    }
    ASSERT_TRUE(codegen::evaluate(*members[m], args).ok());
  }
  std::vector<HostArg> fargs(fused->kernel.params.size());
  for (size_t m = 0; m < members.size(); ++m) {
    size_t s = 0;
    for (size_t p = 0; p < binds[m].size(); ++p) {
      fargs[fused->param_map[m][p]] =
          binds[m][p] ? HostArg::of(arrays[binds[m][p] - 1]) : HostArg::of(scalars[m][s++]);
    }
  }
  auto r = codegen::evaluate(fused->kernel, fargs);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (size_t a = 0; a < arrays.size(); ++a) {
    EXPECT_EQ(arrays[a].data, one[a].data) << "array " << a + 1;
  }
}

HostArray ramp(uint32_t n, double scale) {
  HostArray a(abi::DType::kF32, {n});
  for (uint32_t i = 0; i < n; ++i) a.data[i] = codegen::round_to(abi::DType::kF32, scale * i);
  return a;
}

TEST(LaunchFusion, AFusedChainComputesWhatItsLaunchesComputeOneByOne) {
  Kernel step = parse(kStep);
  std::vector<HostArray> arrays = {ramp(9, 0.01), ramp(9, 0), ramp(9, 0), ramp(9, 0)};
  expect_same({&step, &step, &step}, {{1, 2, 0}, {2, 3, 0}, {3, 4, 0}}, {{0.9}, {0.8}, {0.7}},
              arrays, 9);
}

// Parsed kernels number their named values from 2^30: a fused body of more than three such
// members must renumber, not shift, their ids (shifting wrapped the uint32 ids into
// collisions the verifier refused).
TEST(LaunchFusion, ManyParsedMembersGetFreshIdsThatDoNotWrap) {
  Kernel step = parse(kStep);
  ASSERT_GE(step.next_id, 1u << 30)
      << "the parser's numbering changed: this test needs ids past 2^30";
  std::vector<HostArray> arrays;
  std::vector<const Kernel*> members;
  std::vector<std::vector<uint64_t>> binds;
  std::vector<std::vector<double>> scalars;
  for (uint64_t m = 0; m < 6; ++m) {
    members.push_back(&step);
    binds.push_back({m + 1, m + 2, 0});
    scalars.push_back({0.9 - 0.1 * static_cast<double>(m)});
  }
  for (int a = 0; a < 7; ++a) arrays.push_back(ramp(9, a == 0 ? 0.01 : 0));
  expect_same(members, binds, scalars, arrays, 9);
}

TEST(LaunchFusion, AdjointsChainAndForwardTheirAccumulatedGradients) {
  Kernel step = parse(kStep);
  auto adj = codegen::make_adjoint(step);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  ASSERT_TRUE(codegen::fusible(*adj)) << codegen::print(*adj);
  // Adjoint params: a, b, c, a_grad, b_grad. Steps 2, 1, 0 in reverse over x0..x3, g0..g3.
  std::vector<HostArray> arrays = {ramp(9, 0.01), ramp(9, 0.02), ramp(9, 0.03), ramp(9, 0.04),
                                   ramp(9, 0),    ramp(9, 0),    ramp(9, 0),    ramp(9, 1.0)};
  expect_same({&*adj, &*adj, &*adj}, {{3, 4, 0, 7, 8}, {2, 3, 0, 6, 7}, {1, 2, 0, 5, 6}},
              {{0.9}, {0.8}, {0.7}}, arrays, 9);
  // The chain's gradient arrays are loaded once: later members take the value the earlier one
  // stored.
  std::vector<FusionLaunch> l = {{&*adj, {3, 4, 0, 7, 8}, 0, 9}, {&*adj, {2, 3, 0, 6, 7}, 0, 9}};
  auto fused = codegen::fuse_launches(l, "fused");
  ASSERT_TRUE(fused.ok());
  auto loads = [](const Kernel& k) {
    int n = 0;
    for (const codegen::Stmt& s : k.tasks[0].body.stmts) n += s.op == codegen::Op::kLoad;
    return n;
  };
  EXPECT_LT(loads(fused->kernel), 2 * loads(*adj));
}

// With hardware float atomics reverse mode adds into a_grad (a is only read) atomically. In a
// chain the next step's adjoint reads that gradient (its b_grad): the fused body adds it with a
// load, an add and a store and forwards the sum, as for a load-add-store (a step loop's fused
// adjoint read it from memory after an atomic, 5.7x slower on an H100); the gradient no member
// reads keeps its atomic add.
TEST(LaunchFusion, AnAtomicAddAnotherMemberReadsIsStoredAndForwarded) {
  Kernel step = parse(kStep);
  codegen::AdjointOptions o;
  o.atomic_f32_add = true;
  auto adj = codegen::make_adjoint(step, codegen::Target::host(), o);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  auto count = [](const Kernel& k, codegen::Op op) {
    int n = 0;
    for (const codegen::Stmt& s : k.tasks[0].body.stmts) n += s.op == op;
    return n;
  };
  ASSERT_EQ(count(*adj, codegen::Op::kAtomicAdd), 1) << codegen::print(*adj);
  std::vector<HostArray> arrays = {ramp(9, 0.01), ramp(9, 0.02), ramp(9, 0.03),  ramp(9, 0.04),
                                   ramp(9, 0.5),  ramp(9, 0.25), ramp(9, 0.125), ramp(9, 1.0)};
  expect_same({&*adj, &*adj, &*adj}, {{3, 4, 0, 7, 8}, {2, 3, 0, 6, 7}, {1, 2, 0, 5, 6}},
              {{0.9}, {0.8}, {0.7}}, arrays, 9);
  std::vector<FusionLaunch> l = {{&*adj, {3, 4, 0, 7, 8}, 0, 9},
                                 {&*adj, {2, 3, 0, 6, 7}, 0, 9},
                                 {&*adj, {1, 2, 0, 5, 6}, 0, 9}};
  auto fused = codegen::fuse_launches(l, "fused");
  ASSERT_TRUE(fused.ok());
  // g7 and g6 are added by one member and read by the next: stored; g5 only added: atomic.
  EXPECT_EQ(count(fused->kernel, codegen::Op::kAtomicAdd), 1) << codegen::print(fused->kernel);
  // Each gradient is loaded once (g8, then g7 and g6 before their first add), never again.
  EXPECT_EQ(count(fused->kernel, codegen::Op::kLoad), 3 + 3) << codegen::print(fused->kernel);
}

// Gradients zeroed by a fill before the backward run: the fused adjoints read them as the
// constant 0 and overwrite each whole, so the fills may go -- the fused kernel computes, from
// garbage in those arrays, what the members compute from zeros.
TEST(LaunchFusion, ZeroedArraysAreReadAsZerosAndReportedOverwritten) {
  Kernel step = parse(kStep);
  auto adj = codegen::make_adjoint(step);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  std::vector<FusionLaunch> l = {{&*adj, {3, 4, 0, 7, 8}, 0, 9},
                                 {&*adj, {2, 3, 0, 6, 7}, 0, 9},
                                 {&*adj, {1, 2, 0, 5, 6}, 0, 9}};
  const uint64_t zeros[] = {5, 6, 7};
  auto fused = codegen::fuse_launches(l, "fused", zeros);
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  EXPECT_EQ(fused->overwritten, (std::vector<uint64_t>{5, 6, 7}));
  ASSERT_TRUE(codegen::verify(fused->kernel).ok()) << codegen::print(fused->kernel);
  std::vector<HostArray> members = {ramp(9, 0.01), ramp(9, 0.02), ramp(9, 0.03), ramp(9, 0.04),
                                    ramp(9, 0),    ramp(9, 0),    ramp(9, 0),    ramp(9, 1.0)};
  std::vector<HostArray> garbage = members;
  for (int a : {4, 5, 6}) garbage[a] = ramp(9, 7.5);
  const double c[] = {0.9, 0.8, 0.7};
  for (size_t m = 0; m < l.size(); ++m) {
    std::vector<HostArg> args;
    for (size_t p = 0; p < 5; ++p) {
      args.push_back(p == 2 ? HostArg::of(c[m]) : HostArg::of(members[l[m].arrays[p] - 1]));
    }
    ASSERT_TRUE(codegen::evaluate(*adj, args).ok());
  }
  std::vector<HostArg> fargs(fused->kernel.params.size());
  for (size_t m = 0; m < l.size(); ++m) {
    for (size_t p = 0; p < 5; ++p) {
      fargs[fused->param_map[m][p]] =
          p == 2 ? HostArg::of(c[m]) : HostArg::of(garbage[l[m].arrays[p] - 1]);
    }
  }
  ASSERT_TRUE(codegen::evaluate(fused->kernel, fargs).ok());
  for (size_t a = 0; a < members.size(); ++a) EXPECT_EQ(garbage[a].data, members[a].data) << a;
  // The seed's array (8) is read, never stored: not overwritten, and its load is not a zero.
  const uint64_t seed[] = {8};
  auto seeded = codegen::fuse_launches(l, "fused", seed);
  ASSERT_TRUE(seeded.ok());
  EXPECT_TRUE(seeded->overwritten.empty());
}

// An array read inside a loop before its first store is not known to be overwritten whole.
TEST(LaunchFusion, AnArrayReadInANestedBlockFirstKeepsItsFill) {
  Kernel k = parse(R"(
kernel nested(a: ndarray<f32, 1>, b: ndarray<f32, 1>) {
  task main parallel %i in [0, 8) {
    %zero = const 0 : i32
    %two = const 2 : i32
    for %k in [%zero, %two) {
      %x = load a[%i] : f32
      store b[%i], %x
    }
    %y = load b[%i] : f32
    store a[%i], %y
  }
}
)");
  ASSERT_TRUE(codegen::fusible(k));
  std::vector<FusionLaunch> l = {{&k, {1, 2}, 0, 8}, {&k, {1, 2}, 0, 8}};
  const uint64_t zeros[] = {1, 2};
  auto fused = codegen::fuse_launches(l, "fused", zeros);
  ASSERT_TRUE(fused.ok());
  EXPECT_TRUE(fused->overwritten.empty());
}

}  // namespace
}  // namespace vkad::testing

namespace vkad::testing {
namespace {

// A state with a time axis, DiffTaichi's idiom: x[f + 1, i] from x[f, i].
const char* kTimeStep = R"(
kernel tstep(f: i32, x: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(x, 1)) {
    %f = arg f : i32
    %v = load x[%f, %i] : f32
    %h = const 0.5 : f32
    %s = sin %v : f32
    %y = add %s, %h : f32
    %one = const 1 : i32
    %g = add %f, %one : i32
    store x[%g, %i], %y
  }
}
)";

TEST(LaunchFusion, RowsTheArgumentsDecideKeepAnInvocationsOwnColumnAndFuse) {
  Kernel step = parse(kTimeStep);
  HostArray x(abi::DType::kF32, {4, 7});
  for (size_t i = 0; i < x.data.size(); ++i) {
    x.data[i] = codegen::round_to(abi::DType::kF32, 0.1 * static_cast<double>(i));
  }
  expect_same({&step, &step, &step}, {{0, 1}, {0, 1}, {0, 1}}, {{0}, {1}, {2}}, {x}, 7);
  // Its adjoint too (x_grad[f, i] and x_grad[f + 1, i]).
  Kernel g = step;
  g.params[1].needs_grad = true;
  auto adj = codegen::make_adjoint(g);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  ASSERT_TRUE(codegen::fusible(*adj)) << codegen::print(*adj);
  HostArray xg = x;
  for (size_t i = 0; i < xg.data.size(); ++i) xg.data[i] = (i % 5) * 0.25;
  expect_same({&*adj, &*adj, &*adj}, {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}}, {{2}, {1}, {0}}, {x, xg},
              7);
}

TEST(LaunchFusion, AVectorsComponentsOfTheOwnElementFuseAndAnotherAxisDoesNot) {
  // v[f + 1, i, c] = v[f, i, c] * 0.5 for both components c: a 2-vector per particle.
  Kernel vec = parse(R"(
kernel vstep(f: i32, v: ndarray<f32, 3>) {
  task main parallel %i in [0, shape(v, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %g = add %f, %one : i32
    %zero = const 0 : i32
    %h = const 0.5 : f32
    %a = load v[%f, %i, %zero] : f32
    %b = load v[%f, %i, %one] : f32
    %a2 = mul %a, %h : f32
    %b2 = mul %b, %h : f32
    store v[%g, %i, %zero], %a2
    store v[%g, %i, %one], %b2
  }
}
)");
  HostArray v(abi::DType::kF32, {3, 5, 2});
  for (size_t i = 0; i < v.data.size(); ++i) v.data[i] = static_cast<double>(i % 7);
  expect_same({&vec, &vec}, {{0, 1}, {0, 1}}, {{0}, {1}}, {v}, 5);
  // x[i, f] beside x[f, i]: invocation i of one meets another's element.
  Kernel transposed = parse(R"(
kernel tr(f: i32, x: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(x, 1)) {
    %f = arg f : i32
    %v = load x[%i, %f] : f32
    store x[%i, %f], %v
  }
}
)");
  Kernel step = parse(kTimeStep);
  std::vector<FusionLaunch> l = {{&step, {0, 1}, 0, 7}, {&transposed, {0, 1}, 0, 7}};
  EXPECT_EQ(codegen::fusion_groups(l, 24, 32).size(), 2u);
}

TEST(LaunchFusion, ANeighboursColumnOrARowFromMemoryKeepsLaunchesApart) {
  // x[f, i + 1]: another invocation's column.
  Kernel shifted = parse(R"(
kernel shifted(f: i32, x: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(x, 1)) {
    %f = arg f : i32
    %v = load x[%f, %i] : f32
    %one = const 1 : i32
    %g = add %f, %one : i32
    %j = add %i, %one : i32
    store x[%g, %j], %v
  }
}
)");
  // x[r[0], i]: a row read from memory is not launch-uniform.
  Kernel loaded = parse(R"(
kernel loaded(r: ndarray<i32, 1>, x: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(x, 1)) {
    %zero = const 0 : i32
    %row = load r[%zero] : i32
    %v = load x[%zero, %i] : f32
    store x[%row, %i], %v
  }
}
)");
  Kernel step = parse(kTimeStep);
  for (const Kernel* k : {&shifted, &loaded}) {
    std::vector<uint64_t> binds =
        k == &shifted ? std::vector<uint64_t>{0, 1} : std::vector<uint64_t>{2, 1};
    std::vector<FusionLaunch> l = {{&step, {0, 1}, 0, 7}, {k, binds, 0, 7}};
    EXPECT_EQ(codegen::fusion_groups(l, 24, 32).size(), 2u) << k->name;
  }
}

// A cell kernel of a grid with a time axis (DiffTaichi's grid_op): o[f, i, j] from m and v at
// row f, over the N-d box of the grid's cells.
const char* kCell = R"(
kernel cell(f: i32, m: ndarray<f32, 3>, v: ndarray<f32, 3>, o: ndarray<f32, 3>) {
  task main parallel %i in [0, shape(m, 1)), %j in [0, shape(m, 2)) {
    %f = arg f : i32
    %a = load m[%f, %i, %j] : f32
    %b = load v[%f, %i, %j] : f32
    %one = const 1.0 : f32
    %d = add %a, %one : f32
    %q = div %b, %d : f32
    store o[%f, %i, %j], %q
  }
}
)";

// The same cells' column sums into a rank-1 array: every (i, j) of a column adds into s[i].
const char* kColumn = R"(
kernel column(f: i32, m: ndarray<f32, 3>, s: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(m, 1)), %j in [0, shape(m, 2)) {
    %f = arg f : i32
    %a = load m[%f, %i, %j] : f32
    atomic_add s[%i], %a
  }
}
)";

FusionLaunch cell_launch(const Kernel& k, std::vector<uint64_t> arrays, std::vector<int64_t> rows,
                         int64_t rows_of_grid, int64_t cols) {
  FusionLaunch l{&k, std::move(arrays), 0, 1};
  l.rows = std::move(rows);
  l.dims = {{0, rows_of_grid}, {0, cols}};
  return l;
}

TEST(LaunchFusion, CellKernelsAtDifferentRowsFuseAndComputeWhatTheyComputeOneByOne) {
  Kernel cell = parse(kCell);
  ASSERT_TRUE(codegen::fusible(cell));
  const int64_t any = FusionLaunch::kAnyRow;
  std::vector<FusionLaunch> l;
  for (int64_t f = 0; f < 3; ++f)
    l.push_back(cell_launch(cell, {0, 1, 2, 3}, {any, f, f, f}, 4, 5));
  ASSERT_EQ(codegen::fusion_groups(l, 24, 32).size(), 1u) << "rows 0, 1, 2: one run";
  auto fused = codegen::fuse_launches(l, "fused");
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  ASSERT_TRUE(codegen::verify(fused->kernel).ok()) << codegen::print(fused->kernel);
  ASSERT_EQ(fused->kernel.tasks[0].dims.size(), 2u) << "the fused task keeps the members' box";
  std::vector<HostArray> arrays;
  for (int a = 0; a < 3; ++a) {
    HostArray x(abi::DType::kF32, {3, 4, 5});
    for (size_t i = 0; i < x.data.size(); ++i) {
      x.data[i] = a == 2 ? -7.0 : codegen::round_to(abi::DType::kF32, 0.1 * (i % 13) + a);
    }
    arrays.push_back(std::move(x));
  }
  std::vector<HostArray> one = arrays;
  for (int f = 0; f < 3; ++f) {
    std::vector<HostArg> args = {HostArg::of(f), HostArg::of(one[0]), HostArg::of(one[1]),
                                 HostArg::of(one[2])};
    ASSERT_TRUE(codegen::evaluate(cell, args).ok());
  }
  std::vector<HostArg> fargs(fused->kernel.params.size());
  for (int f = 0; f < 3; ++f) {
    fargs[fused->param_map[f][0]] = HostArg::of(f);
    for (int p = 1; p < 4; ++p) fargs[fused->param_map[f][p]] = HostArg::of(arrays[p - 1]);
  }
  auto r = codegen::evaluate(fused->kernel, fargs);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(arrays[2].data, one[2].data);
  for (double x : arrays[2].data) ASSERT_NE(x, -7.0) << "every cell of every row written";

  // The same row twice, or an unknown row: apart. Another box at another row runs side by
  // side (the rows keep them apart); at the same row, apart.
  std::vector<FusionLaunch> same = {l[0], l[0]};
  EXPECT_EQ(codegen::fusion_groups(same, 24, 32).size(), 2u) << "row 0 twice";
  std::vector<FusionLaunch> box = {l[0], cell_launch(cell, {0, 1, 2, 3}, {any, 1, 1, 1}, 4, 6)};
  const uint32_t side = codegen::kMaxRunBoxes;
  EXPECT_EQ(codegen::fusion_groups(box, 24, 32).size(), 2u) << "one range a run by default";
  EXPECT_EQ(codegen::fusion_groups(box, 24, 32, nullptr, side).size(), 1u)
      << "a 4x6 box beside a 4x5 one";
  box[1].rows = {any, 0, 0, 0};
  EXPECT_EQ(codegen::fusion_groups(box, 24, 32, nullptr, side).size(), 2u) << "both boxes at row 0";
  std::vector<FusionLaunch> unknown = {l[0], l[1]};
  unknown[1].rows.clear();
  EXPECT_EQ(codegen::fusion_groups(unknown, 24, 32).size(), 2u) << "rows not known";
}

TEST(LaunchFusion, CellKernelsSharingAWrittenRankOneArrayStayApart) {
  // s[i] is touched by every (i, j): no invocation owns it, and it has no rows to tell two
  // members apart, so two launches that add into it are not merged (their adds would be
  // right, but a store there would not be: fusion proves nothing about a rank-1 array here).
  Kernel column = parse(kColumn);
  ASSERT_TRUE(codegen::fusible(column));
  const int64_t any = FusionLaunch::kAnyRow;
  std::vector<FusionLaunch> l = {cell_launch(column, {0, 1, 2}, {any, 0, any}, 4, 5),
                                 cell_launch(column, {0, 1, 2}, {any, 1, any}, 4, 5)};
  EXPECT_EQ(codegen::fusion_groups(l, 24, 32).size(), 2u);
}

TEST(LaunchFusion, ThreeDimensionalBoxesKeepEveryIndex) {
  // o[f, i, j, k] = m[f, i, j, k] * 2 + k: the fused task's third index must be the member's.
  Kernel box = parse(R"(
kernel box(f: i32, m: ndarray<f32, 4>, o: ndarray<f32, 4>) {
  task main parallel %i in [0, shape(m, 1)), %j in [0, shape(m, 2)), %k in [0, shape(m, 3)) {
    %f = arg f : i32
    %a = load m[%f, %i, %j, %k] : f32
    %two = const 2.0 : f32
    %b = mul %a, %two : f32
    %kf = cast %k : f32
    %c = add %b, %kf : f32
    store o[%f, %i, %j, %k], %c
  }
}
)");
  ASSERT_TRUE(codegen::fusible(box));
  const int64_t any = FusionLaunch::kAnyRow;
  std::vector<FusionLaunch> l;
  for (int64_t f = 0; f < 2; ++f) {
    FusionLaunch x{&box, {0, 1, 2}, 0, 1};
    x.rows = {any, f, f};
    x.dims = {{0, 3}, {0, 2}, {0, 4}};
    l.push_back(x);
  }
  ASSERT_EQ(codegen::fusion_groups(l, 24, 32).size(), 1u);
  auto fused = codegen::fuse_launches(l, "fused");
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  ASSERT_TRUE(codegen::verify(fused->kernel).ok()) << codegen::print(fused->kernel);
  HostArray m(abi::DType::kF32, {2, 3, 2, 4}), o(abi::DType::kF32, {2, 3, 2, 4});
  for (size_t i = 0; i < m.data.size(); ++i) m.data[i] = static_cast<double>(i % 7);
  for (double& x : o.data) x = -1.0;
  HostArray m1 = m, o1 = o;
  for (int f = 0; f < 2; ++f) {
    std::vector<HostArg> args = {HostArg::of(f), HostArg::of(m1), HostArg::of(o1)};
    ASSERT_TRUE(codegen::evaluate(box, args).ok());
  }
  std::vector<HostArg> fargs(fused->kernel.params.size());
  for (int f = 0; f < 2; ++f) {
    fargs[fused->param_map[f][0]] = HostArg::of(f);
    fargs[fused->param_map[f][1]] = HostArg::of(m);
    fargs[fused->param_map[f][2]] = HostArg::of(o);
  }
  ASSERT_TRUE(codegen::evaluate(fused->kernel, fargs).ok());
  EXPECT_EQ(o.data, o1.data);
  for (double x : o.data) ASSERT_NE(x, -1.0);
}

// Three ranges: y = 2 x and then y2 = y + 1 over 7 particles, a 3x5 grid's cells, and the tail
// [2, 9) of another array. Independent of each other, they run in one kernel of 15 invocations.
const char* kScale = R"(
kernel scale(x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task particles parallel %i in [0, shape(x, 0)) {
    %a = load x[%i] : f32
    %two = const 2.0 : f32
    %b = mul %a, %two : f32
    store y[%i], %b
  }
}
)";
const char* kPlusOne = R"(
kernel plus_one(y: ndarray<f32, 1>, y2: ndarray<f32, 1>) {
  task particles parallel %i in [0, shape(y, 0)) {
    %a = load y[%i] : f32
    %one = const 1.0 : f32
    %b = add %a, %one : f32
    store y2[%i], %b
  }
}
)";
const char* kCells = R"(
kernel cells(g: ndarray<f32, 2>) {
  task cells parallel %i in [0, shape(g, 0)), %j in [0, shape(g, 1)) {
    %ten = const 10 : i32
    %a = mul %i, %ten : i32
    %b = add %a, %j : i32
    %c = cast %b : f32
    store g[%i, %j], %c
  }
}
)";
const char* kTail = R"(
kernel tail(z: ndarray<f32, 1>) {
  task rest parallel %i in [2, shape(z, 0)) {
    %c = cast %i : f32
    %k = const 0.5 : f32
    %d = add %c, %k : f32
    store z[%i], %d
  }
}
)";

TEST(LaunchFusion, LaunchesOfOtherRangesRunSideBySideAndComputeWhatTheyComputeOneByOne) {
  Kernel scale = parse(kScale), plus_one = parse(kPlusOne), cells = parse(kCells),
         tail = parse(kTail);
  // Arrays: 1 x, 2 y, 3 y2 (7 each), 4 g (3x5), 5 z (9).
  FusionLaunch g{&cells, {4}, 0, 1};
  g.dims = {{0, 3}, {0, 5}};
  std::vector<FusionLaunch> l = {launch(scale, {1, 2}, 7), g, launch(plus_one, {2, 3}, 7),
                                 FusionLaunch{&tail, {5}, 2, 9}};
  const uint32_t ranges = codegen::kMaxRunBoxes;
  EXPECT_EQ(codegen::fusion_groups(l, 24, 32).size(), 4u) << "one range a run by default";
  bool rows_used = false;
  std::vector<codegen::FusionRun> runs = codegen::fusion_groups(l, 24, 32, &rows_used, ranges);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].count, 4u);
  EXPECT_FALSE(rows_used) << "no array shared but y, within one range";
  auto fused = codegen::fuse_launches(l, "side");
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  ASSERT_TRUE(codegen::verify(fused->kernel).ok()) << codegen::print(fused->kernel);
  const codegen::Task& t = fused->kernel.tasks[0];
  EXPECT_TRUE(t.dims.empty());
  EXPECT_EQ(t.end.value, 15) << "the largest range's size";

  auto arrays = [] {
    std::vector<HostArray> a = {HostArray(abi::DType::kF32, {7}), HostArray(abi::DType::kF32, {7}),
                                HostArray(abi::DType::kF32, {7}),
                                HostArray(abi::DType::kF32, {3, 5}),
                                HostArray(abi::DType::kF32, {9})};
    for (size_t i = 0; i < 7; ++i) a[0].data[i] = codegen::round_to(abi::DType::kF32, 0.3 * i - 1);
    for (size_t k = 1; k < a.size(); ++k) std::fill(a[k].data.begin(), a[k].data.end(), -7.0);
    return a;
  };
  std::vector<HostArray> one = arrays(), side = arrays();
  for (const FusionLaunch& m : l) {
    std::vector<HostArg> args;
    for (uint64_t id : m.arrays) args.push_back(HostArg::of(one[id - 1]));
    ASSERT_TRUE(codegen::evaluate(*m.kernel, args).ok());
  }
  std::vector<HostArg> fargs(fused->kernel.params.size());
  for (size_t m = 0; m < l.size(); ++m) {
    for (size_t p = 0; p < l[m].arrays.size(); ++p)
      fargs[fused->param_map[m][p]] = HostArg::of(side[l[m].arrays[p] - 1]);
  }
  auto r = codegen::evaluate(fused->kernel, fargs);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (size_t k = 0; k < one.size(); ++k) EXPECT_EQ(side[k].data, one[k].data) << "array " << k + 1;
  EXPECT_EQ(one[3].data[2 * 5 + 4], 24.0) << "the grid's last cell written";
  EXPECT_EQ(one[4].data[1], -7.0) << "the tail's range starts at 2";
  EXPECT_EQ(one[4].data[8], 8.5);

  // A written array touched from another range keeps the launches apart: y, which scale
  // writes, read by a launch over the grid's 15 cells.
  std::vector<FusionLaunch> apart = {launch(scale, {1, 2}, 7), launch(plus_one, {2, 3}, 15)};
  EXPECT_EQ(codegen::fusion_groups(apart, 24, 32, nullptr, ranges).size(), 2u);
  // Nor does a run take more ranges than kMaxRunBoxes.
  std::vector<FusionLaunch> many;
  for (int64_t n = 0; n <= codegen::kMaxRunBoxes; ++n)
    many.push_back(launch(
        scale, {static_cast<uint64_t>(10 + 2 * n), static_cast<uint64_t>(11 + 2 * n)}, 3 + n));
  runs = codegen::fusion_groups(many, 24, 32, nullptr, ranges);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].count, codegen::kMaxRunBoxes);
  runs = codegen::fusion_groups(many, 24, 32, nullptr, 2);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].count, 2u) << "max_ranges = 2";
}

}  // namespace
}  // namespace vkad::testing
