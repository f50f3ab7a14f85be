// The timeline (issue 56, point 3; runtime/timeline.h): every launch, fill, copy and upload
// between begin_timeline and end_timeline is one device event, in recording order and named by
// what the user wrote (the kernel, its adjoint, a graph's launches with the graph's name); the
// host's submissions and waits are host spans; the Chrome trace holds every event; nothing is
// recorded without a timeline; misuse is refused and the session stays usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ir/builder.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using codegen::Array;
using codegen::KernelBuilder;
using codegen::Value;

// y[i] = sin(x[i]) * 0.9 + 0.1 (dy/dx = 0.9 cos x).
codegen::Kernel sin_step() {
  KernelBuilder kb("sin_step");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { y.store({i}, sin(x(i)) * 0.9 + 0.1); });
  return kb.finish();
}

// x[i] = x[i] * 2 + 1.
codegen::Kernel affine() {
  KernelBuilder kb("affine");
  Array x = kb.ndarray("x", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { x.store({i}, x(i) * 2.0 + 1.0); });
  return kb.finish();
}

constexpr uint32_t kN = 4096;

class TimelineTest : public ValidatedSessionTest {
 protected:
  NdArrayHandle make(const char* name) {
    auto h = s_->ndarray(DType::kF32, {kN}, name);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return h.ok() ? *h : NdArrayHandle{};
  }
  bool timestamps() const { return s_->runtime().caps().timestamps; }
  static std::vector<const TimelineEvent*> device_events(const Timeline& t) {
    std::vector<const TimelineEvent*> out;
    for (const TimelineEvent& e : t.events) {
      if (e.gpu) out.push_back(&e);
    }
    return out;
  }
};

TEST_F(TimelineTest, EachLaunchFillCopyAndUploadIsOneDeviceEventInOrder) {
  auto k = s_->compile(affine());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  NdArrayHandle a = make("a"), b = make("b");
  const std::vector<float> ones(kN, 1.0f);
  ASSERT_TRUE(s_->begin_timeline().ok());
  ASSERT_TRUE(s_->upload(a, std::span<const float>(ones)).ok());
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(a)}).ok());
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(a)}).ok());
  ASSERT_TRUE(s_->fill(b, 3.0).ok());
  ASSERT_TRUE(s_->copy(a, b).ok());
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(b)}).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  auto t = s_->end_timeline();
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // The work itself is unchanged: ((1 * 2 + 1) * 2 + 1) copied, then * 2 + 1 = 15.
  std::vector<float> got(kN);
  ASSERT_TRUE(s_->download(b, std::span<float>(got)).ok());
  for (uint32_t i = 0; i < kN; i += 511) ASSERT_EQ(got[i], 15.0f) << i;

  bool synchronized = false;
  for (const TimelineEvent& e : t->events) synchronized |= !e.gpu && e.name == "synchronize";
  EXPECT_TRUE(synchronized) << "the wait is a host span";
  if (!timestamps()) {
    EXPECT_FALSE(t->gpu_timestamps);
    EXPECT_TRUE(device_events(*t).empty());
    GTEST_SKIP() << "the device has no timestamp queries: host spans only";
  }
  ASSERT_TRUE(t->gpu_timestamps);
  const std::vector<const TimelineEvent*> d = device_events(*t);
  const std::vector<std::string> want = {"upload 'a'", "affine",          "affine",
                                         "fill 'b'",   "copy 'a' -> 'b'", "affine"};
  ASSERT_EQ(d.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(d[i]->name, want[i]) << "event " << i;
    EXPECT_GE(d[i]->end_us, d[i]->begin_us) << want[i];
    // Dependent work, stamped at BOTTOM_OF_PIPE: each event starts where the one before ended.
    if (i > 0) {
      EXPECT_GE(d[i]->begin_us, d[i - 1]->end_us - 1e-3) << want[i];
    }
  }
  EXPECT_EQ(d[1]->category, "launch");
  EXPECT_NE(d[1]->launch, 0u);
  EXPECT_EQ(d[2]->launch, d[1]->launch + 1) << "launch ids in order";
  EXPECT_EQ(d[3]->category, "fill");
  EXPECT_EQ(d[4]->category, "copy");
  EXPECT_EQ(d[0]->category, "upload");
  // The summary groups by name: affine three times.
  const std::vector<TimelineKernelSummary> rows = t->summarize();
  double share = 0;
  for (const TimelineKernelSummary& r : rows) {
    share += r.share;
    if (r.name == "affine") {
      EXPECT_EQ(r.count, 3u);
    }
  }
  EXPECT_NEAR(share, 1.0, 1e-9);
  EXPECT_NE(t->summary().find("affine"), std::string::npos);
  EXPECT_EQ(t->dropped, 0u);
}

TEST_F(TimelineTest, ATapesForwardAndAdjointLaunchesAreNamedAndGradientsUnchanged) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  NdArrayHandle x0 = make("x0"), x1 = make("x1"), x2 = make("x2");
  std::vector<float> init(kN);
  for (uint32_t i = 0; i < kN; ++i) init[i] = -1.5f + 3.0f * static_cast<float>(i) / kN;
  ASSERT_TRUE(s_->upload(x0, std::span<const float>(init)).ok());
  ASSERT_TRUE(s_->begin_timeline().ok());
  Tape tape(*s_);
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(x0), Arg::ndarray(x1)}).ok());
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(x1), Arg::ndarray(x2)}).ok());
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(x2, 1.0)}).ok());
  auto g = tape.grad(x0);
  ASSERT_TRUE(g.ok());
  auto t = s_->end_timeline();
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::vector<float> grad(kN);
  ASSERT_TRUE(s_->download(*g, std::span<float>(grad)).ok());
  for (uint32_t i = 0; i < kN; i += 97) {
    const double x = init[i], y = std::sin(x) * 0.9 + 0.1;
    // Vulkan's sin/cos: 2^-11 absolute on [-pi, pi]; two factors of at most 0.9.
    ASSERT_NEAR(grad[i], 0.81 * std::cos(x) * std::cos(y), 5e-3) << i;
  }
  if (!timestamps()) GTEST_SKIP() << "no timestamp queries";
  int forward = 0, adjoint = 0;
  for (const TimelineEvent* e : device_events(*t)) {
    forward += e->name == "sin_step";
    adjoint += e->name == "sin_step_adjoint";
  }
  EXPECT_EQ(forward, 2);
  EXPECT_EQ(adjoint, 2);
}

TEST_F(TimelineTest, AReplayedGraphsLaunchesAreTimedWithTheGraphsName) {
  auto k = s_->compile(affine());
  ASSERT_TRUE(k.ok());
  NdArrayHandle a = make("a");
  ASSERT_TRUE(s_->fill(a, 0.0).ok());
  ASSERT_TRUE(s_->begin_capture("three affines").ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(a)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s_->replay(*g).ok());  // before the timeline: recorded into bundles
  ASSERT_TRUE(s_->begin_timeline(runtime::kTimelineMaxEvents, 1).ok());  // every replay timed
  ASSERT_TRUE(s_->replay(*g).ok());
  ASSERT_TRUE(s_->replay(*g).ok());
  auto t = s_->end_timeline();
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE(s_->replay(*g).ok());  // after it: bundles again
  // 0 -> 4 replays of x * 2 + 1 three times (whatever fusion made of them): 2^12 - 1.
  std::vector<float> got(kN);
  ASSERT_TRUE(s_->download(a, std::span<float>(got)).ok());
  EXPECT_EQ(got[0], 4095.0f);
  EXPECT_EQ(got[kN - 1], 4095.0f);
  int replays = 0;
  for (const TimelineEvent& e : t->events) {
    if (!e.gpu && e.category == "replay") {
      ++replays;
      EXPECT_EQ(e.graph, "three affines");
    }
  }
  EXPECT_EQ(replays, 2);
  if (!timestamps()) GTEST_SKIP() << "no timestamp queries";
  // However end_capture fused them, both replays ran the same launches, each timed.
  const std::vector<const TimelineEvent*> d = device_events(*t);
  ASSERT_FALSE(d.empty());
  ASSERT_EQ(d.size() % 2, 0u);
  const size_t half = d.size() / 2;
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d[i]->graph, "three affines");
    EXPECT_EQ(d[i]->category, "launch");
    EXPECT_EQ(d[i]->name, d[i % half]->name);
  }
  EXPECT_EQ(d[half]->launch, d[half - 1]->launch + 1);
}

// A graph replayed from bundles under a timeline runs its timed bundles (recorded at the
// first replay under it, reused by the next -- recorded again by each under the validation
// layer -- never by replays without a timeline): each launch
// one event between two stamps, a stamp shared by consecutive launches and a fill batch timed
// apart from the launch after it; the result is the untimed replays'.
TEST_F(TimelineTest, ABundledReplayIsTimedFromItsTimedBundlesOneStampPerLaunch) {
  runtime::Runtime& rt = s_->runtime();
  if (!rt.caps().push_descriptor) GTEST_SKIP() << "no push descriptors: replays are not bundled";
  auto k = s_->compile(affine());
  ASSERT_TRUE(k.ok());
  NdArrayHandle a = make("a"), b = make("b");
  ASSERT_TRUE(s_->fill(a, 0.0).ok());
  // Through the runtime: its capture keeps the launches as launched (no fusion).
  const std::vector<Arg> on_a = {Arg::ndarray(a)}, on_b = {Arg::ndarray(b)};
  // Its shape's pipeline made now: captured with it, the plans never change (a pipeline made on
  // a thread meanwhile would record the bundles again at some replay).
  ASSERT_TRUE(rt.prepare(*k, on_a).ok());
  ASSERT_TRUE(rt.graphs().begin_capture("steps").ok());
  ASSERT_TRUE(rt.launch(*k, on_a).ok());
  ASSERT_TRUE(rt.launch(*k, on_a).ok());
  ASSERT_TRUE(rt.fill(b, 1.0).ok());
  ASSERT_TRUE(rt.launch(*k, on_b).ok());
  auto g = rt.graphs().end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto stats = [&] {
    auto st = rt.stats();
    EXPECT_TRUE(st.ok());
    return st.ok() ? *st : runtime::RuntimeStats{};
  };
  ASSERT_TRUE(rt.graphs().replay(*g).ok());
  const runtime::RuntimeStats before = stats();
  ASSERT_TRUE(s_->begin_timeline(runtime::kTimelineMaxEvents, 1).ok());
  runtime::LaunchId first{};
  ASSERT_TRUE(rt.graphs().replay(*g, {}, &first).ok());
  ASSERT_TRUE(rt.graphs().replay(*g).ok());
  auto t = s_->end_timeline();
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE(rt.graphs().replay(*g).ok());
  const runtime::RuntimeStats after = stats();
  // Four replays, all from bundles; the timed set recorded once (the plain one before), or
  // under the validation layer once per timed replay (runtime/graph.cpp: the layer must not see
  // a timed bundle in two submissions).
  EXPECT_EQ(after.bundle_replays - before.bundle_replays, 3u);
  const uint64_t timed_recordings = rt.device().validation_enabled() ? 2u : 1u;
  EXPECT_EQ(after.graph_recordings - before.graph_recordings,
            t->gpu_timestamps ? timed_recordings : 0u);
  // a: from 0, x * 2 + 1 twice per replay, four replays: 2^8 - 1; b: 1 * 2 + 1.
  std::vector<float> got(kN);
  ASSERT_TRUE(s_->download(a, std::span<float>(got)).ok());
  EXPECT_EQ(got[0], 255.0f);
  ASSERT_TRUE(s_->download(b, std::span<float>(got)).ok());
  EXPECT_EQ(got[kN - 1], 3.0f);
  if (!timestamps()) GTEST_SKIP() << "no timestamp queries";
  const std::vector<const TimelineEvent*> d = device_events(*t);
  ASSERT_EQ(d.size(), 6u);  // three launches per replay
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d[i]->name, "affine");
    EXPECT_EQ(d[i]->graph, "steps");
    EXPECT_EQ(d[i]->category, "launch");
    EXPECT_EQ(d[i]->launch, first.value + i);
    EXPECT_LE(d[i]->begin_us, d[i]->end_us);
    if (i > 0) {
      EXPECT_LE(d[i - 1]->end_us, d[i]->begin_us);
    }
  }
  for (size_t r : {0u, 3u}) {
    EXPECT_EQ(d[r]->end_us, d[r + 1]->begin_us);  // one stamp between two launches
    // The fill ran between the second and the third launch: a stamp of its own after it (a
    // fill of 16 KiB behind a barrier takes more than the timestamp period on any device).
    EXPECT_LT(d[r + 1]->end_us, d[r + 2]->begin_us);
  }
}

// Replay sampling: with replay_sample 2, a graph's replays 0, 2, 4 are timed launch by launch and
// 1, 3 as one event each, whose span holds its launches; the summary's kernels are the timed
// launches and it says what was left out; a replay_sample of 0 is refused.
TEST_F(TimelineTest, ReplaysBetweenSampledOnesAreOneEventEach) {
  auto k = s_->compile(affine());
  ASSERT_TRUE(k.ok());
  NdArrayHandle a = make("a");
  ASSERT_TRUE(s_->fill(a, 0.0).ok());
  ASSERT_TRUE(s_->begin_capture("pair").ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(a)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto launches = s_->runtime().graphs().graph_launch_kernels(*g);
  ASSERT_TRUE(launches.ok());
  const uint64_t per_replay = launches->size();  // 1 or 2, whatever the rework made
  EXPECT_EQ(s_->begin_timeline(100, 0).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(s_->begin_timeline(runtime::kTimelineMaxEvents, 2).ok());
  for (int r = 0; r < 5; ++r) ASSERT_TRUE(s_->replay(*g).ok());
  auto t = s_->end_timeline();
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->replay_sample, 2u);
  EXPECT_EQ(t->replays_timed, 3u);
  EXPECT_EQ(t->replays_spanned, 2u);
  EXPECT_EQ(t->spanned_launches, 2 * per_replay);
  std::vector<float> got(kN);
  ASSERT_TRUE(s_->download(a, std::span<float>(got)).ok());
  EXPECT_EQ(got[0], 1023.0f);  // x * 2 + 1, ten times
  if (!timestamps()) GTEST_SKIP() << "no timestamp queries";
  std::vector<const TimelineEvent*> spans, timed;
  for (const TimelineEvent* e : device_events(*t)) {
    (e->category == "replay" ? spans : timed).push_back(e);
  }
  ASSERT_EQ(spans.size(), 2u);
  ASSERT_EQ(timed.size(), 3 * per_replay);
  for (const TimelineEvent* e : spans) {
    EXPECT_EQ(e->name, "replay 'pair'");
    EXPECT_EQ(e->graph, "pair");
    EXPECT_LE(e->begin_us, e->end_us);
  }
  // In recording order: replay 1's span after replay 0's launches, before replay 2's.
  EXPECT_LE(timed[per_replay - 1]->end_us, spans[0]->end_us);
  EXPECT_LE(spans[0]->end_us, timed[2 * per_replay - 1]->end_us);
  uint64_t counted = 0;
  for (const TimelineKernelSummary& row : t->summarize()) {
    EXPECT_EQ(row.name.find("replay"), std::string::npos);
    counted += row.count;
  }
  EXPECT_EQ(counted, 3 * per_replay);
  EXPECT_NE(t->summary().find("2 of 5 graph replays timed as one event"), std::string::npos)
      << t->summary();
}

TEST_F(TimelineTest, TheChromeTraceHoldsEveryEventAndEscapesNames) {
  auto k = s_->compile(affine());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto odd = s_->ndarray(DType::kF32, {kN}, "quote\"and\\slash");
  ASSERT_TRUE(odd.ok());
  NdArrayHandle a = make("a");
  ASSERT_TRUE(s_->begin_timeline().ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(a)}).ok());
  ASSERT_TRUE(s_->fill(*odd, 1.0).ok());
  auto t = s_->end_timeline();
  ASSERT_TRUE(t.ok());
  const std::string json = t->chrome_trace_json();
  const std::string path = ::testing::TempDir() + "vkad_timeline_test.json";
  ASSERT_TRUE(t->write_chrome_trace(path).ok());
  std::ifstream f(path);
  std::stringstream read;
  read << f.rdbuf();
  EXPECT_EQ(read.str(), json);
  std::remove(path.c_str());
  size_t complete = 0;
  for (size_t p = json.find("\"ph\": \"X\""); p != std::string::npos;
       p = json.find("\"ph\": \"X\"", p + 1)) {
    ++complete;
  }
  EXPECT_EQ(complete, t->events.size());
  if (timestamps()) {
    EXPECT_NE(json.find("\"fill 'quote\\\"and\\\\slash'\""), std::string::npos) << json;
  }
  EXPECT_FALSE(t->write_chrome_trace("/nonexistent-dir/x/trace.json").ok());
}

TEST_F(TimelineTest, MaxEventsDropsTheRestAndSaysHowMany) {
  auto k = s_->compile(affine());
  ASSERT_TRUE(k.ok());
  NdArrayHandle a = make("a");
  ASSERT_TRUE(s_->begin_timeline(4).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(a)}).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  auto t = s_->end_timeline();
  ASSERT_TRUE(t.ok());
  if (!timestamps()) GTEST_SKIP() << "no timestamp queries: a few host spans, none dropped";
  ASSERT_EQ(t->events.size(), 4u);
  // The first four events recorded are kept (launches in order, and a submission where a flush
  // by age came between them: the first launch makes its pipeline); the rest are counted: the
  // other launches, a submission per flush and the wait.
  uint64_t gpu = 0;
  for (const TimelineEvent& e : t->events) {
    if (!e.gpu) continue;
    EXPECT_EQ(e.launch, t->events[0].launch + gpu);
    ++gpu;
  }
  EXPECT_GE(gpu, 2u);
  EXPECT_TRUE(t->events[0].gpu);
  EXPECT_GE(t->events.size() + t->dropped, 10u + 1 + 1);
  EXPECT_LE(t->events.size() + t->dropped, 10u + 10 + 1);
  EXPECT_NE(t->summary().find("not kept"), std::string::npos);
}

TEST_F(TimelineTest, NothingIsRecordedWithoutATimelineAndMisuseIsRefused) {
  auto k = s_->compile(affine());
  ASSERT_TRUE(k.ok());
  NdArrayHandle a = make("a");
  const uint64_t pools_before = s_->runtime().device().live().query_pools;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(a)}).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  EXPECT_EQ(s_->runtime().device().live().query_pools, pools_before) << "no queries when off";
  EXPECT_FALSE(s_->runtime().timeline_on());

  Result<Timeline> none = s_->end_timeline();
  EXPECT_EQ(none.status().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(s_->begin_timeline().ok());
  EXPECT_EQ(s_->begin_timeline().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(s_->end_timeline().ok());
  ASSERT_TRUE(s_->begin_capture("c").ok());
  EXPECT_EQ(s_->begin_timeline().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(s_->end_capture().ok());
  // Still usable, and a second timeline works.
  ASSERT_TRUE(s_->begin_timeline().ok());
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(a)}).ok());
  auto t = s_->end_timeline();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(device_events(*t).size(), timestamps() ? 1u : 0u);
}

}  // namespace
}  // namespace vkad::testing
