// Pure policy for choosing a device and a memory type. No live Vulkan objects: the inputs are
// plain descriptions, so the choices are unit-tested without a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace vkad::rhi {

enum class DeviceKind : uint8_t { kDiscreteGpu, kIntegratedGpu, kVirtualGpu, kCpu, kOther };
const char* device_kind_name(DeviceKind kind);

struct PhysicalDeviceInfo {
  std::string name;
  DeviceKind kind = DeviceKind::kOther;
  uint32_t api_version = 0;  // VK_MAKE_API_VERSION form
  bool has_compute_queue = false;
  // VkPhysicalDeviceIDProperties::deviceUUID (all zero for a device below Vulkan 1.1). On NVIDIA
  // it is the CUDA device's UUID (cuDeviceGetUuid, nvidia-smi's "GPU-..."), which is how a
  // process matches a Vulkan device to a CUDA ordinal.
  std::array<uint8_t, 16> uuid{};
};

using DeviceUuid = std::array<uint8_t, 16>;
// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case hex (the form nvidia-smi prints after "GPU-").
std::string format_uuid(const DeviceUuid& uuid);
// The UUID in `text`: 32 hex digits, dashes anywhere ignored, an optional case-insensitive
// "GPU-" prefix (nvidia-smi's form). nullopt for anything else.
std::optional<DeviceUuid> parse_uuid(std::string_view text);

struct DeviceSelection {
  // "" = automatic. Otherwise a device UUID (parse_uuid's forms: "GPU-1a2b...", as
  // nvidia-smi -L prints it), a decimal index into the enumeration order, or a
  // case-insensitive substring of the device name ("llvmpipe", "H100").
  std::string forced;
  uint32_t min_api_version = 0;
};

// Automatic order: discrete GPU, integrated, virtual, other, CPU (lavapipe) last; ties keep the
// enumeration order. Devices below min_api_version or without a compute queue are skipped, and a
// forced device that is one of those is an error naming why. Returns the index into `devices`.
Result<size_t> choose_device(const std::vector<PhysicalDeviceInfo>& devices,
                             const DeviceSelection& selection);

struct MemoryTypeInfo {
  uint32_t property_flags = 0;  // VkMemoryPropertyFlags
  uint32_t heap_index = 0;
};

// Picks the first memory type allowed by `type_bits` that has all `required` flags, preferring
// one that also has all `preferred` flags and, among those, fewest extra flags. -1 if none.
int choose_memory_type(const std::vector<MemoryTypeInfo>& types, uint32_t type_bits,
                       uint32_t required, uint32_t preferred);

// The first shared block of a host-visible memory type that is not device-local (a discrete
// GPU's staging memory: pinned system memory, whose allocation the driver pays for by the
// byte -- 64 MiB took ~20 ms on an H100 host, a session's first readback or upload).
inline constexpr uint64_t kFirstHostBlockBytes = 4ull << 20;

// The size of a new shared (not dedicated) block of a memory type with `property_flags`, for a
// request of `request` bytes, where `blocks_of_type` shared blocks of that type are live and
// `block_bytes` is the configured block size. Device-local types (all of lavapipe's, which are
// host-visible too) get `block_bytes`; host-only ones start at kFirstHostBlockBytes and double
// with each live block up to `block_bytes`, never below the request.
uint64_t shared_block_bytes(uint32_t property_flags, uint64_t block_bytes, size_t blocks_of_type,
                            uint64_t request);

}  // namespace vkad::rhi
