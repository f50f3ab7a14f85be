// Runtime::Graphs::instantiate: a graph made from a list of steps, without a capture, is the graph
// that capturing those steps makes -- the same results as launching them one by one, the barriers
// the list leaves out omitted only between two launches, each launch's origin kept -- and a refused
// step is the error launch() or fill() gives, naming the step, with nothing kept. A capture the
// caller has open is left as it was. Runtime::Graphs::graph_record reads a graph's steps back.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/sample_kernels.h"

namespace vkad::testing {
namespace {

using runtime::Arg;
using runtime::DType;
using runtime::GraphStep;
using runtime::LaunchOrigin;
using runtime::NdArrayHandle;
using runtime::Runtime;

constexpr uint32_t kN = 300;

// Both replay paths, as tests/gpu/graph_test.cpp: pre-recorded bundles (push descriptors) and
// every step recorded again (descriptor sets).
class GraphInstantiate : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    runtime::RuntimeOptions o;
    o.device.enable_validation = true;
    o.device.push_descriptors = GetParam();
    auto r = Runtime::create(o);
    if (!r.ok() && r.status().code() == ErrorCode::kNoDevice)
      GTEST_SKIP() << "SKIPPED: no Vulkan device";
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    rt_ = std::move(r).value();
    auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
    ASSERT_TRUE(k.ok());
    axpy_ = *k;
    for (uint32_t i = 0; i < kN; ++i) xs_[i] = 0.25f * static_cast<float>(i % 17);
    x_ = array(xs_, "x");
  }
  void TearDown() override {
    if (!rt_) return;
    std::string all;
    for (const auto& m : rt_->device().validation_messages()) all += m + "\n";
    EXPECT_EQ(rt_->device().validation_message_count(), 0u) << all;
  }
  NdArrayHandle array(const std::vector<float>& v, const std::string& name) {
    auto h = rt_->create_ndarray(DType::kF32, {static_cast<uint32_t>(v.size())}, name);
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(rt_->upload(*h, v.data(), 4 * v.size()).ok());
    return *h;
  }
  template <typename T>
  std::vector<T> read(NdArrayHandle h) {
    std::vector<T> out(kN);
    Status s = rt_->download(h, out.data(), sizeof(T) * kN);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out;
  }
  // The steps below over arrays y, z (f32) and w (f64): fills, dependent launches, and a launch
  // independent of the one before it (no barrier between them).
  struct Arrays {
    NdArrayHandle y, z, w;
  };
  Arrays arrays(const char* tag) {
    Arrays a;
    a.y = array(std::vector<float>(kN, -7.0f), std::string("y ") + tag);
    a.z = array(std::vector<float>(kN, -7.0f), std::string("z ") + tag);
    auto w = rt_->create_ndarray(DType::kF64, {kN}, std::string("w ") + tag);
    EXPECT_TRUE(w.ok());
    a.w = *w;
    return a;
  }
  // The launches' arguments, kept for the steps' spans.
  std::vector<std::vector<Arg>> launch_args(const Arrays& a) const {
    return {{Arg::f32(2.0f), Arg::ndarray(x_), Arg::ndarray(a.y)},
            {Arg::f32(3.0f), Arg::ndarray(x_), Arg::ndarray(a.z)},  // independent of the first
            {Arg::f32(4.0f), Arg::ndarray(x_), Arg::ndarray(a.y)},
            {Arg::f32(1.0f), Arg::ndarray(a.z), Arg::ndarray(a.y)}};
  }
  static LaunchOrigin origin(uint64_t index) {
    LaunchOrigin o;
    o.what = "tape entry";
    o.index = index;
    return o;
  }
  std::vector<GraphStep> steps(const Arrays& a, const std::vector<std::vector<Arg>>& args) const {
    return {GraphStep::array_fill(a.y, 1.0),
            GraphStep::array_fill(a.z, 0.5),
            GraphStep::kernel_launch(axpy_, args[0], false, origin(0)),
            GraphStep::kernel_launch(axpy_, args[1], /*omit_barrier=*/true, origin(1)),
            GraphStep::kernel_launch(axpy_, args[2], false, origin(2)),
            GraphStep::array_fill(a.w, 1.0),  // an f64 pattern with unequal halves
            GraphStep::kernel_launch(axpy_, args[3], false, origin(3))};
  }
  // What the steps compute, launched one by one.
  void run_eagerly(std::span<const GraphStep> list) {
    for (const GraphStep& s : list) {
      Status st = s.launch ? rt_->launch(s.kernel, s.args) : rt_->fill(s.array, s.value);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  }

  std::unique_ptr<Runtime> rt_;
  runtime::KernelHandle axpy_;
  std::vector<float> xs_ = std::vector<float>(kN);
  NdArrayHandle x_;
};

TEST_P(GraphInstantiate, AStepListReplaysAsTheStepsLaunchedOneByOne) {
  const Arrays eager = arrays("eager"), made = arrays("graph");
  const auto eager_args = launch_args(eager), made_args = launch_args(made);
  run_eagerly(steps(eager, eager_args));
  const runtime::RuntimeStats before = *rt_->stats();
  auto g = rt_->graphs().instantiate("made", steps(made, made_args));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const runtime::RuntimeStats after = *rt_->stats();
  EXPECT_EQ(after.launches, before.launches) << "instantiate runs nothing";
  EXPECT_EQ(after.graphs, before.graphs + 1);
  EXPECT_FALSE(rt_->graphs().capturing());
  for (float v : read<float>(made.y)) ASSERT_EQ(v, -7.0f) << "nothing ran before the replay";
  EXPECT_EQ(*rt_->graphs().graph_steps(*g), 7u);
  EXPECT_EQ(*rt_->graphs().graph_barriers(*g), 3u) << "one of the four launches goes without";
  EXPECT_EQ(rt_->graphs().graph_launch_kernels(*g)->size(), 4u);
  const std::vector<LaunchOrigin> origins = *rt_->graphs().graph_launch_origins(*g);
  ASSERT_EQ(origins.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(origins[i].text(), origin(i).text());
  for (int r = 0; r < 2; ++r) {  // the first replay records the bundles, the second runs them
    ASSERT_TRUE(rt_->graphs().replay(*g).ok());
    EXPECT_EQ(read<float>(made.y), read<float>(eager.y)) << "replay " << r;
    EXPECT_EQ(read<float>(made.z), read<float>(eager.z)) << "replay " << r;
    EXPECT_EQ(read<double>(made.w), read<double>(eager.w)) << "replay " << r;
  }
  const std::vector<float> y = read<float>(made.y);
  for (uint32_t i = 0; i < kN; ++i) {
    // y = 1 + 2x + 4x + z with z = 0.5 + 3x: exact in f32 for these small multiples of 1/4.
    ASSERT_EQ(y[i], (0.5f + 3.0f * xs_[i]) + (4.0f * xs_[i] + (2.0f * xs_[i] + 1.0f)))
        << "element " << i;
  }
  ASSERT_TRUE(rt_->graphs().release_graph(*g).ok());
  EXPECT_EQ(rt_->stats()->graphs, before.graphs);
}

// omit_barrier as omit_next_barrier(): honoured only where the step before is a launch.
TEST_P(GraphInstantiate, ABarrierIsLeftOutOnlyBetweenTwoLaunches) {
  const Arrays a = arrays("a");
  const Arg y[] = {Arg::f32(2.0f), Arg::ndarray(x_), Arg::ndarray(a.y)};
  const Arg z[] = {Arg::f32(3.0f), Arg::ndarray(x_), Arg::ndarray(a.z)};
  const GraphStep list[] = {GraphStep::kernel_launch(axpy_, y, /*omit_barrier=*/true),
                            GraphStep::array_fill(a.z, 0.0),
                            GraphStep::kernel_launch(axpy_, z, /*omit_barrier=*/true),
                            GraphStep::kernel_launch(axpy_, y, /*omit_barrier=*/true)};
  auto g = rt_->graphs().instantiate("barriers", list);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*rt_->graphs().graph_barriers(*g), 2u) << "only the third launch's request is honoured";
  auto record = rt_->graphs().graph_record(*g);
  ASSERT_TRUE(record.ok());
  ASSERT_EQ(record->size(), 4u);
  EXPECT_EQ(record->launches(), 3u);
  const bool omitted[] = {false, false, false, true};
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ((*record)[i].omit_barrier, omitted[i]) << "step " << i;
}

// A refused step: launch()'s or fill()'s error (same code, same message after the step's
// index), and nothing kept.
TEST_P(GraphInstantiate, ARefusedStepNamesItsIndexAndNothingIsKept) {
  const Arrays a = arrays("a");
  const Arg good[] = {Arg::f32(2.0f), Arg::ndarray(x_), Arg::ndarray(a.y)};
  const Arg short_list[] = {Arg::f32(2.0f), Arg::ndarray(x_)};
  const Arg scalar_for_array[] = {Arg::f32(2.0f), Arg::f32(1.0f), Arg::ndarray(a.y)};
  const uint64_t graphs = rt_->stats()->graphs;
  struct Case {
    std::vector<GraphStep> steps;
    size_t bad;
    Status alone;  // the step refused by launch() or fill()
  };
  const Case cases[] = {
      {{GraphStep::array_fill(a.y, 0.0), GraphStep::kernel_launch(axpy_, good),
        GraphStep::kernel_launch(axpy_, short_list)},
       2,
       rt_->launch(axpy_, short_list)},
      {{GraphStep::kernel_launch(axpy_, scalar_for_array)},
       0,
       rt_->launch(axpy_, scalar_for_array)},
      {{GraphStep::kernel_launch(axpy_, good), GraphStep::array_fill(a.y, 1e300)},
       1,
       rt_->fill(a.y, 1e300)},
  };
  for (const Case& c : cases) {
    ASSERT_FALSE(c.alone.ok());
    auto g = rt_->graphs().instantiate("refused", c.steps);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), c.alone.code());
    EXPECT_EQ(g.status().message(), "instantiate of graph 'refused', step " +
                                        std::to_string(c.bad) + ": " + c.alone.message());
    EXPECT_EQ(rt_->stats()->graphs, graphs);
  }
  // The graphs made after a refusal are whole: the refused lists left nothing behind.
  auto g = rt_->graphs().instantiate("after",
                                     std::vector<GraphStep>{GraphStep::kernel_launch(axpy_, good)});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*rt_->graphs().graph_steps(*g), 1u);
}

// Dead and foreign handles, of kernels and of arrays: the errors launch() and fill() give.
TEST_P(GraphInstantiate, ABadHandleIsRefusedAsLaunchAndFillRefuseIt) {
  const Arrays a = arrays("a");
  auto gone = rt_->register_kernel(make_axpy_kernel("gone"));
  ASSERT_TRUE(gone.ok());
  ASSERT_TRUE(rt_->unregister_kernel(*gone).ok());
  auto freed = rt_->create_ndarray(DType::kF32, {kN}, "freed");
  ASSERT_TRUE(freed.ok());
  ASSERT_TRUE(rt_->free_ndarray(*freed).ok());
  const NdArrayHandle foreign{(uint64_t{0x7fff} << 32) | 5};
  const Arg good[] = {Arg::f32(2.0f), Arg::ndarray(x_), Arg::ndarray(a.y)};
  const Arg dead_array[] = {Arg::f32(2.0f), Arg::ndarray(*freed), Arg::ndarray(a.y)};
  struct Case {
    GraphStep step;
    ErrorCode code;
    const char* names;
  };
  const Case cases[] = {
      {GraphStep::kernel_launch(*gone, good), ErrorCode::kNotFound, "kernel handle"},
      {GraphStep::kernel_launch(runtime::KernelHandle{foreign.id}, good),
       ErrorCode::kInvalidArgument, "kernel handle"},
      {GraphStep::kernel_launch(axpy_, dead_array), ErrorCode::kNotFound, "ndarray handle"},
      {GraphStep::array_fill(*freed, 0.0), ErrorCode::kNotFound, "ndarray handle"},
      {GraphStep::array_fill(foreign, 0.0), ErrorCode::kInvalidArgument, "ndarray handle"},
  };
  for (const Case& c : cases) {
    const GraphStep list[] = {GraphStep::kernel_launch(axpy_, good), c.step};
    auto g = rt_->graphs().instantiate("", list);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), c.code) << g.status().to_string();
    const std::string& m = g.status().message();
    EXPECT_EQ(m.rfind("instantiate of graph 'graph', step 1: ", 0), 0u) << m;
    EXPECT_NE(m.find(c.names), std::string::npos) << m;
    const Status alone = c.step.launch ? rt_->launch(c.step.kernel, c.step.args)
                                       : rt_->fill(c.step.array, c.step.value);
    EXPECT_NE(m.find(alone.message()), std::string::npos)
        << m << "\nlaunch/fill: " << alone.to_string();
  }
}

// Allowed while the caller has a capture open, which goes on as if nothing happened: its steps,
// its pending omit_next_barrier request, and the note its launches take.
TEST_P(GraphInstantiate, ACaptureOpenMeanwhileIsLeftAsItWas) {
  const Arrays a = arrays("a");
  const Arg y[] = {Arg::f32(2.0f), Arg::ndarray(x_), Arg::ndarray(a.y)};
  const Arg z[] = {Arg::f32(3.0f), Arg::ndarray(x_), Arg::ndarray(a.z)};
  ASSERT_TRUE(rt_->graphs().begin_capture("user").ok());
  rt_->set_launch_note("user note", 9);
  ASSERT_TRUE(rt_->fill(a.y, 1.0).ok());
  ASSERT_TRUE(rt_->launch(axpy_, y).ok());
  ASSERT_TRUE(rt_->graphs().omit_next_barrier().ok());
  const GraphStep list[] = {GraphStep::array_fill(a.z, 0.0),
                            GraphStep::kernel_launch(axpy_, z, false, origin(4))};
  auto made = rt_->graphs().instantiate("meanwhile", list);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  EXPECT_TRUE(rt_->graphs().capturing());
  EXPECT_EQ(rt_->graphs().capture_record().size(), 2u);
  ASSERT_TRUE(rt_->launch(axpy_, z).ok());  // takes the request made before instantiate
  auto user = rt_->graphs().end_capture();
  ASSERT_TRUE(user.ok()) << user.status().to_string();
  rt_->set_launch_note(nullptr, 0);
  EXPECT_EQ(*rt_->graphs().graph_steps(*user), 3u);
  EXPECT_EQ(*rt_->graphs().graph_barriers(*user), 1u);
  const std::vector<LaunchOrigin> user_origins = *rt_->graphs().graph_launch_origins(*user);
  for (const LaunchOrigin& o : user_origins) EXPECT_EQ(o.text(), "user note 9");
  EXPECT_EQ(rt_->graphs().graph_launch_origins(*made)->at(0).text(), origin(4).text());
  ASSERT_TRUE(rt_->graphs().replay(*made).ok());
  ASSERT_TRUE(rt_->graphs().replay(*user).ok());
  const std::vector<float> ys = read<float>(a.y), zs = read<float>(a.z);
  for (uint32_t i = 0; i < kN; ++i) {
    ASSERT_EQ(ys[i], 1.0f + 2.0f * xs_[i]) << "element " << i;
    ASSERT_EQ(zs[i], 6.0f * xs_[i]) << "element " << i;  // 0 + 3x, then 3x more
  }
}

// graph_record gives the steps back as they went in (a fill's value, a launch's kernel, arguments,
// barrier and origin), a launch's arguments with the replays' updates applied; instantiating the
// record makes the same graph.
TEST_P(GraphInstantiate, ARecordReadsTheStepsBackAndInstantiatesTheSameGraph) {
  const Arrays a = arrays("a");
  const auto args = launch_args(a);
  const std::vector<GraphStep> list = steps(a, args);
  auto g = rt_->graphs().instantiate("recorded", list);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto check = [&](const Runtime::Graphs::GraphRecord& record, float first_scalar) {
    ASSERT_EQ(record.size(), list.size());
    EXPECT_EQ(record.launches(), 4u);
    for (size_t i = 0; i < list.size(); ++i) {
      const GraphStep s = record[i];
      ASSERT_EQ(s.launch, list[i].launch) << "step " << i;
      if (!s.launch) {
        EXPECT_EQ(s.array.id, list[i].array.id) << "step " << i;
        EXPECT_EQ(s.value, list[i].value) << "step " << i;
        continue;
      }
      EXPECT_EQ(s.kernel.id, list[i].kernel.id) << "step " << i;
      EXPECT_EQ(s.omit_barrier, list[i].omit_barrier) << "step " << i;
      EXPECT_EQ(s.origin.text(), list[i].origin.text()) << "step " << i;
      ASSERT_EQ(s.args.size(), list[i].args.size()) << "step " << i;
      for (size_t p = 0; p < s.args.size(); ++p) {
        const float want = i == 2 && p == 0 ? first_scalar : static_cast<float>(list[i].args[p].f);
        EXPECT_EQ(s.args[p].kind, list[i].args[p].kind) << "step " << i << ", argument " << p;
        EXPECT_EQ(s.args[p].array.id, list[i].args[p].array.id) << "step " << i;
        EXPECT_EQ(static_cast<float>(s.args[p].f), want) << "step " << i << ", argument " << p;
      }
    }
  };
  check(*rt_->graphs().graph_record(*g), 2.0f);
  const runtime::GraphUpdate update[] = {{0, 0, Arg::f32(5.0f)}};
  ASSERT_TRUE(rt_->graphs().replay(*g, update).ok());
  check(*rt_->graphs().graph_record(*g), 5.0f);
  const std::vector<float> y = read<float>(a.y);
  // From the record: the updated scalar taken as captured.
  std::vector<GraphStep> again;
  const Runtime::Graphs::GraphRecord record = *rt_->graphs().graph_record(*g);
  for (size_t i = 0; i < record.size(); ++i) again.push_back(record[i]);
  auto copy = rt_->graphs().instantiate("again", again);
  ASSERT_TRUE(copy.ok()) << copy.status().to_string();
  ASSERT_TRUE(rt_->graphs().replay(*copy).ok());
  EXPECT_EQ(read<float>(a.y), y);
  EXPECT_EQ(*rt_->graphs().graph_barriers(*copy), *rt_->graphs().graph_barriers(*g));
  EXPECT_EQ(rt_->graphs().graph_record(runtime::GraphHandle{12345}).status().code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(rt_->graphs().capture_record().size(), 0u) << "no capture open";
}

// The record of a long capture (its arguments in several chunks of the graph's ChunkedVector)
// gives every step back as captured: what Session's rework reads in place of a log of its own.
TEST_P(GraphInstantiate, ACapturesRecordGivesEveryStepBackAcrossItsChunks) {
  const Arrays a = arrays("a");
  ASSERT_TRUE(rt_->graphs().begin_capture("long").ok());
  for (int32_t i = 0; i < 3000; ++i) {  // 3 arguments a launch: past the first chunks
    if (i % 7 == 3) {
      ASSERT_TRUE(rt_->fill(a.z, 0.5 * (i % 5)).ok());
      continue;
    }
    const Arg args[] = {Arg::f32(static_cast<float>(i)), Arg::ndarray(x_),
                        Arg::ndarray(i % 2 ? a.y : a.z)};
    ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  }
  const Runtime::Graphs::GraphRecord open = rt_->graphs().capture_record();
  ASSERT_EQ(open.size(), 3000u);
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok());
  const Runtime::Graphs::GraphRecord record = *rt_->graphs().graph_record(*g);
  ASSERT_EQ(record.size(), 3000u);
  EXPECT_EQ(record.launches(), 3000u - 429u);
  for (int32_t i = 0; i < 3000; ++i) {
    const GraphStep s = record[static_cast<size_t>(i)];
    ASSERT_EQ(s.launch, i % 7 != 3) << "step " << i;
    if (!s.launch) {
      ASSERT_EQ(s.array.id, a.z.id) << "step " << i;
      ASSERT_EQ(s.value, 0.5 * (i % 5)) << "step " << i;
      continue;
    }
    ASSERT_EQ(s.kernel.id, axpy_.id) << "step " << i;
    ASSERT_EQ(s.args.size(), 3u) << "step " << i;
    ASSERT_EQ(s.args[0].f, static_cast<double>(static_cast<float>(i))) << "step " << i;
    ASSERT_EQ(s.args[1].array.id, x_.id) << "step " << i;
    ASSERT_EQ(s.args[2].array.id, (i % 2 ? a.y : a.z).id) << "step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(BothReplayPaths, GraphInstantiate, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Bundled" : "StepByStep";
                         });

}  // namespace
}  // namespace vkad::testing
