// The physical devices Vulkan reports to this process, described with the facts a caller needs
// to pick one (name, kind, UUID, driver): what Device::create chooses among, and what
// vkad::devices() lists. Only queries; creates nothing but the shared instance.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "rhi/device_plan.h"
#include "rhi/instance.h"

namespace vkad::rhi {

struct PhysicalDeviceEntry {
  VkPhysicalDevice handle = VK_NULL_HANDLE;  // borrowed from the instance
  PhysicalDeviceInfo info;                   // name, kind, API version, compute queue, UUID
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  std::string driver_name;  // empty below Vulkan 1.2
  std::string driver_info;
};

// Every physical device of `instance`, in vkEnumeratePhysicalDevices order: the order of the
// indices DeviceSelection::forced takes. The loader enumerates ICDs and their devices in a fixed
// order, so one process's instances (with and without validation) and processes started with
// the same environment see the same indices. kVulkan naming the call if enumeration fails.
Result<std::vector<PhysicalDeviceEntry>> enumerate_physical_devices(const Instance& instance);

// The queue family vkad uses on `pd`: a compute-only family where there is one (async compute
// on discrete GPUs), else any family with compute; -1 if none. `count_out` gets its queue count.
int compute_queue_family(VkPhysicalDevice pd, uint32_t* count_out);

// The kind of a device of Vulkan type `t` (kOther for any type added after 1.2's).
DeviceKind device_kind(VkPhysicalDeviceType t);

}  // namespace vkad::rhi
