// The checks Runtime::register_kernel makes of a compiled kernel before it creates anything:
// a pure function of the kernel and the device's limits (plain numbers), so every refusal is
// tested on the host (tests/unit/kernel_checks_test.cpp) without a device.
//
// A CompiledKernel may come from anywhere (the compiler, a file, a user's own), so nothing in it
// is trusted: every count, index and symbolic size that the runtime later reads at launch is
// checked here. The SPIR-V modules themselves are checked later, by check_module
// (spirv_interface.h), once per pipeline-cache miss.
#pragma once

#include <cstdint>
#include <string>

#include "abi/kernel_abi.h"
#include "base/status.h"

namespace vkad::runtime {

// What register_kernel needs to know of the device (rhi::Capabilities has them all).
struct KernelLimits {
  std::string device_name;
  uint32_t max_workgroup_size_x = 0;       // maxComputeWorkGroupSize[0]
  uint32_t max_workgroup_invocations = 0;  // maxComputeWorkGroupInvocations
  bool float64 = false;                    // shaderFloat64: f64 parameters
  bool int64 = false;                      // shaderInt64: i64 parameters
};

// OK, or the first problem found: kInvalidArgument for a malformed kernel (no tasks, too many
// parameters / tasks / adstacks, an enumerator out of range, a rank, local_size, launch
// specialization word, N-d bound, adstack capacity, loop-pass bound or range bound that refers
// to what is not there), kUnsupported for an f64 / i64 parameter the device lacks. The message
// names the kernel and, where it applies, the parameter or task and what is wrong.
Status check_kernel(const CompiledKernel& kernel, const KernelLimits& limits);

}  // namespace vkad::runtime
