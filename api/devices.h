// vkad::devices() — the Vulkan devices a Session can run on, for programs that spread work over
// several GPUs (one Session per device, each on its own thread or in its own process).
//
//   for (const vkad::DeviceInfo& d : *vkad::devices())
//     if (!d.cpu) sessions.push_back(*vkad::Session::create({.device = d.uuid}));
//
// Every device Vulkan reports is listed, usable or not, in the order whose indices
// SessionOptions::device and VKAD_DEVICE take. `uuid` (VkPhysicalDeviceIDProperties::deviceUUID)
// names the physical device across processes and APIs: on NVIDIA it is the CUDA device's UUID
// (cuDeviceGetUuid; nvidia-smi -L prints it after "GPU-"), so a program running CUDA beside vkad
// (PyTorch, NCCL) matches a CUDA ordinal to a Vulkan device by it, whatever order each API
// enumerates in and whatever CUDA_VISIBLE_DEVICES hides. SessionOptions::device accepts it too.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace vkad {

struct DeviceInfo {
  uint32_t index = 0;  // what SessionOptions::device / VKAD_DEVICE take as a number
  std::string name;    // VkPhysicalDeviceProperties::deviceName
  // "discrete GPU", "integrated GPU", "virtual GPU", "CPU" or "other".
  std::string kind;
  bool cpu = false;  // a CPU implementation (lavapipe): no GPU behind it
  std::array<uint8_t, 16> uuid_bytes{};
  std::string uuid;  // "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; also a SessionOptions::device value
  std::string driver_name;  // "NVIDIA", "llvmpipe"; empty below Vulkan 1.2
  std::string driver_info;  // the driver's version text ("580.159.04")
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  uint32_t api_version = 0;  // VK_MAKE_API_VERSION form
  // A Session can be created on it (Vulkan 1.2 and a compute queue); otherwise `unusable` says
  // why, as Session::create would.
  bool usable = false;
  std::string unusable;
  // The device Session::create() with no device given would take (VKAD_DEVICE counted).
  bool automatic = false;
};

// Every physical device, in enumeration order. Uses the process-wide instance of the default
// validation setting (VKAD_VALIDATION), creating it on first use; thread-safe. kNoDevice without
// a Vulkan loader; an empty list when the loader has no driver. `automatic` is on no device when
// VKAD_DEVICE names none that qualifies.
Result<std::vector<DeviceInfo>> devices();

}  // namespace vkad
