// api/tape.h (vkad::Tape) and Runtime::zero_many / Session::zero(span) on a real device with
// validation on: gradients against closed forms, storage reused across iterations, every error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ir/builder.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using codegen::Array;
using codegen::KernelBuilder;
using codegen::Value;

class TapeTest : public ValidatedSessionTest {
 protected:
  NdArrayHandle make(uint32_t n, const char* name, DType t = DType::kF32) {
    auto h = s_->ndarray(t, {n}, name);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return h.ok() ? *h : NdArrayHandle{};
  }
  std::vector<float> read(NdArrayHandle h, uint32_t n) {
    std::vector<float> out(n);
    Status st = s_->download(h, std::span<float>(out));
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }
  SessionStats stats() {
    auto r = s_->stats();
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : SessionStats{};
  }
};

// y[i] = sin(x[i]) * 0.9 + 0.1: dy/dx = 0.9 cos(x).
codegen::Kernel sin_step() {
  KernelBuilder kb("sin_step");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { y.store({i}, sin(x(i)) * 0.9 + 0.1); });
  return kb.finish();
}

constexpr uint32_t kN = 64;
constexpr int kSteps = 10;

std::vector<float> start_values() {
  std::vector<float> x0(kN);
  for (uint32_t i = 0; i < kN; ++i) x0[i] = -1.5f + 3.0f * static_cast<float>(i) / kN;
  return x0;
}

// d x_to / d x_from through y = sin(x) 0.9 + 0.1, evaluated in double from x0.
std::vector<double> chain_gradient(const std::vector<float>& x0, int from, int to) {
  std::vector<double> out(x0.size());
  for (size_t i = 0; i < x0.size(); ++i) {
    double x = x0[i], g = 1;
    for (int k = 0; k < to; ++k) {
      if (k >= from) g *= 0.9 * std::cos(x);
      x = std::sin(x) * 0.9 + 0.1;
    }
    out[i] = g;
  }
  return out;
}

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double w = 1) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // Vulkan's sin/cos: 2^-11 absolute on [-pi, pi]; ten factors of at most 0.9 each.
    ASSERT_NEAR(got[i], w * want[i], 5e-3 * std::fabs(w)) << "element " << i;
  }
}

// --- zero_many ----------------------------------------------------------------------------

TEST_F(TapeTest, ZeroManyZeroesEveryListedArrayAndNothingElse) {
  const std::vector<float> junk(kN, 7.5f);
  NdArrayHandle a = make(kN, "a"), b = make(kN, "b"), c = make(kN, "c");
  auto ints = s_->ndarray(DType::kI32, {4, 4}, "ints");
  ASSERT_TRUE(ints.ok());
  const std::vector<int32_t> ijunk(16, -3);
  for (NdArrayHandle h : {a, b, c}) ASSERT_TRUE(s_->upload(h, std::span<const float>(junk)).ok());
  ASSERT_TRUE(s_->upload(*ints, std::span<const int32_t>(ijunk)).ok());
  const NdArrayHandle list[] = {a, *ints, c, a};  // a twice: filled twice, no error
  ASSERT_TRUE(s_->zero(std::span<const NdArrayHandle>(list)).ok());
  EXPECT_EQ(read(a, kN), std::vector<float>(kN, 0.0f));
  EXPECT_EQ(read(c, kN), std::vector<float>(kN, 0.0f));
  EXPECT_EQ(read(b, kN), junk) << "an array not listed is untouched";
  std::vector<int32_t> got(16);
  ASSERT_TRUE(s_->download(*ints, std::span<int32_t>(got)).ok());
  EXPECT_EQ(got, std::vector<int32_t>(16, 0));
  EXPECT_TRUE(s_->zero(std::span<const NdArrayHandle>()).ok()) << "an empty list records nothing";
}

TEST_F(TapeTest, ZeroManyChecksEveryHandleFirstAndRecordsNothingOnError) {
  const std::vector<float> junk(kN, 7.5f);
  NdArrayHandle a = make(kN, "a"), b = make(kN, "b"), dead = make(kN, "dead");
  for (NdArrayHandle h : {a, b}) ASSERT_TRUE(s_->upload(h, std::span<const float>(junk)).ok());
  ASSERT_TRUE(s_->free(dead).ok());
  {
    const NdArrayHandle list[] = {a, b, dead};  // the bad one last: a and b must stay
    Status st = s_->zero(std::span<const NdArrayHandle>(list));
    EXPECT_EQ(st.code(), ErrorCode::kNotFound);
    EXPECT_EQ(st.message(), "zero_many: ndarray handle " + runtime::handle_string(dead.id) +
                                " was freed or never existed");
  }
  {
    const NdArrayHandle foreign{(uint64_t{999999} << 32) | 1};
    const NdArrayHandle list[] = {a, foreign};
    Status st = s_->zero(std::span<const NdArrayHandle>(list));
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find("zero_many: ndarray handle 999999:1 belongs to runtime 999999"),
              std::string::npos)
        << st.message();
  }
  EXPECT_EQ(read(a, kN), junk);
  EXPECT_EQ(read(b, kN), junk);
}

// --- Tape ---------------------------------------------------------------------------------

struct Chain {
  std::vector<NdArrayHandle> x;  // x[0] .. x[kSteps]
  std::vector<Arg> args;         // per step: x[k], x[k + 1]
};

TEST_F(TapeTest, TenLaunchChainMatchesClosedFormSeededByValueAndByData) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> x0 = start_values();
  std::vector<NdArrayHandle> x;
  for (int k = 0; k <= kSteps; ++k) x.push_back(make(kN, "x"));
  ASSERT_TRUE(s_->upload(x[0], std::span<const float>(x0)).ok());
  Tape tape(*s_);
  for (int k = 0; k < kSteps; ++k) {
    Status st = tape.launch(*d, {Arg::ndarray(x[k]), Arg::ndarray(x[k + 1])});
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  EXPECT_EQ(tape.launches(), static_cast<size_t>(kSteps));
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(x[kSteps], 1.0)}).ok());
  auto g0 = tape.grad(x[0]);
  ASSERT_TRUE(g0.ok()) << g0.status().to_string();
  expect_near(read(*g0, kN), chain_gradient(x0, 0, kSteps));
  // An intermediate array's gradient: d x10 / d x4.
  auto g4 = tape.grad(x[4]);
  ASSERT_TRUE(g4.ok());
  expect_near(read(*g4, kN), chain_gradient(x0, 4, kSteps));
  EXPECT_EQ(tape.gradients(), static_cast<size_t>(kSteps + 1));

  // Seeded by host data: weights per element.
  std::vector<float> w(kN);
  for (uint32_t i = 0; i < kN; ++i) w[i] = 0.5f + 0.01f * static_cast<float>(i);
  ASSERT_TRUE(tape.backward({TapeSeed::of_data(x[kSteps], std::span<const float>(w))}).ok());
  const std::vector<float> got = read(*g0, kN);
  const std::vector<double> want = chain_gradient(x0, 0, kSteps);
  for (uint32_t i = 0; i < kN; ++i) ASSERT_NEAR(got[i], w[i] * want[i], 5e-3) << i;

  // Two seeds at once: d(x10 + 2 x5)/dx0 = chain(0, 10) + 2 chain(0, 5).
  ASSERT_TRUE(
      tape.backward({TapeSeed::of_value(x[kSteps], 1.0), TapeSeed::of_value(x[5], 2.0)}).ok());
  const std::vector<float> both = read(*g0, kN);
  const std::vector<double> c5 = chain_gradient(x0, 0, 5);
  for (uint32_t i = 0; i < kN; ++i) ASSERT_NEAR(both[i], want[i] + 2 * c5[i], 1e-2) << i;
}

TEST_F(TapeTest, ReusedAcrossIterationsAllocatesNothingAfterTheFirst) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> x0 = start_values();
  std::vector<NdArrayHandle> x;
  for (int k = 0; k <= kSteps; ++k) x.push_back(make(kN, "x"));
  ASSERT_TRUE(s_->upload(x[0], std::span<const float>(x0)).ok());
  // The caller's own gradient for x[0] (as Python's array.grad): used, never freed by the tape.
  NdArrayHandle mine = make(kN, "x0_grad");
  Tape tape(*s_);
  ASSERT_TRUE(tape.set_grad(x[0], mine).ok());
  std::vector<float> first;
  SessionStats after_first{};
  for (int it = 0; it < 3; ++it) {
    tape.reset();
    EXPECT_EQ(tape.launches(), 0u);
    for (int k = 0; k < kSteps; ++k) {
      ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(x[k]), Arg::ndarray(x[k + 1])}).ok());
    }
    ASSERT_TRUE(tape.backward({TapeSeed::of_value(x[kSteps], 1.0)}).ok());
    auto g = tape.grad(x[0]);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->id, mine.id);
    const std::vector<float> got = read(mine, kN);  // a readback: drains every retirement
    const SessionStats st = stats();
    if (it == 0) {
      expect_near(got, chain_gradient(x0, 0, kSteps));
      first = got;
      after_first = st;
      // x[0]'s gradient is the caller's: the tape made the other ten.
      EXPECT_EQ(st.ndarrays, static_cast<uint64_t>(kSteps + 1 + 1 + kSteps));
    } else {
      EXPECT_EQ(got, first) << "iteration " << it << ": zeroed, not accumulated";
      EXPECT_EQ(st.ndarrays, after_first.ndarrays) << "iteration " << it;
      EXPECT_EQ(st.memory_block_bytes, after_first.memory_block_bytes) << "iteration " << it;
      EXPECT_EQ(st.memory_used_bytes, after_first.memory_used_bytes) << "iteration " << it;
    }
  }
  EXPECT_EQ(tape.gradients(), static_cast<size_t>(kSteps + 1));
  EXPECT_TRUE(s_->free(mine).ok()) << "the caller's gradient is still the caller's";
}

// The DiffTaichi / Warp idiom: a new tape per iteration. The gradients a dropped tape made go
// into the runtime's ndarray pool and the next tape's come from there, so after the first
// iterations nothing is created: no Vulkan object, no memory block; and the gradients are right.
TEST_F(TapeTest, NewTapePerIterationCreatesNothingInTheSteadyState) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> x0 = start_values();
  std::vector<NdArrayHandle> x;
  for (int k = 0; k <= kSteps; ++k) x.push_back(make(kN, "x"));
  ASSERT_TRUE(s_->upload(x[0], std::span<const float>(x0)).ok());
  const std::vector<double> want = chain_gradient(x0, 0, kSteps);
  SessionStats warm{};
  for (int it = 0; it < 5; ++it) {
    Tape tape(*s_);
    for (int k = 0; k < kSteps; ++k) {
      ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(x[k]), Arg::ndarray(x[k + 1])}).ok());
    }
    ASSERT_TRUE(tape.backward({TapeSeed::of_value(x[kSteps], 1.0)}).ok());
    auto g = tape.grad(x[0]);
    ASSERT_TRUE(g.ok());
    expect_near(read(*g, kN), want);   // a readback: drains every retirement
    s_->runtime().finish_pipelines();  // a variant made on another thread counts now, not later
    const SessionStats st = stats();
    if (it == 1) warm = st;
    if (it > 1) {
      EXPECT_EQ(st.vulkan_objects_created, warm.vulkan_objects_created) << "iteration " << it;
      EXPECT_EQ(st.memory_block_bytes, warm.memory_block_bytes) << "iteration " << it;
    }
  }
  // The last tape's gradients are in the pool now; release_idle_memory gives them back.
  const SessionStats pooled = stats();
  EXPECT_GE(pooled.ndarray_pool_bytes, static_cast<uint64_t>(kSteps + 1) * kN * 4);
  ASSERT_TRUE(s_->release_idle_memory().ok());
  EXPECT_EQ(stats().ndarray_pool_bytes, 0u);
  EXPECT_LT(stats().live_buffers, pooled.live_buffers);
}

TEST_F(TapeTest, GradientOfAFreedArrayIsFreedAtTheNextReset) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok());
  NdArrayHandle a = make(kN, "a"), b = make(kN, "b");
  ASSERT_TRUE(s_->zero(a).ok());
  const uint64_t base = stats().ndarrays;
  {
    Tape tape(*s_);
    ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(a), Arg::ndarray(b)}).ok());
    ASSERT_TRUE(tape.backward({TapeSeed::of_value(b, 1.0)}).ok());
    EXPECT_EQ(stats().ndarrays, base + 2);  // a_grad, b_grad
    ASSERT_TRUE(s_->free(a).ok());
    tape.reset();
    EXPECT_EQ(stats().ndarrays, base - 1 + 1) << "a and its gradient are gone; b's stays";
    EXPECT_EQ(tape.gradients(), 1u);
    Result<NdArrayHandle> g = tape.grad(a);
    EXPECT_EQ(g.status().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(stats().ndarrays, base - 1) << "the tape's destruction freed b's gradient";
}

TEST_F(TapeTest, ErrorsNameWhatIsWrongAndChangeNothing) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok());
  NdArrayHandle a = make(kN, "a"), b = make(kN, "b"), other = make(kN, "other");
  NdArrayHandle small = make(3, "small");
  ASSERT_TRUE(s_->zero(a).ok());
  Tape tape(*s_);

  // backward with nothing recorded.
  Status st = tape.backward({TapeSeed::of_value(b, 1.0)});
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "tape.backward: no launch of a differentiated kernel was recorded");

  // launch: wrong count; nothing launched or recorded.
  const uint64_t launches = stats().launches;
  st = tape.launch(*d, {Arg::ndarray(a)});
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "tape.launch: 1 arguments given, the forward kernel has 2 parameters");
  // launch: arguments Session::launch refuses (a scalar for an ndarray that is not a gradient
  // can't happen here; an f64 array for an f32 parameter can).
  auto wide = s_->ndarray(DType::kF64, {kN}, "wide");
  if (wide.ok()) {
    st = tape.launch(*d, {Arg::ndarray(*wide), Arg::ndarray(b)});
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.message().rfind("tape.launch: ", 0), 0u) << st.message();
  }
  EXPECT_EQ(tape.launches(), 0u);
  EXPECT_EQ(stats().launches, launches);

  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(a), Arg::ndarray(b)}).ok());
  const uint64_t ndarrays = stats().ndarrays;

  // Seeds: an array no recorded launch differentiates; data of the wrong size; a value f32
  // cannot hold. Nothing is made (ndarray count) or recorded.
  st = tape.backward({TapeSeed::of_value(other, 1.0)});
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "tape.backward: seed for ndarray " + runtime::handle_string(other.id) +
                              ", which is not a differentiated (grad) argument of any recorded "
                              "launch");
  const float three[3] = {1, 2, 3};
  st = tape.backward({TapeSeed::of_data(b, three, sizeof three)});
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("12 bytes given, the array holds 256"), std::string::npos)
      << st.message();
  st = tape.backward({TapeSeed::of_value(b, 1e300)});
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("value 1e+300 does not fit f32"), std::string::npos) << st.message();
  EXPECT_EQ(stats().ndarrays, ndarrays);
  EXPECT_EQ(stats().launches, launches + 1);

  // grad before any backward, and of an array never differentiated.
  Result<NdArrayHandle> g = tape.grad(a);
  EXPECT_EQ(g.status().code(), ErrorCode::kInvalidArgument);
  g = tape.grad(other);
  EXPECT_EQ(g.status().message(),
            "tape.grad: ndarray " + runtime::handle_string(other.id) +
                " is not a differentiated (grad) argument of any recorded launch, or backward() "
                "has not run");

  // set_grad: shape or dtype differs, the array itself, a dead handle.
  st = tape.set_grad(a, small);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("is f32 of shape (3,), ndarray " + runtime::handle_string(a.id) +
                              " is f32 of shape (64,)"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(tape.set_grad(a, a).code(), ErrorCode::kInvalidArgument);
  NdArrayHandle gone = make(kN, "gone");
  ASSERT_TRUE(s_->free(gone).ok());
  st = tape.set_grad(a, gone);
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_EQ(st.message().rfind("tape.set_grad: ", 0), 0u) << st.message();
  EXPECT_EQ(tape.gradients(), 0u);

  // An argument freed between the recording and backward: the adjoint launch names it.
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(b, 1.0)}).ok());
  ASSERT_TRUE(s_->free(other).ok());
  Tape t2(*s_);
  NdArrayHandle c = make(kN, "c");
  ASSERT_TRUE(t2.launch(*d, {Arg::ndarray(b), Arg::ndarray(c)}).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  ASSERT_TRUE(s_->free(b).ok());
  st = t2.backward({TapeSeed::of_value(c, 1.0)});
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("tape.backward: ", 0), 0u) << st.message();
  ASSERT_TRUE(s_->synchronize().ok());
}

// x[t + 1, i] = sin(x[t, i]) * 0.9 + 0.1: sin_step on a time axis, for Tape::launch_loop.
codegen::Kernel sin_row() {
  KernelBuilder kb("sin_row");
  codegen::Scalar t = kb.scalar("t", DType::kI32);
  Array x = kb.ndarray("x", DType::kF32, 2, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(1), [&](Value i) {
    Value tv = t;
    x.store({tv + 1, i}, sin(x(tv, i)) * 0.9 + 0.1);
  });
  return kb.finish();
}

TEST_F(TapeTest, ALaunchLoopOnTheTapeMatchesTheClosedFormAndItsLaunchesOneByOne) {
  auto d = s_->differentiate(sin_row());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> x0 = start_values();
  std::vector<float> rows(size_t{kSteps + 1} * kN, 0.0f), seed(rows.size(), 0.0f);
  std::copy(x0.begin(), x0.end(), rows.begin());
  std::fill(seed.begin() + size_t{kSteps} * kN, seed.end(), 1.0f);  // d(sum of row kSteps)
  std::vector<std::vector<float>> grads;
  for (bool looped : {true, false}) {
    auto x = s_->ndarray(DType::kF32, {kSteps + 1, kN}, "x");
    ASSERT_TRUE(x.ok());
    ASSERT_TRUE(s_->upload(*x, std::span<const float>(rows)).ok());
    Tape tape(*s_);
    if (looped) {
      const TapeLoopLaunch body[] = {{&*d, {Arg::i32(0), Arg::ndarray(*x)}, {1, 0}}};
      LoopInfo info;
      Status st = tape.launch_loop(body, kSteps, &info);
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_TRUE(info.rolled);        // 64 elements, 10 iterations: one resident kernel
      EXPECT_EQ(tape.launches(), 1u);  // the body's one launch, with its steps and count
    } else {
      for (int k = 0; k < kSteps; ++k) {
        ASSERT_TRUE(tape.launch(*d, {Arg::i32(k), Arg::ndarray(*x)}).ok());
      }
    }
    ASSERT_TRUE(tape.backward({TapeSeed::of_data(*x, std::span<const float>(seed))}).ok());
    auto g = tape.grad(*x);
    ASSERT_TRUE(g.ok());
    std::vector<float> all(rows.size());
    ASSERT_TRUE(s_->download(*g, std::span<float>(all)).ok());
    grads.emplace_back(all.begin(), all.begin() + kN);  // row 0: d(row kSteps) / d(row 0)
    expect_near(grads.back(), chain_gradient(x0, 0, kSteps));
    ASSERT_TRUE(s_->free(*x).ok());
  }
  for (uint32_t i = 0; i < kN; ++i) EXPECT_NEAR(grads[0][i], grads[1][i], 1e-5) << i;
}

TEST_F(TapeTest, ALaunchLoopThatWouldSpoilGradientsIsRefusedBeforeItRuns) {
  auto d = s_->differentiate(sin_row());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  auto x = s_->ndarray(DType::kF32, {kSteps + 1, kN}, "x");
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(s_->zero(*x).ok());
  Tape tape(*s_);
  // Without a step every iteration writes row 1 again, which the first wrote, differentiated.
  const TapeLoopLaunch body[] = {{&*d, {Arg::i32(0), Arg::ndarray(*x)}, {}}};
  Status st = tape.launch_loop(body, 3);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tape.launch_loop: launch 0 of the body ('sin_row'), iteration 1"),
            std::string::npos)
      << st.to_string();
  EXPECT_EQ(tape.launches(), 0u);
  std::vector<float> row1(size_t{kSteps + 1} * kN);
  ASSERT_TRUE(s_->download(*x, std::span<float>(row1)).ok());
  EXPECT_EQ(row1[kN], 0.0f);  // nothing ran
  // A hand-made i32 argument out of range, stepping: refused before r * step is added to it
  // (signed overflow, undefined behaviour, for a start near INT64_MAX).
  TapeLoopLaunch huge = {&*d, {Arg::i32(0), Arg::ndarray(*x)}, {1, 0}};
  huge.args[0].i = INT64_MAX;
  st = tape.launch_loop({&huge, 1}, 3);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tape.launch_loop: launch 0 of the body, iteration 0: argument 0 "
                              "(i32) value " +
                              std::to_string(INT64_MAX) + " does not fit"),
            std::string::npos)
      << st.to_string();
  EXPECT_EQ(tape.launches(), 0u);
  // The record is as before: the loop with its step goes on the same tape.
  const TapeLoopLaunch stepping[] = {{&*d, {Arg::i32(0), Arg::ndarray(*x)}, {1, 0}}};
  EXPECT_TRUE(tape.launch_loop(stepping, kSteps).ok());
}

// y[i] = sin(a x[i]) with a scalar `a` marked grad: the tape keeps its gradient in a {1} array
// (scalar_grad), summed over the recording's launches of the kernel.
constexpr const char* kScaledSin = R"(
kernel scaled(a: f32 grad, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = arg a : f32
    %3 = mul %1, %2 : f32
    %4 = sin %3 : f32
    store y[%0], %4
  }
})";

TEST_F(TapeTest, ScalarParameterGradientSumsOverLaunches) {
  auto d = s_->differentiate(kScaledSin);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> x0 = start_values();
  NdArrayHandle x = make(kN, "x"), y = make(kN, "y"), z = make(kN, "z");
  ASSERT_TRUE(s_->upload(x, std::span<const float>(x0)).ok());
  const float a = 0.8f;
  Tape tape(*s_);
  for (int it = 0; it < 2; ++it) {  // a second backward zeroes the scalar's gradient again
    tape.reset();
    ASSERT_TRUE(tape.launch(*d, {Arg::f32(a), Arg::ndarray(x), Arg::ndarray(y)}).ok());
    ASSERT_TRUE(tape.launch(*d, {Arg::f32(a), Arg::ndarray(y), Arg::ndarray(z)}).ok());
    ASSERT_TRUE(tape.backward({TapeSeed::of_value(z, 1.0)}).ok());
    auto g = tape.scalar_grad(*d, 0);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    // L = sum sin(a sin(a x)): dL/da = sum cos(a y) (y + a cos(a x) x), y = sin(a x).
    double want = 0;
    for (float xf : x0) {
      const double xv = xf, yv = std::sin(a * xv);
      want += std::cos(a * yv) * (yv + a * std::cos(a * xv) * xv);
    }
    // Central differences of the closed form agree with it (the form is the derivative).
    auto loss = [&](double av) {
      double l = 0;
      for (float xf : x0) l += std::sin(av * std::sin(av * xf));
      return l;
    };
    const double fd = (loss(a + 1e-5) - loss(a - 1e-5)) / 2e-5;
    ASSERT_NEAR(fd, want, 1e-6 * std::fabs(want));
    EXPECT_NEAR(read(*g, 1)[0], want, 2e-3 * std::fabs(want)) << "iteration " << it;
  }
  // Not a differentiated scalar: x (an array's gradient is grad(x)) and a parameter past the
  // kernel's.
  for (uint32_t p : {1u, 7u}) {
    auto bad = tape.scalar_grad(*d, p);
    EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find(p == 1 ? "has no scalar gradient: it is an ndarray"
                                                 : "is not a differentiated (grad) parameter"),
              std::string::npos)
        << bad.status().message();
  }
}

// What the Python binding's tape needs of vkad::Tape (issue 52, point 5): a loop's plain kernels,
// kept loop checks, the caller's gradient taken back, what a backward launched, and a freed
// array's adjoint named.

// y[i] = x[1, i] * 2: a kernel that is not differentiated, beside sin_row in a loop's body.
constexpr const char* kDoubleRow = R"(
kernel double_row(x: ndarray<f32, 2>, y: ndarray<f32, 1>) {
  task main parallel %0 in [0, shape(y, 0)) {
    %r = const 1 : i32
    %1 = load x[%r, %0] : f32
    %2 = const 2.0 : f32
    %3 = mul %1, %2 : f32
    store y[%0], %3
  }
})";

TEST_F(TapeTest, ALoopsPlainKernelRunsUnrecordedAndBackwardListsTheAdjointLoop) {
  auto d = s_->differentiate(sin_row());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  auto plain = s_->compile(kDoubleRow);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  const std::vector<float> x0 = start_values();
  std::vector<float> rows(size_t{kSteps + 1} * kN, 0.0f), seed(rows.size(), 0.0f);
  std::copy(x0.begin(), x0.end(), rows.begin());
  std::fill(seed.begin() + size_t{kSteps} * kN, seed.end(), 1.0f);
  auto x = s_->ndarray(DType::kF32, {kSteps + 1, kN}, "x");
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(s_->upload(*x, std::span<const float>(rows)).ok());
  NdArrayHandle y = make(kN, "y");
  Tape tape(*s_);
  TapeLoopLaunch body[2] = {{&*d, {Arg::i32(0), Arg::ndarray(*x)}, {1, 0}}, {}};
  body[1].kernel = *plain;
  body[1].args = {Arg::ndarray(*x), Arg::ndarray(y)};
  LoopInfo info;
  Status st = tape.launch_loop(body, kSteps, &info);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(tape.launches(), 1u);  // only the differentiated launch is recorded
  const std::vector<float> got_y = read(y, kN);
  for (uint32_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(got_y[i], 2 * (std::sin(x0[i]) * 0.9 + 0.1), 1e-3) << "the plain kernel ran";
  }
  // Neither d nor kernel: refused, nothing recorded.
  const TapeLoopLaunch empty[] = {{nullptr, {Arg::ndarray(*x)}, {}}};
  st = tape.launch_loop(empty, 2);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no differentiate() result, nor a kernel"), std::string::npos);
  EXPECT_EQ(tape.launches(), 1u);
  std::vector<TapeAdjointLaunch> launched;
  ASSERT_TRUE(
      tape.backward(std::vector<TapeSeed>{TapeSeed::of_data(*x, std::span<const float>(seed))},
                    &launched)
          .ok());
  ASSERT_EQ(launched.size(), 1u);
  EXPECT_TRUE(launched[0].is_loop);
  EXPECT_EQ(launched[0].record, 0u);
  EXPECT_GE(launched[0].loop.launches, 1u);
  auto g = tape.grad(*x);
  ASSERT_TRUE(g.ok());
  std::vector<float> all(rows.size());
  ASSERT_TRUE(s_->download(*g, std::span<float>(all)).ok());
  expect_near(std::vector<float>(all.begin(), all.begin() + kN), chain_gradient(x0, 0, kSteps));
}

TEST_F(TapeTest, LoopChecksAreKeptForALoopFirstInARecordingAndRefusedOnesAreNot) {
  auto d = s_->differentiate(sin_row());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  auto x = s_->ndarray(DType::kF32, {kSteps + 1, kN}, "x");
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(s_->zero(*x).ok());
  auto checks = std::make_shared<TapeLoopChecks>();
  const TapeLoopLaunch refused[] = {{&*d, {Arg::i32(0), Arg::ndarray(*x)}, {}}};
  Status st = checks->prepare(*s_, refused, 3);
  EXPECT_NE(st.message().find("launch 0 of the body ('sin_row'), iteration 1"), std::string::npos)
      << st.to_string();
  EXPECT_EQ(checks->size(), 0u);
  const TapeLoopLaunch stepping[] = {{&*d, {Arg::i32(0), Arg::ndarray(*x)}, {1, 0}}};
  ASSERT_TRUE(checks->prepare(*s_, stepping, kSteps).ok());
  EXPECT_EQ(checks->size(), 1u);
  Tape tape(*s_);
  tape.set_loop_checks(checks);
  for (int it = 0; it < 2; ++it) {  // the kept check, taken; then the tape goes on from it
    tape.reset();
    ASSERT_TRUE(tape.launch_loop(stepping, kSteps).ok());
    EXPECT_EQ(checks->size(), 1u);
    // What the kept record says was read: row kSteps - 1, so writing it again is refused.
    st = tape.launch(*d, {Arg::i32(kSteps - 2), Arg::ndarray(*x)});
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  }
  // Another loop first in a recording is checked and kept too.
  tape.reset();
  ASSERT_TRUE(tape.launch_loop(stepping, kSteps - 1).ok());
  EXPECT_EQ(checks->size(), 2u);
  // Not first in its recording: checked against the record, not kept.
  const TapeLoopLaunch last[] = {{&*d, {Arg::i32(kSteps - 1), Arg::ndarray(*x)}, {1, 0}}};
  ASSERT_TRUE(tape.launch_loop(last, 1).ok());
  EXPECT_EQ(checks->size(), 2u);
}

TEST_F(TapeTest, SetGradOfNoneGivesTheGradientBackToTheTape) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok());
  NdArrayHandle a = make(kN, "a"), b = make(kN, "b"), mine = make(kN, "mine");
  ASSERT_TRUE(s_->zero(a).ok());
  Tape tape(*s_);
  ASSERT_TRUE(tape.set_grad(a, mine).ok());
  EXPECT_TRUE(tape.has_grad(a));
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(a), Arg::ndarray(b)}).ok());
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(b, 1.0)}).ok());
  EXPECT_EQ(tape.grad(a)->id, mine.id);
  ASSERT_TRUE(tape.set_grad(a, NdArrayHandle{}).ok());
  EXPECT_FALSE(tape.has_grad(a));
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(b, 1.0)}).ok());
  auto g = tape.grad(a);
  ASSERT_TRUE(g.ok());
  EXPECT_NE(g->id, mine.id);                            // the tape's own, made by that backward
  EXPECT_NEAR(read(*g, kN)[0], 0.9, 1e-3);              // d(0.9 sin(a) + 0.1)/da at a = 0
  ASSERT_TRUE(tape.set_grad(a, NdArrayHandle{}).ok());  // a gradient the tape made stays
  EXPECT_TRUE(tape.has_grad(a));
  EXPECT_NEAR(read(mine, kN)[0], 0.9, 1e-3);  // the caller's, left as the first backward left it
}

TEST_F(TapeTest, ADifferentiatedArrayFreedAfterItsLaunchIsNamedByThatLaunchsAdjoint) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok());
  NdArrayHandle x0 = make(kN, "x0"), y0 = make(kN, "y0"), x1 = make(kN, "x1"), y1 = make(kN, "y1");
  ASSERT_TRUE(s_->zero(x0).ok());
  ASSERT_TRUE(s_->zero(x1).ok());
  Tape tape(*s_);
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(x0), Arg::ndarray(y0)}).ok());
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(x1), Arg::ndarray(y1)}).ok());
  ASSERT_TRUE(s_->free(x1).ok());
  const uint64_t launches = stats().launches;
  Status st = tape.backward({TapeSeed::of_value(y0, 1.0), TapeSeed::of_value(y1, 1.0)});
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("tape.backward: adjoint of launch 1: ", 0), 0u) << st.message();
  EXPECT_EQ(stats().launches, launches);  // launch 1's adjoint is the first; none ran
}

// Writes from outside the recording (NVIDIA/warp#1350: Warp's tape differentiates at whatever
// the arrays hold when backward runs, silently). x0 -> x1 -> x2 recorded; then x1, which launch
// 1 reads, is written by something not on the tape: backward refuses, naming the array and the
// writer, and nothing it would have read is changed. An outside launch that only reads x1, or
// writes the recording's output x2 (which no recorded launch reads), is no reason to refuse.
TEST_F(TapeTest, AnArrayTheRecordingReadsWrittenOutsideItIsRefusedNamingTheWriter) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  auto plain = s_->compile(sin_step());  // the forward alone: reads x, writes y
  ASSERT_TRUE(plain.ok());
  const std::vector<float> x0 = start_values();
  NdArrayHandle x[3] = {make(kN, "x0"), make(kN, "x1"), make(kN, "x2")};
  NdArrayHandle scratch = make(kN, "scratch");
  ASSERT_TRUE(s_->upload(x[0], std::span<const float>(x0)).ok());
  auto record = [&](Tape& t) {
    for (int k = 0; k < 2; ++k) {
      Status st = t.launch(*d, {Arg::ndarray(x[k]), Arg::ndarray(x[k + 1])});
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  };
  auto refused = [&](Status st, const char* writer) {
    EXPECT_EQ(st.code(), ErrorCode::kFailedPrecondition) << st.to_string();
    EXPECT_NE(st.message().find("'x1'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(writer), std::string::npos) << st.message();
  };
  Tape tape(*s_);
  record(tape);
  // Reading x1 or writing x2 outside the recording: backward runs, with the right gradient.
  ASSERT_TRUE(s_->launch(*plain, {Arg::ndarray(x[1]), Arg::ndarray(scratch)}).ok());
  ASSERT_TRUE(s_->launch(*plain, {Arg::ndarray(scratch), Arg::ndarray(x[2])}).ok());
  ASSERT_TRUE(s_->launch(*plain, {Arg::ndarray(x[0]), Arg::ndarray(x[1])}).ok());  // x1 again
  // (the same values: the launch is what counts, not what it stores)
  refused(tape.backward({TapeSeed::of_value(x[2], 1.0)}), "a launch of 'sin_step'");
  tape.reset();
  record(tape);
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(x[2], 1.0)}).ok());
  expect_near(read(*tape.grad(x[0]), kN), chain_gradient(x0, 0, 2));
  // An upload, a fill, a copy into x1: refused, each named; and a later recorded launch that
  // uses x1 is refused too, before it runs.
  const std::vector<float> ones(kN, 1.0f);
  ASSERT_TRUE(s_->upload(x[1], std::span<const float>(ones)).ok());
  refused(tape.backward({TapeSeed::of_value(x[2], 1.0)}), "an upload");
  refused(tape.launch(*d, {Arg::ndarray(x[1]), Arg::ndarray(scratch)}), "an upload");
  tape.reset();
  record(tape);
  ASSERT_TRUE(s_->fill(x[1], 0.5).ok());
  refused(tape.backward({TapeSeed::of_value(x[2], 1.0)}), "a fill");
  tape.reset();
  record(tape);
  ASSERT_TRUE(s_->copy(x[0], x[1]).ok());
  refused(tape.backward({TapeSeed::of_value(x[2], 1.0)}), "a copy");
  // Recorded again: the gradient is that of the arrays as they now are.
  tape.reset();
  record(tape);
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(x[2], 1.0)}).ok());
  expect_near(read(*tape.grad(x[0]), kN), chain_gradient(x0, 0, 2));
}

}  // namespace
}  // namespace vkad::testing

namespace vkad::testing {
namespace {

// Tape::copy (NVIDIA/warp#1728's case): a copy of an array the recording touched is recorded as
// the differentiated copy, so the gradient reaching the copy reaches its source; a copy of
// arrays the recording has not touched is their state before it (plain, not recorded); a copy
// into an array a recorded launch read is refused like any launch that would overwrite it.
TEST_F(TapeTest, ACopyInTheRecordingPassesTheGradientToItsSource) {
  auto d = s_->differentiate(sin_step());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> x0 = start_values();
  NdArrayHandle x = make(kN, "x"), z = make(kN, "z"), y1 = make(kN, "y1"), y2 = make(kN, "y2");
  ASSERT_TRUE(s_->upload(x, std::span<const float>(x0)).ok());
  Tape tape(*s_);
  ASSERT_TRUE(tape.copy(x, z).ok());  // nothing touched yet: the state before the recording
  EXPECT_EQ(tape.launches(), 0u);
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(x), Arg::ndarray(y1)}).ok());
  Status st = tape.copy(x, z);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(tape.launches(), 2u);
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(z), Arg::ndarray(y2)}).ok());
  st = tape.copy(y2, x);  // x was read by launch 0
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("ndarray 'x'"), std::string::npos) << st.to_string();
  EXPECT_EQ(tape.launches(), 3u);
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(y1, 1.0), TapeSeed::of_value(y2, 1.0)}).ok());
  auto g = tape.grad(x);
  ASSERT_TRUE(g.ok());
  // y1 and y2 are each 0.9 sin(x) + 0.1 of the same values: d(y1 + y2)/dx = 2 x 0.9 cos(x).
  expect_near(read(*g, kN), chain_gradient(x0, 0, 1), 2.0);
}

}  // namespace
}  // namespace vkad::testing
