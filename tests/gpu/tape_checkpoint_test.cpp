// Checkpointing across launches (Tape::set_checkpoint_every, api/tape.h): a program that
// reuses two state arrays (a ring) gets, with segments of K launches, the gradients the same
// program gets with one array per step on the default tape, and its arrays hold the forward's
// end state afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

// b = sin(a) * c + 0.1
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

// loss += x * x over every element (an array the recording accumulates into).
constexpr const char* kLoss = R"(
kernel sq(x: ndarray<f32, 1> grad, loss: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %q = mul %v, %v : f32
    %z = const 0 : i32
    atomic_add loss[%z], %q
  }
}
)";

constexpr uint32_t kN = 100;
constexpr uint32_t kSteps = 7;

float c_of(uint32_t j) { return 0.9f - 0.03f * static_cast<float>(j % 8); }

// Base: a gtest fixture, parameterized (K) or not.
template <class Base>
class TapeCheckpointBase : public ValidatedSessionFixture<Base> {
 protected:
  void SetUp() override {
    ValidatedSessionFixture<Base>::SetUp();
    if (this->IsSkipped() || this->HasFatalFailure()) return;
    auto d = this->s_->differentiate(std::string_view(kStep));
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    step_ = *d;
    auto l = this->s_->differentiate(std::string_view(kLoss));
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    loss_ = *l;
    for (uint32_t i = 0; i < kN; ++i) x0_.push_back(0.01f * static_cast<float>(i));
  }
  NdArrayHandle array(const std::vector<float>& v, const std::string& name) {
    auto h = this->s_->ndarray(DType::kF32, {static_cast<uint32_t>(v.size())}, name);
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(this->s_->upload(*h, std::span<const float>(v)).ok());
    return *h;
  }
  std::vector<float> read(NdArrayHandle h, uint32_t n = kN) {
    std::vector<float> out(n);
    EXPECT_TRUE(this->s_->download(h, std::span<float>(out)).ok());
    return out;
  }
  // The reference: one array per step, default tape. Returns dL/dx0, x_S and the loss.
  struct Reference {
    std::vector<float> grad, last;
    float loss = 0;
  };
  Reference per_step(const std::vector<float>& x0, uint32_t steps = kSteps) {
    Reference want;
    Tape t(*this->s_);
    std::vector<NdArrayHandle> xs;
    for (uint32_t j = 0; j <= steps; ++j) {
      xs.push_back(array(j == 0 ? x0 : std::vector<float>(kN, 0), "x" + std::to_string(j)));
    }
    NdArrayHandle loss = array({0}, "loss");
    for (uint32_t j = 0; j < steps; ++j) {
      EXPECT_TRUE(
          t.launch(step_, {Arg::ndarray(xs[j]), Arg::ndarray(xs[j + 1]), Arg::f32(c_of(j))}).ok());
    }
    EXPECT_TRUE(t.launch(loss_, {Arg::ndarray(xs[steps]), Arg::ndarray(loss)}).ok());
    EXPECT_TRUE(t.backward({TapeSeed::of_value(loss, 1.0)}).ok());
    want.grad = read(*t.grad(xs[0]));
    want.last = read(xs[steps]);
    want.loss = read(loss, 1)[0];
    for (NdArrayHandle x : xs) EXPECT_TRUE(this->s_->free(x).ok());
    EXPECT_TRUE(this->s_->free(loss).ok());
    return want;
  }
  void expect_near(const std::vector<float>& got, const Reference& want, const std::string& what) {
    for (uint32_t i = 0; i < kN; ++i) {
      // The same f32 operations; only the loss's atomic sum may add in another order.
      ASSERT_NEAR(got[i], want.grad[i], 1e-5 * std::fabs(want.grad[i]) + 1e-7)
          << what << ", element " << i;
    }
  }
  // The ring program on `t`: the loss zeroed, `steps` steps from ring[0], the loss of the last
  // (the start state uploaded by the caller: an upload is not allowed inside a capture).
  void record_ring(Tape& t, const NdArrayHandle (&ring)[2], NdArrayHandle loss, uint32_t steps) {
    t.reset();
    EXPECT_TRUE(this->s_->zero(loss).ok());
    for (uint32_t j = 0; j < steps; ++j) {
      Status st = t.launch(
          step_, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]), Arg::f32(c_of(j))});
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    EXPECT_TRUE(t.launch(loss_, {Arg::ndarray(ring[steps % 2]), Arg::ndarray(loss)}).ok());
  }
  // The least bytes any plan of the ring program of `steps` steps needs, as the planner's
  // refusal names them. W: both ring arrays and the loss; w: a deepest-level slot holds a ring
  // array's copy and (where the loss's launch sits at that position) the loss's.
  static constexpr uint64_t kRingState = 2 * kN * 4 + 4, kRingPerLaunch = kN * 4 + 4;
  uint64_t least_ring_bytes(uint32_t steps) {
    Result<codegen::CheckpointPlan> least =
        codegen::plan_checkpoints(steps + 1, kRingState, kRingPerLaunch, 1, 0, "test");
    EXPECT_FALSE(least.ok());
    if (least.ok()) return 0;
    const std::string msg = least.status().message();
    const size_t at = msg.find("at least ");
    EXPECT_NE(at, std::string::npos) << msg;
    return at == std::string::npos ? 0 : std::stoull(msg.substr(at + 9));
  }
  Differentiated step_, loss_;
  std::vector<float> x0_;
};

class TapeCheckpoint : public TapeCheckpointBase<::testing::TestWithParam<uint32_t>> {};
class TapeCheckpointOnce : public TapeCheckpointBase<::testing::Test> {};

TEST_P(TapeCheckpoint, ARingOfTwoArraysGetsThePerStepProgramsGradients) {
  const uint32_t k = GetParam();
  Reference want = per_step(x0_);
  if (HasFatalFailure()) return;
  // The ring: step j reads ring[j % 2] and writes ring[(j + 1) % 2]. The default tape refuses
  // it (step 2 overwrites what step 0 read) ...
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
  NdArrayHandle loss = array({0}, "loss");
  {
    Tape plain(*s_);
    Status st;
    for (uint32_t j = 0; j < kSteps && st.ok(); ++j) {
      st = plain.launch(
          step_, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]), Arg::f32(c_of(j))});
    }
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  }
  // ... a checkpointed one takes it, twice (the copies are kept for the second iteration).
  ASSERT_TRUE(s_->upload(ring[0], std::span<const float>(x0_)).ok());
  Tape t(*s_);
  EXPECT_TRUE(t.keeps_intermediate_gradients());  // checkpointing off
  ASSERT_TRUE(t.set_checkpoint_every(k).ok());
  EXPECT_FALSE(t.keeps_intermediate_gradients());
  uint64_t created = 0;
  for (int iteration = 0; iteration < 2; ++iteration) {
    t.reset();
    ASSERT_TRUE(s_->upload(ring[0], std::span<const float>(x0_)).ok());
    ASSERT_TRUE(s_->zero(loss).ok());
    for (uint32_t j = 0; j < kSteps; ++j) {
      ASSERT_TRUE(t.launch(step_, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]),
                                   Arg::f32(c_of(j))})
                      .ok());
    }
    ASSERT_TRUE(t.launch(loss_, {Arg::ndarray(ring[kSteps % 2]), Arg::ndarray(loss)}).ok());
    EXPECT_EQ(t.set_checkpoint_every(1).code(), ErrorCode::kFailedPrecondition);
    Status st = t.backward({TapeSeed::of_value(loss, 1.0)});
    ASSERT_TRUE(st.ok()) << st.to_string();
    // dL/d(ring[0] as it was before the first step): ring[0]'s gradient after backward.
    const std::vector<float> got = read(*t.grad(ring[0]));
    expect_near(got, want, "K = " + std::to_string(k) + ", iteration " + std::to_string(iteration));
    if (HasFatalFailure()) return;
    // The arrays hold what the forward left.
    const std::vector<float> last = read(ring[kSteps % 2]);
    for (uint32_t i = 0; i < kN; ++i) EXPECT_EQ(last[i], want.last[i]) << i;
    EXPECT_NEAR(read(loss, 1)[0], want.loss, 1e-5 * std::fabs(want.loss));
    // The second iteration reuses every copy and gradient: no device memory is made. The
    // specialized pipelines a launch starts on another thread are taken in first, so that one
    // finished late on a loaded machine is not counted as this iteration's.
    s_->runtime().finish_pipelines();
    const uint64_t now = s_->stats()->vulkan_objects_created;
    if (iteration == 1) {
      EXPECT_EQ(now, created);
    }
    created = now;
  }
}

TEST_F(TapeCheckpointOnce, ARingWhoseArraysShareOneGradientGetsThePerStepProgramsGradients) {
  // Both ring arrays given one gradient array (set_grad): each step's adjoint reads its seed from
  // it, and adds into it what reaches the array it read. `step` stores its output whole, so the
  // tape would run the plain adjoint and clear the output's gradient itself afterwards -- which
  // here would clear what the adjoint just added for the input: it runs the clearing adjoint
  // for such a launch instead (api/tape.h, Record::clears_after).
  Reference want = per_step(x0_);
  if (HasFatalFailure()) return;
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
  NdArrayHandle loss = array({0}, "loss");
  NdArrayHandle shared = array(std::vector<float>(kN, 0), "shared grad");
  Tape t(*s_);
  ASSERT_TRUE(t.set_checkpoint_every(3).ok());
  ASSERT_TRUE(t.set_grad(ring[0], shared).ok());
  ASSERT_TRUE(t.set_grad(ring[1], shared).ok());
  record_ring(t, ring, loss, kSteps);
  Status st = t.backward({TapeSeed::of_value(loss, 1.0)});
  ASSERT_TRUE(st.ok()) << st.to_string();
  expect_near(read(shared), want, "one gradient for both ring arrays");
}

// The copies a backward no longer uses are freed by it (outside a capture), with K as with a
// budget: a tape that recorded a ring of one size, then one of another, holds what a tape that
// only recorded the second holds.
TEST_P(TapeCheckpoint, ABackwardFreesTheCopiesItNoLongerUses) {
  const uint32_t k = GetParam();
  auto iteration = [&](Tape& t, uint32_t n) {
    t.reset();
    std::vector<float> x0(x0_.begin(), x0_.begin() + n);
    NdArrayHandle ring[2] = {array(x0, "ring0"), array(std::vector<float>(n, 0), "ring1")};
    NdArrayHandle loss = array({0}, "loss");
    for (uint32_t j = 0; j < kSteps; ++j) {
      ASSERT_TRUE(t.launch(step_, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]),
                                   Arg::f32(c_of(j))})
                      .ok());
    }
    ASSERT_TRUE(t.launch(loss_, {Arg::ndarray(ring[kSteps % 2]), Arg::ndarray(loss)}).ok());
    ASSERT_TRUE(t.backward({TapeSeed::of_value(loss, 1.0)}).ok());
    ASSERT_TRUE(s_->synchronize().ok());
  };
  Tape both(*s_), second(*s_);
  ASSERT_TRUE(both.set_checkpoint_every(k).ok());
  ASSERT_TRUE(second.set_checkpoint_every(k).ok());
  iteration(both, kN);
  const uint64_t first_bytes = both.checkpoint_bytes();
  EXPECT_GT(first_bytes, 0u);
  iteration(both, kN / 2);
  iteration(second, kN / 2);
  EXPECT_EQ(both.checkpoint_bytes(), second.checkpoint_bytes());
  EXPECT_LT(both.checkpoint_bytes(), first_bytes);
}

// A checkpointed iteration captured as a graph (its copies are launches of copy kernels there)
// and replayed on two inputs: the per-step program's gradients, and the arrays hold the
// forward's end state after each replay.
TEST_P(TapeCheckpoint, ACapturedCheckpointedIterationReplaysToThePerStepProgramsGradients) {
  const uint32_t k = GetParam();
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
  NdArrayHandle loss = array({0}, "loss");
  Tape t(*s_);
  ASSERT_TRUE(t.set_checkpoint_every(k).ok());
  ASSERT_TRUE(s_->begin_capture("checkpointed").ok());
  ASSERT_TRUE(s_->zero(loss).ok());
  for (uint32_t j = 0; j < kSteps; ++j) {
    ASSERT_TRUE(t.launch(step_, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]),
                                 Arg::f32(c_of(j))})
                    .ok());
  }
  ASSERT_TRUE(t.launch(loss_, {Arg::ndarray(ring[kSteps % 2]), Arg::ndarray(loss)}).ok());
  std::vector<TapeAdjointLaunch> launched;
  const TapeSeed seed = TapeSeed::of_value(loss, 1.0);
  Status st = t.backward(std::span<const TapeSeed>(&seed, 1), &launched);
  ASSERT_TRUE(st.ok()) << st.to_string();
  Result<GraphHandle> g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  // backward told every launch it made: copies, forward launches again and adjoints, as the
  // graph numbers them after the recording's (the seed's fill is not a launch).
  Result<std::vector<std::string>> names = s_->graph_launch_names(*g);
  ASSERT_TRUE(names.ok());
  ASSERT_GE(names->size(), launched.size());
  const size_t first = names->size() - launched.size();
  size_t copies = 0;
  for (size_t i = 0; i < launched.size(); ++i) {
    const std::string& name = (*names)[first + i];
    const TapeAdjointLaunch& l = launched[i];
    copies += l.is_copy;
    // Records 0 .. kSteps - 1 are steps, kSteps the loss.
    const std::string kernel = l.record < kSteps ? "step" : "sq";
    const std::string want =
        l.is_copy ? "vkad_copy_f32_1" : kernel + (l.is_forward ? "" : "_adjoint");
    EXPECT_TRUE(name == want || name.rfind(want + "#", 0) == 0)
        << "launch " << first + i << " '" << name << "', want '" << want << "'";
  }
  EXPECT_GT(copies, 0u);
  ASSERT_TRUE(s_->finish_rework(*g).ok());
  for (float scale : {1.0f, 1.5f}) {
    std::vector<float> x0 = x0_;
    for (float& v : x0) v *= scale;
    const Reference want = per_step(x0);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(s_->upload(ring[0], std::span<const float>(x0)).ok());
    st = s_->replay(*g);
    ASSERT_TRUE(st.ok()) << st.to_string();
    expect_near(read(*t.grad(ring[0])), want,
                "K = " + std::to_string(k) + ", scale " + std::to_string(scale));
    if (HasFatalFailure()) return;
    const std::vector<float> last = read(ring[kSteps % 2]);
    for (uint32_t i = 0; i < kN; ++i) EXPECT_EQ(last[i], want.last[i]) << i;
    EXPECT_NEAR(read(loss, 1)[0], want.loss, 1e-5 * std::fabs(want.loss));
  }
  ASSERT_TRUE(s_->release_graph(*g).ok());
}

// b = a * c + 0.1 at every element but the first: linear in a, so its adjoint reads no array's
// values (only b's gradient); and not a whole overwrite of b, so a new version of b starts
// from a copy of the old one unless it is written in place.
constexpr const char* kLinearStep = R"(
kernel lstep(a: ndarray<f32, 1> grad, b: ndarray<f32, 1> grad, c: f32) {
  task main parallel %i in [1, shape(a, 0)) {
    %x = load a[%i] : f32
    %k = arg c : f32
    %m = mul %x, %k : f32
    %c1 = const 0.1 : f32
    %y = add %m, %c1 : f32
    store b[%i], %y
  }
}
)";

// At the deepest level each launch runs again into a copy of what it writes -- unless no
// adjoint reads the version it overwrites: then it writes the tape's copy in place. A ring of a
// linear step (adjoints read only gradients) makes one copy per array a segment writes; the same
// ring of sin steps (each adjoint reads its input: the ring's other array) one per launch. Both
// get the per-step program's gradients. (Both steps leave element 0 alone: a launch storing to
// every element makes no copy at all, the next test.)
TEST_P(TapeCheckpoint, ALaunchOverwritingAVersionNoAdjointReadsWritesInPlace) {
  const uint32_t k = GetParam();
  Result<Differentiated> linear = s_->differentiate(std::string_view(kLinearStep));
  ASSERT_TRUE(linear.ok()) << linear.status().to_string();
  // The fixture's sin step at every element but the first (kLinearStep's range).
  std::string partial_sin_ir = kStep;
  partial_sin_ir.replace(partial_sin_ir.find("kernel step("), 12, "kernel pstep(");
  partial_sin_ir.replace(partial_sin_ir.find("[0, shape(a, 0))"), 16, "[1, shape(a, 0))");
  Result<Differentiated> partial_sin = s_->differentiate(std::string_view(partial_sin_ir));
  ASSERT_TRUE(partial_sin.ok()) << partial_sin.status().to_string();
  auto copies_of = [&](const Differentiated& step, const Reference& want) -> size_t {
    NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
    NdArrayHandle loss = array({0}, "loss");
    Tape t(*s_);
    EXPECT_TRUE(t.set_checkpoint_every(k).ok());
    for (uint32_t j = 0; j < kSteps; ++j) {
      EXPECT_TRUE(t.launch(step, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]),
                                  Arg::f32(c_of(j))})
                      .ok());
    }
    EXPECT_TRUE(t.launch(loss_, {Arg::ndarray(ring[kSteps % 2]), Arg::ndarray(loss)}).ok());
    std::vector<TapeAdjointLaunch> launched;
    const TapeSeed seed = TapeSeed::of_value(loss, 1.0);
    Status st = t.backward(std::span<const TapeSeed>(&seed, 1), &launched);
    EXPECT_TRUE(st.ok()) << st.to_string();
    expect_near(read(*t.grad(ring[0])), want,
                step.forward.id == linear->forward.id ? "lin" : "sin");
    EXPECT_EQ(read(ring[kSteps % 2]), want.last);
    size_t copies = 0;
    for (const TapeAdjointLaunch& l : launched) copies += l.is_copy;
    for (NdArrayHandle a : {ring[0], ring[1], loss}) EXPECT_TRUE(s_->free(a).ok());
    return copies;
  };
  // The references: the fixture's per-step program with lstep, then pstep, for step.
  const Differentiated whole_step = step_, sin_step = *partial_sin;
  step_ = *linear;
  const Reference want_linear = per_step(x0_);
  step_ = sin_step;
  const Reference want_sin = per_step(x0_);
  step_ = whole_step;
  if (HasFatalFailure()) return;
  const size_t with_sin = copies_of(sin_step, want_sin);
  const size_t with_linear = copies_of(*linear, want_linear);
  if (HasFatalFailure()) return;
  // Records 0 .. kSteps - 1 write ring[(j + 1) % 2], record kSteps the loss; in each level-0
  // segment of K records, every write after an array's first is one copy fewer.
  size_t repeated = 0;
  for (uint32_t first = 0; first <= kSteps; first += k) {
    const uint32_t last = std::min(kSteps + 1, first + k);
    bool seen[3] = {false, false, false};
    for (uint32_t j = first; j < last; ++j) {
      const uint32_t a = j < kSteps ? (j + 1) % 2 : 2;
      repeated += seen[a];
      seen[a] = true;
    }
  }
  EXPECT_EQ(with_linear + repeated, with_sin) << "K = " << k;
  if (k >= 3) {
    EXPECT_GT(repeated, 0u);
  }
  for (const Differentiated* d : {&*linear, &*partial_sin}) {
    ASSERT_TRUE(s_->release(d->forward).ok());
    ASSERT_TRUE(s_->release(d->adjoint).ok());
  }
}

// A launch storing to every element of the array it writes, reading none of it (the fixture's
// step: b[i] for every i), starts its new version without a copy of the old: the deepest level
// makes no copy, and a backward's copies are only the end state's (kept, then put back) and
// each level-0 segment's start. The per-step program's gradients.
TEST_P(TapeCheckpoint, ALaunchStoringEveryElementStartsItsVersionWithoutACopy) {
  const uint32_t k = GetParam();
  const Reference want = per_step(x0_);
  if (HasFatalFailure()) return;
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
  NdArrayHandle loss = array({0}, "loss");
  Tape t(*s_);
  ASSERT_TRUE(t.set_checkpoint_every(k).ok());
  record_ring(t, ring, loss, kSteps);
  std::vector<TapeAdjointLaunch> launched;
  const TapeSeed seed = TapeSeed::of_value(loss, 1.0);
  Status st = t.backward(std::span<const TapeSeed>(&seed, 1), &launched);
  ASSERT_TRUE(st.ok()) << st.to_string();
  expect_near(read(*t.grad(ring[0])), want, "K = " + std::to_string(k));
  size_t copies = 0;
  for (const TapeAdjointLaunch& l : launched) copies += l.is_copy;
  // Records 0 .. kSteps - 1 write ring[(j + 1) % 2]; record kSteps the loss, written once by an
  // atomic add and read by nothing after: stable, never copied.
  size_t starts = 0;
  for (uint32_t first = 0; first <= kSteps; first += k) {
    bool seen[2] = {false, false};
    for (uint32_t j = first; j < std::min(kSteps, first + k); ++j) {
      starts += !seen[(j + 1) % 2];
      seen[(j + 1) % 2] = true;
    }
  }
  EXPECT_EQ(copies, 2 * 2 + starts) << "K = " << k;
  for (NdArrayHandle a : {ring[0], ring[1], loss}) EXPECT_TRUE(s_->free(a).ok());
}

// log[t, i] = x[i] * x[i]: a time axis written a row per step.
constexpr const char* kLogRow = R"(
kernel log_row(x: ndarray<f32, 1> grad, log: ndarray<f32, 2> grad, t: i32) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %q = mul %v, %v : f32
    %r = arg t : i32
    store log[%r, %i], %q
  }
}
)";

// loss += the sum of every log[t, i].
constexpr const char* kSumLog = R"(
kernel sum_log(log: ndarray<f32, 2> grad, loss: ndarray<f32, 1> grad) {
  task main parallel %t in [0, shape(log, 0)), %i in [0, shape(log, 1)) {
    %v = load log[%t, %i] : f32
    %z = const 0 : i32
    atomic_add loss[%z], %v
  }
}
)";

// A ring whose steps also write a time axis (a row per step, read only after: DiffTaichi's
// actuation[t, i]). The time axis is stable -- what backward finds there is what every launch
// saw -- so the launches writing it do not run again and it is never copied; the ring's steps
// run again as before. Gradients: the per-step program's; the time axis keeps the forward's rows.
TEST_P(TapeCheckpoint, ALaunchWritingOnlyATimeAxisRunsOnceAndItsRowsAreNotCopied) {
  const uint32_t k = GetParam();
  Result<Differentiated> log_row = s_->differentiate(std::string_view(kLogRow));
  Result<Differentiated> sum_log = s_->differentiate(std::string_view(kSumLog));
  ASSERT_TRUE(log_row.ok()) << log_row.status().to_string();
  ASSERT_TRUE(sum_log.ok()) << sum_log.status().to_string();
  auto zeros = [&](uint32_t n) { return std::vector<float>(n, 0); };
  // The reference: an array per step on the default tape.
  std::vector<NdArrayHandle> xs;
  for (uint32_t j = 0; j <= kSteps; ++j) {
    xs.push_back(array(j == 0 ? x0_ : zeros(kN), "x" + std::to_string(j)));
  }
  auto log_ref = s_->ndarray(DType::kF32, {kSteps, kN}, "log_ref");
  auto log = s_->ndarray(DType::kF32, {kSteps, kN}, "log");
  ASSERT_TRUE(log_ref.ok() && log.ok());
  ASSERT_TRUE(s_->zero(*log_ref).ok() && s_->zero(*log).ok());
  NdArrayHandle loss_ref = array({0}, "loss_ref"), loss = array({0}, "loss");
  std::vector<float> want_grad, want_log(kSteps * kN), got_log(kSteps * kN);
  {
    Tape t(*s_);
    for (uint32_t j = 0; j < kSteps; ++j) {
      ASSERT_TRUE(
          t.launch(step_, {Arg::ndarray(xs[j]), Arg::ndarray(xs[j + 1]), Arg::f32(c_of(j))}).ok());
      ASSERT_TRUE(t.launch(*log_row, {Arg::ndarray(xs[j + 1]), Arg::ndarray(*log_ref),
                                      Arg::i32(static_cast<int32_t>(j))})
                      .ok());
    }
    ASSERT_TRUE(t.launch(*sum_log, {Arg::ndarray(*log_ref), Arg::ndarray(loss_ref)}).ok());
    ASSERT_TRUE(t.backward({TapeSeed::of_value(loss_ref, 1.0)}).ok());
    want_grad = read(*t.grad(xs[0]));
    ASSERT_TRUE(s_->download(*log_ref, std::span<float>(want_log)).ok());
  }
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(zeros(kN), "ring1")};
  Tape t(*s_);
  ASSERT_TRUE(t.set_checkpoint_every(k).ok());
  for (uint32_t j = 0; j < kSteps; ++j) {
    ASSERT_TRUE(t.launch(step_, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]),
                                 Arg::f32(c_of(j))})
                    .ok());
    ASSERT_TRUE(t.launch(*log_row, {Arg::ndarray(ring[(j + 1) % 2]), Arg::ndarray(*log),
                                    Arg::i32(static_cast<int32_t>(j))})
                    .ok());
  }
  ASSERT_TRUE(t.launch(*sum_log, {Arg::ndarray(*log), Arg::ndarray(loss)}).ok());
  std::vector<TapeAdjointLaunch> launched;
  const TapeSeed seed = TapeSeed::of_value(loss, 1.0);
  Status st = t.backward(std::span<const TapeSeed>(&seed, 1), &launched);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<float> got = read(*t.grad(ring[0]));
  for (uint32_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(got[i], want_grad[i], 1e-5 * std::fabs(want_grad[i]) + 1e-7) << "element " << i;
  }
  ASSERT_TRUE(s_->download(*log, std::span<float>(got_log)).ok());
  EXPECT_EQ(got_log, want_log);
  // Records 2j: step j; 2j + 1: log_row j; 2 kSteps: sum_log. Only steps run again (where K
  // leaves a segment more than one launch: K = 1 reverses each alone, from its start copy).
  size_t steps_again = 0;
  for (const TapeAdjointLaunch& l : launched) {
    if (!l.is_forward) continue;
    EXPECT_TRUE(l.record < 2 * kSteps && l.record % 2 == 0)
        << "record " << l.record << " ran again";
    steps_again += l.record % 2 == 0;
  }
  if (k > 1) {
    EXPECT_GT(steps_again, 0u);
  }
  for (NdArrayHandle a : xs) EXPECT_TRUE(s_->free(a).ok());
  for (NdArrayHandle a : {*log_ref, *log, loss_ref, loss, ring[0], ring[1]}) {
    EXPECT_TRUE(s_->free(a).ok());
  }
}

// Session::copy inside a capture is a launch of a copy kernel: every element of every rank
// (the first three axes a parallel task, the rest serial loops) and dtype arrives, the replay
// copying what the source holds then; outside a capture it is the transfer copy still.
TEST_F(TapeCheckpointOnce, ACopyInsideACaptureCopiesEveryElementOfEveryRankAndDtype) {
  std::vector<DType> dtypes = {DType::kF32, DType::kI32, DType::kU32, DType::kBool};
  if (s_->target().float64) dtypes.push_back(DType::kF64);
  if (s_->target().int64) dtypes.push_back(DType::kI64);
  const std::vector<std::vector<uint32_t>> shapes = {
      {7}, {5, 3}, {3, 4, 5}, {2, 3, 4, 5}, {2, 2, 3, 1, 3}};
  uint32_t seed = 12345;
  for (DType t : dtypes) {
    for (const std::vector<uint32_t>& shape : shapes) {
      SCOPED_TRACE(std::string(runtime::dtype_name(t)) + ", rank " + std::to_string(shape.size()));
      uint64_t n = 1;
      for (uint32_t e : shape) n *= e;
      const uint64_t bytes = n * runtime::dtype_bytes(t);
      auto src = s_->ndarray(t, shape, "src");
      auto dst = s_->ndarray(t, shape, "dst");
      ASSERT_TRUE(src.ok() && dst.ok());
      auto bits = [&] {
        std::vector<unsigned char> v(bytes);
        for (unsigned char& b : v)
          b = static_cast<unsigned char>((seed = seed * 1103515245 + 12345) >> 16);
        // bool elements hold 0 or 1 in their first byte.
        if (t == DType::kBool)
          for (size_t i = 0; i < v.size(); ++i) v[i] = i % 4 == 0 ? v[i] & 1 : 0;
        return v;
      };
      ASSERT_TRUE(s_->upload(*dst, bits().data(), bytes).ok());
      ASSERT_TRUE(s_->begin_capture("copy").ok());
      Status st = s_->copy(*src, *dst);
      ASSERT_TRUE(st.ok()) << st.to_string();
      Result<GraphHandle> g = s_->end_capture();
      ASSERT_TRUE(g.ok()) << g.status().to_string();
      Result<std::vector<std::string>> names = s_->graph_launch_names(*g);
      ASSERT_TRUE(names.ok());
      EXPECT_EQ(*names,
                std::vector<std::string>{"vkad_copy_" + std::string(runtime::dtype_name(t)) + "_" +
                                         std::to_string(shape.size())});
      for (int replay = 0; replay < 2; ++replay) {
        const std::vector<unsigned char> want = bits();
        ASSERT_TRUE(s_->upload(*src, want.data(), bytes).ok());
        ASSERT_TRUE(s_->replay(*g).ok());
        std::vector<unsigned char> got(bytes);
        ASSERT_TRUE(s_->download(*dst, got.data(), bytes).ok());
        ASSERT_EQ(got, want) << "replay " << replay;
      }
      // Outside a capture: the transfer copy (no launch).
      const std::vector<unsigned char> want = bits();
      ASSERT_TRUE(s_->upload(*src, want.data(), bytes).ok());
      ASSERT_TRUE(s_->copy(*src, *dst).ok());
      std::vector<unsigned char> got(bytes);
      ASSERT_TRUE(s_->download(*dst, got.data(), bytes).ok());
      ASSERT_EQ(got, want);
      ASSERT_TRUE(s_->release_graph(*g).ok());
      ASSERT_TRUE(s_->free(*src).ok());
      ASSERT_TRUE(s_->free(*dst).ok());
    }
  }
  // A copy the session cannot make inside a capture is refused there as outside, by name.
  auto a = s_->ndarray(DType::kF32, {4}, "a");
  auto b = s_->ndarray(DType::kF32, {5}, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(s_->begin_capture("bad copy").ok());
  Status st = s_->copy(*a, *b);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dtypes or shapes differ"), std::string::npos) << st.message();
  st = s_->copy(*a, *a);
  EXPECT_NE(st.message().find("one array"), std::string::npos) << st.message();
  ASSERT_TRUE(s_->end_capture().ok());
}

// A memory budget instead of K (issue 57, point 2): a ring of 40 steps under budgets from
// roomy to the least any plan needs gets the per-step program's gradients, every time with
// fewer bytes of copies and more levels (each running the forward once more); the copies stay
// within the budget; a budget below the least is refused before anything runs, naming it; the
// next recording takes the plan's level-0 cut and makes no device object.
// Two rings of different sizes stepped in turn: the planner's estimate takes every deepest
// position to hold both a big and a small copy, so within this budget it needs three levels;
// counted exactly (every other position holds a small one) two fit, and the tape picks them.
// The copies stay within the budget and the gradients are the per-step program's.
TEST_F(TapeCheckpointOnce, TwoLevelsCountedExactlyFitWhereTheEstimateNeedsThree) {
  constexpr uint32_t kBig = 4096, kSmall = 16, kLong = 64;
  constexpr uint64_t kBudget = 500000;
  std::vector<float> big0(kBig), small0(kSmall);
  for (uint32_t i = 0; i < kBig; ++i) big0[i] = 0.001f * static_cast<float>(i % 1000);
  for (uint32_t i = 0; i < kSmall; ++i) small0[i] = 0.05f * static_cast<float>(i);
  auto per_step_grad = [&](const std::vector<float>& x0) {
    const uint32_t n = static_cast<uint32_t>(x0.size());
    std::vector<NdArrayHandle> xs;
    for (uint32_t j = 0; j <= kLong; ++j) {
      xs.push_back(array(j == 0 ? x0 : std::vector<float>(n, 0), "x" + std::to_string(j)));
    }
    NdArrayHandle loss = array({0}, "loss");
    Tape t(*s_);
    for (uint32_t j = 0; j < kLong; ++j) {
      EXPECT_TRUE(
          t.launch(step_, {Arg::ndarray(xs[j]), Arg::ndarray(xs[j + 1]), Arg::f32(c_of(j))}).ok());
    }
    EXPECT_TRUE(t.launch(loss_, {Arg::ndarray(xs[kLong]), Arg::ndarray(loss)}).ok());
    EXPECT_TRUE(t.backward({TapeSeed::of_value(loss, 1.0)}).ok());
    std::vector<float> g(n);
    EXPECT_TRUE(s_->download(*t.grad(xs[0]), std::span<float>(g)).ok());
    for (NdArrayHandle x : xs) EXPECT_TRUE(s_->free(x).ok());
    EXPECT_TRUE(s_->free(loss).ok());
    return g;
  };
  const std::vector<float> want_big = per_step_grad(big0), want_small = per_step_grad(small0);
  NdArrayHandle big[2] = {array(big0, "big0"), array(std::vector<float>(kBig, 0), "big1")};
  NdArrayHandle small[2] = {array(small0, "small0"), array(std::vector<float>(kSmall, 0), "s1")};
  NdArrayHandle loss = array({0}, "loss");
  Tape t(*s_);
  ASSERT_TRUE(t.set_memory_budget(kBudget).ok());
  for (uint32_t j = 0; j < kLong; ++j) {
    for (NdArrayHandle* ring : {big, small}) {
      ASSERT_TRUE(t.launch(step_, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]),
                                   Arg::f32(c_of(j))})
                      .ok());
    }
  }
  ASSERT_TRUE(t.launch(loss_, {Arg::ndarray(big[kLong % 2]), Arg::ndarray(loss)}).ok());
  ASSERT_TRUE(t.launch(loss_, {Arg::ndarray(small[kLong % 2]), Arg::ndarray(loss)}).ok());
  Result<codegen::CheckpointPlan> plan = t.checkpoint_plan();
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->segments.size(), 2u) << plan->to_string();
  EXPECT_LE(plan->peak_bytes, kBudget) << plan->to_string();
  // The estimate alone: W = both rings and the loss, w = a big, a small and the loss's copy.
  const uint64_t state = 2 * (kBig + kSmall) * 4 + 4, per_launch = (kBig + kSmall) * 4 + 4;
  Result<codegen::CheckpointPlan> estimate =
      codegen::plan_checkpoints(2 * kLong + 2, state, per_launch, kBudget, 0, "test");
  ASSERT_TRUE(estimate.ok()) << estimate.status().to_string();
  EXPECT_GT(estimate->segments.size(), 2u) << estimate->to_string();
  Status st = t.backward({TapeSeed::of_value(loss, 1.0)});
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_LE(t.checkpoint_bytes(), kBudget);
  for (auto [ring, want] : {std::pair{big, &want_big}, std::pair{small, &want_small}}) {
    std::vector<float> got(want->size());
    ASSERT_TRUE(s_->download(*t.grad(ring[0]), std::span<float>(got)).ok());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], (*want)[i], 1e-5 * std::fabs((*want)[i]) + 1e-6) << "element " << i;
    }
  }
  for (NdArrayHandle a : {big[0], big[1], small[0], small[1], loss}) EXPECT_TRUE(s_->free(a).ok());
}

TEST_F(TapeCheckpointOnce, AMemoryBudgetPicksTheFewestLevelsThatFitAndGetsTheGradients) {
  constexpr uint32_t kLong = 40;
  const Reference want = per_step(x0_, kLong);
  if (HasFatalFailure()) return;
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
  NdArrayHandle loss = array({0}, "loss");
  const uint64_t state = kRingState, per_launch = kRingPerLaunch;
  auto record = [&](Tape& t) {
    EXPECT_TRUE(s_->upload(ring[0], std::span<const float>(x0_)).ok());
    record_ring(t, ring, loss, kLong);
  };
  const uint64_t min_bytes = least_ring_bytes(kLong);
  if (HasFailure()) return;
  uint32_t last_levels = 0;
  uint64_t last_objects = 0;
  uint64_t last_peak = UINT64_MAX;
  for (uint64_t budget : {uint64_t{1} << 20, 2 * min_bytes, min_bytes + min_bytes / 4, min_bytes}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    Tape t(*s_);
    ASSERT_TRUE(t.set_memory_budget(budget).ok());
    EXPECT_EQ(t.checkpoint_every(), 0u);
    EXPECT_FALSE(t.keeps_intermediate_gradients());
    for (int iteration = 0; iteration < 3; ++iteration) {
      record(t);
      Result<codegen::CheckpointPlan> plan = t.checkpoint_plan();
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      EXPECT_LE(plan->peak_bytes, budget) << plan->to_string();
      EXPECT_EQ(plan->recompute, plan->segments.size());
      EXPECT_EQ(plan->segments.back(), 1u);
      EXPECT_EQ(plan->launches, kLong + 1);
      Status st = t.backward({TapeSeed::of_value(loss, 1.0)});
      ASSERT_TRUE(st.ok()) << st.to_string();
      expect_near(read(*t.grad(ring[0])), want, plan->to_string());
      if (HasFatalFailure()) return;
      // backward may run again on the same recording: the copies it trimmed after the first
      // (level 0's merged slots, a deeper plan's levels) are the ones it needs no more.
      st = t.backward({TapeSeed::of_value(loss, 1.0)});
      ASSERT_TRUE(st.ok()) << st.to_string();
      expect_near(read(*t.grad(ring[0])), want, plan->to_string() + ", backward again");
      if (HasFatalFailure()) return;
      const std::vector<float> last = read(ring[kLong % 2]);
      for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(last[i], want.last[i]) << i;
      EXPECT_LE(t.checkpoint_bytes(), budget);
      // From the third recording on (the second took the first plan's cut) nothing is made
      // (specialized pipelines made on another thread taken in first, as above).
      s_->runtime().finish_pipelines();
      const uint64_t objects = s_->stats()->vulkan_objects_created;
      const uint64_t previous = std::exchange(last_objects, objects);
      if (iteration == 2) {
        EXPECT_EQ(objects, previous) << plan->to_string();
        EXPECT_GE(plan->recompute, last_levels) << plan->to_string();
        EXPECT_LE(plan->peak_bytes, last_peak) << plan->to_string();
        last_levels = plan->recompute;
        last_peak = plan->peak_bytes;
      }
    }
  }
  EXPECT_GE(last_levels, 3u);  // the least bytes take more levels
  // Below the least: refused by the launch (its copies alone pass it) or by backward (no plan
  // fits), naming the least, with nothing run by backward.
  for (uint64_t budget : {2 * state + per_launch + 8, state}) {
    Tape t(*s_);
    ASSERT_TRUE(t.set_memory_budget(budget).ok());
    Status st;
    ASSERT_TRUE(s_->upload(ring[0], std::span<const float>(x0_)).ok());
    for (uint32_t j = 0; j < kLong && st.ok(); ++j) {
      st = t.launch(
          step_, {Arg::ndarray(ring[j % 2]), Arg::ndarray(ring[(j + 1) % 2]), Arg::f32(c_of(j))});
    }
    if (st.ok()) st = t.launch(loss_, {Arg::ndarray(ring[kLong % 2]), Arg::ndarray(loss)});
    if (st.ok()) {
      std::vector<TapeAdjointLaunch> launched;
      const TapeSeed seed = TapeSeed::of_value(loss, 1.0);
      st = t.backward(std::span<const TapeSeed>(&seed, 1), &launched);
      EXPECT_TRUE(launched.empty());
    }
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("memory budget"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("at least"), std::string::npos) << st.message();
  }
  EXPECT_EQ(Tape(*s_).set_memory_budget(0).code(), ErrorCode::kOk);
}

// A graph captures a recording after a first one ran (its doubling cut), as a training loop
// does: the captured backward trims the first plan's slots it does not use, so the copies stay
// within the budget (they held both plans' slots: past the budget near the least), and the
// replays get the per-step program's gradients.
TEST_F(TapeCheckpointOnce, ACapturedSecondRecordingKeepsTheCopiesWithinTheBudget) {
  constexpr uint32_t kLong = 40;
  const Reference want = per_step(x0_, kLong);
  if (HasFatalFailure()) return;
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
  NdArrayHandle loss = array({0}, "loss");
  const uint64_t min_bytes = least_ring_bytes(kLong);
  if (HasFailure()) return;
  const TapeSeed seed = TapeSeed::of_value(loss, 1.0);
  auto start = [&] { ASSERT_TRUE(s_->upload(ring[0], std::span<const float>(x0_)).ok()); };
  auto record = [&](Tape& t) { record_ring(t, ring, loss, kLong); };
  for (uint64_t budget = min_bytes; budget < 3 * min_bytes; budget += min_bytes / 4) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    Tape t(*s_);
    ASSERT_TRUE(t.set_memory_budget(budget).ok());
    start();
    record(t);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(t.backward(std::span<const TapeSeed>(&seed, 1)).ok());
    EXPECT_LE(t.checkpoint_bytes(), budget);
    start();
    ASSERT_TRUE(s_->begin_capture("second").ok());
    record(t);
    if (HasFatalFailure()) return;
    Status st = t.backward(std::span<const TapeSeed>(&seed, 1));
    ASSERT_TRUE(st.ok()) << st.to_string();
    Result<GraphHandle> g = s_->end_capture();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_LE(t.checkpoint_bytes(), budget) << t.checkpoint_plan()->to_string();
    for (int replay = 0; replay < 2; ++replay) {
      start();
      ASSERT_TRUE(s_->replay(*g).ok());
      expect_near(read(*t.grad(ring[0])), want, "replay " + std::to_string(replay));
      if (HasFatalFailure()) return;
    }
    ASSERT_TRUE(s_->release_graph(*g).ok());
  }
}

// Two graphs of one budgeted tape, recordings of two lengths (two plans, the second deeper):
// capturing the second trims what the first plan left over the budget, and the first graph
// still replays to its gradients after it (its copies are pinned, and a graph keeps what it
// launches with alive).
TEST_F(TapeCheckpointOnce, AnEarlierGraphKeepsItsCopiesWhenALaterCaptureTrims) {
  constexpr uint32_t kLong = 40, kShort = 60;
  const Reference want_long = per_step(x0_, kLong), want_short = per_step(x0_, kShort);
  if (HasFatalFailure()) return;
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
  NdArrayHandle loss = array({0}, "loss");
  const TapeSeed seed = TapeSeed::of_value(loss, 1.0);
  const uint64_t min_bytes = least_ring_bytes(std::max(kLong, kShort));
  if (HasFailure()) return;
  // From the least up: the tighter, the more a capture's trim frees.
  for (uint64_t budget : {min_bytes + min_bytes / 4, 3 * min_bytes / 2, 2 * min_bytes}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    Tape t(*s_);
    ASSERT_TRUE(t.set_memory_budget(budget).ok());
    auto capture = [&](uint32_t steps) -> GraphHandle {
      EXPECT_TRUE(s_->upload(ring[0], std::span<const float>(x0_)).ok());
      EXPECT_TRUE(s_->begin_capture("ring").ok());
      record_ring(t, ring, loss, steps);
      Status st = t.backward(std::span<const TapeSeed>(&seed, 1));
      EXPECT_TRUE(st.ok()) << st.to_string();
      Result<GraphHandle> g = s_->end_capture();
      EXPECT_TRUE(g.ok()) << g.status().to_string();
      return g.ok() ? *g : GraphHandle{};
    };
    auto replay = [&](GraphHandle g, const Reference& want, const std::string& what) {
      ASSERT_TRUE(s_->upload(ring[0], std::span<const float>(x0_)).ok());
      Status st = s_->replay(g);
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
      expect_near(read(*t.grad(ring[0])), want, what);
    };
    const GraphHandle long_graph = capture(kLong);
    replay(long_graph, want_long, "the long graph");
    if (HasFatalFailure()) return;
    const GraphHandle short_graph = capture(kShort);
    replay(short_graph, want_short, "the short graph");
    if (HasFatalFailure()) return;
    replay(long_graph, want_long, "the long graph after the short one's capture");
    if (HasFatalFailure()) return;
    ASSERT_TRUE(s_->release_graph(short_graph).ok());
    ASSERT_TRUE(s_->release_graph(long_graph).ok());
  }
}

// DiffTaichi's grid, cleared and refilled every step (issue 57, point 3): particles scatter into
// one grid (atomic adds) and gather from it, the grid cleared by a fill on the tape. With
// checkpointing the fill is recorded and run again, and the gradient equals that of a program
// with a fresh grid per step on the default tape, which refuses the reused grid's fill.
constexpr const char* kP2g = R"(
kernel p2g(x: ndarray<f32, 1> grad, cell: ndarray<i32, 1>, g: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %j = load cell[%i] : i32
    atomic_add g[%j], %v
  }
}
)";
constexpr const char* kG2p = R"(
kernel g2p(x: ndarray<f32, 1> grad, g: ndarray<f32, 1> grad, cell: ndarray<i32, 1>,
           y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %j = load cell[%i] : i32
    %m = load g[%j] : f32
    %s = sin %m : f32
    %h = const 0.05 : f32
    %a = mul %s, %h : f32
    %v = load x[%i] : f32
    %k = const 0.9 : f32
    %b = mul %v, %k : f32
    %y = add %a, %b : f32
    store y[%i], %y
  }
}
)";

TEST_P(TapeCheckpoint, AGridClearedEveryStepByARecordedFillGetsThePerStepGridsGradients) {
  const uint32_t k = GetParam();
  auto p2g = s_->differentiate(std::string_view(kP2g));
  auto g2p = s_->differentiate(std::string_view(kG2p));
  ASSERT_TRUE(p2g.ok() && g2p.ok()) << p2g.status().to_string() << g2p.status().to_string();
  constexpr uint32_t kCells = 7, kGridSteps = 6;
  std::vector<int32_t> cells(kN);
  for (uint32_t i = 0; i < kN; ++i) cells[i] = static_cast<int32_t>((i * 5) % kCells);
  auto cell = s_->ndarray(DType::kI32, {kN}, "cell");
  ASSERT_TRUE(cell.ok() && s_->upload(*cell, std::span<const int32_t>(cells)).ok());
  auto step = [&](Tape& t, NdArrayHandle x, NdArrayHandle g, NdArrayHandle y) {
    Status st = t.launch(*p2g, {Arg::ndarray(x), Arg::ndarray(*cell), Arg::ndarray(g)});
    if (st.ok()) {
      st = t.launch(*g2p, {Arg::ndarray(x), Arg::ndarray(g), Arg::ndarray(*cell), Arg::ndarray(y)});
    }
    return st;
  };
  // The reference: a fresh grid (zeros) and state array per step.
  std::vector<float> want;
  {
    Tape t(*s_);
    std::vector<NdArrayHandle> xs = {array(x0_, "x0")}, gs;
    for (uint32_t f = 0; f < kGridSteps; ++f) {
      xs.push_back(array(std::vector<float>(kN, 0), "x"));
      gs.push_back(array(std::vector<float>(kCells, 0), "g"));
      ASSERT_TRUE(step(t, xs[f], gs[f], xs[f + 1]).ok());
    }
    NdArrayHandle loss = array({0}, "loss");
    ASSERT_TRUE(t.launch(loss_, {Arg::ndarray(xs.back()), Arg::ndarray(loss)}).ok());
    ASSERT_TRUE(t.backward({TapeSeed::of_value(loss, 1.0)}).ok());
    want = read(*t.grad(xs[0]));
  }
  NdArrayHandle ring[2] = {array(x0_, "ring0"), array(std::vector<float>(kN, 0), "ring1")};
  NdArrayHandle grid = array(std::vector<float>(kCells, 0), "grid");
  NdArrayHandle loss = array({0}, "loss");
  {  // The default tape refuses the fill of a grid a recorded launch wrote, naming the fix.
    Tape plain(*s_);
    ASSERT_TRUE(plain.fill(grid, 0.0).ok());  // untouched yet: the grid's state before
    ASSERT_TRUE(step(plain, ring[0], grid, ring[1]).ok());
    Status st = plain.fill(grid, 0.0);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find("set_memory_budget"), std::string::npos) << st.message();
  }
  for (bool budget : {false, true}) {
    SCOPED_TRACE(budget ? "a memory budget" : "K = " + std::to_string(k));
    Tape t(*s_);
    ASSERT_TRUE((budget ? t.set_memory_budget(64 << 10) : t.set_checkpoint_every(k)).ok());
    for (int iteration = 0; iteration < 2; ++iteration) {
      t.reset();
      ASSERT_TRUE(s_->upload(ring[0], std::span<const float>(x0_)).ok());
      ASSERT_TRUE(s_->zero(loss).ok());
      for (uint32_t f = 0; f < kGridSteps; ++f) {
        Status st = t.fill(grid, 0.0);
        ASSERT_TRUE(st.ok()) << st.to_string();
        ASSERT_TRUE(step(t, ring[f % 2], grid, ring[(f + 1) % 2]).ok());
      }
      ASSERT_TRUE(t.launch(loss_, {Arg::ndarray(ring[kGridSteps % 2]), Arg::ndarray(loss)}).ok());
      // The first fill found the grid untouched (not recorded); the others are records.
      EXPECT_EQ(t.launches(), 2 * kGridSteps + 1 + (kGridSteps - 1));
      Status st = t.backward({TapeSeed::of_value(loss, 1.0)});
      ASSERT_TRUE(st.ok()) << st.to_string();
      const std::vector<float> got = read(*t.grad(ring[0]));
      // The grid's atomic sums add in any order on a GPU, and the reference's too. With 0.05
      // sin(grid) the six steps amplify that rounding little: a numpy model of this program in
      // f32 with random atomic orders spreads by 2.3e-6 of the largest gradient (~7; with 0.5
      // it was chaotic: 3e-3, the H200 reference alone moving by 3.6e-4 between runs). A grid
      // path missed by the recomputation is off by O(1) of the gradient (it is ~90% of it).
      float largest = 0;
      for (float w : want) largest = std::max(largest, std::fabs(w));
      for (uint32_t i = 0; i < kN; ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-4 * std::fabs(want[i]) + 1e-5 * largest) << "element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Segments, TapeCheckpoint, ::testing::Values(1u, 2u, 3u, 8u),
                         [](const auto& info) { return "K" + std::to_string(info.param); });

}  // namespace
}  // namespace vkad::testing
