#include "rhi/device_plan.h"

#include <vulkan/vulkan_core.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>

namespace vkad::rhi {

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kDiscreteGpu: return "discrete GPU";
    case DeviceKind::kIntegratedGpu: return "integrated GPU";
    case DeviceKind::kVirtualGpu: return "virtual GPU";
    case DeviceKind::kCpu: return "CPU";
    case DeviceKind::kOther: return "other";
  }
  return "other";
}

namespace {

int kind_rank(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kDiscreteGpu: return 0;
    case DeviceKind::kIntegratedGpu: return 1;
    case DeviceKind::kVirtualGpu: return 2;
    case DeviceKind::kOther: return 3;
    case DeviceKind::kCpu: return 4;
  }
  return 5;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string version_string(uint32_t v) {
  return std::to_string(v >> 22) + "." + std::to_string((v >> 12) & 0x3ff) + "." +
         std::to_string(v & 0xfff);
}

Status unusable_reason(const PhysicalDeviceInfo& d, const DeviceSelection& sel) {
  if (d.api_version < sel.min_api_version) {
    return make_error(ErrorCode::kUnsupported, "device '" + d.name + "' supports Vulkan " +
                                                   version_string(d.api_version) + ", vkad needs " +
                                                   version_string(sel.min_api_version));
  }
  if (!d.has_compute_queue) {
    return make_error(ErrorCode::kUnsupported, "device '" + d.name + "' has no compute queue");
  }
  return {};
}

}  // namespace

std::string format_uuid(const DeviceUuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[uuid[i] >> 4];
    out += kHex[uuid[i] & 0xf];
  }
  return out;
}

std::optional<DeviceUuid> parse_uuid(std::string_view text) {
  if (text.size() >= 4 && lower(std::string(text.substr(0, 4))) == "gpu-") text.remove_prefix(4);
  DeviceUuid out{};
  size_t digits = 0;
  for (char c : text) {
    if (c == '-') continue;
    int v = -1;
    if (c >= '0' && c <= '9') v = c - '0';
    if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    if (v < 0 || digits >= 32) return std::nullopt;
    out[digits / 2] = static_cast<uint8_t>(out[digits / 2] | (digits % 2 ? v : v << 4));
    ++digits;
  }
  if (digits != 32) return std::nullopt;
  return out;
}

Result<size_t> choose_device(const std::vector<PhysicalDeviceInfo>& devices,
                             const DeviceSelection& selection) {
  if (devices.empty()) return make_error(ErrorCode::kNoDevice, "no Vulkan physical device found");
  if (!selection.forced.empty()) {
    const std::string& f = selection.forced;
    bool numeric = std::all_of(f.begin(), f.end(),
                               [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    size_t index = devices.size();
    if (std::optional<DeviceUuid> uuid = parse_uuid(f)) {
      for (size_t i = 0; i < devices.size() && index == devices.size(); ++i) {
        if (devices[i].uuid == *uuid) index = i;
      }
      if (index == devices.size()) {
        std::string present;
        for (const auto& d : devices) {
          present += (present.empty() ? "" : ", ") + format_uuid(d.uuid) + " ('" + d.name + "')";
        }
        return make_error(ErrorCode::kNotFound,
                          "no device has UUID " + format_uuid(*uuid) + "; present: " + present);
      }
    } else if (numeric) {
      // from_chars, not stoul: an index past unsigned long must be "out of range", not a throw.
      size_t parsed = 0;
      auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), parsed);
      if (ec != std::errc() || end != f.data() + f.size() || parsed >= devices.size()) {
        return make_error(ErrorCode::kNotFound,
                          "device index " + f + " out of range: " + std::to_string(devices.size()) +
                              " device(s) present");
      }
      index = parsed;
    } else {
      for (size_t i = 0; i < devices.size(); ++i) {
        if (lower(devices[i].name).find(lower(f)) != std::string::npos) {
          index = i;
          break;
        }
      }
      if (index == devices.size()) {
        std::string names;
        for (const auto& d : devices) names += (names.empty() ? "'" : ", '") + d.name + "'";
        return make_error(ErrorCode::kNotFound,
                          "no device name contains '" + f + "'; present: " + names);
      }
    }
    VKAD_TRY(unusable_reason(devices[index], selection));
    return index;
  }
  size_t best = devices.size();
  Status last_reason;
  for (size_t i = 0; i < devices.size(); ++i) {
    Status why = unusable_reason(devices[i], selection);
    if (!why.ok()) {
      last_reason = why;
      continue;
    }
    if (best == devices.size() || kind_rank(devices[i].kind) < kind_rank(devices[best].kind)) {
      best = i;
    }
  }
  if (best == devices.size()) return last_reason;
  return best;
}

int choose_memory_type(const std::vector<MemoryTypeInfo>& types, uint32_t type_bits,
                       uint32_t required, uint32_t preferred) {
  int best = -1;
  int best_score = 0;
  for (size_t i = 0; i < types.size() && i < 32; ++i) {
    if (!(type_bits & (1u << i))) continue;
    uint32_t flags = types[i].property_flags;
    if ((flags & required) != required) continue;
    // Having every preferred flag dominates; then fewer unrequested flags (e.g. avoid a
    // host-visible type for device-only data when a plain device-local one exists).
    int score = ((flags & preferred) == preferred ? 1000 : 0) -
                std::popcount(flags & ~(required | preferred));
    if (best < 0 || score > best_score) {
      best = static_cast<int>(i);
      best_score = score;
    }
  }
  return best;
}

uint64_t shared_block_bytes(uint32_t property_flags, uint64_t block_bytes, size_t blocks_of_type,
                            uint64_t request) {
  const bool host_only = (property_flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0 &&
                         (property_flags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) == 0;
  if (!host_only || block_bytes <= kFirstHostBlockBytes) return block_bytes;
  uint64_t size = kFirstHostBlockBytes;
  for (size_t i = 0; i < blocks_of_type && size < block_bytes; ++i) size *= 2;
  while (size < request && size < block_bytes) size *= 2;
  return std::min(std::max(size, request), block_bytes);
}

}  // namespace vkad::rhi
