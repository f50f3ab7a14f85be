// Captured launch sequences (Runtime::Graphs::begin_capture / end_capture / replay): a replay
// computes what launching the captured steps one by one computes, takes scalar updates, binds
// arrays by reference, reports device errors with the replayed launch's number, refuses misuse with
// nothing recorded, and in its steady state creates no Vulkan object.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "diffsim/diffsim.h"
#include "rhi/vk_check.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/sample_kernels.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using runtime::Arg;
using runtime::DType;
using runtime::GraphUpdate;
using runtime::Runtime;

// Both replay paths: a pre-recorded bundle (push descriptors, every device vkad knows of) and
// every step recorded again (descriptor sets).
class Graphs : public ::testing::TestWithParam<bool> {
 protected:
  bool bundled() const { return GetParam(); }
  void SetUp() override {
    runtime::RuntimeOptions o;
    o.device.enable_validation = true;
    o.device.push_descriptors = GetParam();
    o.max_list_age_us = max_list_age_us_;
    o.run_threads_after_steps = run_threads_after_;
    auto r = Runtime::create(o);
    if (!r.ok() && r.status().code() == ErrorCode::kNoDevice)
      GTEST_SKIP() << "SKIPPED: no Vulkan device";
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    rt_ = std::move(r).value();
    auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
    ASSERT_TRUE(k.ok());
    axpy_ = *k;
    x_ = array(xs_, "x");
    y_ = array(std::vector<float>(kN, 0.0f), "y");
  }
  void TearDown() override {
    if (!rt_) return;
    std::string all;
    for (const auto& m : rt_->device().validation_messages()) all += m + "\n";
    EXPECT_EQ(rt_->device().validation_message_count(), 0u) << all;
  }
  runtime::NdArrayHandle u32_array(const std::vector<uint32_t>& v, const char* name) {
    auto h = rt_->create_ndarray(DType::kU32, {static_cast<uint32_t>(v.size())}, name);
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(rt_->upload(*h, v.data(), 4 * v.size()).ok());
    return *h;
  }
  runtime::NdArrayHandle array(const std::vector<float>& v, const std::string& name) {
    auto h = rt_->create_ndarray(DType::kF32, {static_cast<uint32_t>(v.size())}, name);
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(rt_->upload(*h, v.data(), 4 * v.size()).ok());
    return *h;
  }
  std::vector<float> read(runtime::NdArrayHandle h) {
    std::vector<float> out(kN);
    Status s = rt_->download(h, out.data(), 4 * kN);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out;
  }
  // y = 1, then y = a_k * x + y for a = {2, 3, 4}: captured, not run (`run`: run as captured).
  runtime::GraphHandle capture_three(bool run = false) {
    EXPECT_TRUE(rt_->graphs().begin_capture("three", run).ok());
    EXPECT_TRUE(rt_->fill(y_, 1.0).ok());
    for (float a : {2.0f, 3.0f, 4.0f}) {
      const Arg args[] = {Arg::f32(a), Arg::ndarray(x_), Arg::ndarray(y_)};
      EXPECT_TRUE(rt_->launch(axpy_, args).ok());
    }
    auto g = rt_->graphs().end_capture();
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return *g;
  }
  // The device error the axpy kernel raises (x < 0) at the three launches from `first` on,
  // reported by synchronize with their numbers, each replayed one also with its place in the
  // graph ("#4 (launch 0 of graph 'three')").
  void expect_three_flagged(runtime::LaunchId first, bool replayed) {
    Status s = rt_->synchronize();
    EXPECT_EQ(s.code(), ErrorCode::kDeviceError);
    auto id = [&](uint64_t k) {
      const std::string n = "#" + std::to_string(first.value + k);
      return replayed ? n + " (launch " + std::to_string(k) + " of graph 'three')" : n;
    };
    const std::string want = "launches " + id(0) + ", " + id(1) + ", " + id(2);
    EXPECT_NE(s.message().find(want), std::string::npos) << s.message() << "\nwanted " << want;
  }
  void expect_y(float sum_a) {
    std::vector<float> y = read(y_);
    for (uint32_t i = 0; i < kN; ++i) {
      // a*x + y in f32, one rounding per step (small integers times exact x: exact).
      ASSERT_EQ(y[i], 1.0f + sum_a * xs_[i]) << "element " << i;
    }
  }
  static constexpr uint32_t kN = 300;
  std::vector<float> xs_ = [] {
    std::vector<float> v(kN);
    for (uint32_t i = 0; i < kN; ++i) v[i] = 0.25f * static_cast<float>(i % 17);
    return v;
  }();
  double max_list_age_us_ = runtime::RuntimeOptions{}.max_list_age_us;
  // Recording threads from a capture's first step: the tests of pieces recorded aside.
  uint32_t run_threads_after_ = 0;
  std::unique_ptr<Runtime> rt_;
  runtime::KernelHandle axpy_;
  runtime::NdArrayHandle x_, y_;
};

TEST_P(Graphs, CaptureRunsNothingAndReplayEqualsLaunchingTheSteps) {
  const uint64_t launches = rt_->stats()->launches;
  runtime::GraphHandle g = capture_three();
  EXPECT_EQ(rt_->stats()->launches, launches) << "capturing launches nothing";
  std::vector<float> y0 = read(y_);
  for (float v : y0) ASSERT_EQ(v, 0.0f) << "the captured fill did not run either";
  runtime::LaunchId first;
  ASSERT_TRUE(rt_->graphs().replay(g, {}, &first).ok());
  EXPECT_EQ(first.value, launches + 1);
  expect_y(9.0f);
  ASSERT_TRUE(rt_->graphs().replay(g).ok());  // the fill resets y: the same result again
  expect_y(9.0f);
  auto s = *rt_->stats();
  EXPECT_EQ(s.graph_replays, 2u);
  EXPECT_EQ(s.replayed_launches, 6u);
  EXPECT_EQ(s.launches, launches + 6);
  EXPECT_EQ(s.graphs, 1u);
  if (bundled() && rt_->device().caps().push_descriptor) {
    EXPECT_EQ(s.bundle_replays, 2u);
    EXPECT_EQ(s.graph_recordings, 1u) << "recorded once, executed twice";
  } else {
    EXPECT_EQ(s.bundle_replays, 0u);
  }
}

// Fills of 8-byte dtypes whose halves differ (f64 1.0: a tape's seed of an f64 loss) are
// captured -- recorded in the command buffer, not staged from the host -- and a replay, or a
// capture that runs, writes them: a few elements, one past vkCmdUpdateBuffer's 64 KiB (copies
// double the prefix), and an i64, each between launches.
TEST_P(Graphs, EightByteFillsWithUnequalHalvesAreCapturedAndReplayed) {
  struct Case {
    DType t;
    uint32_t n;
    double v;
  };
  const Case cases[] = {{DType::kF64, 7, 1.0}, {DType::kF64, 20000, -0.1}, {DType::kI64, 3, -3e12}};
  for (bool run : {false, true}) {
    SCOPED_TRACE(run ? "a capture that runs" : "replayed");
    std::vector<runtime::NdArrayHandle> arrays;
    for (const Case& c : cases) {
      auto h = rt_->create_ndarray(c.t, {c.n}, "wide");
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      std::vector<unsigned char> junk(8 * c.n, 0xA5);
      ASSERT_TRUE(rt_->upload(*h, junk.data(), junk.size()).ok());
      arrays.push_back(*h);
    }
    ASSERT_TRUE(rt_->graphs().begin_capture("wide fills", run).ok());
    for (size_t k = 0; k < arrays.size(); ++k) {
      Status st = rt_->fill(arrays[k], cases[k].v);
      ASSERT_TRUE(st.ok()) << st.to_string();
      const Arg args[] = {Arg::f32(1.0f), Arg::ndarray(x_), Arg::ndarray(y_)};
      ASSERT_TRUE(rt_->launch(axpy_, args).ok());
    }
    auto g = rt_->graphs().end_capture();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    if (!run) {
      ASSERT_TRUE(rt_->graphs().replay(*g).ok());
    }
    for (size_t k = 0; k < arrays.size(); ++k) {
      std::vector<unsigned char> got(8 * cases[k].n);
      ASSERT_TRUE(rt_->download(arrays[k], got.data(), got.size()).ok());
      for (uint32_t e = 0; e < cases[k].n; ++e) {
        if (cases[k].t == DType::kF64) {
          double d;
          std::memcpy(&d, got.data() + 8 * e, 8);
          ASSERT_EQ(d, cases[k].v) << "case " << k << ", element " << e;
        } else {
          int64_t i;
          std::memcpy(&i, got.data() + 8 * e, 8);
          ASSERT_EQ(i, static_cast<int64_t>(cases[k].v)) << "case " << k << ", element " << e;
        }
      }
    }
    ASSERT_TRUE(rt_->graphs().release_graph(*g).ok());
    for (runtime::NdArrayHandle h : arrays) ASSERT_TRUE(rt_->free_ndarray(h).ok());
  }
}

// Replays in flight together, each with its own scalars: the second replay's args do not
// overwrite the first's before the first ran (in one list, and across a flush).
TEST_P(Graphs, ReplaysInFlightTogetherEachSeeTheirOwnScalars) {
  auto k = rt_->register_kernel(make_axpy_kernel("axpy"));
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(rt_->graphs().begin_capture("one").ok());
  const Arg args[] = {Arg::f32(1.0f), Arg::ndarray(x_), Arg::ndarray(y_)};
  ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok());
  for (bool flush_between : {false, true}) {
    auto z = array(std::vector<float>(kN, 0.0f), "z");
    ASSERT_TRUE(rt_->fill(y_, 0.0).ok());
    const GraphUpdate two[] = {{0, 0, Arg::f32(2.0f)}};
    ASSERT_TRUE(rt_->graphs().replay(*g, two).ok());  // y = 2x
    const Arg copy[] = {Arg::f32(1.0f), Arg::ndarray(y_), Arg::ndarray(z)};
    ASSERT_TRUE(rt_->launch(*k, copy).ok());  // z = y
    if (flush_between) {
      ASSERT_TRUE(rt_->flush().ok());
    }
    const GraphUpdate three[] = {{0, 0, Arg::f32(3.0f)}};
    ASSERT_TRUE(rt_->graphs().replay(*g, three).ok());  // y = 3x + 2x
    std::vector<float> zs = read(z), ys = read(y_);
    for (uint32_t i = 0; i < kN; ++i) {
      ASSERT_EQ(zs[i], 2.0f * xs_[i]) << "element " << i << ", flush " << flush_between;
      ASSERT_EQ(ys[i], 5.0f * xs_[i]) << "element " << i << ", flush " << flush_between;
    }
    ASSERT_TRUE(rt_->free_ndarray(z).ok());
  }
}

// A graph whose args take several ring chunks (each replay copies them in per chunk-sized
// piece, and back for the error words): every launch runs with its own scalar, and an error
// raised by every launch is reported from the first one on.
TEST_P(Graphs, AGraphWhoseArgsSpanSeveralRingChunksRunsEveryLaunchWithItsOwnArgs) {
  // Each launch takes at least its args bytes (more when aligned): past two chunks' worth.
  const uint64_t per_launch = make_axpy_kernel("axpy").args_bytes();
  const uint32_t n = static_cast<uint32_t>(2 * runtime::kRingChunkBytes / per_launch + 64);
  ASSERT_TRUE(rt_->graphs().begin_capture("long").ok());
  ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
  float sum = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const float a = static_cast<float>(i % 7) - 3.0f;  // -3..3: distinct per neighbour
    sum += a;
    const Arg args[] = {Arg::f32(a), Arg::ndarray(x_), Arg::ndarray(y_)};
    ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  }
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(rt_->graphs().replay(*g).ok());
    expect_y(sum);  // exact: small integer sums times multiples of 1/4
  }
  std::vector<float> neg(xs_);
  neg[7] = -1.0f;  // every launch flags it
  ASSERT_TRUE(rt_->upload(x_, neg.data(), 4 * kN).ok());
  runtime::LaunchId first;
  ASSERT_TRUE(rt_->graphs().replay(*g, {}, &first).ok());
  Status s = rt_->synchronize();
  EXPECT_EQ(s.code(), ErrorCode::kDeviceError);
  EXPECT_NE(s.message().find("#" + std::to_string(first.value) + " (launch 0 of graph '"),
            std::string::npos)
      << s.message().substr(0, 400) << "\nwanted #" << first.value;
}

// The replay that records a long graph records it in bundles of kBundleLaunches launches and
// submits each as it is recorded: every launch runs with its own args (fills between them
// included), a device error names the replayed launch, and later replays execute the bundles
// without recording or submitting anything more.
TEST_P(Graphs, AGraphRecordedInPiecesRunsEveryLaunchAndNamesItsErrors) {
  const uint32_t n = 3 * runtime::kBundleLaunches + 5;  // four bundles
  runtime::NdArrayHandle z = array(std::vector<float>(kN, 5.0f), "z");
  ASSERT_TRUE(rt_->graphs().begin_capture("pieces").ok());
  ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
  float sum = 0;
  for (uint32_t i = 0; i < n; ++i) {
    // Fills between launches, some right at a bundle's end (record_steps' fill barriers).
    if (i % runtime::kBundleLaunches == 0 || i % 97 == 0) {
      ASSERT_TRUE(rt_->fill(z, 0.0).ok());
    }
    const float a = static_cast<float>(i % 7) - 3.0f;
    sum += a;
    const Arg args[] = {Arg::f32(a), Arg::ndarray(x_), Arg::ndarray(y_)};
    ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  }
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok());
  std::vector<float> neg(xs_);
  neg[7] = -1.0f;  // every launch flags it, from the first bundle on
  ASSERT_TRUE(rt_->upload(x_, neg.data(), 4 * kN).ok());
  const uint64_t flushes = rt_->stats()->flushes;
  runtime::LaunchId first;
  ASSERT_TRUE(rt_->graphs().replay(*g, {}, &first).ok());
  const bool pieces = bundled() && rt_->device().caps().push_descriptor;
  if (pieces) {
    EXPECT_GE(rt_->stats()->flushes, flushes + 3) << "each bundle but the last submitted";
  }
  Status s = rt_->synchronize();
  EXPECT_EQ(s.code(), ErrorCode::kDeviceError);
  EXPECT_NE(s.message().find("#" + std::to_string(first.value) + " (launch 0 of graph '"),
            std::string::npos)
      << s.message().substr(0, 400) << "\nwanted #" << first.value;
  ASSERT_TRUE(rt_->upload(x_, xs_.data(), 4 * kN).ok());
  const uint64_t recorded = rt_->stats()->graph_recordings;
  for (int r = 0; r < 2; ++r) {
    const uint64_t before = rt_->stats()->flushes;
    ASSERT_TRUE(rt_->graphs().replay(*g).ok());
    if (pieces) {
      // At most the one flush a list past max_dispatches_per_list gets after the replay.
      EXPECT_LE(rt_->stats()->flushes, before + 1);
    }
    expect_y(sum);  // exact: small integer sums times multiples of 1/4
    std::vector<float> zs = read(z);
    for (float v : zs) ASSERT_EQ(v, 0.0f);
  }
  EXPECT_EQ(rt_->stats()->graph_recordings, recorded) << "recorded once";
}

// An update that changes a launch's range (the copy kernel's count is a scalar): the bundle
// bakes ranges in, so it is recorded again; an update of a plain scalar is not.
TEST_P(Graphs, AnUpdateThatChangesTheRangeIsRecordedAgain) {
  auto k = rt_->register_kernel(make_copy_u32x4_kernel());
  ASSERT_TRUE(k.ok());
  std::vector<uint32_t> src(kN), zeros(kN, 0u);
  for (uint32_t i = 0; i < kN; ++i) src[i] = 1000u + i;
  auto a = u32_array(src, "a"), b = u32_array(zeros, "b");
  ASSERT_TRUE(rt_->graphs().begin_capture("copy").ok());
  const Arg args[] = {Arg::u32(2), Arg::ndarray(a), Arg::ndarray(b)};
  ASSERT_TRUE(rt_->launch(*k, args).ok());
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok());
  auto check = [&](uint32_t copied) {
    std::vector<uint32_t> out(kN);
    ASSERT_TRUE(rt_->download(b, out.data(), 4 * kN).ok());
    for (uint32_t i = 0; i < kN; ++i) {
      ASSERT_EQ(out[i], i < copied ? src[i] : 0u) << "element " << i << " of " << copied;
    }
  };
  ASSERT_TRUE(rt_->graphs().replay(*g).ok());
  check(8);
  const uint64_t recorded = rt_->stats()->graph_recordings;
  const GraphUpdate all[] = {{0, 0, Arg::u32(kN / 4)}};
  ASSERT_TRUE(rt_->graphs().replay(*g, all).ok());
  check(kN / 4 * 4);
  if (bundled() && rt_->device().caps().push_descriptor) {
    EXPECT_EQ(rt_->stats()->graph_recordings, recorded + 1);
  }
  ASSERT_TRUE(rt_->graphs().replay(*g).ok());  // the update stays
  check(kN / 4 * 4);
  if (bundled() && rt_->device().caps().push_descriptor) {
    EXPECT_EQ(rt_->stats()->graph_recordings, recorded + 1) << "nothing changed: not again";
  }
}

// Launches of one kernel that plan alike share their plan in the graph: an update that changes
// one launch's range changes that launch only, at this replay and later ones.
TEST_P(Graphs, AnUpdateOfOneOfTwoLaunchesPlannedAlikeChangesThatLaunchOnly) {
  auto k = rt_->register_kernel(make_copy_u32x4_kernel());
  ASSERT_TRUE(k.ok());
  std::vector<uint32_t> src(kN), zeros(kN, 0u);
  for (uint32_t i = 0; i < kN; ++i) src[i] = 1000u + i;
  auto a = u32_array(src, "a"), b = u32_array(zeros, "b"), c = u32_array(zeros, "c");
  ASSERT_TRUE(rt_->graphs().begin_capture("two copies").ok());
  for (runtime::NdArrayHandle to : {b, c}) {
    const Arg args[] = {Arg::u32(2), Arg::ndarray(a), Arg::ndarray(to)};
    ASSERT_TRUE(rt_->launch(*k, args).ok());
  }
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok());
  auto check = [&](runtime::NdArrayHandle h, uint32_t copied) {
    std::vector<uint32_t> out(kN);
    ASSERT_TRUE(rt_->download(h, out.data(), 4 * kN).ok());
    for (uint32_t i = 0; i < kN; ++i) {
      ASSERT_EQ(out[i], i < copied ? src[i] : 0u) << "element " << i << " of " << copied;
    }
  };
  const GraphUpdate second[] = {{1, 0, Arg::u32(kN / 4)}};
  ASSERT_TRUE(rt_->graphs().replay(*g, second).ok());
  check(b, 8);
  check(c, kN / 4 * 4);
  ASSERT_TRUE(rt_->upload(c, zeros.data(), 4 * kN).ok());
  const GraphUpdate first[] = {{0, 0, Arg::u32(4)}};
  ASSERT_TRUE(rt_->graphs().replay(*g, first).ok());  // the second launch's update stays
  check(b, 16);
  check(c, kN / 4 * 4);
}

// zero_many is captured as fills (and a fill of the same array after it, with another value,
// is ordered after it): every replay zeroes again what was written since.
TEST_P(Graphs, CapturedZeroManyRunsAtEveryReplay) {
  auto z = array(std::vector<float>(kN, 5.0f), "z");
  const runtime::NdArrayHandle both[] = {y_, z};
  ASSERT_TRUE(rt_->graphs().begin_capture("zeros").ok());
  ASSERT_TRUE(rt_->zero_many(both).ok());
  ASSERT_TRUE(rt_->fill(z, 2.0).ok());  // same array again in the same run of fills
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok());
  for (int i = 0; i < 3; ++i) {
    std::vector<float> junk(kN, 9.0f + i);
    ASSERT_TRUE(rt_->upload(y_, junk.data(), 4 * kN).ok());
    ASSERT_TRUE(rt_->upload(z, junk.data(), 4 * kN).ok());
    ASSERT_TRUE(rt_->graphs().replay(*g).ok());
    for (float v : read(y_)) ASSERT_EQ(v, 0.0f) << "replay " << i;
    for (float v : read(z)) ASSERT_EQ(v, 2.0f) << "replay " << i;
  }
}

TEST_P(Graphs, ScalarUpdatesApplyToThisAndLaterReplays) {
  runtime::GraphHandle g = capture_three();
  const GraphUpdate u[] = {{1, 0, Arg::f32(-5.0f)}};
  ASSERT_TRUE(rt_->graphs().replay(g, u).ok());
  expect_y(2.0f - 5.0f + 4.0f);
  ASSERT_TRUE(rt_->graphs().replay(g).ok());
  expect_y(1.0f);
}

TEST_P(Graphs, BadUpdatesAreRefusedWithNothingRecordedOrKept) {
  runtime::GraphHandle g = capture_three();
  const uint64_t launches = rt_->stats()->launches;
  const GraphUpdate past[] = {{3, 0, Arg::f32(1.0f)}};
  Status s = rt_->graphs().replay(g, past);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(
      s.message().find("replay of graph 'three': update of launch 3; the graph has 3 launches"),
      std::string::npos)
      << s.message();
  const GraphUpdate array_param[] = {{0, 1, Arg::f32(1.0f)}};
  s = rt_->graphs().replay(g, array_param);
  EXPECT_NE(s.message().find("parameter 1 is not a scalar parameter"), std::string::npos)
      << s.message();
  // A good update next to a bad one: neither is kept.
  const GraphUpdate mixed[] = {{0, 0, Arg::f32(100.0f)}, {2, 0, Arg::i32(1)}};
  s = rt_->graphs().replay(g, mixed);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("launch 2: launch of 'axpy', argument 0 ('a'): expected f32, got i32"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(rt_->stats()->launches, launches) << "nothing recorded";
  ASSERT_TRUE(rt_->graphs().replay(g).ok());
  expect_y(9.0f);
}

TEST_P(Graphs, ArraysAreBoundByReferenceAndAFreedOneIsNamed) {
  runtime::GraphHandle g = capture_three();
  std::vector<float> x2(kN, 1.0f);
  ASSERT_TRUE(rt_->upload(x_, x2.data(), 4 * kN).ok());  // new contents, same array
  ASSERT_TRUE(rt_->graphs().replay(g).ok());
  for (float v : read(y_)) ASSERT_EQ(v, 10.0f);
  const uint64_t launches = rt_->stats()->launches;
  ASSERT_TRUE(rt_->free_ndarray(x_).ok());
  Status s = rt_->graphs().replay(g);
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_NE(s.message().find("replay of graph 'three', launch 0 ('axpy'), argument 1 ('x')"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(rt_->stats()->launches, launches);
  ASSERT_TRUE(rt_->graphs().release_graph(g).ok());
  EXPECT_EQ(rt_->graphs().replay(g).code(), ErrorCode::kNotFound);
  EXPECT_EQ(rt_->graphs().release_graph(g).code(), ErrorCode::kNotFound);
  EXPECT_EQ(rt_->stats()->graphs, 0u);
}

TEST_P(Graphs, CallsThatCannotBeCapturedAreRefusedWhileCapturing) {
  EXPECT_EQ(rt_->graphs().end_capture().status().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(rt_->graphs().begin_capture("open").ok());
  EXPECT_EQ(rt_->graphs().begin_capture().code(), ErrorCode::kFailedPrecondition);
  std::vector<float> v(kN);
  for (Status s : {rt_->upload(x_, v.data(), 4 * kN), rt_->download(x_, v.data(), 4 * kN),
                   rt_->synchronize(), rt_->set_retirement_depth(2)}) {
    EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("graph 'open' is being captured"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(rt_->flush().ok()) << "flush submits nothing while capturing";
  auto empty = rt_->graphs().end_capture();
  ASSERT_TRUE(empty.ok());
  ASSERT_TRUE(rt_->graphs().replay(*empty).ok()) << "an empty graph replays as nothing";
  ASSERT_TRUE(rt_->synchronize().ok());
}

TEST_P(Graphs, ADeviceErrorInAReplayNamesTheReplayedLaunch) {
  runtime::GraphHandle g = capture_three();
  std::vector<float> neg(kN, 1.0f);
  neg[5] = -1.0f;  // the axpy kernel flags x < 0 (error code 7)
  ASSERT_TRUE(rt_->upload(x_, neg.data(), 4 * kN).ok());
  runtime::LaunchId first;
  ASSERT_TRUE(rt_->graphs().replay(g, {}, &first).ok());
  expect_three_flagged(first, /*replayed=*/true);
}

// A capture that runs (begin_capture's `run`): every captured step runs as launching it would
// have, in order, pieces recorded on the runtime's thread (push descriptors) or the caller's;
// the graph it leaves replays to the same result.
TEST_P(Graphs, ACaptureThatRunsRunsEveryStepAsLaunchingThem) {
  // Pieces of 16, 32, 64, 128, 256, 512 steps, then the rest (the launches and 8 fills).
  const uint32_t n = 2 * runtime::kBundleLaunches + 37;
  runtime::NdArrayHandle z = array(std::vector<float>(kN, 5.0f), "z");
  const uint64_t launches = rt_->stats()->launches;
  const runtime::LaunchId next = rt_->next_launch_id();
  ASSERT_TRUE(rt_->graphs().begin_capture("running", /*run=*/true).ok());
  ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
  float sum = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (i % 211 == 0) {
      ASSERT_TRUE(rt_->fill(z, 0.0).ok());  // fills between launches
    }
    if (i == n / 2) {  // y reset half-way: a fill ordered between two launches of one piece
      ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
      sum = 0;
    }
    const float a = static_cast<float>(i % 7) - 3.0f;
    sum += a;
    const Arg args[] = {Arg::f32(a), Arg::ndarray(x_), Arg::ndarray(y_)};
    ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  }
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const runtime::RuntimeStats s = *rt_->stats();
  EXPECT_EQ(s.launches, launches + n) << "every captured launch ran";
  EXPECT_EQ(rt_->next_launch_id().value, next.value + n) << "each with a LaunchId";
  EXPECT_EQ(s.run_pieces, 7u);
  EXPECT_GE(s.flushes, 1u);
  if (bundled() && rt_->device().caps().push_descriptor) {
    EXPECT_EQ(s.run_pieces_recorded_aside, s.run_pieces) << "recorded on the runtime's thread";
  } else {
    EXPECT_EQ(s.run_pieces_recorded_aside, 0u);
  }
  expect_y(sum);  // exact: small integer sums times multiples of 1/4
  for (float v : read(z)) ASSERT_EQ(v, 0.0f);
  // The graph is as a capture without `run` leaves it: its replay computes the same.
  ASSERT_TRUE(rt_->fill(y_, 7.0).ok());
  ASSERT_TRUE(rt_->graphs().replay(*g).ok());
  expect_y(sum);
}

// The steps left at end_capture are cut into one piece per recording thread (at least 64
// steps each): nothing comes after them, so their recording is what the device waits for.
// Here 300 are left: three pieces where the runtime has three threads (a GPU machine), one on
// a two-core machine (one thread); either way every step runs, in order.
TEST_P(Graphs, ACaptureThatRunsSharesItsLastStepsAmongTheThreads) {
  const uint32_t first_pieces = 16 + 32 + 64 + 128 + 256 + runtime::kBundleLaunches;
  const uint32_t left = 300;
  ASSERT_TRUE(rt_->graphs().begin_capture("last steps", /*run=*/true).ok());
  ASSERT_TRUE(rt_->fill(y_, 1.0).ok());  // a step too
  float sum = 0;
  for (uint32_t i = 0; i + 1 < first_pieces + left; ++i) {
    const float a = static_cast<float>(i % 5) - 2.0f;
    sum += a;
    const Arg args[] = {Arg::f32(a), Arg::ndarray(x_), Arg::ndarray(y_)};
    ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  }
  const uint64_t pieces_before = rt_->stats()->run_pieces;
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  const uint64_t threads = rt_->device().caps().push_descriptor ? std::clamp(hw - 1, 1, 3) : 0;
  const uint64_t last = std::clamp<uint64_t>(left / 64, 1, std::max<uint64_t>(threads, 1));
  EXPECT_EQ(rt_->stats()->run_pieces, 6 + last);
  EXPECT_LE(pieces_before, 6u) << "the last steps are cut by end_capture";
  expect_y(sum);
  ASSERT_TRUE(rt_->graphs().release_graph(*g).ok());
}

TEST_P(Graphs, ACaptureThatRunsReportsDeviceErrorsWithTheLaunchesNumbers) {
  std::vector<float> neg(xs_);
  neg[7] = -1.0f;  // the axpy kernel flags x < 0 (error code 7): every launch
  ASSERT_TRUE(rt_->upload(x_, neg.data(), 4 * kN).ok());
  const runtime::LaunchId first = rt_->next_launch_id();
  capture_three(/*run=*/true);
  expect_three_flagged(first, /*replayed=*/false);
}

// Freeing an array while the capture runs: the steps captured before it (which bind its
// buffer) are submitted first, so they run on live memory; the graph then names the freed
// array at its replay, as any graph does.
TEST_P(Graphs, FreeingAnArrayWhileACaptureRunsRunsTheStepsBeforeTheFree) {
  runtime::NdArrayHandle z = array(std::vector<float>(kN, 0.0f), "z");
  ASSERT_TRUE(rt_->graphs().begin_capture("running", /*run=*/true).ok());
  ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
  for (int i = 0; i < 5; ++i) {
    const Arg into_z[] = {Arg::f32(1.0f), Arg::ndarray(x_), Arg::ndarray(z)};
    ASSERT_TRUE(rt_->launch(axpy_, into_z).ok());
    const Arg into_y[] = {Arg::f32(2.0f), Arg::ndarray(x_), Arg::ndarray(y_)};
    ASSERT_TRUE(rt_->launch(axpy_, into_y).ok());
  }
  const uint64_t pieces = rt_->stats()->run_pieces;
  ASSERT_TRUE(rt_->free_ndarray(z).ok());
  EXPECT_EQ(rt_->stats()->run_pieces, pieces + 1) << "the steps before the free submitted";
  const Arg more[] = {Arg::f32(3.0f), Arg::ndarray(x_), Arg::ndarray(y_)};
  ASSERT_TRUE(rt_->launch(axpy_, more).ok());
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  expect_y(13.0f);
  Status s = rt_->graphs().replay(*g);
  EXPECT_EQ(s.code(), ErrorCode::kNotFound) << s.to_string();
}

// A piece that cannot be recorded (the side bundle's allocation fails): nothing after it runs,
// end_capture names the failure and drops the capture, and the runtime stays usable -- the next
// capture that runs, and plain launches, work.
TEST_P(Graphs, ACaptureWhosePieceFailsReportsItAndLeavesTheRuntimeUsable) {
  if (!bundled() || !rt_->device().caps().push_descriptor) {
    GTEST_SKIP() << "no side bundles without push descriptors";
  }
  rhi::FaultInjection::arm("vkAllocateCommandBuffers (side bundle)", VK_ERROR_OUT_OF_DEVICE_MEMORY,
                           /*skip=*/1);
  ASSERT_TRUE(rt_->graphs().begin_capture("failing", /*run=*/true).ok());
  for (uint32_t i = 0; i < 3 * runtime::kBundleLaunches; ++i) {
    const Arg args[] = {Arg::f32(1.0f), Arg::ndarray(x_), Arg::ndarray(y_)};
    ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  }
  auto g = rt_->graphs().end_capture();
  rhi::FaultInjection::disarm_all();
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("end_capture of graph 'failing', running its steps as "
                                      "captured"),
            std::string::npos)
      << g.status().to_string();
  EXPECT_NE(g.status().message().find("side bundle"), std::string::npos) << g.status().to_string();
  EXPECT_FALSE(rt_->graphs().capturing());
  ASSERT_TRUE(rt_->synchronize().ok());
  // The second allocation fails: the first or second piece (recorded side by side); what was
  // cut before the failed one ran, nothing after it.
  EXPECT_LE(rt_->stats()->run_pieces, 1u);
  ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
  Status again = rt_->graphs().begin_capture("again", /*run=*/true);
  ASSERT_TRUE(again.ok()) << again.to_string();
  const Arg args[] = {Arg::f32(2.0f), Arg::ndarray(x_), Arg::ndarray(y_)};
  ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  ASSERT_TRUE(rt_->graphs().end_capture().ok());
  ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  expect_y(4.0f);
}

// The runtime destroyed while a capture runs (pieces queued, recorded, submitted): its thread
// stops, nothing leaks, nothing hangs.
TEST_P(Graphs, ARuntimeDestroyedWhileACaptureRunsStopsItsThread) {
  ASSERT_TRUE(rt_->graphs().begin_capture("abandoned", /*run=*/true).ok());
  for (uint32_t i = 0; i < 3 * runtime::kBundleLaunches + 11; ++i) {
    const Arg args[] = {Arg::f32(1.0f), Arg::ndarray(x_), Arg::ndarray(y_)};
    ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  }
  EXPECT_EQ(rt_->device().validation_message_count(), 0u);
  rt_.reset();
}

INSTANTIATE_TEST_SUITE_P(Replay, Graphs, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Bundled" : "RecordedAgain";
                         });

// Lists flushed only when asked: what a fast host sees, where a list is rarely old enough to be
// flushed by age (lavapipe's slow recording hides the next test's bug otherwise).
class GraphsUnflushed : public Graphs {
 protected:
  void SetUp() override {
    max_list_age_us_ = 1e12;
    Graphs::SetUp();
  }
};

// A replay executes the graph's bundles in the open list, and releasing the graph queues them
// for retirement under that list's serial, not yet submitted. The next capture that runs must
// still start: it waited for that serial (never submitted: the wait returns at once), failed
// with kInternal "side bundles still in flight after a wait", and every capture after it too.
TEST_P(GraphsUnflushed, CapturesThatRunAfterAReplayedAndReleasedGraphAllStart) {
  for (int round = 0; round < 6; ++round) {
    // Nothing waited for in between: the capture's own side bundles are still in flight.
    runtime::GraphHandle g = capture_three(/*run=*/true);
    if (HasFailure()) return;
    ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
    Status replayed = rt_->graphs().replay(g);
    ASSERT_TRUE(replayed.ok()) << "round " << round << ": " << replayed.to_string();
    ASSERT_TRUE(rt_->graphs().release_graph(g).ok());
  }
  expect_y(9.0f);
}

INSTANTIATE_TEST_SUITE_P(Replay, GraphsUnflushed, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Bundled" : "RecordedAgain";
                         });

// The example's whole training step (forward with a 16-step loop, adjoint with adstacks in the
// heaps, update; the gradient fills included) captured once and replayed: the same v0 as
// running the step directly, and from the second replay on no Vulkan object is created.
TEST(GraphTraining, ReplayedTrainingStepsEqualDirectStepsAndCreateNothing) {
  auto make = [](bool* skipped) -> std::unique_ptr<Runtime> {
    runtime::RuntimeOptions o;
    o.device.enable_validation = true;
    o.adstack_tier = runtime::AdstackTier::kHeap;
    auto r = Runtime::create(o);
    if (!r.ok() && r.status().code() == ErrorCode::kNoDevice) {
      *skipped = true;
      return nullptr;
    }
    EXPECT_TRUE(r.ok());
    return r.ok() ? std::move(r).value() : nullptr;
  };
  bool skipped = false;
  auto direct_rt = make(&skipped), graph_rt = make(&skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  diffsim::Config c;
  c.particles = 512;
  c.steps = 16;
  auto direct = diffsim::Simulation::create(*direct_rt, c);
  auto graphed = diffsim::Simulation::create(*graph_rt, c);
  ASSERT_TRUE(direct.ok() && graphed.ok());
  ASSERT_TRUE(graph_rt->graphs().begin_capture("train").ok());
  ASSERT_TRUE((*graphed)->step().ok());
  auto g = graph_rt->graphs().end_capture();
  ASSERT_TRUE(g.ok());
  uint64_t created = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE((*direct)->step().ok());
    ASSERT_TRUE(graph_rt->graphs().replay(*g).ok());
    ASSERT_TRUE(graph_rt->synchronize().ok());
    if (i == 1) created = graph_rt->stats()->live.created;
    if (i > 1) {
      EXPECT_EQ(graph_rt->stats()->live.created, created) << "replay " << i;
    }
  }
  auto a = (*direct)->v0(), b = (*graphed)->v0();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) ASSERT_EQ((*a)[i], (*b)[i]) << "v0[" << i << "]";
  EXPECT_GT(graph_rt->stats()->adstack_heap_dispatches, 0u) << "the heaps were bound";
  EXPECT_EQ(graph_rt->device().validation_message_count(), 0u);
  EXPECT_EQ(direct_rt->device().validation_message_count(), 0u);
}

// capture(run) / replay / release in a loop through Session, whose end_capture installs a
// reworked (fused) graph: the replay records the reworked graph's bundles into the open list,
// and releasing queues them under that list's serial, not yet submitted; the captured graph's
// side bundles released after them are raised to that key. The next capture that runs must
// still start: it waited for the unsubmitted serial and failed with kInternal "side bundles
// still in flight after a wait", and every capture after it failed too.
constexpr std::string_view kAxpyIr = R"(
kernel axpy(a: f32, x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = arg a : f32
    %2 = load x[%0] : f32
    %3 = load y[%0] : f32
    %4 = mul %1, %2 : f32
    %5 = add %4, %3 : f32
    store y[%0], %5
  }
})";

// `rounds` of capture(run) / replay / release on `s`, nothing waited for between a release and
// the next capture; then y is checked against the last replay. Errors as gtest failures.
void capture_run_replay_release(Session& s, int rounds, float scale) {
  auto k = s.compile(kAxpyIr);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  constexpr uint32_t n = 300;
  std::vector<float> xs(n);
  for (uint32_t i = 0; i < n; ++i) xs[i] = scale * 0.25f * static_cast<float>(i % 17);
  auto x = s.ndarray(DType::kF32, {n}, "x"), y = s.ndarray(DType::kF32, {n}, "y");
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(s.upload(*x, std::span<const float>(xs)).ok());
  for (int round = 0; round < rounds; ++round) {
    Status began = s.begin_capture("run", CaptureOptions{.run = true});
    ASSERT_TRUE(began.ok()) << "round " << round << ": " << began.to_string();
    ASSERT_TRUE(s.fill(*y, 1.0).ok());
    for (float a : {2.0f, 3.0f, 4.0f}) {
      ASSERT_TRUE(s.launch(*k, {Arg::f32(a), Arg::ndarray(*x), Arg::ndarray(*y)}).ok());
    }
    auto g = s.end_capture();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    // Replayed and released with nothing waited for before the next round's capture.
    ASSERT_TRUE(s.zero(*y).ok());
    Status replayed = s.replay(*g);
    ASSERT_TRUE(replayed.ok()) << replayed.to_string();
    ASSERT_TRUE(s.release_graph(*g).ok());
  }
  std::vector<float> got(n);
  ASSERT_TRUE(s.download(*y, std::span<float>(got)).ok());  // the last replay's
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 1.0f + 9.0f * xs[i]) << i;
  expect_no_validation_messages(s);
}

// capture(run) / replay / release in a loop through Session, whose end_capture installs a
// reworked (fused) graph: the replay records the reworked graph's bundles into the open list,
// and releasing queues them under that list's serial, not yet submitted; the captured graph's
// side bundles released after them are raised to that key. The next capture that runs must
// still start: it waited for the unsubmitted serial and failed with kInternal "side bundles
// still in flight after a wait", and every capture after it failed too.
TEST(SessionGraphs, CapturesThatRunAfterAReplayedAndReleasedGraphAllStart) {
  bool skipped = false;
  std::unique_ptr<Session> s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_NE(s, nullptr);
  capture_run_replay_release(*s, 8, 1.0f);
}

// The same loop on four threads at once, a session each (a capture is its session's), so the
// capture runs' side threads and retirement of several sessions interleave.
TEST(SessionGraphs, CapturesThatRunAfterAReplayedAndReleasedGraphStartOnSeveralThreads) {
  bool skipped = false;
  std::vector<std::unique_ptr<Session>> sessions;
  for (int t = 0; t < 4 && !skipped; ++t) sessions.push_back(validated_session(&skipped));
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    ASSERT_NE(sessions[t], nullptr);
    threads.emplace_back(
        [&, t] { capture_run_replay_release(*sessions[t], 8, 1.0f + static_cast<float>(t)); });
  }
  for (std::thread& th : threads) th.join();
}

// SessionStats::dispatches counts a dispatch per task of every launch, eager or replayed, and
// SessionStats::barriers the compute barriers after them.
TEST(SessionGraphs, StatsCountADispatchPerTaskOfEveryLaunch) {
  bool skipped = false;
  std::unique_ptr<Session> s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_NE(s, nullptr);
  auto k = s->compile(std::string_view(R"(
kernel two(x: ndarray<f32, 1>, t: ndarray<f32, 1>) {
  task first parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %s = mul %v, %v : f32
    store t[%i], %s
  }
  task second parallel %j in [0, shape(x, 0)) {
    %w = load t[%j] : f32
    %u = add %w, %w : f32
    store x[%j], %u
  }
})"));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto x = s->ndarray(DType::kF32, {32}, "x"), t = s->ndarray(DType::kF32, {32}, "t");
  ASSERT_TRUE(x.ok() && t.ok());
  ASSERT_TRUE(s->fill(*x, 1.0).ok());
  const SessionStats before = *s->stats();
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(*x), Arg::ndarray(*t)}).ok());
  const SessionStats eager = *s->stats();
  EXPECT_EQ(eager.launches - before.launches, 1u);
  EXPECT_EQ(eager.dispatches - before.dispatches, 2u);
  ASSERT_TRUE(s->begin_capture("two").ok());
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(*x), Arg::ndarray(*t)}).ok());
  auto g = s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s->replay(*g).ok());
  ASSERT_TRUE(s->replay(*g).ok());
  const SessionStats replayed = *s->stats();
  EXPECT_EQ(replayed.dispatches - eager.dispatches, 4u);
  // A barrier between the two tasks and after the second: every launch's next may read it.
  EXPECT_EQ(eager.barriers - before.barriers, 2u);
  EXPECT_EQ(replayed.barriers - eager.barriers, 4u);  // the same two each replay
  std::vector<float> got(32);
  ASSERT_TRUE(s->download(*x, std::span<float>(got)).ok());
  EXPECT_EQ(got[5], 128.0f);  // x <- 2 x^2, three times from 1: 2, 8, 128
  ASSERT_TRUE(s->release_graph(*g).ok());
  expect_no_validation_messages(*s);
}

// SessionStats::barriers counts only the barriers a replay records: two chains a -> b and
// c -> d of launches over different ranges (so they do not fuse) are scheduled a, c, b, d with
// a barrier after c and after d alone: four dispatches, two barriers (as launched one by one,
// four).
TEST(SessionGraphs, StatsCountTheBarriersAReplayRecords) {
  bool skipped = false;
  std::unique_ptr<Session> s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_NE(s, nullptr);
  // A neighbour read: the next launch cannot fuse with the one writing its input.
  auto k = s->compile(std::string_view(R"(
kernel nb(a: ndarray<f32, 1>, b: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(a, 0)) {
    %one = const 1 : i32
    %n = shape a 0 : i32
    %nl = sub %n, %one : i32
    %ip = add %i, %one : i32
    %ipc = min %ip, %nl : i32
    %x = load a[%ipc] : f32
    %y = load a[%i] : f32
    %s = add %x, %y : f32
    store b[%i], %s
  }
})"));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  std::vector<NdArrayHandle> a;
  for (uint32_t i = 0; i < 6; ++i) {
    auto h = s->ndarray(DType::kF32, {i < 3 ? 64u : 48u}, "a" + std::to_string(i));
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(s->fill(*h, 1.0).ok());
    a.push_back(*h);
  }
  ASSERT_TRUE(s->begin_capture("two chains").ok());
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(a[0]), Arg::ndarray(a[1])}).ok());  // chain 1
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(a[1]), Arg::ndarray(a[2])}).ok());
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(a[3]), Arg::ndarray(a[4])}).ok());  // chain 2
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(a[4]), Arg::ndarray(a[5])}).ok());
  auto g = s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s->finish_rework(*g).ok());
  SessionStats before = *s->stats();
  ASSERT_TRUE(s->replay(*g).ok());
  SessionStats after = *s->stats();
  const uint64_t dispatches = after.dispatches - before.dispatches;
  const uint64_t barriers = after.barriers - before.barriers;
  EXPECT_EQ(dispatches, 4u);
  EXPECT_EQ(barriers, 2u);
  std::vector<float> got(48);
  ASSERT_TRUE(s->download(a[5], std::span<float>(got)).ok());
  EXPECT_EQ(got[10], 4.0f);  // 1 + 1, then 2 + 2
  // The same launches one by one: a barrier after each.
  before = *s->stats();
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(a[0]), Arg::ndarray(a[1])}).ok());
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(a[1]), Arg::ndarray(a[2])}).ok());
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(a[3]), Arg::ndarray(a[4])}).ok());
  ASSERT_TRUE(s->launch(*k, {Arg::ndarray(a[4]), Arg::ndarray(a[5])}).ok());
  after = *s->stats();
  EXPECT_EQ(after.barriers - before.barriers, 4u);
  ASSERT_TRUE(s->release_graph(*g).ok());
  expect_no_validation_messages(*s);
}

// Every launch of a graph has a name an update can address: its kernel's, '#k' on the k-th
// repeat, in the numbering updates take also where end_capture fused the launches into one.
TEST(SessionGraphs, LaunchNamesAreUniqueAndNumberedAsUpdates) {
  bool skipped = false;
  std::unique_ptr<Session> s = validated_session(&skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_NE(s, nullptr);
  auto k = s->compile(kAxpyIr);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  constexpr uint32_t n = 64;
  std::vector<float> xs(n);
  for (uint32_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i % 5);
  auto x = s->ndarray(DType::kF32, {n}, "x"), y = s->ndarray(DType::kF32, {n}, "y");
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(s->upload(*x, std::span<const float>(xs)).ok());
  ASSERT_TRUE(s->begin_capture("named").ok());
  ASSERT_TRUE(s->fill(*y, 0.0).ok());
  for (float a : {1.0f, 2.0f, 3.0f}) {
    ASSERT_TRUE(s->launch(*k, {Arg::f32(a), Arg::ndarray(*x), Arg::ndarray(*y)}).ok());
  }
  auto g = s->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto names = s->graph_launch_names(*g);
  ASSERT_TRUE(names.ok()) << names.status().to_string();
  EXPECT_EQ(*names, (std::vector<std::string>{"axpy", "axpy#1", "axpy#2"}));
  auto third = s->graph_launch(*g, "axpy#2");
  ASSERT_TRUE(third.ok()) << third.status().to_string();
  EXPECT_EQ(*third, 2u);
  auto none = s->graph_launch(*g, "axpy#3");
  EXPECT_EQ(none.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(none.status().message().find("'axpy#1'"), std::string::npos) << none.status().message();
  // a of the third launch 3 -> 10, addressed by name: y = (1 + 2 + 10) x.
  const GraphUpdate u{*third, 0, Arg::f32(10.0f)};
  ASSERT_TRUE(s->replay(*g, {&u, 1}).ok());
  std::vector<float> got(n);
  ASSERT_TRUE(s->download(*y, std::span<float>(got)).ok());
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 13.0f * xs[i]) << i;
  ASSERT_TRUE(s->release_graph(*g).ok());
  EXPECT_EQ(s->graph_launch_names(*g).status().code(), ErrorCode::kNotFound);
  expect_no_validation_messages(*s);
}

}  // namespace
// Recording threads that start part-way (RuntimeOptions::run_threads_after_steps): the pieces cut
// before the threshold are recorded on the caller's thread, those after it aside, and every step
// runs in order either way -- also after a replayed and released graph left side bundles in
// flight, which the threads' start settles mid-capture.
class GraphsLateThreads : public Graphs {
 protected:
  void SetUp() override {
    max_list_age_us_ = 1e12;  // the released graph's bundles stay in the open list
    run_threads_after_ = 16 + 32 + 64 + 128;
    Graphs::SetUp();
  }
};

TEST_P(GraphsLateThreads, ACaptureThatRunsRecordsOnTheCallerUntilItsThreadsStart) {
  runtime::GraphHandle three = capture_three(/*run=*/true);  // 3 steps: on the caller
  if (HasFailure()) return;
  EXPECT_EQ(rt_->stats()->run_pieces_recorded_aside, 0u)
      << "a short capture records no piece aside";
  ASSERT_TRUE(rt_->graphs().replay(three).ok());
  ASSERT_TRUE(rt_->graphs().release_graph(three).ok());
  const runtime::RuntimeStats before = *rt_->stats();
  // Pieces of 16, 32, 64, 128, 256, 512 and the 37 left at end_capture: the first four begin
  // before the threshold (240 steps cut), the other three at or after it.
  const uint32_t n = 16 + 32 + 64 + 128 + 256 + runtime::kBundleLaunches + 37;
  ASSERT_TRUE(rt_->graphs().begin_capture("late threads", /*run=*/true).ok());
  ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
  float sum = 0;
  for (uint32_t i = 0; i + 1 < n; ++i) {
    const float a = static_cast<float>(i % 7) - 3.0f;
    sum += a;
    const Arg args[] = {Arg::f32(a), Arg::ndarray(x_), Arg::ndarray(y_)};
    ASSERT_TRUE(rt_->launch(axpy_, args).ok());
  }
  auto g = rt_->graphs().end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const runtime::RuntimeStats s = *rt_->stats();
  EXPECT_EQ(s.run_pieces - before.run_pieces, 7u);
  const uint64_t aside = s.run_pieces_recorded_aside - before.run_pieces_recorded_aside;
  if (bundled() && rt_->device().caps().push_descriptor) {
    EXPECT_EQ(aside, 3u) << "the pieces cut from the 240th step on, recorded by the threads";
  } else {
    EXPECT_EQ(aside, 0u);
  }
  expect_y(sum);  // exact: small integer sums times multiples of 1/4
  ASSERT_TRUE(rt_->fill(y_, 1.0).ok());
  ASSERT_TRUE(rt_->graphs().replay(*g).ok());
  expect_y(sum);
}

INSTANTIATE_TEST_SUITE_P(Replay, GraphsLateThreads, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Bundled" : "RecordedAgain";
                         });

}  // namespace vkad::testing
