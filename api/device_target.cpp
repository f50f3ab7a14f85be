#include "api/device_target.h"

#include <algorithm>



namespace vkad::codegen {

Target target_from_caps(const rhi::Capabilities& caps) {
  Target t;
  t.device_name = caps.device_name;
  t.float64 = caps.shader_float64;
  t.int64 = caps.shader_int64;
  t.atomic_float32_add = caps.atomic_float32_add;
  t.atomic_float64_add = caps.atomic_float64_add && caps.shader_float64;
  t.atomic_int64 = caps.atomic_int64;
  t.max_local_size = std::min(caps.max_workgroup_invocations, caps.max_workgroup_size[0]);
  t.preserve_nan_inf_f32 = caps.preserve_nan_inf_f32;
  t.preserve_nan_inf_f64 = caps.preserve_nan_inf_f64;
  t.adstack_layout = caps.kind == rhi::DeviceKind::kCpu ? adstack::Layout::kThreadMajor
                                                        : adstack::Layout::kSlotMajor;
  return t;
}

}  // namespace vkad::codegen
