// The reverse-mode fuzzer, device tier: a subset of the random kernels of
// tests/unit/reverse_mode_fuzz_test.cpp (whose adjoints the unit tier checks against finite
// differences on the CPU evaluator) compiled and run on the device, validation on; the device
// adjoint must match the CPU evaluator's. Seeds: VKAD_AD_FUZZ_SEED (default 1) and
// VKAD_AD_FUZZ_GPU_COUNT (default 50); a failure prints the seed and the kernel's text.
#include <gtest/gtest.h>

#include "autodiff/reverse_mode.h"
#include "gpu/kernel_harness.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "support/ad_check.h"
#include "support/ad_fuzz.h"

namespace vkad::testing {
namespace {

using ReverseModeFuzzDevice = KernelTest;

TEST_F(ReverseModeFuzzDevice, AdjointsMatchCpuAdjoints) {
  uint32_t seed0 = env_or("VKAD_AD_FUZZ_SEED", 1), count = env_or("VKAD_AD_FUZZ_GPU_COUNT", 50);
  codegen::Target target = runner_->target();
  int failures = 0;
  for (uint32_t seed = seed0; seed < seed0 + count && failures < 3; ++seed) {
    AdFuzzCase c = random_ad_kernel(seed);
    auto adjoint = codegen::make_adjoint(c.kernel, target);
    ASSERT_TRUE(adjoint.ok()) << "seed " << seed << ": " << adjoint.status().to_string();
    HostValues cpu = adjoint_args(c.kernel, c.args, random_seeds(c.kernel, c.args, seed));
    HostArgs device{cpu.arrays, cpu.scalars};
    auto view = cpu.view();
    auto ref = codegen::evaluate(*adjoint, view);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    Status st = runner_->run(*adjoint, device);
    ASSERT_TRUE(st.ok()) << "seed " << seed << ": " << st.to_string() << "\n"
                         << codegen::print(c.kernel);
    for (size_t p = c.kernel.params.size(); p < adjoint->params.size(); ++p) {
      // f32 transcendentals differ in the last bits between the device and the host libm.
      std::string diff = compare_arrays(device.arrays[p], cpu.arrays[p], 1e-4);
      if (!diff.empty()) {
        ++failures;
        ADD_FAILURE() << "seed " << seed << " (rerun: VKAD_AD_FUZZ_SEED=" << seed
                      << " VKAD_AD_FUZZ_GPU_COUNT=1), '" << adjoint->params[p].name << "': " << diff
                      << "\n"
                      << codegen::print(c.kernel);
      }
    }
  }
}

}  // namespace
}  // namespace vkad::testing
