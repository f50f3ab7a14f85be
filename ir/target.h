// What the compiler may assume about the device it compiles for: plain data, no Vulkan.
// api/device_target.h reads it from a live device (Session does this for every kernel).
//
// A default-constructed Target is the Vulkan 1.2 baseline: no optional feature (no f64, no i64,
// no float or 64-bit atomics), so a kernel compiled for it runs on every device vkad supports.
// Target::host() claims every feature: for host-only work (the text form, the CPU reference,
// verifying without a device), and the default of the passes that take a target.
#pragma once

#include <string>

#include "adstack/adstack_layout.h"

namespace vkad::codegen {

struct Target {
  std::string device_name = "the Vulkan 1.2 baseline";
  bool float64 = false;
  bool int64 = false;               // shaderInt64: i64 values, parameters and ndarrays
  bool atomic_float32_add = false;  // SPV_EXT_shader_atomic_float_add, 32-bit
  bool atomic_float64_add = false;
  bool atomic_int64 = false;  // 64-bit integer buffer atomics (f64 compare-and-swap)
  // Basic, vote and arithmetic subgroup operations in compute shaders (Vulkan 1.1 subgroup
  // properties). The emitter then aggregates each atomic_max over a subgroup whose invocations
  // hit one element, and each atomic_add whose indices are table indices (spirv_emitter.cpp):
  // one atomic per subgroup instead of one per invocation; without it every invocation issues
  // its own. atomic_max gives the same result either way; a float atomic_add's sum is
  // reassociated (as atomics' order is anyway). target_from_caps leaves it off on CPU devices,
  // where it costs more than it saves.
  bool subgroup_arithmetic = false;
  // With subgroup_arithmetic: ballot and relative shuffles in compute too. The emitter then
  // adds each run of consecutive invocations that hit one element of a computed index (an MPM
  // particle's grid cell, its neighbours in the launch often in the same cell) as one atomic
  // of the run's sum (spirv_emitter.cpp, atomic_add).
  bool subgroup_shuffle = false;
  uint32_t max_local_size = 1024;
  // How adstack heaps order their elements (adstack/adstack_layout.h): slot-major on GPUs
  // (coalesced pushes and pops), thread-major on CPU devices (one thread's stacks in its own
  // cache lines). Callers may override it; both are correct on every device.
  adstack::Layout adstack_layout = adstack::Layout::kThreadMajor;
  // Declare SignedZeroInfNanPreserve (SPV_KHR_float_controls) for 32 / 64-bit floats. Without
  // it a driver may assume no NaN or infinity occurs (NVIDIA then turns the documented
  // compare-and-select min/max and NaN -> 0 casts into fmin/fmax and raw conversions), so the
  // "Operation semantics" for NaN, infinities and -0 hold only where the device has it.
  bool preserve_nan_inf_f32 = false;
  bool preserve_nan_inf_f64 = false;

  // Every feature present (see above).
  static Target host() {
    Target t;
    t.device_name = "any device (host)";
    t.float64 = t.int64 = t.atomic_float32_add = t.atomic_float64_add = t.atomic_int64 = true;
    t.subgroup_arithmetic = t.subgroup_shuffle = true;
    return t;
  }
};

}  // namespace vkad::codegen
