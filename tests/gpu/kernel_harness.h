// Runs IR kernels on a real device and on the CPU reference, for the codegen and reverse-mode
// GPU tests: compile -> register -> upload -> launch -> download, with host arrays in the
// CPU evaluator's representation.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ir/ir.h"
#include "reference/cpu_eval.h"
#include "runtime/counted_launch.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"

namespace vkad::testing {

// How to make one argument: a scalar value, or an array of `shape` filled uniformly from
// [lo, hi] (integers for integer dtypes).
struct ArgSpec {
  double scalar = 0;
  std::vector<uint32_t> shape;
  double lo = -1, hi = 1;
  static ArgSpec of(double v) { return {v, {}, 0, 0}; }
  static ArgSpec array(std::vector<uint32_t> s, double lo = -1, double hi = 1) {
    return {0, std::move(s), lo, hi};
  }
};

// Host arguments for `k` built from specs, with storage owned here.
struct HostArgs {
  std::vector<codegen::HostArray> arrays;  // one per parameter (unused for scalars)
  std::vector<double> scalars;
  std::vector<codegen::HostArg> view();
};
HostArgs make_args(const codegen::Kernel& k, const std::vector<ArgSpec>& specs, uint32_t seed);

class KernelRunner {
 public:
  // Null (and `skipped` set) when there is no Vulkan device.
  static std::unique_ptr<KernelRunner> create(runtime::RuntimeOptions options = {},
                                              bool* skipped = nullptr);

  runtime::Runtime& rt() { return *rt_; }
  // The device's target, with the adstack layout overridden when one was set (tests run every
  // adstack kernel in both layouts on whatever device they have).
  codegen::Target target() const;
  void set_adstack_layout(adstack::Layout l) { layout_ = l; }

  // Compiles `k`, uploads every ndarray of `args`, launches once, synchronizes and downloads
  // every ndarray back into `args`. Returns the first error (compile, launch or the device
  // errors synchronize reports).
  Status run(const codegen::Kernel& k, HostArgs& args, const codegen::CompileOptions& o = {});
  Status run_compiled(const runtime::CompiledKernel& ck, HostArgs& args);
  // The same for an adjoint with counted stack capacities (codegen::make_adjoint_counted):
  // `args` are the adjoint's without the trips_ scalars; runtime::launch_counted runs
  // `counter` first.
  Status run_counted(const runtime::CompiledKernel& counter, const runtime::CompiledKernel& adjoint,
                     uint32_t counted, size_t forward_params, HostArgs& args);
  // The same through the forward's own counts: runtime::launch_forward_counted runs
  // `counting_forward` on the first `forward_params` of `args`, then
  // runtime::launch_counted_adjoint the adjoint; every array comes back into `args`, the
  // forward's outputs included. `trips`, when not null, receives the trips array's words as the
  // forward left them (downloaded between the two launches).
  Status run_forward_counted(const runtime::CompiledKernel& counting_forward,
                             const runtime::CompiledKernel& adjoint, uint32_t counted,
                             size_t forward_params, HostArgs& args,
                             std::vector<int32_t>* trips = nullptr);

  // Validation messages so far (the fixture asserts zero).
  size_t validation_messages() const;
  std::string validation_log() const;

 private:
  using ArrayHandles = std::vector<std::pair<size_t, runtime::NdArrayHandle>>;  // param, array
  // New arrays for the ndarrays among the first `n` parameters of `k`, uploaded from `args`;
  // every parameter's Arg appended to `launch_args`.
  Status upload_params(const runtime::CompiledKernel& k, size_t n, HostArgs& args,
                       std::vector<runtime::Arg>* launch_args, ArrayHandles* handles);
  // Downloads each array back into `args` and frees it; `st`, or the first download error.
  Status download_params(const ArrayHandles& handles, HostArgs& args, Status st);

  std::unique_ptr<runtime::Runtime> rt_;
  std::optional<adstack::Layout> layout_;
};

// Both adstack layouts, for INSTANTIATE_TEST_SUITE_P, and a test-name suffix for one.
inline const adstack::Layout kAdstackLayouts[] = {adstack::Layout::kThreadMajor,
                                                  adstack::Layout::kSlotMajor};
inline std::string layout_suffix(adstack::Layout l) {
  return l == adstack::Layout::kSlotMajor ? "SlotMajor" : "ThreadMajor";
}

// Device output `got` against the CPU reference `want`: every element within the bound the
// reference computed for it (want.error, from Vulkan's precision requirements: precision.h;
// exact where empty). NaN matches only NaN; an infinite bound accepts anything. Returns a
// description of the first few mismatches, or "" when all match.
std::string compare_arrays(const codegen::HostArray& got, const codegen::HostArray& want);
// Bit for bit (the sign of zero counts; NaN matches NaN): for operations defined exactly.
std::string compare_arrays_exact(const codegen::HostArray& got, const codegen::HostArray& want);
// |g - w| <= tol * max(1, |w|) (exact for integer dtypes): for values the reference has no
// bound for, such as gradients compared with finite differences.
std::string compare_arrays(const codegen::HostArray& got, const codegen::HostArray& want,
                           double tol);

// A fixture owning a KernelRunner; skips visibly without a device and fails on any
// validation message at teardown.
class KernelTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  virtual runtime::RuntimeOptions options() const { return {}; }
  std::unique_ptr<KernelRunner> runner_;
};

}  // namespace vkad::testing
