#include "rhi/device_list.h"

#include <volk.h>

#include <algorithm>
#include <iterator>

#include "rhi/vk_check.h"

namespace vkad::rhi {

int compute_queue_family(VkPhysicalDevice pd, uint32_t* count_out) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, fams.data());
  int best = -1;
  for (uint32_t i = 0; i < n; ++i) {
    if (!(fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
    bool compute_only = !(fams[i].queueFlags & VK_QUEUE_GRAPHICS_BIT);
    if (best < 0 || (compute_only && (fams[best].queueFlags & VK_QUEUE_GRAPHICS_BIT))) {
      best = static_cast<int>(i);
    }
  }
  if (best >= 0 && count_out) *count_out = fams[best].queueCount;
  return best;
}

Result<std::vector<PhysicalDeviceEntry>> enumerate_physical_devices(const Instance& instance) {
  VkInstance vk_instance = instance.handle();
  uint32_t count = 0;
  VKAD_TRY(vk_call("vkEnumeratePhysicalDevices",
                   [&] { return vkEnumeratePhysicalDevices(vk_instance, &count, nullptr); }));
  std::vector<VkPhysicalDevice> pds(count);
  VKAD_TRY(vk_call("vkEnumeratePhysicalDevices",
                   [&] { return vkEnumeratePhysicalDevices(vk_instance, &count, pds.data()); }));
  pds.resize(count);  // VK_INCOMPLETE cannot happen with the count just read, but stay exact
  std::vector<PhysicalDeviceEntry> out;
  out.reserve(pds.size());
  for (VkPhysicalDevice pd : pds) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(pd, &p);
    PhysicalDeviceEntry e;
    e.handle = pd;
    e.info.name = p.deviceName;
    e.info.kind = device_kind(p.deviceType);
    e.info.api_version = p.apiVersion;
    e.info.has_compute_queue = compute_queue_family(pd, nullptr) >= 0;
    e.vendor_id = p.vendorID;
    e.device_id = p.deviceID;
    // The ID and driver properties are core in 1.1 and 1.2: chained only for a device that
    // has them, so an older device is still listed (with a zero UUID), not queried wrongly.
    if (p.apiVersion >= VK_API_VERSION_1_1) {
      VkPhysicalDeviceIDProperties id{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
      VkPhysicalDeviceDriverProperties driver{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
      if (p.apiVersion >= VK_API_VERSION_1_2) id.pNext = &driver;
      VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
      p2.pNext = &id;
      vkGetPhysicalDeviceProperties2(pd, &p2);
      std::copy(std::begin(id.deviceUUID), std::end(id.deviceUUID), e.info.uuid.begin());
      if (p.apiVersion >= VK_API_VERSION_1_2) {
        e.driver_name = driver.driverName;
        e.driver_info = driver.driverInfo;
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

DeviceKind device_kind(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return DeviceKind::kDiscreteGpu;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return DeviceKind::kIntegratedGpu;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return DeviceKind::kVirtualGpu;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return DeviceKind::kCpu;
    default: return DeviceKind::kOther;
  }
}

}  // namespace vkad::rhi
