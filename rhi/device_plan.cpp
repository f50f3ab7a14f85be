#include "rhi/device_plan.h"

#include <algorithm>
#include <bit>
#include <cctype>

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
    return make_error(ErrorCode::kUnsupported,
                      "device '" + d.name + "' supports Vulkan " + version_string(d.api_version) +
                          ", vkad needs " + version_string(sel.min_api_version));
  }
  if (!d.has_compute_queue) {
    return make_error(ErrorCode::kUnsupported, "device '" + d.name + "' has no compute queue");
  }
  return {};
}

}  // namespace

Result<size_t> choose_device(const std::vector<PhysicalDeviceInfo>& devices,
                             const DeviceSelection& selection) {
  if (devices.empty()) return make_error(ErrorCode::kNoDevice, "no Vulkan physical device found");
  if (!selection.forced.empty()) {
    const std::string& f = selection.forced;
    bool numeric = std::all_of(f.begin(), f.end(), [](char c) { return std::isdigit(c); });
    size_t index = devices.size();
    if (numeric) {
      index = std::stoul(f);
      if (index >= devices.size()) {
        return make_error(ErrorCode::kNotFound, "device index " + f + " out of range: " +
                                                    std::to_string(devices.size()) +
                                                    " device(s) present");
      }
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

}  // namespace vkad::rhi
