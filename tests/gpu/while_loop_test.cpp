// While loops on the device (validation on, zero messages): each kernel of
// tests/support/while_kernels.h forward against the CPU reference, and its adjoint against the
// CPU reference's adjoint (which tests/unit/while_loop_test.cpp checks against finite
// differences), in both adstack layouts. Trip counts differ per thread.
#include <gtest/gtest.h>

#include <functional>

#include "codegen/reverse_mode.h"
#include "codegen/text.h"
#include "gpu/kernel_harness.h"
#include "support/while_kernels.h"

namespace vkad::testing {
namespace {

using codegen::HostArray;

HostArgs host_args(const HostValues& v) {
  HostArgs a;
  a.arrays = v.arrays;
  a.scalars = v.scalars;
  return a;
}

class WhileLoopDevice : public KernelTest {};

TEST_F(WhileLoopDevice, ForwardMatchesTheCpuEvaluator) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  for (const WhileCase& c : while_cases()) {
    auto k = codegen::parse(c.text);
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    HostArgs dev = host_args(c.args()), cpu = dev;
    Status st = runner_->run(*k, dev);
    ASSERT_TRUE(st.ok()) << c.name << ": " << st.to_string();
    auto view = cpu.view();
    ASSERT_TRUE(codegen::evaluate(*k, view).ok()) << c.name;
    for (size_t p = 0; p < k->params.size(); ++p) {
      EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p]), "") << c.name << " parameter " << k->params[p].name;
    }
  }
}

TEST_F(WhileLoopDevice, JumpCountsMatchTheCpuEvaluator) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  auto k = codegen::parse(kJumpCounts);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  HostArgs dev;
  dev.arrays = {while_array({0.1, 0.35, 0.5, 0.75, 1.2, 4.0}), HostArray(codegen::DType::kI32, {6}),
                HostArray(codegen::DType::kI32, {6})};
  dev.scalars = {0, 0, 0};
  HostArgs cpu = dev;
  Status st = runner_->run(*k, dev);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto view = cpu.view();
  ASSERT_TRUE(codegen::evaluate(*k, view).ok());
  for (size_t p = 1; p < 3; ++p) EXPECT_EQ(compare_arrays_exact(dev.arrays[p], cpu.arrays[p]), "");
}

TEST_F(WhileLoopDevice, AdjointMatchesTheCpuAdjointInBothLayouts) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  for (adstack::Layout layout : kAdstackLayouts) {
    runner_->set_adstack_layout(layout);
    for (const WhileCase& c : while_cases()) {
      auto k = codegen::parse(c.text);
      ASSERT_TRUE(k.ok()) << k.status().to_string();
      auto ak = codegen::make_adjoint(*k, runner_->target());
      ASSERT_TRUE(ak.ok()) << ak.status().to_string();
      HostValues base = c.args();
      HostArgs dev = host_args(adjoint_args(*k, base, random_seeds(*k, base, 5)));
      HostArgs cpu = dev;
      Status st = runner_->run(*ak, dev);
      ASSERT_TRUE(st.ok()) << c.name << ": " << st.to_string();
      auto view = cpu.view();
      auto r = codegen::evaluate(*ak, view);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      for (size_t p = k->params.size(); p < ak->params.size(); ++p) {
        EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p], 1e-9), "")
            << c.name << " " << ak->params[p].name << " (" << layout_suffix(layout) << ")";
      }
    }
  }
}

// Exact sizing without max_trip on the device: launch_counted runs the counting kernel, reads
// the counts back and launches the adjoint sized by them; its gradients equal the CPU
// reference's adjoint with the stated bounds (tests/unit/counted_sizing_test.cpp shows the two
// CPU adjoints agree bit for bit and the counts are exact).
TEST_F(WhileLoopDevice, CountedSizingMatchesTheCpuAdjoint) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  std::function<void(codegen::Block&)> strip = [&](codegen::Block& b) {
    for (codegen::Stmt& s : b.stmts) {
      if (s.op == codegen::Op::kWhile) s.has_cap = false;
      for (codegen::Block& c : s.blocks) strip(c);
    }
  };
  for (adstack::Layout layout : kAdstackLayouts) {
    runner_->set_adstack_layout(layout);
    for (const WhileCase& c : while_cases()) {
      auto k = codegen::parse(c.text);
      ASSERT_TRUE(k.ok());
      auto capped = codegen::make_adjoint(*k, runner_->target());
      ASSERT_TRUE(capped.ok());
      codegen::Kernel bare = *k;
      for (codegen::Task& t : bare.tasks) strip(t.body);
      auto ca = codegen::make_adjoint_counted(bare, runner_->target());
      ASSERT_TRUE(ca.ok()) << ca.status().to_string();
      ASSERT_GT(ca->counted, 0u);
      auto counter = codegen::compile(ca->counter, runner_->target());
      auto adjoint = codegen::compile(ca->adjoint, runner_->target());
      ASSERT_TRUE(counter.ok()) << counter.status().to_string();
      ASSERT_TRUE(adjoint.ok()) << adjoint.status().to_string();
      HostValues base = c.args();
      HostArgs dev = host_args(adjoint_args(*k, base, random_seeds(*k, base, 5)));
      HostArgs cpu = dev;
      Status st = runner_->run_counted(*counter, *adjoint, ca->counted, k->params.size(), dev);
      ASSERT_TRUE(st.ok()) << c.name << ": " << st.to_string();
      auto view = cpu.view();
      ASSERT_TRUE(codegen::evaluate(*capped, view).ok());
      for (size_t p = k->params.size(); p < capped->params.size(); ++p) {
        EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p], 1e-9), "")
            << c.name << " " << capped->params[p].name << " (" << layout_suffix(layout) << ")";
      }
    }
  }
}

}  // namespace
}  // namespace vkad::testing
