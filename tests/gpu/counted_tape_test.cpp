// Session::differentiate of a kernel with a loop no trip bound covers (a while loop without
// max_trip): the counted adjoint (codegen::make_adjoint_counted) that Session::launch sizes by
// counting the trips on the device first, on a tape launched one by one, as a step loop and
// checkpointed, against the closed form; refused inside a capture, naming max_trip. Validation
// on (the fixture fails a test that drew a message).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ir/builder.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using codegen::Array;
using codegen::KernelBuilder;
using codegen::Value;

constexpr float kLimit = 4.0f;
constexpr float kShrink = 0.25f;
constexpr uint32_t kN = 48;
constexpr int kSteps = 4;

// x[t + 1, i] = 0.25 v, where v starts at x[t, i] and grows (v = 0.2 v^2 + 1.1 v + a[0]) until
// it reaches 4: a trip count that depends on the lane's data, a float carried and overwritten
// every trip whose old value the adjoint needs (0.4 v + 1.1: what reverse mode must stack), and
// no max_trip.
codegen::Kernel grow_row() {
  KernelBuilder kb("grow_row");
  codegen::Scalar t = kb.scalar("t", DType::kI32);
  Array x = kb.ndarray("x", DType::kF32, 2, {.needs_grad = true});
  Array a = kb.ndarray("a", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(1), [&](Value i) {
    Value tv = t;
    codegen::Local v = kb.local(x(tv, i));
    kb.while_([&] { return v.load() < kLimit; },
              [&] {
                Value b = v.load();
                v.store(b * b * 0.2 + b * 1.1 + a(kb.i32(0)));
              });
    x.store({tv + 1, i}, v.load() * kShrink);
  });
  return kb.finish();
}

// One lane's while loop on the host: float values for the trip decisions (as the device makes
// them), and in double the derivatives of the result by the start value and by a. `margin`:
// how close a value came to the limit (a device that contracts the update into fmas rounds
// differently, so the start values keep every value at least 1e-3 away from it).
struct Grown {
  float v = 0;
  int trips = 0;
  double by_v0 = 1, by_a = 0, margin = 1e30;
};

Grown grow(float v, float a) {
  Grown g;
  for (;;) {
    g.margin = std::min(g.margin, std::fabs(static_cast<double>(v) - kLimit));
    if (!(v < kLimit)) break;
    const double f = 0.4 * v + 1.1;
    g.by_v0 *= f;
    g.by_a = g.by_a * f + 1;
    v = v * v * 0.2f + v * 1.1f + a;
    ++g.trips;
  }
  g.v = v;
  return g;
}

// kSteps steps of grow_row on the host.
struct Reference {
  std::vector<float> last;    // row kSteps
  std::vector<double> by_x0;  // d last[i] / d x0[i]
  double by_a = 0;            // d sum(last) / d a
  std::vector<int> trips;     // each element's trips in step 0
  double margin = 1e30;
};

Reference reference(const std::vector<float>& x0, float a) {
  Reference r;
  r.last = x0;
  r.by_x0.assign(x0.size(), 1.0);
  r.trips.assign(x0.size(), 0);
  for (size_t i = 0; i < x0.size(); ++i) {
    double dx = 1, da = 0;
    for (int s = 0; s < kSteps; ++s) {
      const Grown g = grow(r.last[i], a);
      r.margin = std::min(r.margin, g.margin);
      if (s == 0) r.trips[i] = g.trips;
      dx = kShrink * g.by_v0 * dx;
      da = kShrink * (g.by_v0 * da + g.by_a);
      r.last[i] = g.v * kShrink;
    }
    r.by_x0[i] = dx;
    r.by_a += da;
  }
  return r;
}

// Start values from `lo` to `lo + span`, each nudged until the reference passes no closer than
// 1e-3 to the limit.
std::vector<float> start_values(float lo, float span, float a) {
  std::vector<float> x0(kN);
  for (uint32_t i = 0; i < kN; ++i) {
    float v = lo + span * static_cast<float>(i) / kN;
    for (int k = 0; k < 100 && reference({v}, a).margin < 1e-3; ++k) v += 1.37e-3f;
    x0[i] = v;
  }
  return x0;
}

class CountedTapeTest : public ValidatedSessionTest {
 protected:
  // Runs kSteps steps of grow_row on a tape (`how`: "launches", "loop" or "checkpointed"),
  // seeds d(sum of row kSteps), and checks row kSteps, row 0's gradient and a's against the
  // reference.
  void run(const Differentiated& d, const std::string& how, const std::vector<float>& x0, float a) {
    SCOPED_TRACE(how);
    const Reference want = reference(x0, a);
    ASSERT_GE(want.margin, 1e-3);
    std::vector<float> rows(size_t{kSteps + 1} * kN, 0.0f), seed(rows.size(), 0.0f);
    std::copy(x0.begin(), x0.end(), rows.begin());
    std::fill(seed.begin() + size_t{kSteps} * kN, seed.end(), 1.0f);
    auto x = s_->ndarray(DType::kF32, {kSteps + 1, kN}, "x");
    auto av = s_->ndarray(DType::kF32, {1}, "a");
    ASSERT_TRUE(x.ok() && av.ok());
    ASSERT_TRUE(s_->upload(*x, std::span<const float>(rows)).ok());
    ASSERT_TRUE(s_->upload(*av, std::span<const float>(&a, 1)).ok());
    {
      Tape tape(*s_);
      if (how == "checkpointed") ASSERT_TRUE(tape.set_checkpoint_every(1).ok());
      if (how == "loop") {
        const TapeLoopLaunch body[] = {
            {&d, {Arg::i32(0), Arg::ndarray(*x), Arg::ndarray(*av)}, {1, 0, 0}}};
        LoopInfo info;
        Status st = tape.launch_loop(body, kSteps, &info);
        ASSERT_TRUE(st.ok()) << st.to_string();
        // A counted adjoint counts per launch: the loop's launches go one by one.
        EXPECT_FALSE(info.rolled);
        EXPECT_EQ(info.launches, static_cast<uint32_t>(kSteps));
        EXPECT_EQ(tape.launches(), static_cast<size_t>(kSteps));
      } else {
        for (int k = 0; k < kSteps; ++k) {
          Status st = tape.launch(d, {Arg::i32(k), Arg::ndarray(*x), Arg::ndarray(*av)});
          ASSERT_TRUE(st.ok()) << st.to_string();
        }
      }
      Status st = tape.backward({TapeSeed::of_data(*x, std::span<const float>(seed))});
      ASSERT_TRUE(st.ok()) << st.to_string();
      auto gx = tape.grad(*x);
      auto ga = tape.grad(*av);
      ASSERT_TRUE(gx.ok() && ga.ok());
      std::vector<float> got(rows.size()), got_a(1), out(rows.size());
      ASSERT_TRUE(s_->download(*gx, std::span<float>(got)).ok());
      ASSERT_TRUE(s_->download(*ga, std::span<float>(got_a)).ok());
      ASSERT_TRUE(s_->download(*x, std::span<float>(out)).ok());
      for (uint32_t i = 0; i < kN; ++i) {
        // Forward: at most 4 x 13 roundings of values near 4.
        EXPECT_NEAR(out[size_t{kSteps} * kN + i], want.last[i], 1e-5 * 64) << "row 4, " << i;
        // Row 0's gradient: products of up to 4 factors 0.25 x 1.3^n; f32 to ~2^-18 relative.
        EXPECT_NEAR(got[i], want.by_x0[i], 2e-5 * std::fabs(want.by_x0[i]) + 1e-6)
            << "d row 4 / d x0, element " << i << " (" << want.trips[i] << " trips)";
      }
      // d/da sums 48 lanes' atomic adds (order undefined): a relative 1e-4.
      EXPECT_NEAR(got_a[0], want.by_a, 1e-4 * std::fabs(want.by_a)) << "d sum / d a";
    }
    ASSERT_TRUE(s_->free(*x).ok());
    ASSERT_TRUE(s_->free(*av).ok());
  }
};

TEST_F(CountedTapeTest, AWhileLoopWithoutMaxTripIsDifferentiatedByCountingItsTrips) {
  auto d = s_->differentiate(grow_row());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->counted, 1u);
  EXPECT_EQ(s_->counted_loops(d->adjoint), 1u);
  EXPECT_EQ(s_->counted_loops(d->forward), 0u);
  const float a = 0.4f;
  const std::vector<float> x0 = start_values(0.02f, 3.9f, a);
  const Reference want = reference(x0, a);
  EXPECT_GE(*std::max_element(want.trips.begin(), want.trips.end()), 5);
  EXPECT_EQ(*std::min_element(want.trips.begin(), want.trips.end()), 1);
  for (const char* how : {"launches", "loop", "checkpointed"}) run(*d, how, x0, a);
  // Other data, other counts: each launch of the adjoint counts again (stacks sized for the
  // first data would overflow: these take 3 to 4 times the trips).
  const std::vector<float> small = start_values(0.002f, 0.05f, 0.02f);
  const Reference more = reference(small, 0.02f);
  EXPECT_GE(*std::min_element(more.trips.begin(), more.trips.end()),
            3 * *std::max_element(want.trips.begin(), want.trips.end()));
  run(*d, "launches", small, 0.02f);
  EXPECT_TRUE(s_->release(d->adjoint).ok());
  EXPECT_TRUE(s_->release(d->forward).ok());
  EXPECT_EQ(s_->counted_loops(d->adjoint), 0u);
}

TEST_F(CountedTapeTest, ACountedAdjointIsRefusedInACaptureNamingMaxTripAndRunsAfterIt) {
  auto d = s_->differentiate(grow_row());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  auto x = s_->ndarray(DType::kF32, {kSteps + 1, kN}, "x");
  auto av = s_->ndarray(DType::kF32, {1}, "a");
  auto gx = s_->ndarray(DType::kF32, {kSteps + 1, kN}, "x_grad");
  auto ga = s_->ndarray(DType::kF32, {1}, "a_grad");
  ASSERT_TRUE(x.ok() && av.ok() && gx.ok() && ga.ok());
  const std::vector<Arg> fwd = {Arg::i32(0), Arg::ndarray(*x), Arg::ndarray(*av)};
  const std::vector<NdArrayHandle> grads = {*gx, *ga};
  auto args = d->adjoint_args(fwd, grads);
  ASSERT_TRUE(args.ok());
  ASSERT_TRUE(s_->begin_capture("counted").ok());
  Status st = s_->launch(d->adjoint, *args);
  EXPECT_EQ(st.code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("grow_row"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("max_trip"), std::string::npos) << st.to_string();
  auto graph = s_->end_capture();
  if (graph.ok()) EXPECT_TRUE(s_->release_graph(*graph).ok());
  // Outside the capture the same launch runs: x zero, a = 0.4, every seed 1. Row 1's seed
  // reaches row 0 through 0.25 dv/dv0, added to row 0's own seed (the plain adjoint keeps the
  // seeds it reads).
  const float a = 0.4f;
  ASSERT_TRUE(s_->fill(*x, 0.0).ok());
  ASSERT_TRUE(s_->fill(*av, a).ok());
  ASSERT_TRUE(s_->fill(*ga, 0.0).ok());
  ASSERT_TRUE(s_->fill(*gx, 1.0).ok());
  st = s_->launch(d->adjoint, *args);
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<float> out(size_t{kSteps + 1} * kN);
  ASSERT_TRUE(s_->download(*gx, std::span<float>(out)).ok());
  const Grown g = grow(0.0f, a);
  ASSERT_GT(g.trips, 1);
  for (uint32_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(out[i], 1.0 + kShrink * g.by_v0, 1e-4 * (1.0 + kShrink * g.by_v0)) << i;
  }
}

}  // namespace
}  // namespace vkad::testing
