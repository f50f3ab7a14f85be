// capabilities_from: the pure part of device creation, from plain facts to Capabilities.
#include <gtest/gtest.h>

#include <cstring>

#include "rhi/device.h"

namespace vkad::rhi {
namespace {

DeviceFacts gpu_facts() {
  DeviceFacts f;
  std::strcpy(f.properties.deviceName, "Some GPU");
  f.properties.deviceType = VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
  f.properties.apiVersion = VK_API_VERSION_1_3;
  f.properties.limits.timestampPeriod = 1.0f;
  f.properties.limits.maxStorageBufferRange = 1u << 31;
  f.queue_family.timestampValidBits = 64;
  f.features.shaderInt64 = VK_TRUE;
  f.features.shaderFloat64 = VK_TRUE;
  f.f12.timelineSemaphore = VK_TRUE;
  f.f12.shaderBufferInt64Atomics = VK_TRUE;
  f.has_atomic_float_ext = true;
  f.atomic_float.shaderBufferFloat32AtomicAdd = VK_TRUE;
  f.atomic_float.shaderBufferFloat64AtomicAdd = VK_TRUE;
  f.has_push_descriptor_ext = true;
  f.max_push_descriptors = 32;
  f.p12.shaderSignedZeroInfNanPreserveFloat64 = VK_TRUE;
  f.p12.driverID = VK_DRIVER_ID_NVIDIA_PROPRIETARY;
  f.p11.subgroupSize = 32;
  f.p11.subgroupSupportedStages = VK_SHADER_STAGE_COMPUTE_BIT;
  f.p11.subgroupSupportedOperations = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_VOTE_BIT |
                                      VK_SUBGROUP_FEATURE_ARITHMETIC_BIT |
                                      VK_SUBGROUP_FEATURE_BALLOT_BIT |
                                      VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT;
  f.memory.memoryHeapCount = 2;
  f.memory.memoryHeaps[0] = {80ull << 30, VK_MEMORY_HEAP_DEVICE_LOCAL_BIT};
  f.memory.memoryHeaps[1] = {64ull << 30, 0};
  return f;
}

TEST(DeviceCaps, FeaturesFollowTheFactsAndTheirPrerequisites) {
  DeviceFacts f = gpu_facts();
  Capabilities c = capabilities_from(f, true);
  EXPECT_EQ(c.device_name, "Some GPU");
  EXPECT_EQ(c.kind, DeviceKind::kDiscreteGpu);
  EXPECT_TRUE(c.atomic_int64 && c.atomic_float64_add && c.preserve_nan_inf_f64);
  EXPECT_TRUE(c.push_descriptor);
  EXPECT_EQ(c.max_push_descriptors, 32u);
  EXPECT_TRUE(c.subgroup_arithmetic && c.subgroup_shuffle);
  EXPECT_TRUE(c.timestamps);
  EXPECT_EQ(c.max_loop_passes, 0u);
  ASSERT_EQ(c.heaps.size(), 2u);
  EXPECT_TRUE(c.heaps[0].device_local);
  EXPECT_FALSE(c.heaps[1].device_local);
  // Prerequisites: int64 atomics need shaderInt64; f64 atomics and NaN preservation need f64;
  // float atomics need the extension; push descriptors need the option and a non-zero limit.
  f.features.shaderInt64 = VK_FALSE;
  f.features.shaderFloat64 = VK_FALSE;
  f.has_atomic_float_ext = false;
  c = capabilities_from(f, true);
  EXPECT_FALSE(c.atomic_int64 || c.atomic_float64_add || c.atomic_float32_add ||
               c.preserve_nan_inf_f64);
  // Subgroup arithmetic needs the compute stage and all of basic, vote and arithmetic.
  f = gpu_facts();
  f.p11.subgroupSupportedOperations &= ~VK_SUBGROUP_FEATURE_VOTE_BIT;
  EXPECT_FALSE(capabilities_from(f, true).subgroup_arithmetic);
  EXPECT_FALSE(capabilities_from(f, true).subgroup_shuffle);  // needs subgroup_arithmetic
  // Combining runs also needs ballot and relative shuffles.
  for (VkSubgroupFeatureFlags bit :
       {VK_SUBGROUP_FEATURE_BALLOT_BIT, VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT}) {
    f = gpu_facts();
    f.p11.subgroupSupportedOperations &= ~bit;
    EXPECT_TRUE(capabilities_from(f, true).subgroup_arithmetic);
    EXPECT_FALSE(capabilities_from(f, true).subgroup_shuffle);
  }
  f = gpu_facts();
  f.p11.subgroupSupportedStages = VK_SHADER_STAGE_FRAGMENT_BIT;
  EXPECT_FALSE(capabilities_from(f, true).subgroup_arithmetic);
  EXPECT_FALSE(capabilities_from(gpu_facts(), false).push_descriptor);
  f = gpu_facts();
  f.max_push_descriptors = 0;
  EXPECT_FALSE(capabilities_from(f, true).push_descriptor);
  f = gpu_facts();
  f.queue_family.timestampValidBits = 0;
  EXPECT_FALSE(capabilities_from(f, true).timestamps);
  f.p12.driverID = VK_DRIVER_ID_MESA_LLVMPIPE;
  EXPECT_EQ(capabilities_from(f, true).max_loop_passes, 65535u);
}

TEST(DeviceCaps, AnImportedDeviceUsesOnlyWhatItStatesItEnabled) {
  ExternalFeatures on;  // nothing stated
  Capabilities c = capabilities_from(gpu_facts(), on);
  EXPECT_FALSE(c.timeline_semaphore || c.shader_int64 || c.shader_float64 || c.atomic_int64 ||
               c.atomic_float32_add || c.atomic_float64_add || c.push_descriptor ||
               c.preserve_nan_inf_f64);
  on.shader_float64 = on.atomic_float64_add = on.timeline_semaphore = true;
  c = capabilities_from(gpu_facts(), on);
  EXPECT_TRUE(c.shader_float64 && c.atomic_float64_add && c.timeline_semaphore);
  EXPECT_FALSE(c.atomic_int64);  // stated int64 atomics missing
  DeviceFacts f = gpu_facts();
  f.features.shaderFloat64 = VK_FALSE;  // stated but not supported: not used
  EXPECT_FALSE(capabilities_from(f, on).shader_float64);
}

}  // namespace
}  // namespace vkad::rhi
