// An array a kernel updates in place (x[i] = f(x[i], ...), taichi-dev/taichi#2505's form):
// Session::differentiate splits it (autodiff/in_place.h) and the tape keeps a copy of the array
// from before each such launch for its adjoint. Gradients against the closed form, launched
// once, twice in a row and as a step loop; what is refused and how. Validation on.
#include <gtest/gtest.h>

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

constexpr uint32_t kN = 40;

// x[i] = 0.5 x[i]^2 + w[i], in place.
codegen::Kernel square_in_place() {
  KernelBuilder kb("square_in_place");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array w = kb.ndarray("w", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Value v = x(i);
    x.store({i}, v * v * 0.5 + w(i));
  });
  return kb.finish();
}

class InPlaceTapeTest : public ValidatedSessionTest {
 protected:
  NdArrayHandle upload(const std::vector<float>& v, const char* name) {
    auto h = s_->ndarray(DType::kF32, {static_cast<uint32_t>(v.size())}, name);
    EXPECT_TRUE(h.ok());
    if (!h.ok()) return {};
    EXPECT_TRUE(s_->upload(*h, std::span<const float>(v)).ok());
    return *h;
  }
  std::vector<float> read(NdArrayHandle h) {
    std::vector<float> out(kN);
    Status st = s_->download(h, std::span<float>(out));
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }
};

std::vector<float> values(float lo, float span) {
  std::vector<float> v(kN);
  for (uint32_t i = 0; i < kN; ++i) v[i] = lo + span * static_cast<float>(i) / kN;
  return v;
}

TEST_F(InPlaceTapeTest, UpdatesInPlaceGetTheGradientsOfTheValuesTheyReplaced) {
  auto d = s_->differentiate(square_in_place());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_EQ(d->in_place, std::vector<uint32_t>{0});
  const std::vector<codegen::InPlaceParam>* split = s_->in_place(d->adjoint);
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(s_->in_place(d->forward), nullptr);
  const std::vector<float> x0 = values(-1.2f, 2.6f), w = values(0.3f, -0.9f);
  // Once, twice in a row (the second reads what the first stored), and as a step loop of 3.
  for (int launches : {1, 2, 3}) {
    SCOPED_TRACE("launches " + std::to_string(launches));
    NdArrayHandle x = upload(x0, "x"), wh = upload(w, "w");
    Tape tape(*s_);
    if (launches == 3) {
      const TapeLoopLaunch body[] = {{&*d, {Arg::ndarray(x), Arg::ndarray(wh)}, {}}};
      LoopInfo info;
      Status st = tape.launch_loop(body, 3, &info);
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(tape.launches(), 3u);  // one by one: each launch's adjoint reads its own copy
    } else {
      for (int k = 0; k < launches; ++k) {
        Status st = tape.launch(*d, {Arg::ndarray(x), Arg::ndarray(wh)});
        ASSERT_TRUE(st.ok()) << st.to_string();
      }
    }
    Status st = tape.backward({TapeSeed::of_value(x, 1.0)});
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto gx = tape.grad(x);
    auto gw = tape.grad(wh);
    ASSERT_TRUE(gx.ok() && gw.ok());
    const std::vector<float> got_x = read(*gx), got_w = read(*gw), out = read(x);
    for (uint32_t i = 0; i < kN; ++i) {
      // x_{k+1} = 0.5 x_k^2 + w: d x_n / d x_0 = prod x_k, d x_n / d w = sum_k prod_{j > k} x_j.
      double v = x0[i], dx = 1, dw = 0;
      for (int k = 0; k < launches; ++k) {
        dw = dw * v + 1;
        dx *= v;
        v = static_cast<double>(static_cast<float>(0.5 * v * v + w[i]));
      }
      EXPECT_NEAR(out[i], v, 1e-5 * (1 + std::fabs(v))) << "x after, element " << i;
      EXPECT_NEAR(got_x[i], dx, 1e-5 * (1 + std::fabs(dx))) << "d x_n / d x_0, element " << i;
      EXPECT_NEAR(got_w[i], dw, 1e-5 * (1 + std::fabs(dw))) << "d x_n / d w, element " << i;
    }
    tape.reset();
    ASSERT_TRUE(s_->free(x).ok());
    ASSERT_TRUE(s_->free(wh).ok());
  }
}

// Two updates in place and their backward captured as a graph (the copies are launches there),
// replayed on two inputs: the closed form's gradients each time.
TEST_F(InPlaceTapeTest, ACapturedIterationReplaysToTheClosedForm) {
  auto d = s_->differentiate(square_in_place());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> x0 = values(-1.2f, 2.6f), w = values(0.3f, -0.9f);
  NdArrayHandle x = upload(x0, "x"), wh = upload(w, "w");
  Tape tape(*s_);
  ASSERT_TRUE(s_->begin_capture("in place").ok());
  for (int k = 0; k < 2; ++k) {
    Status st = tape.launch(*d, {Arg::ndarray(x), Arg::ndarray(wh)});
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  Status st = tape.backward({TapeSeed::of_value(x, 1.0)});
  ASSERT_TRUE(st.ok()) << st.to_string();
  Result<GraphHandle> g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s_->finish_rework(*g).ok());
  auto gx = tape.grad(x);
  auto gw = tape.grad(wh);
  ASSERT_TRUE(gx.ok() && gw.ok());
  for (float scale : {1.0f, 0.5f}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    std::vector<float> start = x0;
    for (float& v : start) v *= scale;
    ASSERT_TRUE(s_->upload(x, std::span<const float>(start)).ok());
    st = s_->replay(*g);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const std::vector<float> got_x = read(*gx), got_w = read(*gw);
    for (uint32_t i = 0; i < kN; ++i) {
      const double x1 = static_cast<double>(static_cast<float>(0.5 * start[i] * start[i] + w[i]));
      EXPECT_NEAR(got_x[i], x1 * start[i], 1e-5 * (1 + std::fabs(x1 * start[i]))) << i;
      EXPECT_NEAR(got_w[i], x1 + 1, 1e-5 * (1 + std::fabs(x1))) << i;
    }
  }
  EXPECT_TRUE(s_->release_graph(*g).ok());
}

TEST_F(InPlaceTapeTest, WithoutATapeOrWithCheckpointingItIsRefusedSayingWhy) {
  auto d = s_->differentiate(square_in_place());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  NdArrayHandle x = upload(values(0.1f, 1.0f), "x"), w = upload(values(0.0f, 1.0f), "w");
  auto gx = s_->ndarray(DType::kF32, {kN}, "x_grad");
  auto gw = s_->ndarray(DType::kF32, {kN}, "w_grad");
  ASSERT_TRUE(gx.ok() && gw.ok());
  const std::vector<Arg> fwd = {Arg::ndarray(x), Arg::ndarray(w)};
  const std::vector<NdArrayHandle> grads = {*gx, *gw};
  auto args = d->adjoint_args(fwd, grads);
  ASSERT_TRUE(args.ok());
  Status st = s_->launch(d->adjoint, *args);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("square_in_place"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("in place"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("Tape"), std::string::npos) << st.to_string();
  Tape tape(*s_);
  ASSERT_TRUE(tape.set_checkpoint_every(2).ok());
  st = tape.launch(*d, fwd);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("in place"), std::string::npos) << st.to_string();
  EXPECT_EQ(tape.launches(), 0u);
  // The forward alone, off any tape, runs as written.
  ASSERT_TRUE(s_->launch(d->forward, fwd).ok());
  EXPECT_NEAR(read(x)[3], 0.5f * std::pow(0.1f + 3.0f / kN, 2.0f) + 3.0f / kN, 1e-6);
}

// x[i] = 0.5 x[i]^2 and z[i] = 0.5 z[i]^2 in one kernel: both split. One array bound to both is
// refused (each copy would hold the array before the launch, and the adjoint would miss that
// the second update read the first's result), as without the split.
TEST_F(InPlaceTapeTest, OneArrayPassedForTwoUpdatedParametersIsRefused) {
  KernelBuilder kb("two_updates");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array z = kb.ndarray("z", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Value a = x(i);
    Value b = z(i);
    x.store({i}, a * a * 0.5);
    z.store({i}, b * b * 0.5);
  });
  auto d = s_->differentiate(kb.finish());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->in_place, (std::vector<uint32_t>{0, 1}));
  NdArrayHandle a = upload(values(0.5f, 1.0f), "a"), b = upload(values(0.2f, 1.0f), "b");
  Tape tape(*s_);
  Status st = tape.launch(*d, {Arg::ndarray(a), Arg::ndarray(a)});
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("ndarray 'a'"), std::string::npos) << st.to_string();
  EXPECT_EQ(tape.launches(), 0u);
  // Two arrays: both gradients, d(0.5 v^2)/dv = v.
  const std::vector<float> a0 = read(a), b0 = read(b);
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(a), Arg::ndarray(b)}).ok());
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(a, 1.0), TapeSeed::of_value(b, 1.0)}).ok());
  auto ga = tape.grad(a);
  auto gb = tape.grad(b);
  ASSERT_TRUE(ga.ok() && gb.ok());
  const std::vector<float> got_a = read(*ga), got_b = read(*gb);
  for (uint32_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(got_a[i], a0[i], 1e-6) << i;
    EXPECT_NEAR(got_b[i], b0[i], 1e-6) << i;
  }
}

// A step loop recorded launch by launch whose second body launch is refused (it updates x in
// place after the first read x, differentiated) leaves the first recorded: backward refuses
// until reset() rather than differentiate part of the loop.
TEST_F(InPlaceTapeTest, AStepLoopRefusedPartWayLeavesTheTapeRefusingBackward) {
  KernelBuilder kb("sin_of");
  Array xp = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array yp = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, xp.dim(0), [&](Value i) { yp.store({i}, sin(xp(i))); });
  auto reader = s_->differentiate(kb.finish());
  auto d = s_->differentiate(square_in_place());
  ASSERT_TRUE(reader.ok() && d.ok());
  NdArrayHandle x = upload(values(0.1f, 1.0f), "x"), w = upload(values(0.0f, 1.0f), "w");
  NdArrayHandle y = upload(values(0.0f, 0.0f), "y");
  Tape tape(*s_);
  const TapeLoopLaunch body[] = {{&*reader, {Arg::ndarray(x), Arg::ndarray(y)}, {}},
                                 {&*d, {Arg::ndarray(x), Arg::ndarray(w)}, {}}};
  Status st = tape.launch_loop(body, 2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("iteration 0"), std::string::npos) << st.to_string();
  EXPECT_EQ(tape.launches(), 1u);  // sin_of ran and is recorded
  st = tape.backward({TapeSeed::of_value(y, 1.0)});
  EXPECT_EQ(st.code(), ErrorCode::kFailedPrecondition) << st.to_string();
  EXPECT_NE(st.message().find("launch_loop"), std::string::npos) << st.to_string();
  tape.reset();
  ASSERT_TRUE(tape.launch(*reader, {Arg::ndarray(x), Arg::ndarray(y)}).ok());
  EXPECT_TRUE(tape.backward({TapeSeed::of_value(y, 1.0)}).ok());
}

// What the split does not take stays refused with reverse mode's message: a load after the
// store (it would read the new value) and a loop that loads and stores.
TEST_F(InPlaceTapeTest, AnUpdateThatReadsWhatItStoredIsStillRefused) {
  for (int form : {0, 1}) {
    KernelBuilder kb("reads_after");
    Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
    Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
    kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
      if (form == 0) {
        x.store({i}, x(i) * 2.0);
        y.store({i}, sin(x(i) + 0.0));  // reads the new value
      } else {
        kb.for_range(kb.i32(0), kb.i32(3), [&](Value) { x.store({i}, sin(x(i))); });
      }
    });
    auto d = s_->differentiate(kb.finish());
    ASSERT_FALSE(d.ok()) << "form " << form;
    EXPECT_EQ(d.status().code(), ErrorCode::kInvalidArgument);
    // Form 0: read and written; form 1: stored in every trip of the loop at one element.
    EXPECT_NE(d.status().message().find(form == 0 ? "both read and written" : "every iteration"),
              std::string::npos)
        << d.status().to_string();
  }
}

}  // namespace
}  // namespace vkad::testing
