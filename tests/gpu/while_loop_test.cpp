// While loops on the device (validation on, zero messages): each kernel of
// tests/support/while_kernels.h forward against the CPU reference, and its adjoint against the
// CPU reference's adjoint (which tests/unit/while_loop_test.cpp checks against finite
// differences), in both adstack layouts. Trip counts differ per thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "autodiff/reverse_mode.h"
#include "gpu/kernel_harness.h"
#include "ir/text.h"
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
      EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p]), "")
          << c.name << " parameter " << k->params[p].name;
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

// Exact sizing from the forward's own counts: launch_forward_counted runs the counting forward
// (make_adjoint_counted's counting_forward), launch_counted_adjoint the adjoint sized by what it
// recorded. On the device, for the while kernels and the three-task kernel, with and without
// subgroup-combined atomics (where the device has subgroup arithmetic): the forward's outputs
// equal the plain forward's bit for bit; the trips words equal word for word those the counter
// kernel leaves when run after the forward (same slots, same atomics); the gradients equal
// launch_counted's on the same arrays, and the CPU reference's (whose counted adjoint
// tests/unit/counted_sizing_test.cpp checks against the max_trip one, and that against finite
// differences).
TEST_F(WhileLoopDevice, CountingForwardSizesTheAdjointAsTheCounterDoes) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  std::function<void(codegen::Block&)> strip = [&](codegen::Block& b) {
    for (codegen::Stmt& s : b.stmts) {
      if (s.op == codegen::Op::kWhile || s.op == codegen::Op::kFor) s.has_cap = false;
      for (codegen::Block& c : s.blocks) strip(c);
    }
  };
  std::vector<std::pair<std::string, std::pair<const char*, HostValues>>> cases;
  for (const WhileCase& c : while_cases()) cases.push_back({c.name, {c.text, c.args()}});
  cases.push_back({"three_tasks", {kThreeTasks, three_tasks_args()}});
  for (bool subgroup : {false, true}) {
    codegen::Target t = runner_->target();
    t.subgroup_arithmetic = subgroup && runner_->rt().caps().subgroup_arithmetic;
    if (subgroup && !t.subgroup_arithmetic) {
      GTEST_LOG_(INFO) << "device has no subgroup arithmetic: per-thread atomics only";
      continue;
    }
    for (const auto& [name, text_args] : cases) {
      const std::string what = name + (subgroup ? " (subgroup atomics)" : "");
      auto k = codegen::parse(text_args.first);
      ASSERT_TRUE(k.ok()) << k.status().to_string();
      codegen::Kernel bare = *k;
      for (codegen::Task& task : bare.tasks) strip(task.body);
      auto ca = codegen::make_adjoint_counted(bare, t);
      ASSERT_TRUE(ca.ok()) << what << ": " << ca.status().to_string();
      ASSERT_GT(ca->counted, 0u);
      auto forward = codegen::compile(ca->counting_forward, t);
      auto counter = codegen::compile(ca->counter, t);
      auto adjoint = codegen::compile(ca->adjoint, t);
      ASSERT_TRUE(forward.ok() && counter.ok() && adjoint.ok()) << what;
      const HostValues& base = text_args.second;
      const size_t nf = bare.params.size();
      const std::vector<HostArray> seeds = random_seeds(bare, base, 5);

      HostArgs dev = host_args(adjoint_args(bare, base, seeds));
      std::vector<int32_t> words;
      Status st = runner_->run_forward_counted(*forward, *adjoint, ca->counted, nf, dev, &words);
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();

      // The plain forward on the device: the same outputs, bit for bit.
      HostArgs plain = host_args(base);
      ASSERT_TRUE(runner_->run(bare, plain).ok()) << what;
      for (size_t p = 0; p < nf; ++p) {
        if (bare.params[p].kind != codegen::ParamKind::kNdArray) continue;
        EXPECT_EQ(compare_arrays_exact(dev.arrays[p], plain.arrays[p]), "")
            << what << " " << bare.params[p].name;
      }
      // The counter after that forward: the same words.
      HostArgs counted = plain;
      counted.arrays.push_back(
          HostArray(codegen::DType::kI32, {ca->counted * runtime::kTripSlots}));
      counted.scalars.push_back(0);
      ASSERT_TRUE(runner_->run_compiled(*counter, counted).ok()) << what;
      ASSERT_EQ(words.size(), counted.arrays.back().size());
      for (size_t w = 0; w < words.size(); ++w) {
        EXPECT_EQ(words[w], counted.arrays.back().data[w]) << what << " trips word " << w;
      }
      // launch_counted on the arrays the forward left.
      HostValues after{plain.arrays, plain.scalars};
      HostArgs lc = host_args(adjoint_args(bare, after, seeds));
      st = runner_->run_counted(*counter, *adjoint, ca->counted, nf, lc);
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
      // The CPU reference: forward, counter, adjoint.
      HostValues cpu_after = base;
      auto fv = cpu_after.view();
      ASSERT_TRUE(codegen::evaluate(bare, fv).ok()) << what;
      HostValues cpu_counted = cpu_after;
      cpu_counted.arrays.push_back(
          HostArray(codegen::DType::kI32, {ca->counted * runtime::kTripSlots}));
      cpu_counted.scalars.push_back(0);
      auto cv = cpu_counted.view();
      ASSERT_TRUE(codegen::evaluate(ca->counter, cv).ok()) << what;
      HostValues cpu = adjoint_args(bare, cpu_after, seeds);
      for (uint32_t j = 0; j < ca->counted; ++j) {
        double m = 0;
        for (uint32_t s = 0; s < runtime::kTripSlots; ++s)
          m = std::max(m, cpu_counted.arrays.back().data[j * runtime::kTripSlots + s]);
        cpu.arrays.emplace_back();
        cpu.scalars.push_back(m);
      }
      auto av = cpu.view();
      auto ar = codegen::evaluate(ca->adjoint, av);
      ASSERT_TRUE(ar.ok()) << what;
      for (uint32_t f : ar->error_flags) EXPECT_EQ(f, 0u) << what;
      for (size_t p = nf; p < ca->adjoint.params.size() - ca->counted; ++p) {
        const std::string param = what + " " + ca->adjoint.params[p].name;
        EXPECT_EQ(compare_arrays(dev.arrays[p], lc.arrays[p], 1e-12), "")
            << param << " against launch_counted";
        EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p], 1e-9), "")
            << param << " against the CPU";
      }
    }
  }
}

}  // namespace
}  // namespace vkad::testing
