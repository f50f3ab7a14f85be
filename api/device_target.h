// The compile target of a live device: what codegen may assume (ir/target.h), read from the
// RHI's capability snapshot. It lives above both the compiler (ir/, spirv/) and rhi/ so that the
// compiler never sees Vulkan: the compiler takes a plain Target, and only this function knows where
// one comes from.
#pragma once

#include "autodiff/adjoint_plan.h"
#include "ir/target.h"
#include "rhi/device.h"

namespace vkad::codegen {

// Slot-major adstacks for discrete, integrated, virtual and unknown GPUs, thread-major for CPU
// devices (on lavapipe the slot-major layout is several times slower). Features the device lacks
// are off, so a kernel that needs them fails verify() with kUnsupported naming the statement.
// Target::subgroup_arithmetic is on where the device has it, except on CPU devices (see there).
Target target_from_caps(const rhi::Capabilities& caps);

// Reverse mode's options for the device: segmented checkpointing
// (AdjointOptions::checkpoint_segment) on for GPUs (kGpuCheckpointSegment), off for CPU devices
// (their caches hold a thread's stacks; the replay would only add work); the environment
// variable VKAD_ADJOINT_CHECKPOINT ("off" or a segment length) overrides it. The gradient of
// an array a kernel only reads is added atomically where the device has hardware float atomics
// of the type (AdjointOptions::atomic_f32_add / atomic_f64_add).
AdjointOptions adjoint_options_from_caps(const rhi::Capabilities& caps);

}  // namespace vkad::codegen
