// Session::rework_loop (docs/graphs.md, "Step loops"): a step loop too wide to roll gets the graph
// rework's plan of its launches ahead, and launch_loop launches that plan. The loop here is
// DiffTaichi's shape in miniature: `acc` adds into g[t] (as an adjoint adds into a gradient),
// `hop` gathers g[t] at a neighbour (as p2g's adjoint reads the grid's), `copy` feeds the next
// step's acc. Gather recompute makes hop compute acc's value itself, which holds only where g[t]
// was zero before acc: the plan relies on it, and launch_loop uses the plan only inside a capture
// whose log shows g zeroed and not written since. Results are compared with the CPU evaluator's
// launches one by one.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ir/text.h"
#include "reference/cpu_eval.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

// g[t, i] += 2 a[t, i]
constexpr const char* kAcc = R"(
kernel acc(t: i32, a: ndarray<f32, 2>, g: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(g, 1)) {
    %t = arg t : i32
    %x = load a[%t, %i] : f32
    %two = const 2 : f32
    %v = mul %x, %two : f32
    atomic_add g[%t, %i], %v
  }
}
)";

// x[t + 1, i] = 0.5 x[t, i] + 0.25 g[t, (i + 1) % n]
constexpr const char* kHop = R"(
kernel hop(t: i32, g: ndarray<f32, 2>, x: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(g, 1)) {
    %t = arg t : i32
    %n = shape g 1 : i32
    %one = const 1 : i32
    %j0 = add %i, %one : i32
    %j = mod %j0, %n : i32
    %x = load x[%t, %i] : f32
    %g = load g[%t, %j] : f32
    %h = const 0.5 : f32
    %q = const 0.25 : f32
    %a = mul %x, %h : f32
    %b = mul %g, %q : f32
    %v = add %a, %b : f32
    %u = add %t, %one : i32
    store x[%u, %i], %v
  }
}
)";

// a[t + 1, i] = x[t + 1, i]
constexpr const char* kCopy = R"(
kernel copy(t: i32, x: ndarray<f32, 2>, a: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(x, 1)) {
    %t = arg t : i32
    %one = const 1 : i32
    %u = add %t, %one : i32
    %x = load x[%u, %i] : f32
    store a[%u, %i], %x
  }
}
)";

// x[t + 1, i] = x[t, i] + s[i]
constexpr const char* kUse = R"(
kernel use(t: i32, x: ndarray<f32, 2>, s: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(s, 0)) {
    %t = arg t : i32
    %one = const 1 : i32
    %u = add %t, %one : i32
    %x = load x[%t, %i] : f32
    %s = load s[%i] : f32
    %v = add %x, %s : f32
    store x[%u, %i], %v
  }
}
)";

// s[i] += 0.5
constexpr const char* kBump = R"(
kernel bump(t: i32, s: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(s, 0)) {
    %h = const 0.5 : f32
    atomic_add s[%i], %h
  }
}
)";

constexpr uint32_t kN = 48;
constexpr uint32_t kT = 12;

struct Program {
  std::unique_ptr<Session> s;
  KernelHandle acc, hop, copy;
  NdArrayHandle x, a, g;
  std::vector<float> x0;
};

std::unique_ptr<Program> make_program(bool* skipped) {
  auto p = std::make_unique<Program>();
  // resident_max_range 0: nothing rolls, whatever the device.
  p->s = validated_session(skipped, [](SessionOptions& o) { o.resident_max_range = 0; });
  if (!p->s) return nullptr;
  Session& s = *p->s;
  p->acc = *s.compile(std::string_view(kAcc));
  p->hop = *s.compile(std::string_view(kHop));
  p->copy = *s.compile(std::string_view(kCopy));
  p->x = *s.ndarray(DType::kF32, {kT + 1, kN}, "x");
  p->a = *s.ndarray(DType::kF32, {kT + 1, kN}, "a");
  p->g = *s.ndarray(DType::kF32, {kT, kN}, "g");
  p->x0.assign(size_t{kT + 1} * kN, 777.0f);  // junk past row 0: the loop must write it
  for (uint32_t i = 0; i < kN; ++i) p->x0[i] = std::cos(0.2f * static_cast<float>(i));
  return p;
}

std::vector<LoopLaunch> body(const Program& p) {
  const Arg t0 = Arg::i32(0);
  return {{p.acc, {t0, Arg::ndarray(p.a), Arg::ndarray(p.g)}, {1, 0, 0}},
          {p.hop, {t0, Arg::ndarray(p.g), Arg::ndarray(p.x)}, {1, 0, 0}},
          {p.copy, {t0, Arg::ndarray(p.x), Arg::ndarray(p.a)}, {1, 0, 0}}};
}

// x as the launches one by one leave it, from x0 (and a0 = x0) and g filled with `g0`; `pre`:
// acc(0) once before the loop.
std::vector<double> expected(const Program& p, float g0, bool pre) {
  const codegen::Kernel acc = *codegen::parse(kAcc), hop = *codegen::parse(kHop),
                        copy = *codegen::parse(kCopy);
  codegen::HostArray hx(DType::kF32, {kT + 1, kN}), ha(DType::kF32, {kT + 1, kN}),
      hg(DType::kF32, {kT, kN});
  for (size_t i = 0; i < p.x0.size(); ++i) hx.data[i] = ha.data[i] = p.x0[i];
  for (double& v : hg.data) v = g0;
  using codegen::HostArg;
  auto run = [&](const codegen::Kernel& k, uint32_t t, codegen::HostArray& a,
                 codegen::HostArray& b) {
    ASSERT_TRUE(
        codegen::evaluate(k, std::vector<HostArg>{HostArg::of(t), HostArg::of(a), HostArg::of(b)})
            .ok());
  };
  if (pre) run(acc, 0, ha, hg);
  for (uint32_t t = 0; t < kT; ++t) {
    run(acc, t, ha, hg);
    run(hop, t, hg, hx);
    run(copy, t, hx, ha);
  }
  return hx.data;
}

// Every value is a sum of a few f32 products of numbers <= 2 in magnitude (0.5 x + 0.5 x'
// halves each step): a few ulps of 2, 1e-5 absolute is ample, and a missed or doubled g term
// (>= 0.5 |x| ~ 1e-2 here) fails it.
void expect_x(Program& p, float g0, bool pre) {
  const std::vector<double> want = expected(p, g0, pre);
  std::vector<float> got(want.size());
  ASSERT_TRUE(p.s->download(p.x, std::span<float>(got)).ok());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "x element " << i;
}

size_t graph_steps(Program& p, GraphHandle g) {
  Result<size_t> n = p.s->runtime().graphs().graph_steps(g);
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  return n.ok() ? *n : 0;
}

// One loop inside a capture that runs: `before` records what precedes the loop.
template <typename Before>
LoopInfo captured_loop(Program& p, Before&& before, GraphHandle* graph) {
  LoopInfo info;
  EXPECT_TRUE(p.s->upload(p.x, std::span<const float>(p.x0)).ok());
  EXPECT_TRUE(p.s->upload(p.a, std::span<const float>(p.x0)).ok());
  EXPECT_TRUE(p.s->begin_capture("loop", CaptureOptions{.run = true}).ok());
  before();
  Status st = p.s->launch_loop(body(p), kT, &info);
  EXPECT_TRUE(st.ok()) << st.to_string();
  Result<GraphHandle> g = p.s->end_capture();
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (g.ok()) *graph = *g;
  EXPECT_TRUE(p.s->synchronize().ok());
  return info;
}

// Each test's program (make_program) on a session of its own.
class LoopRework : public ::testing::Test {
 protected:
  void SetUp() override {
    bool skipped = false;
    p_ = make_program(&skipped);
    if (skipped) GTEST_SKIP() << "no Vulkan device";
    ASSERT_NE(p_, nullptr);
  }
  std::unique_ptr<Program> p_;
};

TEST_F(LoopRework, APreparedLoopRunsItsPlanWhereTheZerosItNeedsHold) {
  auto& p = p_;
  Session& s = *p->s;
  // Unprepared: the launches one by one.
  GraphHandle g{0};
  LoopInfo info = captured_loop(
      *p, [&] { ASSERT_TRUE(s.zero(p->g).ok()); }, &g);
  EXPECT_FALSE(info.reworked);
  EXPECT_EQ(info.launches, 3 * kT);
  expect_x(*p, 0.0f, false);

  s.rework_loop(body(*p), kT);
  s.rework_loop(body(*p), kT);  // made already: nothing more
  // Zeroed in the capture: the plan, fewer launches (each hop computes its acc), same results.
  info = captured_loop(
      *p, [&] { ASSERT_TRUE(s.zero(p->g).ok()); }, &g);
  EXPECT_TRUE(info.reworked);
  EXPECT_LT(info.launches, 3 * kT);
  EXPECT_EQ(graph_steps(*p, g), 1 + info.launches);  // the fill and the plan's launches
  EXPECT_EQ(s.stats()->reworked_loops, 1u);
  expect_x(*p, 0.0f, false);
  // Its graph replays with the same results.
  ASSERT_TRUE(s.upload(p->x, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.upload(p->a, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.replay(g).ok());
  ASSERT_TRUE(s.synchronize().ok());
  expect_x(*p, 0.0f, false);

  // g zeroed, then written by a launch before the loop: its row 0 is not zero, so the plan
  // would be wrong -- the launches one by one.
  info = captured_loop(
      *p,
      [&] {
        ASSERT_TRUE(s.zero(p->g).ok());
        ASSERT_TRUE(s.launch(p->acc, {Arg::i32(0), Arg::ndarray(p->a), Arg::ndarray(p->g)}).ok());
      },
      &g);
  EXPECT_FALSE(info.reworked);
  EXPECT_EQ(info.launches, 3 * kT);
  expect_x(*p, 0.0f, true);
  // Filled with another value: one by one as well.
  info = captured_loop(
      *p, [&] { ASSERT_TRUE(s.fill(p->g, 1.0).ok()); }, &g);
  EXPECT_FALSE(info.reworked);
  expect_x(*p, 1.0f, false);
  // Outside a capture nothing shows what g holds: one by one.
  ASSERT_TRUE(s.upload(p->x, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.upload(p->a, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.zero(p->g).ok());
  ASSERT_TRUE(s.launch_loop(body(*p), kT, &info).ok());
  EXPECT_FALSE(info.reworked);
  expect_x(*p, 0.0f, false);
  EXPECT_EQ(s.stats()->reworked_loops, 1u);
  expect_no_validation_messages(s);
}

// hop alone: x[t + 1] from x[t] and a g (filled with 0.5) the loop only reads. Consecutive hops
// gather x at their own element only, so the plan rework_loop makes fuses them; it assumes
// nothing of g. x holds x0 again.
std::vector<LoopLaunch> prepared_hops(Program& p) {
  Session& s = *p.s;
  EXPECT_TRUE(s.fill(p.g, 0.5).ok());
  std::vector<LoopLaunch> hops = {body(p)[1]};
  s.rework_loop(hops, kT);
  EXPECT_TRUE(s.upload(p.x, std::span<const float>(p.x0)).ok());
  return hops;
}

TEST_F(LoopRework, APlanNeedingNoZerosRunsOutsideACaptureToo) {
  auto& p = p_;
  Session& s = *p->s;
  const std::vector<LoopLaunch> hops = prepared_hops(*p);
  LoopInfo info;
  ASSERT_TRUE(s.launch_loop(hops, kT, &info).ok());
  EXPECT_TRUE(info.reworked);
  EXPECT_LT(info.launches, kT);
  // The reference: hop alone from g = 0.5.
  const codegen::Kernel hop = *codegen::parse(kHop);
  codegen::HostArray hx(DType::kF32, {kT + 1, kN}), hg(DType::kF32, {kT, kN});
  for (size_t i = 0; i < p->x0.size(); ++i) hx.data[i] = p->x0[i];
  for (double& v : hg.data) v = 0.5;
  for (uint32_t t = 0; t < kT; ++t) {
    using codegen::HostArg;
    ASSERT_TRUE(codegen::evaluate(
                    hop, std::vector<HostArg>{HostArg::of(t), HostArg::of(hg), HostArg::of(hx)})
                    .ok());
  }
  std::vector<float> got(hx.data.size());
  ASSERT_TRUE(s.download(p->x, std::span<float>(got)).ok());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], hx.data[i], 1e-5) << i;
  expect_no_validation_messages(s);
}

// A capture that runs cuts a piece after a loop launched as its plan (as after a rolled one),
// so the device starts the loop while the caller records what follows: the hops, then a use
// of their result, make two pieces, not the one a capture of so few steps makes otherwise.
TEST_F(LoopRework, ACaptureThatRunsStartsAPlannedLoopAtOnce) {
  auto& p = p_;
  Session& s = *p->s;
  const std::vector<LoopLaunch> hops = prepared_hops(*p);
  const uint64_t pieces = s.runtime().stats()->run_pieces;
  ASSERT_TRUE(s.begin_capture("hops", CaptureOptions{.run = true}).ok());
  LoopInfo info;
  ASSERT_TRUE(s.launch_loop(hops, kT, &info).ok());
  EXPECT_TRUE(info.reworked);
  ASSERT_TRUE(s.launch(p->copy, {Arg::i32(kT - 1), Arg::ndarray(p->x), Arg::ndarray(p->a)}).ok());
  Result<GraphHandle> g = s.end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s.synchronize().ok());
  EXPECT_EQ(s.runtime().stats()->run_pieces - pieces, 2u);
  expect_no_validation_messages(s);
}

// A reworked loop captured in a graph: its launches are the plan's (fused kernels of other
// parameters), so an update in the body's numbering would land on another parameter. Refused
// as for a rolled loop, naming the launch, and the graph replays as before.
TEST_F(LoopRework, AnUpdateOfAReworkedLoopsLaunchIsRefused) {
  auto& p = p_;
  Session& s = *p->s;
  const std::vector<LoopLaunch> hops = prepared_hops(*p);
  ASSERT_TRUE(s.begin_capture("reworked").ok());
  LoopInfo info;
  ASSERT_TRUE(s.launch_loop(hops, kT, &info).ok());
  ASSERT_TRUE(info.reworked);
  auto g = s.end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const GraphUpdate bad[] = {{0, 0, Arg::i32(3)}};
  Status refused = s.replay(*g, bad);
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument) << refused.to_string();
  EXPECT_NE(refused.message().find("update of launch 0, made by a launch_loop"), std::string::npos)
      << refused.to_string();
  ASSERT_TRUE(s.replay(*g).ok());
  std::vector<float> once(p->x0.size()), twice(p->x0.size());
  ASSERT_TRUE(s.download(p->x, std::span<float>(once)).ok());
  ASSERT_TRUE(s.upload(p->x, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.replay(*g).ok());
  ASSERT_TRUE(s.download(p->x, std::span<float>(twice)).ok());
  EXPECT_EQ(once, twice);
  EXPECT_NE(once, p->x0);
  ASSERT_TRUE(s.release_graph(*g).ok());
  expect_no_validation_messages(s);
}

TEST_F(LoopRework, APlanReadingAZeroFilledArrayRunsOnlyWhereItIsZero) {
  // use(t) reads s, bump(t) adds into it: their element-wise launches fuse, and a fused run
  // right after a zero fill of a 1-d array reads it as the constant -- so the plan relies on
  // s being zero at the loop's start, as on a zeroed accumulator.
  auto& p = p_;
  Session& s = *p->s;
  const KernelHandle use = *s.compile(std::string_view(kUse));
  const KernelHandle bump = *s.compile(std::string_view(kBump));
  const NdArrayHandle acc = *s.ndarray(DType::kF32, {kN}, "s");
  const Arg t0 = Arg::i32(0);
  const std::vector<LoopLaunch> loop = {
      {use, {t0, Arg::ndarray(p->x), Arg::ndarray(acc)}, {1, 0, 0}},
      {bump, {t0, Arg::ndarray(acc)}, {1, 0}}};
  s.rework_loop(loop, kT);
  for (double s0 : {0.0, 5.0}) {
    ASSERT_TRUE(s.upload(p->x, std::span<const float>(p->x0)).ok());
    ASSERT_TRUE(s.begin_capture("loop", CaptureOptions{.run = true}).ok());
    ASSERT_TRUE(s.fill(acc, s0).ok());
    LoopInfo info;
    ASSERT_TRUE(s.launch_loop(loop, kT, &info).ok());
    Result<GraphHandle> g = s.end_capture();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(s.synchronize().ok());
    EXPECT_EQ(info.reworked, s0 == 0.0) << "s0 " << s0;
    // x[t + 1] = x[t] + s0 + 0.5 t, exactly representable steps of 0.5 over the start value.
    std::vector<float> got(p->x0.size());
    ASSERT_TRUE(s.download(p->x, std::span<float>(got)).ok());
    for (uint32_t t = 0; t <= kT; ++t) {
      for (uint32_t i = 0; i < kN; ++i) {
        const double want = p->x0[i] + t * s0 + 0.5 * (t * (t - 1.0) / 2.0);
        ASSERT_NEAR(got[size_t{t} * kN + i], want, 1e-4) << "s0 " << s0 << " t " << t << " i " << i;
      }
    }
  }
  expect_no_validation_messages(s);
}

TEST_F(LoopRework, APendingBackgroundReworkIsInstalledBeforeThePlanIsMade) {
  // The same loop captured one by one with its rework in the background: that rework compiles
  // the kernels the plan wants and caches them under handles registered only at its install.
  // rework_loop installs it first, so the plan launches registered kernels.
  auto& p = p_;
  Session& s = *p->s;
  ASSERT_TRUE(s.upload(p->x, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.upload(p->a, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.begin_capture("background", CaptureOptions{.background_rework = true}).ok());
  ASSERT_TRUE(s.zero(p->g).ok());
  ASSERT_TRUE(s.launch_loop(body(*p), kT).ok());
  Result<GraphHandle> bg = s.end_capture();  // its rework runs on a thread
  ASSERT_TRUE(bg.ok()) << bg.status().to_string();
  s.rework_loop(body(*p), kT);
  GraphHandle g{0};
  LoopInfo info = captured_loop(
      *p, [&] { ASSERT_TRUE(s.zero(p->g).ok()); }, &g);
  EXPECT_TRUE(info.reworked);
  expect_x(*p, 0.0f, false);
  // The background graph, reworked, gives the same.
  ASSERT_TRUE(s.upload(p->x, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.upload(p->a, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(s.replay(*bg).ok());
  ASSERT_TRUE(s.synchronize().ok());
  expect_x(*p, 0.0f, false);
  expect_no_validation_messages(s);
}

}  // namespace
}  // namespace vkad::testing
