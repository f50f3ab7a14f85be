// The NaN / infinity checks (issue 56, point 2; CompileOptions::check_finite): with them on, the
// first NaN or infinity a launch stores or atomically adds into an ndarray -- in a forward
// kernel or in an adjoint's gradient accumulation -- is a kDeviceError naming the kernel, the
// task and the statement; the values are stored as without the checks; off, nothing is
// checked.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <span>
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

constexpr uint32_t kN = 256;

// y[i] = x[i] * 2 (finite for finite x), then z[i] = log(x[i]) (-inf at 0, NaN below).
codegen::Kernel two_stores() {
  KernelBuilder kb("two_stores");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  Array z = kb.ndarray("z", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    y.store({i}, x(i) * 2.0);
    z.store({i}, log(x(i)));
  });
  return kb.finish();
}

// y[i] = sqrt(x[i]): finite at 0, its derivative 0.5 / sqrt(x) is not.
codegen::Kernel root() {
  KernelBuilder kb("root");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { y.store({i}, sqrt(x(i))); });
  return kb.finish();
}

class FiniteChecks : public ValidatedSessionTest {
 protected:
  void adjust(SessionOptions& o) override { o.compile.check_finite = true; }
  NdArrayHandle make(const char* name, const std::vector<float>& values) {
    auto h = s_->ndarray(DType::kF32, {kN}, name);
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(s_->upload(*h, std::span<const float>(values)).ok());
    return *h;
  }
  std::vector<float> read(NdArrayHandle h) {
    std::vector<float> out(kN);
    EXPECT_TRUE(s_->download(h, std::span<float>(out)).ok());
    return out;
  }
};

std::vector<float> positive_with_zero_at(uint32_t at) {
  std::vector<float> x(kN);
  for (uint32_t i = 0; i < kN; ++i) x[i] = 0.5f + 0.01f * static_cast<float>(i);
  x[at] = 0.0f;
  return x;
}

TEST_F(FiniteChecks, ALogOfZeroInAForwardKernelNamesTheStatementAndKeepsTheValue) {
  auto k = s_->compile(two_stores());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  NdArrayHandle x = make("x", positive_with_zero_at(17)), y = make("y", std::vector<float>(kN)),
                z = make("z", std::vector<float>(kN));
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(z)}).ok());
  Status st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  // The second store (z = log x) is named, not the first (y = 2x, finite).
  EXPECT_NE(st.message().find("kernel 'two_stores', task 'main': a NaN or an infinity was "
                              "stored by `store z["),
            std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("`store y["), std::string::npos) << st.message();
  EXPECT_EQ(s_->runtime().device_errors().at(0).code, runtime::kErrorNonFinite);
  // Stored all the same (-inf), and the runtime goes on.
  const std::vector<float> got = read(z);
  EXPECT_EQ(got[17], -std::numeric_limits<float>::infinity());
  EXPECT_NEAR(got[0], std::log(0.5f), 1e-6);
  ASSERT_TRUE(s_->upload(x, std::span<const float>(std::vector<float>(kN, 2.0f))).ok());
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(z)}).ok());
  EXPECT_TRUE(s_->synchronize().ok()) << "finite values raise nothing";
}

TEST_F(FiniteChecks, AnInfiniteGradientInTheAdjointNamesTheAdjointKernel) {
  auto d = s_->differentiate(root());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  NdArrayHandle x = make("x", positive_with_zero_at(3)), y = make("y", std::vector<float>(kN));
  Tape tape(*s_);
  ASSERT_TRUE(tape.launch(*d, {Arg::ndarray(x), Arg::ndarray(y)}).ok());
  ASSERT_TRUE(s_->synchronize().ok()) << "sqrt(0) = 0 is finite";
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(y, 1.0)}).ok());
  Status st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("kernel 'root_adjoint'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("a NaN or an infinity was stored by `"), std::string::npos)
      << st.message();
  auto g = tape.grad(x);
  ASSERT_TRUE(g.ok());
  const std::vector<float> grad = read(*g);
  EXPECT_TRUE(std::isinf(grad[3]));
  EXPECT_NEAR(grad[0], 0.5 / std::sqrt(0.5), 1e-5);
}

// The bounds checks (on by default) name the access that went out of bounds: y[i + 1] at the
// last element, not the in-bounds load of x before it.
TEST_F(FiniteChecks, AnOutOfBoundsAccessNamesItsStatement) {
  KernelBuilder kb("shift");
  Array xa = kb.ndarray("x", DType::kF32, 1);
  Array ya = kb.ndarray("y", DType::kF32, 1);
  kb.parallel_for("main", 0, xa.dim(0), [&](Value i) { ya.store({i + 1}, xa(i)); });
  auto k = s_->compile(kb.finish());
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  NdArrayHandle x = make("x", std::vector<float>(kN, 1.0f)), y = make("y", std::vector<float>(kN));
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(x), Arg::ndarray(y)}).ok());
  Status st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("kernel 'shift', task 'main': out-of-bounds ndarray access by "
                              "`store y["),
            std::string::npos)
      << st.message();
  EXPECT_EQ(read(y)[kN - 1], 1.0f) << "the in-bounds stores were made";
}

// Off (the default), the same launches report nothing: no check is compiled in.
class NoFiniteChecks : public FiniteChecks {
 protected:
  void adjust(SessionOptions& o) override { o.compile.check_finite = false; }
};

TEST_F(NoFiniteChecks, NothingIsCheckedByDefault) {
  auto k = s_->compile(two_stores());
  ASSERT_TRUE(k.ok());
  NdArrayHandle x = make("x", positive_with_zero_at(17)), y = make("y", std::vector<float>(kN)),
                z = make("z", std::vector<float>(kN));
  ASSERT_TRUE(s_->launch(*k, {Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(z)}).ok());
  EXPECT_TRUE(s_->synchronize().ok());
  EXPECT_EQ(read(z)[17], -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace vkad::testing
