// Launch fusion at Session::end_capture (api/session.h, codegen/launch_fusion.h) on a device:
// a fused graph computes what the same graph computes unfused, takes scalar updates addressed
// to the captured launches, refuses bad ones in the captured numbering, and really is fewer
// launches.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/runtime.h"
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
  SessionOptions o;
  o.validation = true;
  o.fuse_graph_launches = fuse;
  auto r = Session::create(o);
  if (!r.ok() && r.status().code() == ErrorCode::kNoDevice) {
    *skipped = true;
    return nullptr;
  }
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return nullptr;
  auto p = std::make_unique<Program>();
  p->s = std::move(r).value();
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
    VKAD_TRY(s.launch(p.d.forward, {Arg::ndarray(p.x[j]), Arg::ndarray(p.x[j + 1]), Arg::f32(c_of(j))}));
  }
  VKAD_TRY(s.zero(std::span<const NdArrayHandle>(p.g.data(), kSteps)));
  VKAD_TRY(s.fill(p.g[kSteps], 1.0));
  for (uint32_t j = kSteps; j-- > 0;) {
    VKAD_TRY(s.launch(p.d.adjoint, {Arg::ndarray(p.x[j]), Arg::ndarray(p.x[j + 1]),
                                    Arg::f32(c_of(j)), Arg::ndarray(p.g[j]), Arg::ndarray(p.g[j + 1])}));
  }
  return {};
}

std::vector<float> read(Program& p, NdArrayHandle h) {
  std::vector<float> out(kN);
  EXPECT_TRUE(p.s->download(h, std::span<float>(out)).ok());
  return out;
}

void expect_clean(Program& p) {
  const rhi::Device& d = p.s->runtime().device();
  std::string all;
  for (const auto& m : d.validation_messages()) all += m + "\n";
  EXPECT_EQ(d.validation_message_count(), 0u) << all;
}

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
  for (Program* p : {fused.get(), plain.get()}) {
    ASSERT_TRUE(p->s->begin_capture("substeps").ok());
    ASSERT_TRUE(record(*p).ok());
    auto g = p->s->end_capture();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    (p == fused.get() ? gf : gp) = *g;
  }
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
  for (Program* p : {fused.get(), plain.get()}) {
    ASSERT_TRUE(p->s->begin_capture("substeps").ok());
    ASSERT_TRUE(record(*p).ok());
    (p == fused.get() ? gf : gp) = *p->s->end_capture();
  }
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

}  // namespace
}  // namespace vkad::testing
