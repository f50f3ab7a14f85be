// The one place every VkResult goes through. It names the call in the error, maps the result
// to an ErrorCode, and has a seam that lets tests make a named call fail.
#pragma once

#include <vulkan/vulkan.h>

#include <string>

#include "base/status.h"

namespace vkad::rhi {

// Maps `result` to a Status naming `call`. VK_SUCCESS (and other non-negative results) -> ok.
Status check_vk(VkResult result, const char* call);

// Fault injection for tests. While armed for `call`, the next `count` invocations made through
// vk_call() after skipping `skip` of them do not reach the driver and return `result` instead.
// Process-wide; tests arm it, exercise a path, then disarm.
struct FaultInjection {
  static void arm(const std::string& call, VkResult result, int skip = 0, int count = 1);
  static void disarm_all();
  // True (and *result set) when the call should fail without reaching the driver.
  static bool take(const char* call, VkResult* result);
  static bool any_armed();
};

// Runs `fn` (which returns VkResult) unless a fault is injected for `call`, then checks.
template <typename Fn>
Status vk_call(const char* call, Fn&& fn) {
  VkResult r;
  if (FaultInjection::any_armed() && FaultInjection::take(call, &r)) return check_vk(r, call);
  return check_vk(fn(), call);
}

}  // namespace vkad::rhi
