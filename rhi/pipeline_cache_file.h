// The driver pipeline cache on disk: which device and driver a VkPipelineCache's data belongs
// to, and the check that data read back is for this one. Pure (no Vulkan calls): unit-tested
// with made-up properties. The file itself is base/cache_file.h's format, kind kPipelineCache,
// keyed by pipeline_cache_key().
#pragma once

#include <vulkan/vulkan.h>

#include <string>
#include <string_view>

namespace vkad::rhi {

// The identity the data is valid for: vendor and device id, driver version and the device's
// pipelineCacheUUID (the driver changes the UUID when its cache format or compiler changes).
// A different identity gives a different key, so another driver's file is never even read.
std::string pipeline_cache_key(const VkPhysicalDeviceProperties& p);
// The file name for that key.
std::string pipeline_cache_file_name(const VkPhysicalDeviceProperties& p);

// Whether `data` begins with a VkPipelineCacheHeaderVersionOne of this device (header size at
// least 32, version ONE, vendorID, deviceID and pipelineCacheUUID equal): drivers are meant to
// ignore foreign data, but vkad does not hand them any.
bool pipeline_cache_header_matches(std::string_view data, const VkPhysicalDeviceProperties& p);

}  // namespace vkad::rhi
