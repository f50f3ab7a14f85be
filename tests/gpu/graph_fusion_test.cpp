// Launch fusion at Session::end_capture (api/session.h, graph/launch_fusion.h) on a device:
// a fused graph computes what the same graph computes unfused, takes scalar updates addressed
// to the captured launches, refuses bad ones in the captured numbering, and really is fewer
// launches.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

// b = sin(a) * c + 0.1: a substep with a scalar.
constexpr const char* kStep = R"(
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

constexpr uint32_t kN = 1000;  // not a multiple of a workgroup: the tail is masked in each member
constexpr uint32_t kSteps = 40;

struct Program {
  std::unique_ptr<Session> s;
  Differentiated d;
  std::vector<NdArrayHandle> x, g;
};

// A session (fusion on or off) with kSteps substeps over x0..xS and their gradients.
std::unique_ptr<Program> make_program(bool fuse, bool* skipped) {
  auto p = std::make_unique<Program>();
  p->s = validated_session(skipped, [&](SessionOptions& o) { o.fuse_graph_launches = fuse; });
  if (!p->s) return nullptr;
  auto d = p->s->differentiate(std::string_view(kStep));
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  p->d = *d;
  std::vector<float> x0(kN);
  for (uint32_t i = 0; i < kN; ++i) x0[i] = 0.003f * static_cast<float>(i);
  for (uint32_t j = 0; j <= kSteps; ++j) {
    p->x.push_back(*p->s->ndarray(DType::kF32, {kN}, "x" + std::to_string(j)));
    p->g.push_back(*p->s->ndarray(DType::kF32, {kN}, "g" + std::to_string(j)));
  }
  EXPECT_TRUE(p->s->upload(p->x[0], std::span<const float>(x0)).ok());
  return p;
}

float c_of(uint32_t j) { return 0.95f - 0.005f * static_cast<float>(j); }

// Forward, gradients zeroed, seed, adjoints last-first: one training iteration's launches.
Status record(Program& p) {
  Session& s = *p.s;
  for (uint32_t j = 0; j < kSteps; ++j) {
    VKAD_TRY(
        s.launch(p.d.forward, {Arg::ndarray(p.x[j]), Arg::ndarray(p.x[j + 1]), Arg::f32(c_of(j))}));
  }
  VKAD_TRY(s.zero(std::span<const NdArrayHandle>(p.g.data(), kSteps)));
  VKAD_TRY(s.fill(p.g[kSteps], 1.0));
  for (uint32_t j = kSteps; j-- > 0;) {
    VKAD_TRY(
        s.launch(p.d.adjoint, {Arg::ndarray(p.x[j]), Arg::ndarray(p.x[j + 1]), Arg::f32(c_of(j)),
                               Arg::ndarray(p.g[j]), Arg::ndarray(p.g[j + 1])}));
  }
  return {};
}

// record(p) captured as graph "substeps".
GraphHandle capture_substeps(Program& p, CaptureOptions options = {}) {
  EXPECT_TRUE(p.s->begin_capture("substeps", options).ok());
  EXPECT_TRUE(record(p).ok());
  auto g = p.s->end_capture();
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? *g : GraphHandle{};
}

std::vector<float> read(Program& p, NdArrayHandle h) {
  std::vector<float> out(kN);
  EXPECT_TRUE(p.s->download(h, std::span<float>(out)).ok());
  return out;
}

void expect_clean(Program& p) { expect_no_validation_messages(*p.s); }

// Both compute the same f32 operations in the same order per element; the drivers may still
// contract mul + add differently in a larger kernel, so each value may differ by a few ulp per
// step: 40 steps of 2 ulp relative is below 1e-5.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  for (uint32_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(a[i], b[i], 1e-5 * std::fabs(b[i]) + 1e-30) << what << " at " << i;
  }
}

TEST(GraphFusion, AFusedSubstepGraphComputesWhatTheUnfusedOneDoesInFewerLaunches) {
  bool skipped = false;
  auto fused = make_program(true, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  auto plain = make_program(false, &skipped);
  ASSERT_TRUE(fused && plain);
  GraphHandle gf, gp;
  for (Program* p : {fused.get(), plain.get()}) (p == fused.get() ? gf : gp) = capture_substeps(*p);
  // Garbage in the gradients: the captured zeroing must still happen (or, where the fused
  // graph leaves a fill out, the fused adjoints must overwrite every element without reading).
  const std::vector<float> junk(kN, 12345.0f);
  for (Program* p : {fused.get(), plain.get()}) {
    for (NdArrayHandle g : p->g) ASSERT_TRUE(p->s->upload(g, std::span<const float>(junk)).ok());
  }
  auto launches = [](Program& p) { return p.s->stats()->launches; };
  const uint64_t f0 = launches(*fused), p0 = launches(*plain);
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_TRUE(fused->s->replay(gf).ok());
    ASSERT_TRUE(plain->s->replay(gp).ok());
  }
  ASSERT_TRUE(fused->s->synchronize().ok());
  ASSERT_TRUE(plain->s->synchronize().ok());
  EXPECT_EQ(launches(*plain) - p0, 2u * 2 * kSteps);
  // 40 forward launches bind 41 arrays: two runs under 24 arrays each; 40 adjoints bind 82:
  // four runs (at most 11 launches each).
  EXPECT_LE(launches(*fused) - f0, 2u * 8);
  // The fused kernels are compiled with their extents as pipeline constants
  // (CompileOptions::specialize_shapes) and every launch of them runs specialized (no launch
  // fell back to a generic pipeline). The unfused graph's kernels are the session's, which
  // specializes shapes too (default_compile_options): one pipeline each, the forward and its
  // adjoint, every shape the same.
  auto stats = fused->s->runtime().stats();
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const runtime::RuntimeStats& fs = *stats;
  EXPECT_GT(fs.adstack_specialized_pipelines, 0u);
  EXPECT_GT(fs.adstack_specialized_dispatches, 0u);
  EXPECT_EQ(fs.adstack_specialize_misses, 0u);
  EXPECT_EQ(plain->s->runtime().stats()->adstack_specialized_pipelines, 2u);
  EXPECT_EQ(plain->s->runtime().stats()->adstack_specialize_misses, 0u);
  expect_close(read(*fused, fused->x[kSteps]), read(*plain, plain->x[kSteps]), "x_S");
  expect_close(read(*fused, fused->g[0]), read(*plain, plain->g[0]), "dL/dx0");
  expect_close(read(*fused, fused->g[kSteps / 2]), read(*plain, plain->g[kSteps / 2]), "dL/dx_S/2");
  // The closed form at a few elements: dL/dx0 = prod_j c_j cos(x_j); sin within 2^-11 (Vulkan's
  // absolute bound) per step, so 2e-3 relative over 40 steps.
  const std::vector<float> g0 = read(*fused, fused->g[0]);
  for (uint32_t i : {0u, 1u, 517u, kN - 1}) {
    double x = 0.003 * i, want = 1;
    for (uint32_t j = 0; j < kSteps; ++j) {
      want *= c_of(j) * std::cos(x);
      x = std::sin(x) * c_of(j) + 0.1;
    }
    EXPECT_NEAR(g0[i], want, 2e-3 * std::fabs(want)) << "element " << i;
  }
  expect_clean(*fused);
  expect_clean(*plain);
}

TEST(GraphFusion, UpdatesNameTheCapturedLaunchesAndReachTheirMember) {
  bool skipped = false;
  auto fused = make_program(true, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  auto plain = make_program(false, &skipped);
  ASSERT_TRUE(fused && plain);
  GraphHandle gf, gp;
  for (Program* p : {fused.get(), plain.get()}) (p == fused.get() ? gf : gp) = capture_substeps(*p);
  // c of forward launch 7 and of the adjoint of step 30 (captured launch 40 + 9).
  const GraphUpdate ups[] = {{7, 2, Arg::f32(0.5f)}, {49, 2, Arg::f32(0.25f)}};
  ASSERT_TRUE(fused->s->replay(gf, ups).ok());
  ASSERT_TRUE(plain->s->replay(gp, ups).ok());
  ASSERT_TRUE(fused->s->replay(gf).ok());  // kept for later replays
  ASSERT_TRUE(plain->s->replay(gp).ok());
  expect_close(read(*fused, fused->x[kSteps]), read(*plain, plain->x[kSteps]), "x_S");
  expect_close(read(*fused, fused->g[0]), read(*plain, plain->g[0]), "dL/dx0");
  // The update really changed something: x8 = sin(x7) * 0.5 + 0.1.
  const std::vector<float> x7 = read(*fused, fused->x[7]), x8 = read(*fused, fused->x[8]);
  EXPECT_NEAR(x8[100], std::sin(x7[100]) * 0.5f + 0.1f, 1e-3f);
  // Bad updates are refused in the captured numbering, with nothing kept.
  const GraphUpdate past[] = {{80, 2, Arg::f32(1.0f)}};
  Status st = fused->s->replay(gf, past);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("update of launch 80; the graph has 80 launches"), std::string::npos)
      << st.to_string();
  const GraphUpdate array_param[] = {{3, 1, Arg::f32(1.0f)}};
  st = fused->s->replay(gf, array_param);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("launch 3"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("parameter 1 is not a scalar parameter"), std::string::npos);
  ASSERT_TRUE(fused->s->release_graph(gf).ok());
  ASSERT_TRUE(plain->s->release_graph(gp).ok());
  expect_clean(*fused);
  expect_clean(*plain);
}

// CaptureOptions::background_rework: end_capture returns the graph as captured and the rework
// is installed later; every replay computes what the plain graph does, updates made before
// the install carry over, and the installed graph is the fused one.
GraphHandle capture_in_background(Program& p) {
  return capture_substeps(p, CaptureOptions{.background_rework = true});
}

TEST(GraphFusion, ABackgroundReworkRunsAsCapturedUntilInstalledWithUpdatesCarriedOver) {
  bool skipped = false;
  auto fused = make_program(true, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  auto plain = make_program(false, &skipped);
  ASSERT_TRUE(fused && plain);
  const GraphHandle gf = capture_in_background(*fused);
  const GraphHandle gp = capture_substeps(*plain);
  // Replayed at once (on lavapipe the rework's compiles are still running: the launches as
  // captured), with an update that the reworked graph must keep.
  const GraphUpdate ups[] = {{7, 2, Arg::f32(0.5f)}, {49, 2, Arg::f32(0.25f)}};
  ASSERT_TRUE(fused->s->replay(gf, ups).ok());
  ASSERT_TRUE(plain->s->replay(gp, ups).ok());
  expect_close(read(*fused, fused->x[kSteps]), read(*plain, plain->x[kSteps]), "x_S, first");
  ASSERT_TRUE(fused->s->finish_rework(gf).ok());
  // Installed: the fused graph, with the update of the first replay.
  const std::vector<float> junk(kN, 12345.0f);
  for (NdArrayHandle g : fused->g)
    ASSERT_TRUE(fused->s->upload(g, std::span<const float>(junk)).ok());
  const uint64_t f0 = fused->s->stats()->launches;
  ASSERT_TRUE(fused->s->replay(gf).ok());
  ASSERT_TRUE(fused->s->synchronize().ok());
  EXPECT_LE(fused->s->stats()->launches - f0, 8u);
  ASSERT_TRUE(plain->s->replay(gp).ok());
  expect_close(read(*fused, fused->x[kSteps]), read(*plain, plain->x[kSteps]), "x_S");
  expect_close(read(*fused, fused->g[0]), read(*plain, plain->g[0]), "dL/dx0");
  const std::vector<float> x7 = read(*fused, fused->x[7]), x8 = read(*fused, fused->x[8]);
  EXPECT_NEAR(x8[100], std::sin(x7[100]) * 0.5f + 0.1f, 1e-3f);
  // Updates after the install go through the fused graph's numbering as before.
  const GraphUpdate later[] = {{7, 2, Arg::f32(0.75f)}};
  ASSERT_TRUE(fused->s->replay(gf, later).ok());
  ASSERT_TRUE(plain->s->replay(gp, later).ok());
  expect_close(read(*fused, fused->g[0]), read(*plain, plain->g[0]), "dL/dx0, later");
  ASSERT_TRUE(fused->s->release_graph(gf).ok());
  EXPECT_EQ(fused->s->replay(gf).code(), ErrorCode::kNotFound);
  expect_clean(*fused);
  expect_clean(*plain);
}

TEST(GraphFusion, TheNextCaptureInstallsAPendingBackgroundRework) {
  bool skipped = false;
  auto p = make_program(true, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(p);
  const GraphHandle first = capture_in_background(*p);
  const GraphHandle second = capture_in_background(*p);  // installs the first's rework
  uint64_t n0 = p->s->stats()->launches;
  ASSERT_TRUE(p->s->replay(first).ok());
  ASSERT_TRUE(p->s->synchronize().ok());
  EXPECT_LE(p->s->stats()->launches - n0, 8u);
  // A kernel compiled while the second's rework runs waits for it; releasing the graph drops
  // the rework, and the session closes cleanly with a third still running.
  auto k = p->s->compile(std::string_view(kStep));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(p->s->release_graph(second).ok());
  ASSERT_TRUE(p->s->finish_rework(second).ok());  // nothing pending for it: nothing to do
  n0 = p->s->stats()->launches;
  ASSERT_TRUE(p->s->replay(first).ok());
  ASSERT_TRUE(p->s->synchronize().ok());
  EXPECT_LE(p->s->stats()->launches - n0, 8u);
  (void)capture_in_background(*p);
  expect_clean(*p);
}

// Review findings (each failed before its fix): a fill's sign, a short array's bounds check,
// steps recorded through runtime() during a Session capture, update errors' numbering.
constexpr const char* kRecip = R"(
kernel recip(z: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(y, 0)) {
    %v = load z[%i] : f32
    %one = const 1.0 : f32
    %r = div %one, %v : f32
    store y[%i], %r
  }
})";
constexpr const char* kCopy = R"(
kernel copy(y: ndarray<f32, 1>, w: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(y, 0)) {
    %v = load y[%i] : f32
    store w[%i], %v
  }
})";
constexpr const char* kAddZ = R"(
kernel addz(x: ndarray<f32, 1>, z: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %a = load x[%i] : f32
    %b = load z[%i] : f32
    %c = add %a, %b : f32
    store y[%i], %c
  }
})";
constexpr const char* kDouble = R"(
kernel dbl(y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(y, 0)) {
    %v = load y[%i] : f32
    %r = add %v, %v : f32
    store y[%i], %r
  }
})";

class FusionEdges : public ValidatedSessionTest {
 protected:
  KernelHandle kernel(const char* text) {
    auto k = s_->compile(std::string_view(text));
    EXPECT_TRUE(k.ok()) << k.status().to_string();
    return k.ok() ? *k : KernelHandle{};
  }
  NdArrayHandle array(uint32_t n, float v, const char* name) {
    auto h = s_->ndarray(DType::kF32, {n}, name);
    EXPECT_TRUE(h.ok());
    const std::vector<float> init(n, v);
    EXPECT_TRUE(s_->upload(*h, std::span<const float>(init)).ok());
    return *h;
  }
  std::vector<float> read(NdArrayHandle h, uint32_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(s_->download(h, std::span<float>(out)).ok());
    return out;
  }
};

TEST_F(FusionEdges, AFillOfMinusZeroIsNotReadAsPlusZero) {
  KernelHandle recip = kernel(kRecip), copy = kernel(kCopy);
  NdArrayHandle z = array(8, 1, "z"), y = array(8, 0, "y"), w = array(8, 0, "w");
  ASSERT_TRUE(s_->begin_capture("g").ok());
  ASSERT_TRUE(s_->fill(z, -0.0).ok());
  ASSERT_TRUE(s_->launch(recip, {Arg::ndarray(z), Arg::ndarray(y)}).ok());
  ASSERT_TRUE(s_->launch(copy, {Arg::ndarray(y), Arg::ndarray(w)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(s_->replay(*g).ok());
  for (float v : read(w, 8)) EXPECT_EQ(v, -std::numeric_limits<float>::infinity());
}

TEST_F(FusionEdges, AZeroedArrayShorterThanTheRangeStillFaultsOutOfBounds) {
  KernelHandle add = kernel(kAddZ), copy = kernel(kCopy);
  NdArrayHandle x = array(8, 1, "x"), z = array(4, 0, "z"), y = array(8, 0, "y"),
                w = array(8, 0, "w");
  ASSERT_TRUE(s_->begin_capture("g").ok());
  ASSERT_TRUE(s_->zero(z).ok());
  ASSERT_TRUE(s_->launch(add, {Arg::ndarray(x), Arg::ndarray(z), Arg::ndarray(y)}).ok());
  ASSERT_TRUE(s_->launch(copy, {Arg::ndarray(y), Arg::ndarray(w)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(s_->replay(*g).ok());
  Status st = s_->synchronize();
  EXPECT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("out-of-bounds"), std::string::npos) << st.to_string();
  // The error names the graph launch that raised it (issue 56, point 5), from a replay of its
  // bundles and from one recorded launch by launch (with a timeline on).
  EXPECT_NE(st.message().find(" of graph 'g')"), std::string::npos) << st.to_string();
  ASSERT_TRUE(s_->begin_timeline().ok());
  ASSERT_TRUE(s_->replay(*g).ok());
  ASSERT_TRUE(s_->end_timeline().ok());
  st = s_->synchronize();
  EXPECT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find(" of graph 'g')"), std::string::npos) << st.to_string();
}

TEST_F(FusionEdges, StepsRecordedThroughTheRuntimeDuringACaptureAreKept) {
  KernelHandle add = kernel(kAddZ), dbl = kernel(kDouble), copy = kernel(kCopy);
  NdArrayHandle x = array(8, 1, "x"), z = array(8, 1, "z"), y = array(8, 0, "y"),
                w = array(8, 0, "w");
  ASSERT_TRUE(s_->begin_capture("g").ok());
  ASSERT_TRUE(s_->launch(add, {Arg::ndarray(x), Arg::ndarray(z), Arg::ndarray(y)}).ok());
  ASSERT_TRUE(s_->runtime().launch(dbl, std::vector<Arg>{Arg::ndarray(y)}).ok());
  ASSERT_TRUE(s_->runtime().fill(x, 5.0).ok());
  ASSERT_TRUE(s_->launch(copy, {Arg::ndarray(y), Arg::ndarray(w)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(s_->replay(*g).ok());
  for (float v : read(w, 8)) EXPECT_EQ(v, 4.0f);  // (1 + 1) * 2
  for (float v : read(x, 8)) EXPECT_EQ(v, 5.0f);
  // A capture begun through the runtime and ended through the session has nothing to fuse.
  ASSERT_TRUE(s_->runtime().graphs().begin_capture("h").ok());
  ASSERT_TRUE(s_->launch(copy, {Arg::ndarray(y), Arg::ndarray(w)}).ok());
  auto h = s_->end_capture();
  ASSERT_TRUE(h.ok()) << h.status().to_string();
}

TEST_F(FusionEdges, AValueTheRuntimeRefusesIsNamedInTheCapturedNumbering) {
  auto d = s_->differentiate(std::string_view(kStep));
  ASSERT_TRUE(d.ok());
  NdArrayHandle a = array(8, 0.5f, "a"), b = array(8, 0, "b"), c = array(8, 0, "c");
  ASSERT_TRUE(s_->begin_capture("g").ok());
  ASSERT_TRUE(s_->launch(d->forward, {Arg::ndarray(a), Arg::ndarray(b), Arg::f32(0.5f)}).ok());
  ASSERT_TRUE(s_->launch(d->forward, {Arg::ndarray(b), Arg::ndarray(c), Arg::f32(0.5f)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok());
  const GraphUpdate wrong[] = {{1, 2, Arg::i32(5)}};
  Status st = s_->replay(*g, wrong);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("captured launch 1 parameter 2"), std::string::npos)
      << st.to_string();
}

// On a device that caps loop passes per invocation (lavapipe) kernels with loops are not
// fused: an update that keeps each launch under the cap must not be refused because a fused
// kernel would sum their passes. Elsewhere the same graph simply replays.
TEST_F(FusionEdges, UpdatesThatEachLaunchTakesAreNotRefusedForAFusedSum) {
  KernelHandle loop = kernel(R"(
kernel loop(b: ndarray<f32, 1>, n: i32) {
  task main parallel %i in [0, shape(b, 0)) {
    %z = const 0 : i32
    %n = arg n : i32
    for %k in [%z, %n) {
      %x = load b[%i] : f32
      %one = const 1.0 : f32
      %y = add %x, %one : f32
      store b[%i], %y
    }
  }
})");
  NdArrayHandle b = array(8, 0, "b"), c = array(8, 0, "c");
  ASSERT_TRUE(s_->begin_capture("g").ok());
  ASSERT_TRUE(s_->launch(loop, {Arg::ndarray(b), Arg::i32(1)}).ok());
  ASSERT_TRUE(s_->launch(loop, {Arg::ndarray(c), Arg::i32(1)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok());
  const GraphUpdate ups[] = {{0, 1, Arg::i32(40000)}, {1, 1, Arg::i32(40000)}};
  Status st = s_->replay(*g, ups);
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (float v : read(b, 8)) EXPECT_EQ(v, 40000.0f);
  for (float v : read(c, 8)) EXPECT_EQ(v, 40000.0f);
}

}  // namespace
}  // namespace vkad::testing
