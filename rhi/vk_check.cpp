#include "rhi/vk_check.h"

#include <atomic>
#include <mutex>
#include <vector>

namespace vkad::rhi {

namespace {

const char* vk_result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED: return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_ERROR_INVALID_SHADER_NV: return "VK_ERROR_INVALID_SHADER_NV";
    default: return "VkResult";
  }
}

struct Armed {
  std::string call;
  VkResult result;
  int skip;
  int count;
};

std::atomic<bool> g_any_armed{false};
std::mutex g_mutex;
std::vector<Armed> g_armed;

}  // namespace

Status check_vk(VkResult result, const char* call) {
  if (result >= 0) return {};
  std::string msg = std::string(call) + " failed with " + vk_result_name(result) + " (" +
                    std::to_string(static_cast<int>(result)) + ")";
  switch (result) {
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return make_error(ErrorCode::kOutOfDeviceMemory, msg);
    case VK_ERROR_OUT_OF_HOST_MEMORY: return make_error(ErrorCode::kOutOfHostMemory, msg);
    case VK_ERROR_DEVICE_LOST: return make_error(ErrorCode::kDeviceLost, msg);
    case VK_ERROR_FEATURE_NOT_PRESENT:
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_LAYER_NOT_PRESENT:
    case VK_ERROR_INCOMPATIBLE_DRIVER: return make_error(ErrorCode::kUnsupported, msg);
    default: return make_error(ErrorCode::kVulkan, msg);
  }
}

void FaultInjection::arm(const std::string& call, VkResult result, int skip, int count) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_armed.push_back({call, result, skip, count});
  g_any_armed.store(true, std::memory_order_release);
}

void FaultInjection::disarm_all() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_armed.clear();
  g_any_armed.store(false, std::memory_order_release);
}

bool FaultInjection::any_armed() { return g_any_armed.load(std::memory_order_acquire); }

bool FaultInjection::take(const char* call, VkResult* result) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto it = g_armed.begin(); it != g_armed.end(); ++it) {
    if (it->call != call) continue;
    if (it->skip > 0) {
      --it->skip;
      return false;
    }
    *result = it->result;
    if (--it->count <= 0) g_armed.erase(it);
    g_any_armed.store(!g_armed.empty(), std::memory_order_release);
    return true;
  }
  return false;
}

}  // namespace vkad::rhi
