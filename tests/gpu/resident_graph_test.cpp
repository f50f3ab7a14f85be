// Resident step loops at Session::end_capture (graph/resident.h, docs/graphs.md,
// "Resident step loops"): a captured loop of small launches -- a neighbour read fusion cannot
// merge, an atomic reduction, a one-element launch with a float scalar -- becomes one launch of a
// single-workgroup kernel whose phases meet at workgroup barriers. Its results are those of
// the launches one by one on the CPU evaluator; an update of a rolled launch's scalar falls
// back to the graph as captured; the off switch and the range limit keep the launches.
#include <gtest/gtest.h>

#include <climits>
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

// y[t, i] = x[t, i] + 0.25 * (x[t, (i + 1) % n] - x[t, i]): reads a neighbour's element.
constexpr const char* kSpread = R"(
kernel spread(t: i32, x: ndarray<f32, 2>, y: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(y, 1)) {
    %t = arg t : i32
    %n = shape y 1 : i32
    %one = const 1 : i32
    %j0 = add %i, %one : i32
    %j = mod %j0, %n : i32
    %a = load x[%t, %i] : f32
    %b = load x[%t, %j] : f32
    %d = sub %b, %a : f32
    %q = const 0.25 : f32
    %e = mul %d, %q : f32
    %r = add %a, %e : f32
    store y[%t, %i], %r
  }
}
)";

// x[t + 1, i] = 0.75 * y[t, i] + m[t]; total[0] += y[t, i].
constexpr const char* kAdvance = R"(
kernel advance(t: i32, y: ndarray<f32, 2>, m: ndarray<f32, 1>, x: ndarray<f32, 2>,
               total: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(y, 1)) {
    %t = arg t : i32
    %y = load y[%t, %i] : f32
    %k = const 0.75 : f32
    %s = mul %y, %k : f32
    %m = load m[%t] : f32
    %v = add %s, %m : f32
    %one = const 1 : i32
    %u = add %t, %one : i32
    store x[%u, %i], %v
    %z = const 0 : i32
    atomic_add total[%z], %y
  }
}
)";

// m[t] = c * t: one element, a float scalar that stays the same in every step.
constexpr const char* kMark = R"(
kernel mark(t: i32, c: f32, m: ndarray<f32, 1>) {
  task main parallel %i in [0, 1) {
    %t = arg t : i32
    %c = arg c : f32
    %tf = cast %t : f32
    %v = mul %c, %tf : f32
    store m[%t], %v
  }
}
)";

constexpr uint32_t kN = 40;
constexpr uint32_t kT = 30;
constexpr float kC = 0.01f;

struct Program {
  std::unique_ptr<Session> s;
  KernelHandle spread, advance, mark;
  NdArrayHandle x, y, m, total;
  std::vector<float> x0;
};

std::unique_ptr<Program> make_program(uint32_t resident_max_range, bool* skipped) {
  auto p = std::make_unique<Program>();
  p->s = validated_session(skipped,
                           [&](SessionOptions& o) { o.resident_max_range = resident_max_range; });
  if (!p->s) return nullptr;
  Session& s = *p->s;
  p->spread = *s.compile(std::string_view(kSpread));
  p->advance = *s.compile(std::string_view(kAdvance));
  p->mark = *s.compile(std::string_view(kMark));
  p->x = *s.ndarray(DType::kF32, {kT + 1, kN}, "x");
  p->y = *s.ndarray(DType::kF32, {kT, kN}, "y");
  p->m = *s.ndarray(DType::kF32, {kT}, "m");
  p->total = *s.ndarray(DType::kF32, {1}, "total");
  p->x0.assign(size_t{kT + 1} * kN, 555.0f);  // junk past row 0: the loop must write it
  for (uint32_t i = 0; i < kN; ++i) p->x0[i] = std::sin(0.3f * static_cast<float>(i));
  EXPECT_TRUE(s.upload(p->x, std::span<const float>(p->x0)).ok());
  return p;
}

// Per step: the controller value, the neighbour spread, the state update; a fill first.
Status record(Program& p) {
  Session& s = *p.s;
  VKAD_TRY(s.zero(p.total));
  for (uint32_t t = 0; t < kT; ++t) {
    const Arg ti = Arg::i32(static_cast<int32_t>(t));
    VKAD_TRY(s.launch(p.mark, {ti, Arg::f32(kC), Arg::ndarray(p.m)}));
    VKAD_TRY(s.launch(p.spread, {ti, Arg::ndarray(p.x), Arg::ndarray(p.y)}));
    VKAD_TRY(s.launch(p.advance, {ti, Arg::ndarray(p.y), Arg::ndarray(p.m), Arg::ndarray(p.x),
                                  Arg::ndarray(p.total)}));
  }
  return {};
}

// The same launches one by one on the CPU evaluator; `c3`: the scalar c of step 3.
void expected(const Program& p, float c3, std::vector<double>* x, double* total) {
  auto parse = [](const char* t) { return *codegen::parse(t); };
  const codegen::Kernel spread = parse(kSpread), advance = parse(kAdvance), mark = parse(kMark);
  codegen::HostArray hx(DType::kF32, {kT + 1, kN}), hy(DType::kF32, {kT, kN}),
      hm(DType::kF32, {kT}), ht(DType::kF32, {1});
  for (size_t i = 0; i < p.x0.size(); ++i) hx.data[i] = p.x0[i];
  for (uint32_t t = 0; t < kT; ++t) {
    using codegen::HostArg;
    const double c = t == 3 ? c3 : kC;
    ASSERT_TRUE(codegen::evaluate(
                    mark, std::vector<HostArg>{HostArg::of(t), HostArg::of(c), HostArg::of(hm)})
                    .ok());
    ASSERT_TRUE(codegen::evaluate(
                    spread, std::vector<HostArg>{HostArg::of(t), HostArg::of(hx), HostArg::of(hy)})
                    .ok());
    ASSERT_TRUE(codegen::evaluate(
                    advance, std::vector<HostArg>{HostArg::of(t), HostArg::of(hy), HostArg::of(hm),
                                                  HostArg::of(hx), HostArg::of(ht)})
                    .ok());
  }
  *x = hx.data;
  *total = ht.data[0];
}

// Every operation is an f32 add or multiply, correctly rounded on both sides, so the state
// matches to a few ulps of accumulated contraction / ordering differences; |x| <= 1 + kT * kC
// (the spread and the 0.75 keep it bounded), so 1e-5 absolute is ~100 ulps. The total is a
// sum of kT * kN terms of |y| <= 1.3 in another order (atomics): its rounding error is at most
// kT * kN * 2^-24 * 1.3 * kT * kN ~ 1e-1 in the worst case, 1e-3 is ample for random order
// (sqrt growth) and still fails on one lost or doubled term (>= 1e-2 here).
void expect_matches(Program& p, float c3) {
  std::vector<double> x;
  double total = 0;
  expected(p, c3, &x, &total);
  std::vector<float> gx(x.size()), gt(1);
  ASSERT_TRUE(p.s->download(p.x, std::span<float>(gx)).ok());
  ASSERT_TRUE(p.s->download(p.total, std::span<float>(gt)).ok());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(gx[i], x[i], 1e-5) << "x element " << i;
  EXPECT_NEAR(gt[0], total, 1e-3);
}

void expect_clean(Program& p) { expect_no_validation_messages(*p.s); }

size_t graph_steps(Program& p, GraphHandle g) {
  Result<size_t> n = p.s->runtime().graphs().graph_steps(g);
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  return n.ok() ? *n : 0;
}

TEST(ResidentGraph, AStepLoopRunsAsOneLaunchWithTheLaunchesResults) {
  bool skipped = false;
  auto p = make_program(1024, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->s->begin_capture("loop").ok());
  ASSERT_TRUE(record(*p).ok());
  Result<GraphHandle> g = p->s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  // The fill and one resident launch instead of 3 * kT launches.
  EXPECT_EQ(graph_steps(*p, *g), 2u);
  Result<SessionStats> st = p->s->stats();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->rolled_launches, 3u * kT);
  for (int rep = 0; rep < 2; ++rep) {  // a second replay starts from the first one's junk
    ASSERT_TRUE(p->s->replay(*g).ok());
    ASSERT_TRUE(p->s->synchronize().ok());
    expect_matches(*p, kC);
  }
  expect_clean(*p);
}

TEST(ResidentGraph, AnUpdateOfARolledLaunchReplaysTheGraphAsCaptured) {
  bool skipped = false;
  auto p = make_program(1024, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->s->begin_capture("loop").ok());
  ASSERT_TRUE(record(*p).ok());
  Result<GraphHandle> g = p->s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  // Launch 9 is step 3's mark (3 launches per step); parameter 1 its c. The resident kernel
  // has one c for every step: only the launches as captured can take a different one.
  const float c3 = 0.5f;
  GraphUpdate u{9, 1, Arg::f32(c3)};
  ASSERT_TRUE(p->s->replay(*g, std::span<const GraphUpdate>(&u, 1)).ok());
  ASSERT_TRUE(p->s->synchronize().ok());
  expect_matches(*p, c3);
  ASSERT_TRUE(p->s->replay(*g).ok());  // the update stays
  ASSERT_TRUE(p->s->synchronize().ok());
  expect_matches(*p, c3);
  expect_clean(*p);
}

TEST(ResidentGraph, OffOrPastTheRangeLimitTheLaunchesStay) {
  for (uint32_t limit : {0u, kN - 1}) {
    bool skipped = false;
    auto p = make_program(limit, &skipped);
    if (skipped) GTEST_SKIP() << "no Vulkan device";
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(p->s->begin_capture("loop").ok());
    ASSERT_TRUE(record(*p).ok());
    Result<GraphHandle> g = p->s->end_capture();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    // Not rolled: the spread's neighbour read keeps it apart from fusion, the mark has
    // another range; at least spread and mark of every step remain launches.
    EXPECT_GE(graph_steps(*p, *g), 1 + 2 * kT) << "limit " << limit;
    ASSERT_TRUE(p->s->replay(*g).ok());
    ASSERT_TRUE(p->s->synchronize().ok());
    expect_matches(*p, kC);
    expect_clean(*p);
  }
}

// Session::launch_loop (docs/graphs.md, "Step loops"): the step loop `record` launches, said as
// one.
std::vector<LoopLaunch> loop_body(const Program& p) {
  const Arg t0 = Arg::i32(0);
  return {
      {p.mark, {t0, Arg::f32(kC), Arg::ndarray(p.m)}, {1, 0, 0}},
      {p.spread, {t0, Arg::ndarray(p.x), Arg::ndarray(p.y)}, {1, 0, 0}},
      {p.advance,
       {t0, Arg::ndarray(p.y), Arg::ndarray(p.m), Arg::ndarray(p.x), Arg::ndarray(p.total)},
       {1, 0, 0, 0, 0}},
  };
}

TEST(ResidentGraph, ALaunchLoopRunsAsOneResidentLaunchWithTheLaunchesResults) {
  bool skipped = false;
  auto p = make_program(1024, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(p, nullptr);
  const std::vector<LoopLaunch> body = loop_body(*p);
  for (uint64_t run = 1; run <= 2; ++run) {  // the second finds the rolled kernel made
    ASSERT_TRUE(p->s->upload(p->x, std::span<const float>(p->x0)).ok());
    ASSERT_TRUE(p->s->zero(p->total).ok());
    LoopInfo info;
    Status st = p->s->launch_loop(body, kT, &info);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(info.rolled);
    EXPECT_EQ(info.launches, 1u);
    EXPECT_EQ(p->s->stats()->rolled_loops, run);
    expect_matches(*p, kC);
  }
  // Captured (and run by the capture): one step for the whole loop, replayed with its results.
  ASSERT_TRUE(p->s->begin_capture("loop", CaptureOptions{.run = true}).ok());
  ASSERT_TRUE(p->s->zero(p->total).ok());
  ASSERT_TRUE(p->s->launch_loop(body, kT).ok());
  Result<GraphHandle> g = p->s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(graph_steps(*p, *g), 2u);
  ASSERT_TRUE(p->s->synchronize().ok());
  expect_matches(*p, kC);
  ASSERT_TRUE(p->s->upload(p->x, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(p->s->replay(*g).ok());
  ASSERT_TRUE(p->s->synchronize().ok());
  expect_matches(*p, kC);
  // Launch 0 is the rolled kernel (the zero is a fill): an update in the body's numbering
  // (parameter 1, the scalar c of `mark`) would land on another of the rolled kernel's
  // parameters. Refused, as in Python and C, and the graph still replays as before.
  const GraphUpdate bad[] = {{0, 1, Arg::f32(2.0f)}};
  Status refused = p->s->replay(*g, bad);
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument) << refused.to_string();
  EXPECT_NE(refused.message().find("update of launch 0, made by a launch_loop"), std::string::npos)
      << refused.to_string();
  ASSERT_TRUE(p->s->upload(p->x, std::span<const float>(p->x0)).ok());
  ASSERT_TRUE(p->s->zero(p->total).ok());
  ASSERT_TRUE(p->s->replay(*g).ok());
  expect_matches(*p, kC);
  ASSERT_TRUE(p->s->release_graph(*g).ok());
  expect_clean(*p);
}

TEST(ResidentGraph, APreparedLaunchLoopIsRolledAndCompiledBesideTheCaller) {
  bool skipped = false;
  auto p = make_program(1024, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(p, nullptr);
  const std::vector<LoopLaunch> body = loop_body(*p);
  p->s->prepare_loop(body, kT);  // on a thread of its own
  p->s->prepare_loop(body, kT);  // the same shape: nothing more
  p->s->ready_loop(body, kT);    // takes the prepared kernel, registers it, makes its pipelines
  ASSERT_TRUE(p->s->zero(p->total).ok());
  LoopInfo info;
  ASSERT_TRUE(p->s->launch_loop(body, kT, &info).ok());
  EXPECT_TRUE(info.rolled);
  expect_matches(*p, kC);
  // Another count is another shape: prepared and never launched, the session still ends cleanly
  // (its destructor joins the thread).
  p->s->prepare_loop(body, kT - 1);
  expect_clean(*p);
}

TEST(ResidentGraph, OffOrPastTheRangeLimitALaunchLoopRunsItsLaunches) {
  for (uint32_t limit : {0u, kN - 1}) {
    bool skipped = false;
    auto p = make_program(limit, &skipped);
    if (skipped) GTEST_SKIP() << "no Vulkan device";
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(p->s->zero(p->total).ok());
    LoopInfo info;
    ASSERT_TRUE(p->s->launch_loop(loop_body(*p), kT, &info).ok());
    EXPECT_FALSE(info.rolled) << "limit " << limit;
    EXPECT_EQ(info.launches, 3u * kT);
    EXPECT_EQ(p->s->stats()->rolled_loops, 0u);
    expect_matches(*p, kC);
    expect_clean(*p);
  }
}

TEST(ResidentGraph, ABadLaunchLoopIsRefusedBeforeAnythingRuns) {
  bool skipped = false;
  auto p = make_program(1024, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(p, nullptr);
  const std::vector<float> seven{7.0f};
  ASSERT_TRUE(p->s->upload(p->total, std::span<const float>(seven)).ok());
  auto refused = [&](std::vector<LoopLaunch> body, uint32_t count, const std::string& what) {
    Status st = p->s->launch_loop(body, count);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.to_string();
  };
  {
    std::vector<LoopLaunch> body = loop_body(*p);
    body[0].step = {0, 1, 0};  // the f32 scalar c
    refused(body, kT,
            "launch 0 of the body, iteration 0: argument 1 steps by 1 per iteration but "
            "is not an i32 scalar");
  }
  {
    std::vector<LoopLaunch> body = loop_body(*p);
    body[2].args[0] = Arg::i32(INT32_MAX - 2);
    refused(body, kT, "launch 2 of the body, iteration 0: argument 0 reaches");
    refused(body, kT, "at iteration 29, past i32");
  }
  {
    // A hand-made i32 argument out of range: refused before r * step is added to it (that sum
    // overflowed int64, undefined behaviour, for a start near INT64_MAX).
    std::vector<LoopLaunch> body = loop_body(*p);
    body[2].args[0].i = INT64_MAX;
    refused(body, kT,
            "launch 2 of the body, iteration 0: argument 0 (i32) value " +
                std::to_string(INT64_MAX) + " does not fit");
  }
  {
    std::vector<LoopLaunch> body = loop_body(*p);
    body[1].step = {1, 0};
    refused(body, kT, "launch 1 of the body, iteration 0: 2 steps for 3 arguments");
  }
  {
    std::vector<LoopLaunch> body = loop_body(*p);
    body[1].args[2] = Arg::ndarray(p->m);  // rank 1 where the kernel takes rank 2
    refused(body, kT, "launch 1 of the body, iteration 0");
  }
  // Nothing ran (total kept its 7, m untouched) and the session goes on.
  std::vector<float> total(1);
  ASSERT_TRUE(p->s->download(p->total, std::span<float>(total)).ok());
  EXPECT_EQ(total[0], 7.0f);
  ASSERT_TRUE(p->s->launch_loop({}, kT).ok());            // an empty body: nothing
  ASSERT_TRUE(p->s->launch_loop(loop_body(*p), 0).ok());  // no iteration: nothing
  ASSERT_TRUE(p->s->zero(p->total).ok());
  ASSERT_TRUE(p->s->launch_loop(loop_body(*p), kT).ok());
  expect_matches(*p, kC);
  expect_clean(*p);
}

// A small 2-d grid (N-d tasks; issue 53, "small launches run together"): per step
// u[t + 1, i, j] = u[t, i, j] + 0.2 (u[t, i + 1, j] - u[t, i, j]) + 0.1 (u[t, i, j + 1] -
// u[t, i, j]), neighbours periodic, over a box that starts at row 1 (a begin other than 0),
// then a 1-d task's column sum into s[t] (atomic). Rolled, the box is walked point by point.
constexpr const char* kGridStep = R"(
kernel grid_step(t: i32, u: ndarray<f32, 3>) {
  task main parallel %i in [1, shape(u, 1)), %j in [0, shape(u, 2)) {
    %t = arg t : i32
    %one = const 1 : i32
    %u1 = add %t, %one : i32
    %r = shape u 1 : i32
    %c = shape u 2 : i32
    %i0 = add %i, %one : i32
    %in = mod %i0, %r : i32
    %j0 = add %j, %one : i32
    %jn = mod %j0, %c : i32
    %a = load u[%t, %i, %j] : f32
    %b = load u[%t, %in, %j] : f32
    %d = load u[%t, %i, %jn] : f32
    %db = sub %b, %a : f32
    %dd = sub %d, %a : f32
    %k1 = const 0.2 : f32
    %k2 = const 0.1 : f32
    %e1 = mul %db, %k1 : f32
    %e2 = mul %dd, %k2 : f32
    %s1 = add %a, %e1 : f32
    %s2 = add %s1, %e2 : f32
    store u[%u1, %i, %j], %s2
  }
}
)";
constexpr const char* kColumnSum = R"(
kernel column_sum(t: i32, u: ndarray<f32, 3>, s: ndarray<f32, 1>) {
  task main parallel %j in [0, shape(u, 2)) {
    %t = arg t : i32
    %z = const 0 : i32
    %v = load u[%t, %z, %j] : f32
    atomic_add s[%t], %v
  }
}
)";

constexpr uint32_t kGridRows = 6, kGridCols = 5, kGridT = 12;

// u0: row 0 of every step left as uploaded (the box starts at row 1); junk past step 0.
std::vector<float> grid_u0() {
  std::vector<float> u(size_t{kGridT + 1} * kGridRows * kGridCols, 7.0f);
  for (uint32_t i = 0; i < kGridRows * kGridCols; ++i)
    u[i] = std::cos(0.7f * static_cast<float>(i));
  return u;
}

// The loop on the CPU evaluator, one launch at a time.
void grid_expected(std::vector<double>* u, std::vector<double>* s) {
  const codegen::Kernel step = *codegen::parse(kGridStep), sum = *codegen::parse(kColumnSum);
  codegen::HostArray hu(DType::kF32, {kGridT + 1, kGridRows, kGridCols}), hs(DType::kF32, {kGridT});
  const std::vector<float> u0 = grid_u0();
  for (size_t i = 0; i < u0.size(); ++i) hu.data[i] = u0[i];
  for (uint32_t t = 0; t < kGridT; ++t) {
    using codegen::HostArg;
    ASSERT_TRUE(
        codegen::evaluate(step, std::vector<HostArg>{HostArg::of(t), HostArg::of(hu)}).ok());
    ASSERT_TRUE(codegen::evaluate(
                    sum, std::vector<HostArg>{HostArg::of(t), HostArg::of(hu), HostArg::of(hs)})
                    .ok());
  }
  *u = hu.data;
  *s = hs.data;
}

// Through launch_loop (`loop`) or a captured graph's rework: one resident launch, the CPU's
// results (f32 adds and multiplies, |u| <= 1: 1e-5 is ~100 ulps; s sums kGridCols values).
void run_grid(bool loop, bool* skipped) {
  auto s = validated_session(skipped, [](SessionOptions&) {});
  if (*skipped) return;
  ASSERT_NE(s, nullptr);
  const KernelHandle step = *s->compile(std::string_view(kGridStep));
  const KernelHandle sum = *s->compile(std::string_view(kColumnSum));
  const NdArrayHandle u = *s->ndarray(DType::kF32, {kGridT + 1, kGridRows, kGridCols}, "u");
  const NdArrayHandle sums = *s->ndarray(DType::kF32, {kGridT}, "s");
  const std::vector<float> u0 = grid_u0();
  ASSERT_TRUE(s->upload(u, std::span<const float>(u0)).ok());
  ASSERT_TRUE(s->zero(sums).ok());
  if (loop) {
    const std::vector<LoopLaunch> body{
        {step, {Arg::i32(0), Arg::ndarray(u)}, {1, 0}},
        {sum, {Arg::i32(0), Arg::ndarray(u), Arg::ndarray(sums)}, {1, 0, 0}}};
    LoopInfo info;
    ASSERT_TRUE(s->launch_loop(body, kGridT, &info).ok());
    EXPECT_TRUE(info.rolled) << "the 2-d step loop was not rolled";
    EXPECT_EQ(info.launches, 1u);
  } else {
    ASSERT_TRUE(s->begin_capture("grid").ok());
    for (uint32_t t = 0; t < kGridT; ++t) {
      const Arg ti = Arg::i32(static_cast<int32_t>(t));
      ASSERT_TRUE(s->launch(step, {ti, Arg::ndarray(u)}).ok());
      ASSERT_TRUE(s->launch(sum, {ti, Arg::ndarray(u), Arg::ndarray(sums)}).ok());
    }
    Result<GraphHandle> g = s->end_capture();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_EQ(s->stats()->rolled_launches, 2u * kGridT) << "the captured 2-d loop was not rolled";
    Result<size_t> n = s->runtime().graphs().graph_steps(*g);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 1u);  // one resident launch
    ASSERT_TRUE(s->replay(*g).ok());
  }
  std::vector<double> want_u, want_s;
  grid_expected(&want_u, &want_s);
  std::vector<float> got_u(want_u.size()), got_s(want_s.size());
  ASSERT_TRUE(s->download(u, std::span<float>(got_u)).ok());
  ASSERT_TRUE(s->download(sums, std::span<float>(got_s)).ok());
  for (size_t i = 0; i < want_u.size(); ++i) ASSERT_NEAR(got_u[i], want_u[i], 1e-5) << "u " << i;
  for (size_t i = 0; i < want_s.size(); ++i) ASSERT_NEAR(got_s[i], want_s[i], 1e-4) << "s " << i;
  expect_no_validation_messages(*s);
}

TEST(ResidentGraph, ALaunchLoopOfASmallGridRollsItsBoxesPointByPoint) {
  bool skipped = false;
  run_grid(/*loop=*/true, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
}

TEST(ResidentGraph, ACapturedLoopOfASmallGridRollsItsBoxesPointByPoint) {
  bool skipped = false;
  run_grid(/*loop=*/false, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
}

// A kernel of kWide arrays, each x_k[t + 1, i] = 0.5 x_k[t, i] + x_(k+1 mod kWide)[t, i]; two
// launches a step on two sets of arrays: a period binding 2 kWide arrays, past the 31 a resident
// kernel binds with push descriptors (graph/graph_rework.h, roll_limits).
constexpr uint32_t kWide = 17;

std::string wide_kernel() {
  std::string params, body =
                          "    %t = arg t : i32\n    %one = const 1 : i32\n"
                          "    %t1 = add %t, %one : i32\n    %h = const 0.5 : f32\n";
  for (uint32_t k = 0; k < kWide; ++k) {
    const std::string x = "x" + std::to_string(k), y = "x" + std::to_string((k + 1) % kWide);
    const std::string n = std::to_string(k);
    params += ", " + x + ": ndarray<f32, 2>";
    body += "    %a" + n + " = load " + x + "[%t, %i] : f32\n    %b" + n + " = load " + y +
            "[%t, %i] : f32\n    %c" + n + " = mul %a" + n + ", %h : f32\n    %d" + n +
            " = add %c" + n + ", %b" + n + " : f32\n    store " + x + "[%t1, %i], %d" + n + "\n";
  }
  return "kernel wide(t: i32" + params + ") {\n  task main parallel %i in [0, shape(x0, 1)) {\n" +
         body + "  }\n}\n";
}

TEST(ResidentGraph, ALoopBindingMoreArraysThanPushDescriptorsRollsWhereTheDeviceBindsThem) {
  constexpr uint32_t kSteps = 6, kCols = 20;
  bool skipped = false;
  auto s = validated_session(&skipped, [](SessionOptions& o) { o.resident_max_range = 1024; });
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(s, nullptr);
  const std::string text = wide_kernel();
  Result<KernelHandle> wide = s->compile(std::string_view(text));
  ASSERT_TRUE(wide.ok()) << wide.status().to_string();
  std::vector<NdArrayHandle> arrays;
  std::vector<std::vector<float>> init;
  for (uint32_t a = 0; a < 2 * kWide; ++a) {
    arrays.push_back(*s->ndarray(DType::kF32, {kSteps + 1, kCols}, "x" + std::to_string(a)));
    init.emplace_back(size_t{kSteps + 1} * kCols);
    for (size_t e = 0; e < init.back().size(); ++e)
      init.back()[e] = std::cos(0.1f * static_cast<float>(e) + static_cast<float>(a));
    ASSERT_TRUE(s->upload(arrays.back(), std::span<const float>(init.back())).ok());
  }
  std::vector<LoopLaunch> body(2);
  for (uint32_t set = 0; set < 2; ++set) {
    body[set].kernel = *wide;
    body[set].args.push_back(Arg::i32(0));
    body[set].step.push_back(1);
    for (uint32_t k = 0; k < kWide; ++k) {
      body[set].args.push_back(Arg::ndarray(arrays[set * kWide + k]));
      body[set].step.push_back(0);
    }
  }
  LoopInfo info;
  ASSERT_TRUE(s->launch_loop(body, kSteps, &info).ok());
  ASSERT_TRUE(s->synchronize().ok());
  const bool binds_more = s->runtime().caps().max_storage_buffers > 33;
  EXPECT_EQ(info.rolled, binds_more)
      << "max_storage_buffers " << s->runtime().caps().max_storage_buffers;
  // The launches one by one on the CPU evaluator.
  const codegen::Kernel k = *codegen::parse(text);
  std::vector<codegen::HostArray> host;
  for (uint32_t a = 0; a < 2 * kWide; ++a) {
    host.emplace_back(DType::kF32, std::vector<uint32_t>{kSteps + 1, kCols});
    for (size_t e = 0; e < init[a].size(); ++e) host.back().data[e] = init[a][e];
  }
  for (uint32_t t = 0; t < kSteps; ++t) {
    for (uint32_t set = 0; set < 2; ++set) {
      std::vector<codegen::HostArg> args{codegen::HostArg::of(t)};
      for (uint32_t j = 0; j < kWide; ++j)
        args.push_back(codegen::HostArg::of(host[set * kWide + j]));
      ASSERT_TRUE(codegen::evaluate(k, args).ok());
    }
  }
  for (uint32_t a = 0; a < 2 * kWide; ++a) {
    std::vector<float> got(host[a].data.size());
    ASSERT_TRUE(s->download(arrays[a], std::span<float>(got)).ok());
    // Six steps of one multiply-add each (|x| < 4): a few ulps.
    for (size_t e = 0; e < got.size(); ++e) {
      ASSERT_NEAR(got[e], host[a].data[e], 1e-5) << "array " << a << " element " << e;
    }
  }
  expect_no_validation_messages(*s);
}

// Serial tasks (one invocation walks the range in order: DiffTaichi's kernels of top-level
// statements): x[t + 1, 0] = 0.9 x[t, 0], then x[t + 1, i] = 0.5 x[t + 1, i - 1] + x[t, i] for
// i = 1 .. n - 1 in order -- each element reads the one the walk wrote just before, so a walk
// out of order or by several invocations reads the junk the row holds and fails.
constexpr const char* kSerialHead = R"(
kernel head(t: i32, x: ndarray<f32, 2>) {
  task main serial %i in [0, 1) {
    %t = arg t : i32
    %one = const 1 : i32
    %u = add %t, %one : i32
    %a = load x[%t, %i] : f32
    %k = const 0.9 : f32
    %v = mul %a, %k : f32
    store x[%u, %i], %v
  }
}
)";
constexpr const char* kSerialScan = R"(
kernel scan(t: i32, x: ndarray<f32, 2>) {
  task main serial %i in [1, shape(x, 1)) {
    %t = arg t : i32
    %one = const 1 : i32
    %u = add %t, %one : i32
    %im = sub %i, %one : i32
    %p = load x[%u, %im] : f32
    %a = load x[%t, %i] : f32
    %h = const 0.5 : f32
    %q = mul %p, %h : f32
    %v = add %q, %a : f32
    store x[%u, %i], %v
  }
}
)";

void run_serial(bool loop, bool* skipped) {
  constexpr uint32_t kSteps = 12, kCols = 37;
  auto s = validated_session(skipped, [](SessionOptions& o) { o.resident_max_range = 1024; });
  if (*skipped) return;
  ASSERT_NE(s, nullptr);
  Result<KernelHandle> head = s->compile(std::string_view(kSerialHead));
  Result<KernelHandle> scan = s->compile(std::string_view(kSerialScan));
  ASSERT_TRUE(head.ok() && scan.ok());
  NdArrayHandle x = *s->ndarray(DType::kF32, {kSteps + 1, kCols}, "x");
  std::vector<float> x0(size_t{kSteps + 1} * kCols, 555.0f);  // junk past row 0
  for (uint32_t i = 0; i < kCols; ++i) x0[i] = std::cos(0.2f * static_cast<float>(i));
  ASSERT_TRUE(s->upload(x, std::span<const float>(x0)).ok());
  const Arg t0 = Arg::i32(0);
  const std::vector<LoopLaunch> body{{*head, {t0, Arg::ndarray(x)}, {1, 0}},
                                     {*scan, {t0, Arg::ndarray(x)}, {1, 0}}};
  if (loop) {
    LoopInfo info;
    ASSERT_TRUE(s->launch_loop(body, kSteps, &info).ok());
    EXPECT_TRUE(info.rolled);
    EXPECT_EQ(info.launches, 1u);
  } else {
    ASSERT_TRUE(s->begin_capture("serial").ok());
    for (uint32_t t = 0; t < kSteps; ++t) {
      const Arg ti = Arg::i32(static_cast<int32_t>(t));
      ASSERT_TRUE(s->launch(*head, {ti, Arg::ndarray(x)}).ok());
      ASSERT_TRUE(s->launch(*scan, {ti, Arg::ndarray(x)}).ok());
    }
    Result<GraphHandle> g = s->end_capture();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    Result<size_t> steps = s->runtime().graphs().graph_steps(*g);
    ASSERT_TRUE(steps.ok());
    EXPECT_EQ(*steps, 1u);  // one resident launch instead of 2 * kSteps
    ASSERT_TRUE(s->replay(*g).ok());
  }
  ASSERT_TRUE(s->synchronize().ok());
  const codegen::Kernel kh = *codegen::parse(kSerialHead), ks = *codegen::parse(kSerialScan);
  codegen::HostArray hx(DType::kF32, {kSteps + 1, kCols});
  for (size_t e = 0; e < x0.size(); ++e) hx.data[e] = x0[e];
  for (uint32_t t = 0; t < kSteps; ++t) {
    using codegen::HostArg;
    ASSERT_TRUE(codegen::evaluate(kh, std::vector<HostArg>{HostArg::of(t), HostArg::of(hx)}).ok());
    ASSERT_TRUE(codegen::evaluate(ks, std::vector<HostArg>{HostArg::of(t), HostArg::of(hx)}).ok());
  }
  std::vector<float> got(hx.data.size());
  ASSERT_TRUE(s->download(x, std::span<float>(got)).ok());
  // |x| < 2 + 12 * 2 (each step adds at most twice the row before); a multiply-add per element
  // and step, chained along the row: 1e-4 absolute is tens of ulps, and a junk read (555) misses
  // by far more.
  for (size_t e = 0; e < got.size(); ++e) ASSERT_NEAR(got[e], hx.data[e], 1e-4) << "element " << e;
  expect_no_validation_messages(*s);
}

TEST(ResidentGraph, ALaunchLoopOfSerialTasksRollsAndWalksEachInOrder) {
  bool skipped = false;
  run_serial(/*loop=*/true, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
}

TEST(ResidentGraph, ACapturedLoopOfSerialTasksRollsAndWalksEachInOrder) {
  bool skipped = false;
  run_serial(/*loop=*/false, &skipped);
  if (skipped) GTEST_SKIP() << "no Vulkan device";
}

// A serial walk whose body adds f64 atomically (a compare-and-swap loop where the device has no
// f64 atomic add: lavapipe): each element costs two loop passes there, which the plan's
// estimate does not see. 400 steps of a 100-element walk fit the estimate (~41,000 passes) and
// not the made kernel (~81,000): on a device that cuts loops at 65,535 the loop must stay
// launches (the runtime would refuse the rolled launch), elsewhere it rolls; the sums are the
// launches' either way.
constexpr const char* kSerialSum = R"(
kernel serial_sum(t: i32, x: ndarray<f64, 2>, s: ndarray<f64, 1>) {
  task main serial %i in [0, shape(x, 1)) {
    %t = arg t : i32
    %v = load x[%t, %i] : f64
    %z = const 0 : i32
    atomic_add s[%z], %v
    %one = const 1 : i32
    %u = add %t, %one : i32
    %h = const 0.5 : f64
    %w = mul %v, %h : f64
    store x[%u, %i], %w
  }
}
)";

TEST(ResidentGraph, ASerialWalkOfFloatAtomicsPastTheLoopCapStaysLaunches) {
  constexpr uint32_t kSteps = 400, kCols = 100;
  bool skipped = false;
  auto s = validated_session(&skipped, [](SessionOptions& o) { o.resident_max_range = 1024; });
  if (skipped) GTEST_SKIP() << "no Vulkan device";
  ASSERT_NE(s, nullptr);
  if (!s->runtime().caps().shader_float64) GTEST_SKIP() << "no float64";
  Result<KernelHandle> k = s->compile(std::string_view(kSerialSum));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  NdArrayHandle x = *s->ndarray(DType::kF64, {kSteps + 1, kCols}, "x");
  NdArrayHandle sum = *s->ndarray(DType::kF64, {1}, "s");
  std::vector<double> x0(size_t{kSteps + 1} * kCols, 0.0);
  for (uint32_t i = 0; i < kCols; ++i) x0[i] = 1.0 + 0.01 * i;
  ASSERT_TRUE(s->upload(x, std::span<const double>(x0)).ok());
  ASSERT_TRUE(s->zero(sum).ok());
  const std::vector<LoopLaunch> body{
      {*k, {Arg::i32(0), Arg::ndarray(x), Arg::ndarray(sum)}, {1, 0, 0}}};
  LoopInfo info;
  Status st = s->launch_loop(body, kSteps, &info);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const uint32_t cap = s->runtime().caps().max_loop_passes;
  const bool cas = !s->runtime().caps().atomic_float64_add;
  if (cap != 0 && cap < 80000 && cas) {
    EXPECT_FALSE(info.rolled);
  }
  if (cap == 0) {
    EXPECT_TRUE(info.rolled);
  }
  ASSERT_TRUE(s->synchronize().ok());
  // The sum of a geometric series per column: sum_t 0.5^t x0[i], in f64 (exact to ~1e-15).
  double want = 0;
  for (uint32_t i = 0; i < kCols; ++i) want += x0[i] * (2.0 - std::ldexp(1.0, 1 - int(kSteps)));
  std::vector<double> got(1);
  ASSERT_TRUE(s->download(sum, std::span<double>(got)).ok());
  EXPECT_NEAR(got[0], want, 1e-9 * want);
  expect_no_validation_messages(*s);
}

}  // namespace
}  // namespace vkad::testing
