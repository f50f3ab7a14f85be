#include "rhi/pipeline_cache_file.h"

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "base/cache_file.h"

namespace vkad::rhi {

std::string pipeline_cache_key(const VkPhysicalDeviceProperties& p) {
  char head[96];
  std::snprintf(head, sizeof head,
                "vulkan-pipeline-cache vendor=%08x device=%08x driver=%08x uuid=", p.vendorID,
                p.deviceID, p.driverVersion);
  std::string key = head;
  for (uint8_t b : p.pipelineCacheUUID) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", b);
    key += hex;
  }
  return key;
}

std::string pipeline_cache_file_name(const VkPhysicalDeviceProperties& p) {
  return cache_file_name("pipelines", pipeline_cache_key(p));
}

bool pipeline_cache_header_matches(std::string_view data, const VkPhysicalDeviceProperties& p) {
  constexpr size_t kHeader = 16 + VK_UUID_SIZE;
  if (data.size() < kHeader) return false;
  uint32_t words[4];
  std::memcpy(words, data.data(), sizeof words);
  return words[0] >= kHeader && words[0] <= data.size() &&
         words[1] == VK_PIPELINE_CACHE_HEADER_VERSION_ONE && words[2] == p.vendorID &&
         words[3] == p.deviceID &&
         std::memcmp(data.data() + 16, p.pipelineCacheUUID, VK_UUID_SIZE) == 0;
}

}  // namespace vkad::rhi
