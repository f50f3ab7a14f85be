// Gradients of kernels that read and write one differentiable ndarray on disjoint rows
// (disjoint_access.h), on the CPU evaluator: DiffTaichi-style programs of many launches
// (tests/support/step_program.h) against central differences of the forward program, and what
// the adjoint does with the gradient array it both reads (seeds) and adds into.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "support/step_program.h"

namespace vkad::testing {
namespace {

class DisjointProgram : public ::testing::TestWithParam<std::string> {};

// Row 0 of x and v, the scalar k and the middle rows, for each program, against central
// differences (f64: h = 1e-5, agreement to 1e-6).
TEST_P(DisjointProgram, GradientsMatchFiniteDifferences) {
  auto p = named_step_program(GetParam(), 5);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  NamedValues init = named_step_program_values(*p, 11);
  ProgramGradCheck r = check_program_gradients(*p, init, run_on_cpu, 1e-5, 1e-6);
  EXPECT_EQ(r.failure, "");
  // Row 0 of both arrays, k, and the middle rows checked.
  const int row = GetParam() == "planar" ? 10 : 5;
  EXPECT_EQ(r.checked, 2 * row + 1 + static_cast<int>(p->mid_rows_checked.size()) * row);
}

INSTANTIATE_TEST_SUITE_P(Programs, DisjointProgram, ::testing::ValuesIn(step_program_names()),
                         [](const auto& info) { return info.param; });

// One launch of the Euler step's adjoint, by hand: the seed at row f + 1 stays where it was
// (the store's adjoint reads it and does not clear it: it is d loss / d the stored row, which
// earlier steps' adjoints read as their seed), and row f receives the seed carried back through
// the step, added onto what it held; the other rows are untouched.
TEST(DisjointAdjoint, StoreSeedStaysAndLoadAddsIntoItsOwnRow) {
  auto p = named_step_program("euler", 3);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  NamedValues v = named_step_program_values(*p, 4);
  const uint32_t f = 2, n = 3;
  v.scalars["f"] = f;
  ASSERT_TRUE(run_on_cpu(p->step, v).ok());
  codegen::HostArray xg(codegen::DType::kF64, {21, n}), vg(codegen::DType::kF64, {21, n});
  for (uint32_t i = 0; i < n; ++i) {
    xg.data[(f + 1) * n + i] = 1.0 + i;   // seed: d loss / d x[f + 1]
    vg.data[(f + 1) * n + i] = -0.5 * i;  // seed: d loss / d v[f + 1]
    xg.data[f * n + i] = 0.25;            // already accumulated into row f (added onto)
  }
  v.arrays["x_grad"] = xg;
  v.arrays["v_grad"] = vg;
  v.arrays["k_grad"] = codegen::HostArray(codegen::DType::kF64, {1});
  ASSERT_TRUE(run_on_cpu(p->step_adjoint, v).ok());
  const double dt = v.scalars["dt"], k = v.scalars["k"];
  double dk = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const double x = v.arrays["x"].data[f * n + i];
    const double sx = xg.data[(f + 1) * n + i], sv = vg.data[(f + 1) * n + i];
    // x' = x + dt v, v' = v - dt k sin x.
    EXPECT_NEAR(v.arrays["x_grad"].data[f * n + i], 0.25 + sx - sv * dt * k * std::cos(x), 1e-12);
    EXPECT_NEAR(v.arrays["v_grad"].data[f * n + i], sx * dt + sv, 1e-12);
    EXPECT_EQ(v.arrays["x_grad"].data[(f + 1) * n + i], sx);
    EXPECT_EQ(v.arrays["v_grad"].data[(f + 1) * n + i], sv);
    dk -= sv * dt * std::sin(x);
  }
  EXPECT_NEAR(v.arrays["k_grad"].data[0], dk, 1e-12);
  for (uint32_t row = 0; row < 21; ++row) {
    if (row == f || row == f + 1) continue;
    for (uint32_t i = 0; i < n; ++i) {
      EXPECT_EQ(v.arrays["x_grad"].data[row * n + i], 0) << "row " << row;
      EXPECT_EQ(v.arrays["v_grad"].data[row * n + i], 0) << "row " << row;
    }
  }
}

// Threads other than p add into x_grad[f, p] only through atomics: the step is not owned
// (x[f, p] is not x[task index]), so no plain load-add-store races with another thread's add,
// and none reads a seed row that this task adds into (the rows are disjoint).
TEST(DisjointAdjoint, AccumulatesWithAtomicsNotLoadAddStore) {
  auto p = named_step_program("euler", 3);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  for (const codegen::Task& t : p->step.tasks) {
    for (bool owned : codegen::owned_ndarrays(p->step, t)) EXPECT_FALSE(owned);
  }
  const std::string a = codegen::print(p->step_adjoint);
  EXPECT_NE(a.find("atomic_add x_grad["), std::string::npos) << a;
  EXPECT_NE(a.find("atomic_add v_grad["), std::string::npos) << a;
  EXPECT_EQ(a.find("store x_grad["), std::string::npos) << a;
  EXPECT_EQ(a.find("store v_grad["), std::string::npos) << a;
}

}  // namespace
}  // namespace vkad::testing
