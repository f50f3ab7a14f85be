// Blocked stencils at Session::end_capture (graph/stencil_blocking.h, docs/graphs.md, "Blocked
// stencils"): a captured run of a neighbour stencil over a time axis (DiffTaichi's wave: clamped
// neighbours picked by select), a periodic pressure iteration and a Jacobi sweep whose row
// steps beside a scalar that does not run a few launches per dispatch with the halo
// recomputed; the wave's adjoint (atomic adds into the neighbours) has a gather form with its
// results, which blocks with a stash. Their results are
// those of the launches one by one on the CPU evaluator; the off switch keeps the launches; kernels
// that are not stencils of that form are refused.
#include "graph/stencil_blocking.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "reference/cpu_eval.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

// p[t, i, j] = 2 p[t-1, i, j] + 0.2 * lap(p[t-1])(i, j) - p[t-2, i, j], a neighbour outside the
// grid reading 0 through a clamped index and a select (DiffTaichi's wave.py, get_p).
constexpr const char* kWave = R"(
kernel wave(t: i32, p: ndarray<f32, 3> grad) {
  task cells parallel %i in [0, shape(p, 1)), %j in [0, shape(p, 2)) {
    %t = arg t : i32
    %one = const 1 : i32
    %two = const 2 : i32
    %zero = const 0 : i32
    %t1 = sub %t, %one : i32
    %t2 = sub %t, %two : i32
    %n = shape p 1 : i32
    %m = shape p 2 : i32
    %nl = sub %n, %one : i32
    %ml = sub %m, %one : i32
    %c = load p[%t1, %i, %j] : f32
    %im = sub %i, %one : i32
    %imc = max %im, %zero : i32
    %a0 = load p[%t1, %imc, %j] : f32
    %ia = ge %i, %one : bool
    %z = const 0.0 : f32
    %a = select %ia, %a0, %z : f32
    %ip = add %i, %one : i32
    %ipc = min %ip, %nl : i32
    %b0 = load p[%t1, %ipc, %j] : f32
    %ib = lt %i, %nl : bool
    %b = select %ib, %b0, %z : f32
    %jm = sub %j, %one : i32
    %jmc = max %jm, %zero : i32
    %d0 = load p[%t1, %i, %jmc] : f32
    %jd = ge %j, %one : bool
    %d = select %jd, %d0, %z : f32
    %jp = add %j, %one : i32
    %jpc = min %jp, %ml : i32
    %e0 = load p[%t1, %i, %jpc] : f32
    %je = lt %j, %ml : bool
    %e = select %je, %e0, %z : f32
    %s1 = add %a, %b : f32
    %s2 = add %d, %e : f32
    %s3 = add %s1, %s2 : f32
    %m4 = const -4.0 : f32
    %cc = mul %m4, %c : f32
    %lap = add %s3, %cc : f32
    %k = const 0.2 : f32
    %kl = mul %k, %lap : f32
    %two_f = const 2.0 : f32
    %c2 = mul %two_f, %c : f32
    %u = add %c2, %kl : f32
    %old = load p[%t2, %i, %j] : f32
    %v = sub %u, %old : f32
    store p[%t, %i, %j], %v
  }
}
)";

// One Jacobi sweep of row a into row a + 1, 1-d, with a right-hand side at row r (a scalar
// that does not step): x[a + 1, i] = (b[r, i] + x[a, i - 1] + x[a, i + 1]) / 2, clamped ends.
constexpr const char* kJacobi = R"(
kernel jacobi(a: i32, r: i32, x: ndarray<f32, 2>, b: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(x, 1)) {
    %a = arg a : i32
    %r = arg r : i32
    %one = const 1 : i32
    %zero = const 0 : i32
    %n = shape x 1 : i32
    %nl = sub %n, %one : i32
    %im = sub %i, %one : i32
    %imc = max %im, %zero : i32
    %ip = add %i, %one : i32
    %ipc = min %ip, %nl : i32
    %l = load x[%a, %imc] : f32
    %h = load x[%a, %ipc] : f32
    %rhs = load b[%r, %i] : f32
    %s = add %l, %h : f32
    %s2 = add %s, %rhs : f32
    %half = const 0.5 : f32
    %v = mul %s2, %half : f32
    %a1 = add %a, %one : i32
    store x[%a1, %i], %v
  }
}
)";

// A Jacobi sweep over the interior [1, 299) of 300 cells, its neighbours unclamped: the sweeps
// at the box's edges read cells 0 and 299, which no launch writes (the fixed boundary). A
// blocked kernel takes a neighbour from shared memory only where it lies in the box; here it
// must read those two from the array.
constexpr const char* kJacobiInterior = R"(
kernel jacobi_interior(a: i32, x: ndarray<f32, 2>) {
  task main parallel %i in [1, 299) {
    %a = arg a : i32
    %one = const 1 : i32
    %im = sub %i, %one : i32
    %ip = add %i, %one : i32
    %l = load x[%a, %im] : f32
    %h = load x[%a, %ip] : f32
    %c = load x[%a, %i] : f32
    %s = add %l, %h : f32
    %s2 = add %s, %c : f32
    %third = const 0.25 : f32
    %v = mul %s2, %third : f32
    %a1 = add %a, %one : i32
    store x[%a1, %i], %v
  }
}
)";

// smoke.py's pressure iteration, 2-d with periodic neighbours (DiffTaichi's dec_index /
// inc_index wrap around the grid), its row a = k + 10 t (k steps, t stays): p[a + 1, y, x] =
// (div[t, y, x] + the 4 neighbours of p[a]) / 4.
constexpr const char* kPressure = R"(
kernel pressure(k: i32, t: i32, p: ndarray<f32, 3> grad, div: ndarray<f32, 3> grad) {
  task cells parallel %y in [0, shape(p, 1)), %x in [0, shape(p, 2)) {
    %k = arg k : i32
    %t = arg t : i32
    %ten = const 10 : i32
    %t10 = mul %t, %ten : i32
    %a = add %k, %t10 : i32
    %one = const 1 : i32
    %zero = const 0 : i32
    %n = shape p 1 : i32
    %m = shape p 2 : i32
    %nl = sub %n, %one : i32
    %ml = sub %m, %one : i32
    %ym = sub %y, %one : i32
    %yl = lt %ym, %zero : bool
    %yd = select %yl, %nl, %ym : i32
    %yp = add %y, %one : i32
    %yh = ge %yp, %n : bool
    %yu = select %yh, %zero, %yp : i32
    %xm = sub %x, %one : i32
    %xl = lt %xm, %zero : bool
    %xd = select %xl, %ml, %xm : i32
    %xp = add %x, %one : i32
    %xh = ge %xp, %m : bool
    %xu = select %xh, %zero, %xp : i32
    %d = load div[%t, %y, %x] : f32
    %p1 = load p[%a, %yd, %x] : f32
    %p2 = load p[%a, %yu, %x] : f32
    %p3 = load p[%a, %y, %xd] : f32
    %p4 = load p[%a, %y, %xu] : f32
    %s1 = add %d, %p1 : f32
    %s2 = add %s1, %p2 : f32
    %s3 = add %s2, %p3 : f32
    %s4 = add %s3, %p4 : f32
    %q = const 0.25 : f32
    %v = mul %s4, %q : f32
    %a1 = add %a, %one : i32
    store p[%a1, %y, %x], %v
  }
}
)";

constexpr uint32_t kRows = 20, kCols = 13;  // not multiples of the 16 x 16 tile
constexpr uint32_t kSteps = 23;             // blocks of K and a rest

codegen::Kernel parsed(const char* text) { return *codegen::parse(text); }

// These boxes are a few tiles: a session blocks them (no floor on a box's tiles by default).
// VKAD_GRAPH_BLOCK_MIN_TILES=<n> sets one, for the scope of this object.
struct TileFloor {
  explicit TileFloor(const char* n) { setenv("VKAD_GRAPH_BLOCK_MIN_TILES", n, 1); }
  ~TileFloor() { unsetenv("VKAD_GRAPH_BLOCK_MIN_TILES"); }
  TileFloor(const TileFloor&) = delete;
  TileFloor& operator=(const TileFloor&) = delete;
};

std::vector<float> initial_wave() {
  std::vector<float> p(size_t{kSteps + 2} * kRows * kCols, 0.0f);
  for (uint32_t i = 0; i < kRows; ++i) {
    for (uint32_t j = 0; j < kCols; ++j) {
      const float v = std::exp(-0.1f * static_cast<float>((i - 7) * (i - 7) + (j - 5) * (j - 5)));
      p[size_t{i} * kCols + j] = v;            // row 0
      p[(size_t{kRows} + i) * kCols + j] = v;  // row 1
    }
  }
  return p;
}

size_t graph_steps(Session& s, GraphHandle g) {
  Result<size_t> n = s.runtime().graphs().graph_steps(g);
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  return n.ok() ? *n : 0;
}

uint64_t blocked(Session& s) {
  Result<SessionStats> st = s.stats();
  EXPECT_TRUE(st.ok());
  return st.ok() ? st->blocked_launches : 0;
}

// Captures `iters` launches of `k` as `name` (`args(a)`: launch a's arguments), expects the
// run blocked (`what`: the launches, named where they were not), replays the graph and
// downloads `out` into *got (as many elements).
void replay_blocked(Session& s, const char* name, KernelHandle k, uint32_t iters,
                    const std::function<std::vector<Arg>(uint32_t)>& args, const char* what,
                    NdArrayHandle out, std::vector<float>* got) {
  ASSERT_TRUE(s.begin_capture(name).ok());
  for (uint32_t a = 0; a < iters; ++a) ASSERT_TRUE(s.launch(k, args(a)).ok());
  Result<GraphHandle> g = s.end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_LT(graph_steps(s, *g), iters / 2) << what << " were not blocked";
  ASSERT_TRUE(s.replay(*g).ok());
  ASSERT_TRUE(s.synchronize().ok());
  ASSERT_TRUE(s.download(out, std::span<float>(*got)).ok());
}

// The wave's forward (t = 2 .. kSteps + 1), captured; the blocked replay against the CPU.
// `expect_blocked`: whether the session should have blocked it.
void run_wave(bool block, bool* skipped, bool expect_blocked) {
  auto s = validated_session(skipped, [&](SessionOptions& o) { o.block_stencils = block; });
  if (*skipped) return;
  ASSERT_NE(s, nullptr);
  Result<KernelHandle> k = s->compile(std::string_view(kWave));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  NdArrayHandle p = *s->ndarray(DType::kF32, {kSteps + 2, kRows, kCols}, "p");
  const std::vector<float> p0 = initial_wave();
  ASSERT_TRUE(s->upload(p, std::span<const float>(p0)).ok());
  ASSERT_TRUE(s->begin_capture("wave").ok());
  for (uint32_t t = 2; t < kSteps + 2; ++t)
    ASSERT_TRUE(s->launch(*k, {Arg::i32(static_cast<int32_t>(t)), Arg::ndarray(p)}).ok());
  Result<GraphHandle> g = s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  if (expect_blocked) {
    EXPECT_LT(graph_steps(*s, *g), kSteps / 2) << "the launches were not blocked";
    EXPECT_GE(blocked(*s), kSteps / 2);
  } else {
    EXPECT_EQ(graph_steps(*s, *g), kSteps);
    EXPECT_EQ(blocked(*s), 0u);
  }
  ASSERT_TRUE(s->replay(*g).ok());
  ASSERT_TRUE(s->synchronize().ok());
  std::vector<float> got(p0.size());
  ASSERT_TRUE(s->download(p, std::span<float>(got)).ok());

  const codegen::Kernel wave = parsed(kWave);
  codegen::HostArray hp(DType::kF32, {kSteps + 2, kRows, kCols});
  for (size_t e = 0; e < p0.size(); ++e) hp.data[e] = p0[e];
  for (uint32_t t = 2; t < kSteps + 2; ++t) {
    using codegen::HostArg;
    ASSERT_TRUE(
        codegen::evaluate(wave, std::vector<HostArg>{HostArg::of(t), HostArg::of(hp)}).ok());
  }
  // The same f32 operations in the same order per cell (the CPU rounds each to f32): equal but
  // for contraction into fused multiply-adds a device may do, a few ulps of |p| <= ~4 per step.
  for (size_t e = 0; e < got.size(); ++e)
    ASSERT_NEAR(got[e], hp.data[e], 1e-4 * (1 + std::fabs(hp.data[e]))) << "element " << e;
  expect_no_validation_messages(*s);
}

TEST(StencilBlocking, AWaveStepLoopRunsSeveralStepsPerDispatchWithTheLaunchesResults) {
  bool skipped = false;
  run_wave(true, &skipped, /*expect_blocked=*/true);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
}

TEST(StencilBlocking, OffTheLaunchesStay) {
  bool skipped = false;
  run_wave(false, &skipped, /*expect_blocked=*/false);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
}

// A floor on the tiles from the environment above the wave's few tiles: its launches stay, with
// the same results.
TEST(StencilBlocking, AFloorOnTilesFromTheEnvironmentLeavesASmallBoxAsLaunched) {
  TileFloor floor("1000");
  bool skipped = false;
  run_wave(true, &skipped, /*expect_blocked=*/false);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
}

// The wave's adjoint in gather form: no atomic add left, and on the CPU evaluator the same
// gradients as reverse mode's atomic adds, t from kSteps + 1 down to 2.
TEST(StencilBlocking, TheGatherFormOfTheWavesAdjointHasItsResults) {
  Result<codegen::Kernel> adj = codegen::make_adjoint(parsed(kWave));
  ASSERT_TRUE(adj.ok()) << adj.status().message();
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {kSteps + 2, kRows, kCols}, {kSteps + 2, kRows, kCols}};
  Result<codegen::Kernel> gathered = codegen::gather_form(*adj, {{0, kRows}, {0, kCols}}, shapes);
  ASSERT_TRUE(gathered.ok()) << gathered.status().message();
  EXPECT_NE(codegen::print(*adj).find("atomic_add p_grad"), std::string::npos);
  EXPECT_EQ(codegen::print(*gathered).find("atomic_add"), std::string::npos);
  // Which candidate's add lands on the thread's cell is known where the box decides it: a
  // neighbour's clamped read (max(i - 1, 0) from i = j + 1) always lands, the own-cell reads
  // too; only the centre's four clamped reads land at the edge alone and keep their compares,
  // one per axis: 8 (20 when every reaching add was compared).
  const std::string text = codegen::print(*gathered);
  size_t eqs = 0;
  for (size_t at = text.find(" = eq "); at != std::string::npos; at = text.find(" = eq ", at + 1))
    ++eqs;
  EXPECT_EQ(eqs, 8u) << text;
  const std::vector<float> p0 = initial_wave();
  codegen::HostArray hp(DType::kF32, {kSteps + 2, kRows, kCols}), ha = hp, hb = hp;
  for (size_t e = 0; e < p0.size(); ++e) {
    hp.data[e] = p0[e];
    ha.data[e] = hb.data[e] = 0.001 * static_cast<double>(e % 37);
  }
  for (uint32_t t = kSteps + 1; t >= 2; --t) {
    using codegen::HostArg;
    ASSERT_TRUE(codegen::evaluate(
                    *adj, std::vector<HostArg>{HostArg::of(t), HostArg::of(hp), HostArg::of(ha)})
                    .ok());
    ASSERT_TRUE(codegen::evaluate(*gathered, std::vector<HostArg>{HostArg::of(t), HostArg::of(hp),
                                                                  HostArg::of(hb)})
                    .ok());
  }
  // The same terms summed in another order, each rounded to f32 (the evaluator rounds f32
  // operations): 23 steps of 6 adds off by half an ulp of the largest gradient (~4).
  double scale = 0;
  for (double v : ha.data) scale = std::max(scale, std::fabs(v));
  for (size_t e = 0; e < ha.data.size(); ++e)
    ASSERT_NEAR(hb.data[e], ha.data[e], 4e-5 * scale) << "element " << e;
  // It blocks, with a stash: each launch adds into rows t - 1 and t - 2, which hold earlier
  // sums (read before written), so K + 1 rows per half of the stash, two halves.
  codegen::StencilLaunch l;
  l.kernel = &*adj;
  l.arrays = {0, 1, 2};
  l.step = {-1, 0, 0};
  l.box = {{0, kRows}, {0, kCols}};
  l.shapes = shapes;
  l.first = {kSteps + 1, 0, 0};
  std::string why;
  const uint32_t K = codegen::stencil_steps(l, codegen::kStencilSharedBytes, &why);
  ASSERT_GE(K, 2u) << why;
  Result<codegen::BlockedStencil> b = codegen::block_stencil(l, K, "blocked");
  ASSERT_TRUE(b.ok()) << b.status().message();
  ASSERT_TRUE(b->prologue.has_value());
  EXPECT_EQ(b->stash_elements, int64_t{2} * (K + 1) * kRows * kCols);
  EXPECT_EQ(b->kernel.params.size(), 4u);
  // Without a scalar that steps the halves cannot alternate: refused, and said why.
  l.step = {0, 0, 0};
  EXPECT_EQ(codegen::stencil_steps(l, codegen::kStencilSharedBytes, &why), 0u);
  EXPECT_NE(why.find("read before the run writes it"), std::string::npos) << why;
}

// The wave's adjoint captured, t from kSteps + 1 down to 2: its gather form blocked, with a
// stash and its prologue, gives reverse mode's results (again on a second replay).
TEST(StencilBlocking, TheWavesAdjointBlocksAsAGatherWithTheLaunchesResults) {
  bool skipped = false;
  auto s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(s, nullptr);
  Result<codegen::Kernel> adj = codegen::make_adjoint(parsed(kWave));
  ASSERT_TRUE(adj.ok()) << adj.status().message();
  const std::string text = codegen::print(*adj);
  Result<KernelHandle> k = s->compile(std::string_view(text));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  const std::vector<float> p0 = initial_wave();
  std::vector<float> g0(p0.size(), 0.0f);
  for (size_t e = 0; e < g0.size(); ++e) g0[e] = 0.001f * static_cast<float>(e % 37);
  NdArrayHandle p = *s->ndarray(DType::kF32, {kSteps + 2, kRows, kCols}, "p");
  NdArrayHandle pg = *s->ndarray(DType::kF32, {kSteps + 2, kRows, kCols}, "p_grad");
  ASSERT_TRUE(s->upload(p, std::span<const float>(p0)).ok());
  ASSERT_TRUE(s->upload(pg, std::span<const float>(g0)).ok());
  ASSERT_TRUE(s->begin_capture("wave_adjoint").ok());
  for (uint32_t t = kSteps + 1; t >= 2; --t) {
    Status st =
        s->launch(*k, {Arg::i32(static_cast<int32_t>(t)), Arg::ndarray(p), Arg::ndarray(pg)});
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  Result<GraphHandle> g = s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_LT(graph_steps(*s, *g), kSteps / 2) << "the adjoint's launches were not blocked";
  EXPECT_GE(blocked(*s), kSteps / 2);
  std::vector<float> got(g0.size());
  for (int rep = 0; rep < 2; ++rep) {  // the stash's halves start over each replay
    ASSERT_TRUE(s->upload(pg, std::span<const float>(g0)).ok());
    ASSERT_TRUE(s->replay(*g).ok());
    Status st = s->synchronize();
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(s->download(pg, std::span<float>(got)).ok());
  }

  codegen::HostArray hp(DType::kF32, {kSteps + 2, kRows, kCols}), hg = hp;
  for (size_t e = 0; e < p0.size(); ++e) {
    hp.data[e] = p0[e];
    hg.data[e] = g0[e];
  }
  for (uint32_t t = kSteps + 1; t >= 2; --t) {
    using codegen::HostArg;
    ASSERT_TRUE(codegen::evaluate(
                    *adj, std::vector<HostArg>{HostArg::of(t), HostArg::of(hp), HostArg::of(hg)})
                    .ok());
  }
  // The adjoint's sums in another order (a gather against atomics, each rounded in f32):
  // errors scale with the largest gradient, which grows with the steps while early rows cancel
  // down to O(1). Bound: 23 steps of 6 adds, each off by half an ulp of the largest value,
  // 2^-24 * 6 * 23 * max|g| ~ 1e-5 max|g|; 4e-5 max|g| leaves room for contraction, and still
  // fails on a lost or doubled neighbour term (>= 0.2 * |g| of a neighbour).
  double scale = 0;
  for (double v : hg.data) scale = std::max(scale, std::fabs(v));
  for (size_t e = 0; e < got.size(); ++e)
    ASSERT_NEAR(got[e], hg.data[e], 4e-5 * scale) << "element " << e;
  expect_no_validation_messages(*s);
}

// A Jacobi sweep's row steps, its right-hand side's row does not (smoke's pressure iterations).
TEST(StencilBlocking, AJacobiSweepBlocksWithARowThatDoesNotStep) {
  bool skipped = false;
  auto s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(s, nullptr);
  constexpr uint32_t kN = 300, kIters = 19;  // more than one 256-cell tile
  Result<KernelHandle> k = s->compile(std::string_view(kJacobi));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  NdArrayHandle x = *s->ndarray(DType::kF32, {kIters + 1, kN}, "x");
  NdArrayHandle b = *s->ndarray(DType::kF32, {2, kN}, "b");
  std::vector<float> x0(size_t{kIters + 1} * kN, 0.0f), b0(size_t{2} * kN);
  for (uint32_t i = 0; i < kN; ++i) x0[i] = std::sin(0.05f * static_cast<float>(i));
  for (size_t i = 0; i < b0.size(); ++i) b0[i] = 0.01f * static_cast<float>(i % 11);
  ASSERT_TRUE(s->upload(x, std::span<const float>(x0)).ok());
  ASSERT_TRUE(s->upload(b, std::span<const float>(b0)).ok());
  std::vector<float> got(x0.size());
  replay_blocked(
      *s, "jacobi", *k, kIters,
      [&](uint32_t a) {
        return std::vector<Arg>{Arg::i32(static_cast<int32_t>(a)), Arg::i32(1), Arg::ndarray(x),
                                Arg::ndarray(b)};
      },
      "the sweeps", x, &got);
  if (HasFatalFailure()) return;
  const codegen::Kernel jacobi = parsed(kJacobi);
  codegen::HostArray hx(DType::kF32, {kIters + 1, kN}), hb(DType::kF32, {2, kN});
  for (size_t e = 0; e < x0.size(); ++e) hx.data[e] = x0[e];
  for (size_t e = 0; e < b0.size(); ++e) hb.data[e] = b0[e];
  for (uint32_t a = 0; a < kIters; ++a) {
    using codegen::HostArg;
    ASSERT_TRUE(codegen::evaluate(jacobi, std::vector<HostArg>{HostArg::of(a), HostArg::of(1u),
                                                               HostArg::of(hx), HostArg::of(hb)})
                    .ok());
  }
  // Adds and a halving, each correctly rounded both sides: equal to a few ulps of |x| <= 2.
  for (size_t e = 0; e < got.size(); ++e) ASSERT_NEAR(got[e], hx.data[e], 1e-5) << "element " << e;
  expect_no_validation_messages(*s);
}

TEST(StencilBlocking, AnInteriorSweepReadsTheBoundaryOutsideItsBoxFromTheArray) {
  bool skipped = false;
  auto s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(s, nullptr);
  constexpr uint32_t kN = 300, kIters = 19;
  Result<KernelHandle> k = s->compile(std::string_view(kJacobiInterior));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  NdArrayHandle x = *s->ndarray(DType::kF32, {kIters + 1, kN}, "x");
  // Every row's boundary cells hold values of their own (large, so a sweep that took 0 or a
  // stale halo for them instead is far off).
  std::vector<float> x0(size_t{kIters + 1} * kN, 0.0f);
  for (uint32_t i = 0; i < kN; ++i) x0[i] = std::cos(0.07f * static_cast<float>(i));
  for (uint32_t a = 0; a <= kIters; ++a) {
    x0[size_t{a} * kN] = 10.0f + static_cast<float>(a);
    x0[size_t{a} * kN + kN - 1] = -20.0f - static_cast<float>(a);
  }
  ASSERT_TRUE(s->upload(x, std::span<const float>(x0)).ok());
  std::vector<float> got(x0.size());
  replay_blocked(
      *s, "jacobi_interior", *k, kIters,
      [&](uint32_t a) {
        return std::vector<Arg>{Arg::i32(static_cast<int32_t>(a)), Arg::ndarray(x)};
      },
      "the sweeps", x, &got);
  if (HasFatalFailure()) return;
  const codegen::Kernel jacobi = parsed(kJacobiInterior);
  codegen::HostArray hx(DType::kF32, {kIters + 1, kN});
  for (size_t e = 0; e < x0.size(); ++e) hx.data[e] = x0[e];
  for (uint32_t a = 0; a < kIters; ++a) {
    using codegen::HostArg;
    ASSERT_TRUE(
        codegen::evaluate(jacobi, std::vector<HostArg>{HostArg::of(a), HostArg::of(hx)}).ok());
  }
  // Two adds and a multiply by 0.25 per step, in the same order: equal to a few ulps of
  // |x| <= 40.
  for (size_t e = 0; e < got.size(); ++e) ASSERT_NEAR(got[e], hx.data[e], 1e-4) << "element " << e;
  expect_no_validation_messages(*s);
}

// Periodic neighbours on a kY x kX grid: the halo wraps around the grid.
void periodic_pressure(uint32_t kY, uint32_t kX) {
  bool skipped = false;
  auto s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(s, nullptr);
  constexpr uint32_t kIters = 12;
  Result<KernelHandle> k = s->compile(std::string_view(kPressure));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  NdArrayHandle p = *s->ndarray(DType::kF32, {kIters + 11, kY, kX}, "p");
  NdArrayHandle div = *s->ndarray(DType::kF32, {2, kY, kX}, "div");
  std::vector<float> p0(size_t{kIters + 11} * kY * kX, 0.0f), d0(size_t{2} * kY * kX);
  for (size_t e = 0; e < size_t{kY} * kX; ++e)  // row 10: the first iteration's
    p0[size_t{10} * kY * kX + e] = std::sin(0.37f * static_cast<float>(e));
  for (size_t e = 0; e < d0.size(); ++e) d0[e] = 0.01f * static_cast<float>(e % 13) - 0.05f;
  ASSERT_TRUE(s->upload(p, std::span<const float>(p0)).ok());
  ASSERT_TRUE(s->upload(div, std::span<const float>(d0)).ok());
  std::vector<float> got(p0.size());
  replay_blocked(
      *s, "pressure", *k, kIters,
      [&](uint32_t a) {
        return std::vector<Arg>{Arg::i32(static_cast<int32_t>(a)), Arg::i32(1), Arg::ndarray(p),
                                Arg::ndarray(div)};
      },
      "the iterations", p, &got);
  if (::testing::Test::HasFatalFailure()) return;
  const codegen::Kernel pressure = parsed(kPressure);
  codegen::HostArray hp(DType::kF32, {kIters + 11, kY, kX}), hd(DType::kF32, {2, kY, kX});
  for (size_t e = 0; e < p0.size(); ++e) hp.data[e] = p0[e];
  for (size_t e = 0; e < d0.size(); ++e) hd.data[e] = d0[e];
  for (uint32_t a = 0; a < kIters; ++a) {
    using codegen::HostArg;
    ASSERT_TRUE(codegen::evaluate(pressure, std::vector<HostArg>{HostArg::of(a), HostArg::of(1u),
                                                                 HostArg::of(hp), HostArg::of(hd)})
                    .ok());
  }
  // Four adds and a multiply by 0.25 per step, in the same order: equal to a few ulps of
  // |p| <= 1.1.
  for (size_t e = 0; e < got.size(); ++e) ASSERT_NEAR(got[e], hp.data[e], 1e-5) << "element " << e;
  expect_no_validation_messages(*s);
}

// 40 x 36: not whole tiles either.
TEST(StencilBlocking, APeriodicPressureIterationBlocksWithTheLaunchesResults) {
  periodic_pressure(40, 36);
}

// A periodic box of at most 32 cells a side (the patterns' Jacobi at 32^2): the halo of a 16-cell
// tile reaches most of the way round, short of wrapping onto the tile itself.
TEST(StencilBlocking, APeriodicBoxOf32CellsBlocksToo) { periodic_pressure(32, 28); }

// The pressure iteration's adjoint, k from 11 down to 0 with t fixed: a gather with periodic
// candidates, blocked with a stash, against the CPU evaluator's atomic adds.
void periodic_pressure_adjoint(uint32_t kY, uint32_t kX) {
  bool skipped = false;
  auto s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(s, nullptr);
  constexpr uint32_t kIters = 12, kRowsP = kIters + 11;
  Result<codegen::Kernel> adj = codegen::make_adjoint(parsed(kPressure));
  ASSERT_TRUE(adj.ok()) << adj.status().message();
  const std::string text = codegen::print(*adj);
  Result<KernelHandle> k = s->compile(std::string_view(text));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_EQ(adj->params.size(), 6u);  // k, t, p, div, p_grad, div_grad
  {
    // Along a wrapping axis each neighbour's add lands on the thread's cell modulo the extent
    // wherever it runs: no add of the gather form keeps a compare with the cell.
    // (as the run below launches it: k steps down from kIters - 1, t fixed at 1)
    const std::vector<int64_t> pshape{kRowsP, kY, kX}, dshape{2, kY, kX};
    const std::vector<int64_t> step{-1, 0, 0, 0, 0, 0}, first{kIters - 1, 1, 0, 0, 0, 0};
    Result<codegen::Kernel> gathered = codegen::gather_form(
        *adj, {{0, kY}, {0, kX}}, {{}, {}, pshape, dshape, pshape, dshape}, &step, &first);
    ASSERT_TRUE(gathered.ok()) << gathered.status().message();
    const std::string gtext = codegen::print(*gathered);
    EXPECT_EQ(gtext.find(" = eq "), std::string::npos) << gtext;
  }
  std::vector<float> g0(size_t{kRowsP} * kY * kX), zeros_p(g0.size(), 0.0f);
  for (size_t e = 0; e < g0.size(); ++e) g0[e] = 0.01f * static_cast<float>(e % 29) - 0.1f;
  std::vector<float> dg0(size_t{2} * kY * kX, 0.0f);
  NdArrayHandle p = *s->ndarray(DType::kF32, {kRowsP, kY, kX}, "p");
  NdArrayHandle div = *s->ndarray(DType::kF32, {2, kY, kX}, "div");
  NdArrayHandle pg = *s->ndarray(DType::kF32, {kRowsP, kY, kX}, "p_grad");
  NdArrayHandle dg = *s->ndarray(DType::kF32, {2, kY, kX}, "div_grad");
  ASSERT_TRUE(s->upload(p, std::span<const float>(zeros_p)).ok());
  ASSERT_TRUE(s->upload(div, std::span<const float>(dg0)).ok());
  ASSERT_TRUE(s->begin_capture("pressure_adjoint").ok());
  for (int32_t a = kIters - 1; a >= 0; --a) {
    ASSERT_TRUE(s->launch(*k, {Arg::i32(a), Arg::i32(1), Arg::ndarray(p), Arg::ndarray(div),
                               Arg::ndarray(pg), Arg::ndarray(dg)})
                    .ok());
  }
  Result<GraphHandle> g = s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_LT(graph_steps(*s, *g), kIters / 2) << "the adjoint's launches were not blocked";
  ASSERT_TRUE(s->upload(pg, std::span<const float>(g0)).ok());
  ASSERT_TRUE(s->upload(dg, std::span<const float>(dg0)).ok());
  ASSERT_TRUE(s->replay(*g).ok());
  Status st = s->synchronize();
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<float> got(g0.size()), got_d(dg0.size());
  ASSERT_TRUE(s->download(pg, std::span<float>(got)).ok());
  ASSERT_TRUE(s->download(dg, std::span<float>(got_d)).ok());
  codegen::HostArray hp(DType::kF32, {kRowsP, kY, kX}), hd(DType::kF32, {2, kY, kX});
  codegen::HostArray hg = hp, hdg = hd;
  for (size_t e = 0; e < g0.size(); ++e) hg.data[e] = g0[e];
  for (int32_t a = kIters - 1; a >= 0; --a) {
    using codegen::HostArg;
    ASSERT_TRUE(codegen::evaluate(
                    *adj, std::vector<HostArg>{HostArg::of(a), HostArg::of(1), HostArg::of(hp),
                                               HostArg::of(hd), HostArg::of(hg), HostArg::of(hdg)})
                    .ok());
  }
  // Sums of quarters of |g| <= ~0.2 in another order: a few ulps per step over 12 steps.
  for (size_t e = 0; e < got.size(); ++e)
    ASSERT_NEAR(got[e], hg.data[e], 1e-5) << "p_grad element " << e;
  for (size_t e = 0; e < got_d.size(); ++e)
    ASSERT_NEAR(got_d[e], hdg.data[e], 1e-5) << "div_grad element " << e;
  expect_no_validation_messages(*s);
}

TEST(StencilBlocking, APeriodicPressureAdjointBlocksWithTheLaunchesResults) {
  periodic_pressure_adjoint(40, 36);
}

TEST(StencilBlocking, APeriodicAdjointOnABoxOf32CellsBlocksToo) {
  periodic_pressure_adjoint(32, 28);
}

// What does not block, and says why.
TEST(StencilBlocking, KernelsThatAreNotStencilsOfTheFormAreRefused) {
  const codegen::Kernel wave = parsed(kWave);
  codegen::StencilLaunch l;
  l.kernel = &wave;
  l.arrays = {0, 1};
  l.step = {1, 0};
  l.box = {{0, kRows}, {0, kCols}};
  l.shapes = {{}, {kSteps + 2, kRows, kCols}};
  std::string why;
  EXPECT_GE(codegen::stencil_steps(l, codegen::kStencilSharedBytes, &why), 2u) << why;
  // Too little shared memory for two steps' rows.
  EXPECT_EQ(codegen::stencil_steps(l, 1024, &why), 0u);
  // Fewer tiles than asked for (20 x 13 cells: 2 tiles of 16 x 16).
  l.min_tiles = 3;
  EXPECT_EQ(codegen::stencil_steps(l, codegen::kStencilSharedBytes, &why), 0u);
  EXPECT_NE(why.find("2 tiles, fewer than 3"), std::string::npos) << why;
  l.min_tiles = 1;
  // A store at a neighbour's cell: another thread's element.
  std::string text = kWave;
  text.replace(text.find("store p[%t, %i, %j]"), 19, "store p[%t, %imc, %j]");
  const codegen::Kernel shifted = parsed(text.c_str());
  l.kernel = &shifted;
  EXPECT_EQ(codegen::stencil_steps(l, codegen::kStencilSharedBytes, &why), 0u);
  EXPECT_NE(why.find("another thread's cell"), std::string::npos) << why;
  // Reading the neighbours of the row it stores: the launch itself races.
  text = kWave;
  text.replace(text.find("load p[%t1, %imc, %j]"), 21, "load p[%t, %imc, %j]");
  const codegen::Kernel racy = parsed(text.c_str());
  l.kernel = &racy;
  EXPECT_EQ(codegen::stencil_steps(l, codegen::kStencilSharedBytes, &why), 0u);
  EXPECT_NE(why.find("around a row it stores"), std::string::npos) << why;
  // An index far past the cell that folds to a near one modulo the extent (i + 18 of 20 rows
  // is i - 2 wrapped) is no wrap-around neighbour: it leaves the extent, which the launch
  // reports as out of bounds.
  text = kWave;
  text.replace(text.find("%imc = max %im, %zero : i32"), 27,
               "%far = const 18 : i32\n    %imc = add %i, %far : i32");
  const codegen::Kernel far = parsed(text.c_str());
  l.kernel = &far;
  EXPECT_EQ(codegen::stencil_steps(l, codegen::kStencilSharedBytes, &why), 0u);
  EXPECT_NE(why.find("no bounded offset"), std::string::npos) << why;
  // A neighbour at an offset no bound is known for (a data-dependent index).
  text = kWave;
  text.replace(text.find("%imc = max %im, %zero : i32"), 27,
               "%imf = load p[%t2, %i, %j] : f32\n    %imc = cast %imf : i32");
  const codegen::Kernel gather = parsed(text.c_str());
  l.kernel = &gather;
  EXPECT_EQ(codegen::stencil_steps(l, codegen::kStencilSharedBytes, &why), 0u);
  EXPECT_NE(why.find("no bounded offset"), std::string::npos) << why;
}

}  // namespace
}  // namespace vkad::testing
