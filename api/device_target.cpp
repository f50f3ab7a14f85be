#include "api/device_target.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "autodiff/checkpoint.h"

namespace vkad::codegen {

namespace {

// VKAD_ADJOINT_CHECKPOINT: "off" / "0", or a segment length. A value that is neither becomes
// UINT32_MAX, which make_adjoint refuses with an error naming the variable (this function has
// no error channel, and ignoring a mistyped setting would hide it).
uint32_t checkpoint_segment(uint32_t device_default) {
  const char* env = std::getenv("VKAD_ADJOINT_CHECKPOINT");
  if (!env || !*env) return device_default;
  const std::string v = env;
  if (v == "off") return 0;
  char* end = nullptr;
  const unsigned long n = std::strtoul(v.c_str(), &end, 10);
  if (*end != '\0' || v[0] == '-' || n > kMaxCheckpointSegment) return UINT32_MAX;
  return static_cast<uint32_t>(n);
}

}  // namespace

Target target_from_caps(const rhi::Capabilities& caps) {
  Target t;
  t.device_name = caps.device_name;
  t.float64 = caps.shader_float64;
  t.int64 = caps.shader_int64;
  t.atomic_float32_add = caps.atomic_float32_add;
  t.atomic_float64_add = caps.atomic_float64_add && caps.shader_float64;
  t.atomic_int64 = caps.atomic_int64;
  // Subgroup-combined atomic_max only on GPUs: on a CPU device a handful of threads barely
  // contend, and lavapipe's subgroup operations cost more than they save (the counting kernel
  // of vkad-bench-counted ran ~30% slower with them, docs/benchmarks-log.md).
  t.subgroup_arithmetic = caps.subgroup_arithmetic && caps.kind != rhi::DeviceKind::kCpu;
  t.subgroup_shuffle = t.subgroup_arithmetic && caps.subgroup_shuffle;
  t.max_local_size = std::min(caps.max_workgroup_invocations, caps.max_workgroup_size[0]);
  t.preserve_nan_inf_f32 = caps.preserve_nan_inf_f32;
  t.preserve_nan_inf_f64 = caps.preserve_nan_inf_f64;
  t.adstack_layout = caps.kind == rhi::DeviceKind::kCpu ? adstack::Layout::kThreadMajor
                                                        : adstack::Layout::kSlotMajor;
  return t;
}

AdjointOptions adjoint_options_from_caps(const rhi::Capabilities& caps) {
  AdjointOptions o;
  o.checkpoint_segment =
      checkpoint_segment(caps.kind == rhi::DeviceKind::kCpu ? 0 : kGpuCheckpointSegment);
  const Target t = target_from_caps(caps);  // the hardware atomics the emitter may use
  o.atomic_f32_add = t.atomic_float32_add;
  o.atomic_f64_add = t.atomic_float64_add;
  return o;
}

}  // namespace vkad::codegen
