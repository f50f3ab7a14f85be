// Graph scheduling at Session::end_capture (api/session.h "Graph scheduling",
// graph/graph_schedule.h) on a device: a program in DiffTaichi's idiom -- a controller step
// writing row t of an array that nothing reads until step t, a state x[f, i] read at f and
// written at f + 1 -- is reordered so the controller launches run together and barriers fall
// only between dependent launches; the results are those of the launches in capture order, an
// update of a row-deciding scalar falls back to the captured order, and atomic adds commute.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

// a[t, i] = w[i] * c: the controller of step t (c = t + 1).
constexpr const char* kAct = R"(
kernel act(t: i32, c: f32, w: ndarray<f32, 1>, a: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(w, 0)) {
    %t = arg t : i32
    %c = arg c : f32
    %w = load w[%i] : f32
    %m = mul %w, %c : f32
    store a[%t, %i], %m
  }
}
)";

// x[f + 1, i] = 0.5 * x[f, i] + a[f, i]: one step of the state, one array with a time axis.
constexpr const char* kStep = R"(
kernel step(f: i32, a: ndarray<f32, 2>, x: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(x, 1)) {
    %f = arg f : i32
    %x = load x[%f, %i] : f32
    %a = load a[%f, %i] : f32
    %h = const 0.5 : f32
    %y = mul %x, %h : f32
    %z = add %y, %a : f32
    %one = const 1 : i32
    %g = add %f, %one : i32
    store x[%g, %i], %z
  }
}
)";

// s[i] += a[t, i]: every step's controller summed, by atomic adds that commute.
constexpr const char* kSum = R"(
kernel sum(t: i32, a: ndarray<f32, 2>, s: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(s, 0)) {
    %t = arg t : i32
    %v = load a[%t, %i] : f32
    atomic_add s[%i], %v
  }
}
)";

constexpr uint32_t kN = 300;
constexpr uint32_t kT = 24;

struct Program {
  std::unique_ptr<Session> s;
  KernelHandle act, step, sum;
  NdArrayHandle w, a, x, total;
};

std::unique_ptr<Program> make_program(bool schedule, bool* skipped, bool fuse = false) {
  auto p = std::make_unique<Program>();
  p->s = validated_session(skipped, [&](SessionOptions& o) {
    o.schedule_graph_launches = schedule;
    o.fuse_graph_launches = fuse;  // scheduling alone unless asked
  });
  if (!p->s) return nullptr;
  Session& s = *p->s;
  p->act = *s.compile(std::string_view(kAct));
  p->step = *s.compile(std::string_view(kStep));
  p->sum = *s.compile(std::string_view(kSum));
  p->w = *s.ndarray(DType::kF32, {kN}, "w");
  p->a = *s.ndarray(DType::kF32, {kT, kN}, "a");
  p->x = *s.ndarray(DType::kF32, {kT + 1, kN}, "x");
  p->total = *s.ndarray(DType::kF32, {kN}, "total");
  std::vector<float> w(kN), x(size_t{kT + 1} * kN, 777.0f);  // junk past row 0
  for (uint32_t i = 0; i < kN; ++i) w[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  for (uint32_t i = 0; i < kN; ++i) x[i] = 1.0f + 0.001f * static_cast<float>(i);
  EXPECT_TRUE(s.upload(p->w, std::span<const float>(w)).ok());
  EXPECT_TRUE(s.upload(p->x, std::span<const float>(x)).ok());
  return p;
}

// DiffTaichi's loop: per step the controller, then the state; the sum last, after a fill.
Status record(Program& p) {
  Session& s = *p.s;
  for (uint32_t t = 0; t < kT; ++t) {
    VKAD_TRY(
        s.launch(p.act, {Arg::i32(static_cast<int32_t>(t)), Arg::f32(static_cast<float>(t + 1)),
                         Arg::ndarray(p.w), Arg::ndarray(p.a)}));
    VKAD_TRY(s.launch(p.step,
                      {Arg::i32(static_cast<int32_t>(t)), Arg::ndarray(p.a), Arg::ndarray(p.x)}));
  }
  VKAD_TRY(s.zero(p.total));
  for (uint32_t t = 0; t < kT; ++t) {
    VKAD_TRY(s.launch(
        p.sum, {Arg::i32(static_cast<int32_t>(t)), Arg::ndarray(p.a), Arg::ndarray(p.total)}));
  }
  return {};
}

// The idiom captured into a graph ("idiom").
Result<GraphHandle> capture_idiom(Program& p, CaptureOptions o = {}) {
  VKAD_TRY(p.s->begin_capture("idiom", o));
  VKAD_TRY(record(p));
  return p.s->end_capture();
}

std::vector<float> read(Program& p, NdArrayHandle h, size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(p.s->download(h, std::span<float>(out)).ok());
  return out;
}

// The program on the host, in capture order: x[T], and the sum of every a[t].
void expected(const Program& p, const std::vector<float>& w, const std::vector<float>& x0,
              std::vector<float>* x, std::vector<float>* total) {
  *x = x0;
  total->assign(kN, 0.0f);
  for (uint32_t t = 0; t < kT; ++t) {
    for (uint32_t i = 0; i < kN; ++i) {
      const float a = w[i] * static_cast<float>(t + 1);
      (*x)[i] = (*x)[i] * 0.5f + a;
      (*total)[i] += a;
    }
  }
  (void)p;
}

void expect_clean(Program& p) { expect_no_validation_messages(*p.s); }

// x: one mul and one add per step, each correctly rounded or contracted into an fma: a few
// ulp per step over 24 steps of values below 2. The sum: 24 terms in any order.
void expect_results(Program& p) {
  std::vector<float> w = read(p, p.w, kN), x_all = read(p, p.x, size_t{kT + 1} * kN);
  std::vector<float> x0(x_all.begin(), x_all.begin() + kN), x, total;
  expected(p, w, x0, &x, &total);
  const std::vector<float> got_total = read(p, p.total, kN);
  for (uint32_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(x_all[size_t{kT} * kN + i], x[i], 1e-5f) << "x[T] at " << i;
    ASSERT_NEAR(got_total[i], total[i], 1e-4f) << "total at " << i;
  }
}

TEST(GraphSchedule, ControllerLaunchesRunTogetherAndBarriersFallOnlyBetweenDependentSteps) {
  bool skipped = false;
  auto p = make_program(true, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  auto plain = make_program(false, &skipped);
  ASSERT_TRUE(p && plain);
  for (Program* q : {p.get(), plain.get()}) {
    auto g = capture_idiom(*q);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(q->s->replay(*g).ok());
    ASSERT_TRUE(q->s->replay(*g).ok());  // twice: the sum is zeroed by the graph's own fill
    ASSERT_TRUE(q->s->synchronize().ok());
    expect_results(*q);
    expect_clean(*q);
    const size_t barriers = *q->s->runtime().graphs().graph_barriers(*g);
    if (q == plain.get()) {
      EXPECT_EQ(barriers, 3u * kT);  // one after every launch
      continue;
    }
    // The controllers first, one barrier after them all; then the steps, each waiting for the
    // one before; after the fill, the sums together.
    EXPECT_EQ(barriers, 1u + kT + 1u);
  }
}

TEST(GraphSchedule, ScheduledThenFusedTheIdiomIsThreeDependentLaunches) {
  bool skipped = false;
  auto p = make_program(true, &skipped, true);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(p);
  auto g = capture_idiom(*p);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const uint64_t before = p->s->stats()->launches;
  ASSERT_TRUE(p->s->replay(*g).ok());
  ASSERT_TRUE(p->s->replay(*g).ok());
  ASSERT_TRUE(p->s->synchronize().ok());
  expect_results(*p);
  expect_clean(*p);
  // Scheduled, the controllers are adjacent and fuse (each invocation writes its own column of
  // a: a[t, i]), and so do the steps (x[f, i] read, x[f + 1, i] written: rows the arguments
  // decide, the invocation's own column) and the sums (s[i]: an atomic on the invocation's own
  // element): three launches, each after a barrier.
  EXPECT_EQ(p->s->stats()->launches - before, 2u * 3);
  EXPECT_EQ(*p->s->runtime().graphs().graph_barriers(*g), 3u);
}

TEST(GraphSchedule, AnUpdateOfARowDecidingScalarRunsTheLaunchesAsCaptured) {
  bool skipped = false;
  auto p = make_program(true, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  auto plain = make_program(false, &skipped);
  ASSERT_TRUE(p && plain);
  for (Program* q : {p.get(), plain.get()}) {
    auto g = capture_idiom(*q);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(q->s->replay(*g).ok());
    // Launch 2 is act(1): made to write row 0 (2 w) instead, which step(0) reads. In capture
    // order it runs after step(0), which sees a[0] = w; a graph that kept running every
    // controller first would give step(0) 2 w.
    const GraphUpdate u{2, 0, Arg::i32(0)};
    ASSERT_TRUE(q->s->replay(*g, std::span<const GraphUpdate>(&u, 1)).ok());
    ASSERT_TRUE(q->s->replay(*g).ok());  // the update stays
    ASSERT_TRUE(q->s->synchronize().ok());
    expect_clean(*q);
  }
  const std::vector<float> xs = read(*p, p->x, size_t{kT + 1} * kN);
  const std::vector<float> xp = read(*plain, plain->x, size_t{kT + 1} * kN);
  const std::vector<float> ts = read(*p, p->total, kN), tp = read(*plain, plain->total, kN);
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_NEAR(xs[i], xp[i], 1e-5f) << "x at " << i;
  for (uint32_t i = 0; i < kN; ++i) ASSERT_NEAR(ts[i], tp[i], 1e-4f) << "total at " << i;
}

// The graph as captured (what a background rework's first replays and a capture that runs
// execute) already goes without the barriers no whole array needs: here the sums after the
// fill only add atomically into one array, so they run together. Per row it would drop more
// (act(t) after step(t - 1), which read another row of a): the capture does not judge rows,
// whose scalars an update may change.
TEST(GraphSchedule, TheGraphAsCapturedGoesWithoutTheBarriersNoArrayNeeds) {
  bool skipped = false;
  auto p = make_program(true, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  auto plain = make_program(false, &skipped);
  ASSERT_TRUE(p && plain);
  for (Program* q : {p.get(), plain.get()}) {
    auto g = capture_idiom(*q, {.background_rework = true});
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    // The runtime's graph of that handle is the one captured, whatever the rework does.
    ASSERT_TRUE(q->s->runtime().graphs().replay(*g).ok());
    ASSERT_TRUE(q->s->synchronize().ok());
    expect_results(*q);
    expect_clean(*q);
    EXPECT_EQ(*q->s->runtime().graphs().graph_barriers(*g),
              q == plain.get() ? 3u * kT : 2u * kT + 1u);
  }
}

// A launch the runtime refuses takes the barrier it was to go without along with it: the next
// launch, which reads what the one before the refused launch wrote, keeps its barrier.
TEST(GraphSchedule, ARefusedLaunchTakesItsOmittedBarrierWithIt) {
  bool skipped = false;
  auto p = make_program(true, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(p);
  Session& s = *p->s;
  NdArrayHandle b = *s.ndarray(DType::kF32, {kT, kN}, "b");
  NdArrayHandle y = *s.ndarray(DType::kF32, {kT + 1, kN}, "y");
  CaptureOptions o;
  o.background_rework = true;  // end_capture's handle stays the graph as captured
  ASSERT_TRUE(s.begin_capture("refused", o).ok());
  ASSERT_TRUE(
      s.launch(p->act, {Arg::i32(0), Arg::f32(1.0f), Arg::ndarray(p->w), Arg::ndarray(p->a)}).ok());
  // Touches only b and y (no conflict with act: its barrier would go), but f is not an i32.
  Status refused = s.launch(p->step, {Arg::f32(0.0f), Arg::ndarray(b), Arg::ndarray(y)});
  EXPECT_FALSE(refused.ok());
  ASSERT_TRUE(s.launch(p->step, {Arg::i32(0), Arg::ndarray(p->a), Arg::ndarray(p->x)}).ok());
  auto g = s.end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*s.runtime().graphs().graph_barriers(*g), 2u);  // act | step |
  expect_clean(*p);
}

// A dynamic loop: its adjoint keeps an adstack per invocation.
constexpr const char* kLoop =
    R"(kernel rec(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %z = const 0 : i32
    %n = arg n : i32
    %c = const 0.5 : f32
    for %k in [%z, %n) {
      %a = load_local %v : f32
      %s = sin %a : f32
      %m = mul %s, %c : f32
      %r = add %m, %c : f32
      store_local %v, %r
    }
    %out = load_local %v : f32
    store y[%i], %out
  }
})";

// Two adjoints on disjoint arrays share no ndarray, but in the heap tier both run from the
// runtime's one set of adstack heaps, thread g of each at the same slots: the barrier between
// them stays (found by review: without it a GPU may overlap them and mix their stacks).
TEST(GraphSchedule, AdjointsSharingTheAdstackHeapsKeepTheirBarrier) {
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.adstack_tier = runtime::AdstackTier::kHeap;
  auto r = Session::create(o, codegen::CompileOptions{});
  if (!r.ok() && r.status().code() == ErrorCode::kNoDevice)
    GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Session& s = **r;
  auto d = s.differentiate(std::string_view(kLoop));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  constexpr uint32_t n = 1024;
  std::vector<float> xs(n), ones(n, 1.0f);
  for (uint32_t i = 0; i < n; ++i) xs[i] = std::sin(0.01f * static_cast<float>(i));
  struct Set {
    NdArrayHandle x, y, gx, gy;
  };
  Set sets[2];
  for (Set& q : sets) {
    q.x = *s.ndarray(DType::kF32, {n});
    q.y = *s.ndarray(DType::kF32, {n});
    q.gx = *s.ndarray(DType::kF32, {n});
    q.gy = *s.ndarray(DType::kF32, {n});
    ASSERT_TRUE(s.upload(q.x, std::span<const float>(xs)).ok());
    ASSERT_TRUE(s.upload(q.gy, std::span<const float>(ones)).ok());
  }
  auto args = [&](const Set& q) {
    std::vector<Arg> fa = {Arg::i32(40), Arg::ndarray(q.x), Arg::ndarray(q.y)};
    NdArrayHandle g[] = {q.gx, q.gy};
    return *d->adjoint_args(fa, g);
  };
  ASSERT_TRUE(s.begin_capture("heaps").ok());
  for (const Set& q : sets) ASSERT_TRUE(s.launch(d->adjoint, args(q)).ok());
  auto g = s.end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*s.runtime().graphs().graph_barriers(*g), 2u);
  for (const Set& q : sets) ASSERT_TRUE(s.zero(q.gx).ok());
  ASSERT_TRUE(s.replay(*g).ok());
  ASSERT_TRUE(s.synchronize().ok());
  EXPECT_GT(s.runtime().stats()->adstack_heap_dispatches, 0u);
  std::vector<float> a(n), b(n);
  ASSERT_TRUE(s.download(sets[0].gx, std::span<float>(a)).ok());
  ASSERT_TRUE(s.download(sets[1].gx, std::span<float>(b)).ok());
  EXPECT_EQ(a, b);  // the same inputs, so the same gradients
  const rhi::Device& dev = s.runtime().device();
  EXPECT_EQ(dev.validation_message_count(), 0u);
}

}  // namespace
}  // namespace vkad::testing
