// Loop nests deeper than kOutlineLoopDepth on the device (validation on, zero messages): their
// modules move the loops nested 8 and 16 deep into functions of their own
// (spirv/spirv_outline.h), called with the values and the function variables they use (the
// adjoint's stack counters and private-tier stacks among them at depth 9; the carried local
// passed on through two levels of calls in the forward at depth 17). Forward and adjoint must
// compute what the CPU reference computes, in both adstack layouts; a parameter passed in the wrong
// place or a variable copied instead of shared would change the results or fail validation.
#include <gtest/gtest.h>

#include "abi/spirv_tools.h"
#include "autodiff/reverse_mode.h"
#include "gpu/kernel_harness.h"
#include "ir/text.h"
#include "spirv/spirv_outline.h"
#include "support/ad_check.h"

namespace vkad::testing {
namespace {

HostArgs host_args(const HostValues& v) {
  HostArgs a;
  a.arrays = v.arrays;
  a.scalars = v.scalars;
  return a;
}

// `depth` nested loops of n trips around an update of a carried local that also reads w[i] and
// the loop indices (values from outside each outlined loop).
codegen::Kernel nest(uint32_t depth) {
  std::string t =
      "kernel nest(n: i32, x: ndarray<f64, 1> grad, w: ndarray<f64, 1> grad, y: ndarray<f64, 1> "
      "grad) {\n"
      "  task t parallel %0 in [0, shape(x, 0)) {\n    %1 = const 0 : i32\n"
      "    %2 = arg n : i32\n    %v = alloca : f64\n    %x = load x[%0] : f64\n"
      "    %w = load w[%0] : f64\n    store_local %v, %x\n";
  for (uint32_t i = 0; i < depth; ++i) t += "for %l" + std::to_string(i) + " in [%1, %2) {\n";
  t += "%a = load_local %v : f64\n%s = sin %a : f64\n%k = add %l0, %l" + std::to_string(depth - 1) +
       " : i32\n%kf = cast %k : f64\n%m = mul %kf, %w : f64\n%c = const 0.01 : f64\n%u = mul %m, "
       "%c : f64\n%r = add %s, %u : f64\n"
       "store_local %v, %r\n";
  for (uint32_t i = 0; i < depth; ++i) t += "}\n";
  t += "    %o = load_local %v : f64\n    store y[%0], %o\n  }\n}\n";
  auto k = codegen::parse(t);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : codegen::Kernel{};
}

class DeepNestDevice : public KernelTest {};

TEST_F(DeepNestDevice, OutlinedForwardAndAdjointMatchTheCpuReference) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  struct Case {
    uint32_t depth, trips;
  };
  for (Case c : {Case{9, 2}, Case{17, 1}}) {
    codegen::Kernel k = nest(c.depth);
    for (adstack::Layout layout : kAdstackLayouts) {
      runner_->set_adstack_layout(layout);
      auto ak = codegen::make_adjoint(k, runner_->target());
      ASSERT_TRUE(ak.ok()) << ak.status().to_string();
      auto compiled = codegen::compile(*ak, runner_->target());
      ASSERT_TRUE(compiled.ok()) << compiled.status().to_string();
      auto forward = codegen::compile(k, runner_->target());
      ASSERT_TRUE(forward.ok()) << forward.status().to_string();
      for (const auto* ck : {&*compiled, &*forward}) {
        ASSERT_NE(codegen::disassemble_spirv(ck->tasks[0].spirv).find("OpFunctionCall"),
                  std::string::npos)
            << "depth " << c.depth << ": not outlined";
      }
      HostValues base;
      base.scalars = {double(c.trips), 0, 0, 0};
      base.arrays.resize(4);
      const uint32_t n = 64;
      for (int p = 1; p <= 3; ++p) base.arrays[p] = codegen::HostArray(codegen::DType::kF64, {n});
      for (uint32_t e = 0; e < n; ++e) {
        base.arrays[1].data[e] = -1.5 + 3.0 * e / n;
        base.arrays[2].data[e] = 0.5 + 0.25 * (e % 7);
      }
      // Forward.
      HostArgs fdev = host_args(base), fcpu = fdev;
      ASSERT_TRUE(runner_->run_compiled(*forward, fdev).ok());
      auto fview = fcpu.view();
      ASSERT_TRUE(codegen::evaluate(k, fview).ok());
      EXPECT_EQ(compare_arrays(fdev.arrays[3], fcpu.arrays[3], 1e-9), "") << "depth " << c.depth;
      // Adjoint. At depth 17 its loop-pass bound nests past what register_kernel takes (a
      // limit of the launch checks, not of the module), so the 2-level calls run in the forward.
      if (c.depth > 16) continue;
      HostArgs dev = host_args(adjoint_args(k, base, random_seeds(k, base, 3)));
      HostArgs cpu = dev;
      Status st = runner_->run_compiled(*compiled, dev);
      ASSERT_TRUE(st.ok()) << "depth " << c.depth << ": " << st.to_string();
      auto view = cpu.view();
      auto r = codegen::evaluate(*ak, view);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      for (size_t p = k.params.size(); p < ak->params.size(); ++p) {
        EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p], 1e-9), "")
            << "depth " << c.depth << " " << ak->params[p].name << " (" << layout_suffix(layout)
            << ")";
      }
    }
  }
}

}  // namespace
}  // namespace vkad::testing
