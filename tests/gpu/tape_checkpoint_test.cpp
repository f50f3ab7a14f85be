// Checkpointing across launches (Tape::set_checkpoint_every, api/tape.h): a program that
// reuses two state arrays (a ring) gets, with segments of K launches, the gradients the same
// program gets with one array per step on the default tape, and its arrays hold the forward's
// end state afterwards.
#include <gtest/gtest.h>

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

float c_of(uint32_t j) { return 0.9f - 0.03f * static_cast<float>(j); }

class TapeCheckpoint : public ValidatedSessionFixture<::testing::TestWithParam<uint32_t>> {
 protected:
  void SetUp() override {
    ValidatedSessionFixture<::testing::TestWithParam<uint32_t>>::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto d = s_->differentiate(std::string_view(kStep));
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    step_ = *d;
    auto l = s_->differentiate(std::string_view(kLoss));
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    loss_ = *l;
    for (uint32_t i = 0; i < kN; ++i) x0_.push_back(0.01f * static_cast<float>(i));
  }
  NdArrayHandle array(const std::vector<float>& v, const std::string& name) {
    auto h = s_->ndarray(DType::kF32, {static_cast<uint32_t>(v.size())}, name);
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(s_->upload(*h, std::span<const float>(v)).ok());
    return *h;
  }
  std::vector<float> read(NdArrayHandle h, uint32_t n = kN) {
    std::vector<float> out(n);
    EXPECT_TRUE(s_->download(h, std::span<float>(out)).ok());
    return out;
  }
  Differentiated step_, loss_;
  std::vector<float> x0_;
};

// The reference: one array per step, default tape. Returns dL/dx0, x_S and the loss.
struct Reference {
  std::vector<float> grad, last;
  float loss = 0;
};

TEST_P(TapeCheckpoint, ARingOfTwoArraysGetsThePerStepProgramsGradients) {
  const uint32_t k = GetParam();
  Reference want;
  {
    Tape t(*s_);
    std::vector<NdArrayHandle> xs;
    for (uint32_t j = 0; j <= kSteps; ++j) {
      xs.push_back(array(j == 0 ? x0_ : std::vector<float>(kN, 0), "x" + std::to_string(j)));
    }
    NdArrayHandle loss = array({0}, "loss");
    for (uint32_t j = 0; j < kSteps; ++j) {
      ASSERT_TRUE(
          t.launch(step_, {Arg::ndarray(xs[j]), Arg::ndarray(xs[j + 1]), Arg::f32(c_of(j))}).ok());
    }
    ASSERT_TRUE(t.launch(loss_, {Arg::ndarray(xs[kSteps]), Arg::ndarray(loss)}).ok());
    ASSERT_TRUE(t.backward({TapeSeed::of_value(loss, 1.0)}).ok());
    want.grad = read(*t.grad(xs[0]));
    want.last = read(xs[kSteps]);
    want.loss = read(loss, 1)[0];
  }
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
    for (uint32_t i = 0; i < kN; ++i) {
      // The same f32 operations; only the loss's atomic sum may add in another order.
      ASSERT_NEAR(got[i], want.grad[i], 1e-5 * std::fabs(want.grad[i]) + 1e-7)
          << "K = " << k << ", element " << i << ", iteration " << iteration;
    }
    // The arrays hold what the forward left.
    const std::vector<float> last = read(ring[kSteps % 2]);
    for (uint32_t i = 0; i < kN; ++i) EXPECT_EQ(last[i], want.last[i]) << i;
    EXPECT_NEAR(read(loss, 1)[0], want.loss, 1e-5 * std::fabs(want.loss));
    // The second iteration reuses every copy and gradient: no device memory is made.
    const uint64_t now = s_->stats()->vulkan_objects_created;
    if (iteration == 1) {
      EXPECT_EQ(now, created);
    }
    created = now;
  }
}

INSTANTIATE_TEST_SUITE_P(Segments, TapeCheckpoint, ::testing::Values(1u, 2u, 3u, 8u),
                         [](const auto& info) { return "K" + std::to_string(info.param); });

}  // namespace
}  // namespace vkad::testing
