#include "api/devices.h"

#include <cstdlib>
#include <cstring>

#include "rhi/device_list.h"

namespace vkad {

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

Result<std::vector<DeviceInfo>> devices() {
  VKAD_ASSIGN_OR_RETURN(std::shared_ptr<rhi::Instance> instance,
                        rhi::Instance::shared(env_flag("VKAD_VALIDATION")));
  VKAD_ASSIGN_OR_RETURN(std::vector<rhi::PhysicalDeviceEntry> entries,
                        rhi::enumerate_physical_devices(*instance));
  std::vector<rhi::PhysicalDeviceInfo> infos;
  for (const auto& e : entries) infos.push_back(e.info);
  // The same policy and inputs as Device::choose_physical, so `automatic` cannot disagree with
  // what Session::create() does.
  rhi::DeviceSelection automatic;
  if (const char* forced = std::getenv("VKAD_DEVICE")) automatic.forced = forced;
  automatic.min_api_version = VK_API_VERSION_1_2;
  Result<size_t> chosen = rhi::choose_device(infos, automatic);
  rhi::DeviceSelection check;
  check.min_api_version = VK_API_VERSION_1_2;

  std::vector<DeviceInfo> out;
  out.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const rhi::PhysicalDeviceEntry& e = entries[i];
    DeviceInfo d;
    d.index = static_cast<uint32_t>(i);
    d.name = e.info.name;
    d.kind = rhi::device_kind_name(e.info.kind);
    d.cpu = e.info.kind == rhi::DeviceKind::kCpu;
    d.uuid_bytes = e.info.uuid;
    d.uuid = rhi::format_uuid(e.info.uuid);
    d.driver_name = e.driver_name;
    d.driver_info = e.driver_info;
    d.vendor_id = e.vendor_id;
    d.device_id = e.device_id;
    d.api_version = e.info.api_version;
    check.forced = std::to_string(i);
    Result<size_t> alone = rhi::choose_device(infos, check);
    d.usable = alone.ok();
    if (!alone.ok()) d.unusable = alone.status().message();
    d.automatic = chosen.ok() && *chosen == i;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace vkad
