#include "rhi/device.h"

#include <volk.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/cache_file.h"
#include "base/log.h"
#include "rhi/device_list.h"
#include "rhi/pipeline_cache_file.h"

namespace vkad::rhi {

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts) {
    if (std::strcmp(e.extensionName, name) == 0) return true;
  }
  return false;
}

}  // namespace

const std::vector<std::string>& Capabilities::feature_names() {
  static const std::vector<std::string> names = {"timeline_semaphore",
                                                 "int64",
                                                 "float64",
                                                 "float16",
                                                 "atomic_float32_add",
                                                 "atomic_float64_add",
                                                 "atomic_int64",
                                                 "buffer_device_address",
                                                 "timestamps"};
  return names;
}

Result<bool> Capabilities::has_feature(const std::string& name) const {
  if (name == "timeline_semaphore") return timeline_semaphore;
  if (name == "int64") return shader_int64;
  if (name == "float64") return shader_float64;
  if (name == "float16") return shader_float16;
  if (name == "atomic_float32_add") return atomic_float32_add;
  if (name == "atomic_float64_add") return atomic_float64_add;
  if (name == "atomic_int64") return atomic_int64;
  if (name == "buffer_device_address") return buffer_device_address;
  if (name == "timestamps") return timestamps;
  std::string known;
  for (const auto& n : feature_names()) known += (known.empty() ? "" : ", ") + n;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown feature name '" + name + "' (known: " + known + ")");
}

Status check_required_features(const Capabilities& caps, const std::vector<std::string>& names) {
  for (const auto& name : names) {
    VKAD_ASSIGN_OR_RETURN(bool present, caps.has_feature(name));
    if (!present) {
      return make_error(ErrorCode::kUnsupported,
                        "device '" + caps.device_name + "' lacks required feature '" + name + "'");
    }
  }
  return {};
}

std::string Capabilities::to_string() const {
  std::ostringstream o;
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  o << "device:                 " << device_name << " (" << device_kind_name(kind) << ")\n"
    << "device UUID:            " << format_uuid(device_uuid) << "\n"
    << "driver:                 " << driver_name << (driver_info.empty() ? "" : " ") << driver_info
    << "\n"
    << "Vulkan API:             " << (api_version >> 22) << "." << ((api_version >> 12) & 0x3ff)
    << "." << (api_version & 0xfff) << "\n"
    << "timeline semaphores:    " << yn(timeline_semaphore) << "\n"
    << "int64 / float64 / f16:  " << yn(shader_int64) << " / " << yn(shader_float64) << " / "
    << yn(shader_float16) << "\n"
    << "atomic float add:       f32 " << yn(atomic_float32_add) << ", f64 "
    << yn(atomic_float64_add) << "\n"
    << "int64 buffer atomics:   " << yn(atomic_int64) << "\n"
    << "buffer device address:  " << yn(buffer_device_address) << "\n"
    << "NaN/inf/-0 preserved:   f32 " << yn(preserve_nan_inf_f32) << ", f64 "
    << yn(preserve_nan_inf_f64) << "\n"
    << "push descriptors:       " << yn(push_descriptor) << " (max " << max_push_descriptors
    << ")\n"
    << "storage buffers:        " << max_storage_buffers << " per pipeline\n"
    << "timestamps:             " << yn(timestamps) << " (period " << timestamp_period_ns
    << " ns)\n"
    << "subgroup size:          " << subgroup_size
    << " (arithmetic in compute: " << yn(subgroup_arithmetic)
    << ", ballot and relative shuffles: " << yn(subgroup_shuffle) << ")\n"
    << "loop passes per thread: "
    << (max_loop_passes
            ? std::to_string(max_loop_passes) + " (the driver silently leaves loops past it)"
            : std::string("no limit"))
    << "\n"
    << "max storage buffer:     " << max_storage_buffer_range << " bytes\n"
    << "max workgroup count:    " << max_workgroup_count[0] << " x " << max_workgroup_count[1]
    << " x " << max_workgroup_count[2] << "\n"
    << "max workgroup size:     " << max_workgroup_size[0] << " x " << max_workgroup_size[1]
    << " x " << max_workgroup_size[2] << " (" << max_workgroup_invocations << " invocations)\n"
    << "max push constants:     " << max_push_constants_size << " bytes\n"
    << "exportable memory (fd): " << yn(export_memory_fd) << ", timeline semaphore "
    << yn(export_semaphore_fd) << "\n";
  for (size_t i = 0; i < heaps.size(); ++i) {
    o << "memory heap " << i << ":          " << (heaps[i].size >> 20) << " MiB"
      << (heaps[i].device_local ? " (device-local)" : "") << "\n";
  }
  return o.str();
}

DeviceCore::DeviceCore() : fn_(std::make_unique<VolkDeviceTable>()) {}
DeviceCore::~DeviceCore() = default;
Device::Device() = default;

void DeviceCore::on_validation_message(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(validation_mutex_);
    if (validation_messages_.size() < 256) validation_messages_.push_back(message);
  }
  validation_count_.fetch_add(1);
}

std::vector<std::string> DeviceCore::validation_messages() const {
  std::lock_guard<std::mutex> lock(validation_mutex_);
  return validation_messages_;
}

void DeviceCore::clear_validation_messages() {
  std::lock_guard<std::mutex> lock(validation_mutex_);
  validation_messages_.clear();
  validation_count_ = 0;
}

Status DeviceCore::status() const {
  if (lost_) {
    return make_error(ErrorCode::kDeviceLost,
                      "the Vulkan device '" + caps_.device_name + "' was lost; recreate it");
  }
  return {};
}

void DeviceCore::set_name(VkObjectType type, uint64_t handle, const std::string& name) {
  if (!debug_utils_ || handle == 0) return;
  VkDebugUtilsObjectNameInfoEXT info{VK_STRUCTURE_TYPE_DEBUG_UTILS_OBJECT_NAME_INFO_EXT};
  info.objectType = type;
  info.objectHandle = handle;
  info.pObjectName = name.c_str();
  vkSetDebugUtilsObjectNameEXT(device_, &info);  // a loader trampoline: dispatches per device
}

namespace {

// Reads every fact capabilities_from() needs. Only queries; creates nothing.
DeviceFacts gather_device_facts(VkPhysicalDevice pd, uint32_t queue_family) {
  DeviceFacts f;
  uint32_t ext_count = 0;
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &ext_count, nullptr);
  std::vector<VkExtensionProperties> exts(ext_count);
  vkEnumerateDeviceExtensionProperties(pd, nullptr, &ext_count, exts.data());
  f.has_atomic_float_ext = has_extension(exts, VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
  f.has_push_descriptor_ext = has_extension(exts, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  f.has_external_memory_fd_ext = has_extension(exts, VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME);
  f.has_external_semaphore_fd_ext =
      has_extension(exts, VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME);
  f.has_pipeline_executable_properties_ext =
      has_extension(exts, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);

  f.atomic_float = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
  f.f12 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  if (f.has_atomic_float_ext) f.f12.pNext = &f.atomic_float;
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &f.f12;
  vkGetPhysicalDeviceFeatures2(pd, &f2);
  f.features = f2.features;

  VkPhysicalDevicePushDescriptorPropertiesKHR push_props{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR};
  f.p11 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES};
  f.p12 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES};
  f.p11.pNext = &f.p12;
  if (f.has_push_descriptor_ext) f.p12.pNext = &push_props;
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &f.p11;
  vkGetPhysicalDeviceProperties2(pd, &p2);
  f.properties = p2.properties;
  f.max_push_descriptors = f.has_push_descriptor_ext ? push_props.maxPushDescriptors : 0;
  // The copies must not point into this frame.
  f.f12.pNext = f.p11.pNext = f.p12.pNext = f.atomic_float.pNext = nullptr;

  uint32_t qn = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &qn, nullptr);
  std::vector<VkQueueFamilyProperties> fams(qn);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &qn, fams.data());
  if (queue_family < qn) f.queue_family = fams[queue_family];
  vkGetPhysicalDeviceMemoryProperties(pd, &f.memory);
  return f;
}

// VKAD_EXPORT_MEMORY=0 (or "off", "false") in the environment.
bool env_off(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  const std::string s(v);
  return s == "0" || s == "off" || s == "false";
}

// Whether device-local blocks and timeline semaphores can be made exportable as opaque fds, for
// sharing with CUDA (DeviceOptions::export_memory). Only where device-local memory is not
// host-visible: on unified-memory devices (lavapipe, integrated GPUs) the host maps the memory
// itself, and such a device's blocks are shared by upload buffers too.
void decide_exports(VkPhysicalDevice pd, const DeviceFacts& f, Capabilities* c) {
  const uint32_t host_visible = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
  for (uint32_t i = 0; i < f.memory.memoryTypeCount; ++i) {
    const uint32_t flags = f.memory.memoryTypes[i].propertyFlags;
    if ((flags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && !(flags & host_visible)) break;
    if (i + 1 == f.memory.memoryTypeCount) return;  // no device-local type the host cannot see
  }
  if (f.has_external_memory_fd_ext) {
    VkPhysicalDeviceExternalBufferInfo info{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO};
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    info.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
    VkExternalBufferProperties props{VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES};
    vkGetPhysicalDeviceExternalBufferProperties(pd, &info, &props);
    const VkExternalMemoryFeatureFlags feats =
        props.externalMemoryProperties.externalMemoryFeatures;
    // Sub-allocated blocks cannot be dedicated allocations: a driver that needs them is skipped.
    c->export_memory_fd = (feats & VK_EXTERNAL_MEMORY_FEATURE_EXPORTABLE_BIT) &&
                          !(feats & VK_EXTERNAL_MEMORY_FEATURE_DEDICATED_ONLY_BIT);
  }
  if (c->export_memory_fd && f.has_external_semaphore_fd_ext && c->timeline_semaphore) {
    VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkPhysicalDeviceExternalSemaphoreInfo info{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_SEMAPHORE_INFO};
    info.pNext = &type;
    info.handleType = VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT;
    VkExternalSemaphoreProperties props{VK_STRUCTURE_TYPE_EXTERNAL_SEMAPHORE_PROPERTIES};
    vkGetPhysicalDeviceExternalSemaphoreProperties(pd, &info, &props);
    c->export_semaphore_fd =
        (props.externalSemaphoreFeatures & VK_EXTERNAL_SEMAPHORE_FEATURE_EXPORTABLE_BIT) != 0;
  }
}

}  // namespace

Capabilities capabilities_from(const DeviceFacts& facts, bool use_push_descriptors) {
  Capabilities c;
  const VkPhysicalDeviceProperties& p = facts.properties;
  const VkPhysicalDeviceLimits& lim = p.limits;
  c.device_name = p.deviceName;
  c.driver_name = facts.p12.driverName;
  c.driver_info = facts.p12.driverInfo;
  c.kind = device_kind(p.deviceType);
  c.api_version = p.apiVersion;
  c.vendor_id = p.vendorID;
  c.device_id = p.deviceID;
  std::copy(std::begin(facts.p11.deviceUUID), std::end(facts.p11.deviceUUID),
            c.device_uuid.begin());
  c.timeline_semaphore = facts.f12.timelineSemaphore;
  c.shader_int64 = facts.features.shaderInt64;
  c.shader_float64 = facts.features.shaderFloat64;
  c.shader_float16 = facts.f12.shaderFloat16;
  c.atomic_float32_add =
      facts.has_atomic_float_ext && facts.atomic_float.shaderBufferFloat32AtomicAdd;
  c.atomic_float64_add = facts.has_atomic_float_ext &&
                         facts.atomic_float.shaderBufferFloat64AtomicAdd && c.shader_float64;
  c.atomic_int64 = facts.f12.shaderBufferInt64Atomics && c.shader_int64;
  c.buffer_device_address = facts.f12.bufferDeviceAddress;
  c.preserve_nan_inf_f32 = facts.p12.shaderSignedZeroInfNanPreserveFloat32;
  c.preserve_nan_inf_f64 = facts.p12.shaderSignedZeroInfNanPreserveFloat64 && c.shader_float64;
  c.push_descriptor =
      use_push_descriptors && facts.has_push_descriptor_ext && facts.max_push_descriptors > 0;
  c.max_push_descriptors = c.push_descriptor ? facts.max_push_descriptors : 0;
  c.timestamps = facts.queue_family.timestampValidBits != 0 && lim.timestampPeriod > 0;
  c.timestamp_period_ns = lim.timestampPeriod;
  c.timestamp_valid_bits = facts.queue_family.timestampValidBits;
  c.subgroup_size = facts.p11.subgroupSize;
  {
    const VkSubgroupFeatureFlags need = VK_SUBGROUP_FEATURE_BASIC_BIT |
                                        VK_SUBGROUP_FEATURE_VOTE_BIT |
                                        VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
    c.subgroup_arithmetic =
        (facts.p11.subgroupSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
        (facts.p11.subgroupSupportedOperations & need) == need;
    const VkSubgroupFeatureFlags shuffle =
        need | VK_SUBGROUP_FEATURE_BALLOT_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT;
    c.subgroup_shuffle =
        c.subgroup_arithmetic && (facts.p11.subgroupSupportedOperations & shuffle) == shuffle;
  }
  c.max_storage_buffer_range = lim.maxStorageBufferRange;
  c.max_storage_buffers = std::min({lim.maxPerStageDescriptorStorageBuffers,
                                    lim.maxDescriptorSetStorageBuffers, lim.maxPerStageResources});
  // Mesa's llvmpipe leaves a loop after 65,535 passes per invocation (see Capabilities).
  if (facts.p12.driverID == VK_DRIVER_ID_MESA_LLVMPIPE) c.max_loop_passes = 65535;
  for (int i = 0; i < 3; ++i) {
    c.max_workgroup_count[i] = lim.maxComputeWorkGroupCount[i];
    c.max_workgroup_size[i] = lim.maxComputeWorkGroupSize[i];
  }
  c.max_workgroup_invocations = lim.maxComputeWorkGroupInvocations;
  c.max_push_constants_size = lim.maxPushConstantsSize;
  c.min_storage_buffer_offset_alignment = lim.minStorageBufferOffsetAlignment;
  c.non_coherent_atom_size = lim.nonCoherentAtomSize ? lim.nonCoherentAtomSize : 1;
  for (uint32_t i = 0; i < facts.memory.memoryHeapCount; ++i) {
    c.heaps.push_back({facts.memory.memoryHeaps[i].size,
                       (facts.memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  }
  return c;
}

Capabilities capabilities_from(const DeviceFacts& facts, const ExternalFeatures& on) {
  Capabilities c = capabilities_from(facts, on.push_descriptor);
  c.timeline_semaphore = c.timeline_semaphore && on.timeline_semaphore;
  c.shader_int64 = c.shader_int64 && on.shader_int64;
  c.shader_float64 = c.shader_float64 && on.shader_float64;
  c.shader_float16 = c.shader_float16 && on.shader_float16;
  c.atomic_float32_add = c.atomic_float32_add && on.atomic_float32_add;
  c.atomic_float64_add = c.atomic_float64_add && on.atomic_float64_add && c.shader_float64;
  c.atomic_int64 = c.atomic_int64 && on.buffer_int64_atomics && c.shader_int64;
  c.buffer_device_address = c.buffer_device_address && on.buffer_device_address;
  c.preserve_nan_inf_f64 = c.preserve_nan_inf_f64 && c.shader_float64;
  return c;
}

Status Device::choose_physical(const DeviceOptions& options) {
  VKAD_ASSIGN_OR_RETURN(std::vector<PhysicalDeviceEntry> entries,
                        enumerate_physical_devices(*instance_));
  std::vector<PhysicalDeviceInfo> infos;
  infos.reserve(entries.size());
  for (const PhysicalDeviceEntry& e : entries) infos.push_back(e.info);
  DeviceSelection sel;
  sel.forced = options.device;
  if (sel.forced.empty() && std::getenv("VKAD_DEVICE")) sel.forced = std::getenv("VKAD_DEVICE");
  sel.min_api_version = VK_API_VERSION_1_2;
  VKAD_ASSIGN_OR_RETURN(size_t chosen, choose_device(infos, sel));
  physical_ = entries[chosen].handle;
  queue_family_ = static_cast<uint32_t>(compute_queue_family(physical_, &queue_count_));
  queue_count_ = std::min<uint32_t>(queue_count_, kMaxStreams);
  return {};
}

Status Device::create_logical(const DeviceFacts& facts) {
  const Capabilities& c = caps_;
  // Enable exactly what caps_ says.
  VkPhysicalDeviceShaderAtomicFloatFeaturesEXT atomic_on{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
  atomic_on.shaderBufferFloat32AtomicAdd = c.atomic_float32_add;
  atomic_on.shaderBufferFloat64AtomicAdd = c.atomic_float64_add;
  VkPhysicalDeviceVulkan12Features on12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  on12.timelineSemaphore = c.timeline_semaphore;
  on12.shaderFloat16 = c.shader_float16;
  on12.bufferDeviceAddress = c.buffer_device_address;
  on12.hostQueryReset = facts.f12.hostQueryReset;
  on12.shaderBufferInt64Atomics = c.atomic_int64;
  if (facts.has_atomic_float_ext) on12.pNext = &atomic_on;
  VkPhysicalDeviceFeatures2 on2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  on2.pNext = &on12;
  on2.features.shaderInt64 = c.shader_int64;
  on2.features.shaderFloat64 = c.shader_float64;
  // The driver's statistics of each pipeline (registers, instructions, spills), on request.
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR stats_on{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  stats_on.pipelineExecutableInfo = VK_TRUE;
  const bool stats_wanted = env_flag("VKAD_PIPELINE_STATS");
  pipeline_stats_ = stats_wanted && facts.has_pipeline_executable_properties_ext;
  if (stats_wanted && !pipeline_stats_) {
    std::fprintf(stderr, "vkad: VKAD_PIPELINE_STATS: '%s' lacks %s; no statistics\n",
                 facts.properties.deviceName, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  }
  std::vector<const char*> dev_ext_names;
  if (pipeline_stats_) {
    stats_on.pNext = on2.pNext;
    on2.pNext = &stats_on;
    dev_ext_names.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  }
  if (facts.has_atomic_float_ext)
    dev_ext_names.push_back(VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
  if (c.push_descriptor) dev_ext_names.push_back(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  if (c.export_memory_fd) dev_ext_names.push_back(VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME);
  if (c.export_semaphore_fd) dev_ext_names.push_back(VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME);

  std::vector<float> priorities(queue_count_, 1.0f);
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = queue_family_;
  qci.queueCount = queue_count_;
  qci.pQueuePriorities = priorities.data();
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.pNext = &on2;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<uint32_t>(dev_ext_names.size());
  dci.ppEnabledExtensionNames = dev_ext_names.data();
  VKAD_TRY(
      vk("vkCreateDevice", [&] { return vkCreateDevice(physical_, &dci, nullptr, &device_); }));
  return {};
}

Status Device::adopt(const ExternalDevice& e) {
  if (e.instance == VK_NULL_HANDLE || e.physical_device == VK_NULL_HANDLE ||
      e.device == VK_NULL_HANDLE) {
    return make_error(ErrorCode::kInvalidArgument,
                      "imported device: the instance, physical device and device must all be set");
  }
  uint32_t qn = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(e.physical_device, &qn, nullptr);
  std::vector<VkQueueFamilyProperties> fams(qn);
  vkGetPhysicalDeviceQueueFamilyProperties(e.physical_device, &qn, fams.data());
  if (e.queue_family >= qn || (fams[e.queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT) == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "imported device: queue family " + std::to_string(e.queue_family) +
                          " does not exist or has no compute queues (" + std::to_string(qn) +
                          " families)");
  }
  // In 64 bits: first_queue + queue_count may wrap in 32 (1 + 0xFFFFFFFF would pass as 0).
  const uint64_t queue_end = uint64_t{e.first_queue} + e.queue_count;
  if (e.queue_count == 0 || queue_end > fams[e.queue_family].queueCount) {
    return make_error(ErrorCode::kInvalidArgument,
                      "imported device: queues " + std::to_string(e.first_queue) + ".." +
                          std::to_string(queue_end) + " of family " +
                          std::to_string(e.queue_family) + ", which has " +
                          std::to_string(fams[e.queue_family].queueCount));
  }
  physical_ = e.physical_device;
  device_ = e.device;
  queue_family_ = e.queue_family;
  first_queue_ = e.first_queue;
  queue_count_ = std::min<uint32_t>(e.queue_count, kMaxStreams);
  imported_ = true;
  return {};
}

Result<std::unique_ptr<Device>> Device::create(const DeviceOptions& options) {
  std::unique_ptr<Device> dev(new Device());
  const ExternalDevice* ext = options.external ? &*options.external : nullptr;
  // An imported device's validation is its instance's business: vkad's layer would not see it.
  dev->validation_enabled_ = !ext && (options.enable_validation || env_flag("VKAD_VALIDATION"));
  // Even an imported device needs the shared instance: it loads the loader's instance-level
  // trampolines, which dispatch on the physical device passed, whichever instance made it.
  VKAD_ASSIGN_OR_RETURN(dev->instance_, Instance::shared(dev->validation_enabled_));
  if (ext) {
    VKAD_TRY(dev->adopt(*ext));
  } else {
    dev->debug_utils_ = dev->instance_->debug_utils();
    dev->instance_->add_sink(dev.get());
    dev->sink_added_ = true;
    VKAD_TRY(dev->choose_physical(options));
  }
  const DeviceFacts facts = gather_device_facts(dev->physical_, dev->queue_family_);
  if (facts.properties.apiVersion < VK_API_VERSION_1_2) {
    return make_error(
        ErrorCode::kUnsupported,
        std::string("device '") + facts.properties.deviceName + "' supports only Vulkan " +
            std::to_string(VK_API_VERSION_MAJOR(facts.properties.apiVersion)) + "." +
            std::to_string(VK_API_VERSION_MINOR(facts.properties.apiVersion)) + "; vkad needs 1.2");
  }
  dev->caps_ = ext ? capabilities_from(facts, ext->enabled)
                   : capabilities_from(facts, options.push_descriptors);
  VKAD_TRY(check_required_features(dev->caps_, options.required_features));
  if (!ext && options.export_memory && !env_off("VKAD_EXPORT_MEMORY")) {
    decide_exports(dev->physical_, facts, &dev->caps_);
  }
  if (!ext) VKAD_TRY(dev->create_logical(facts));
  volkLoadDeviceTable(dev->fn_.get(), dev->device_);
  if (!ext) {
    dev->set_name(VK_OBJECT_TYPE_DEVICE, reinterpret_cast<uint64_t>(dev->device_),
                  "vkad device (" + dev->caps_.device_name + ")");
  }
  dev->allocator_ = std::make_unique<MemoryAllocator>(*dev, options.memory_block_bytes,
                                                      options.memory_limit_bytes,
                                                      options.spare_blocks_per_memory_type);
  dev->properties_ = facts.properties;
  VKAD_TRY(dev->create_pipeline_cache(options.pipeline_cache_dir));
  return dev;
}

Status Device::create_pipeline_cache(const std::string& dir) {
  pipeline_cache_dir_ = dir;
  std::string data;
  if (!dir.empty()) {
    CacheFile f = read_cache_file(dir, pipeline_cache_file_name(properties_),
                                  CacheKind::kPipelineCache, pipeline_cache_key(properties_));
    pipeline_cache_load_.outcome = cache_read_name(f.outcome);
    if (f.outcome == CacheRead::kHit) {
      if (pipeline_cache_header_matches(f.payload, properties_)) {
        data = std::move(f.payload);
      } else {
        pipeline_cache_load_.outcome = "stale";
      }
    }
  }
  VkPipelineCacheCreateInfo info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  info.initialDataSize = data.size();
  info.pInitialData = data.empty() ? nullptr : data.data();
  Status s = vk("vkCreatePipelineCache", [&] {
    return fn_->vkCreatePipelineCache(device_, &info, nullptr, &pipeline_cache_);
  });
  if (!s.ok() && !data.empty()) {
    // A driver may refuse data it cannot use: start empty instead.
    pipeline_cache_load_.outcome = "stale";
    data.clear();
    info.initialDataSize = 0;
    info.pInitialData = nullptr;
    s = vk("vkCreatePipelineCache",
           [&] { return fn_->vkCreatePipelineCache(device_, &info, nullptr, &pipeline_cache_); });
  }
  VKAD_TRY(s);
  pipeline_cache_load_.loaded = !data.empty();
  pipeline_cache_load_.bytes = data.size();
  set_name(VK_OBJECT_TYPE_PIPELINE_CACHE, reinterpret_cast<uint64_t>(pipeline_cache_),
           "vkad pipeline cache");
  return {};
}

Status Device::save_pipeline_cache() {
  if (pipeline_cache_dir_.empty() || pipeline_cache_ == VK_NULL_HANDLE || pipelines_unsaved_ == 0) {
    return {};
  }
  // Another process may have saved since this one loaded: merge what the file holds now, so the
  // rename below does not drop its pipelines (two writers racing still leave one whole file).
  CacheFile current = read_cache_file(pipeline_cache_dir_, pipeline_cache_file_name(properties_),
                                      CacheKind::kPipelineCache, pipeline_cache_key(properties_));
  if (current.outcome == CacheRead::kHit &&
      pipeline_cache_header_matches(current.payload, properties_)) {
    VkPipelineCacheCreateInfo info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    info.initialDataSize = current.payload.size();
    info.pInitialData = current.payload.data();
    VkPipelineCache other = VK_NULL_HANDLE;
    if (fn_->vkCreatePipelineCache(device_, &info, nullptr, &other) == VK_SUCCESS) {
      // Best effort: a failed merge keeps this process's pipelines alone.
      (void)fn_->vkMergePipelineCaches(device_, pipeline_cache_, 1, &other);
      fn_->vkDestroyPipelineCache(device_, other, nullptr);
    }
  }
  size_t size = 0;
  VKAD_TRY(vk("vkGetPipelineCacheData", [&] {
    return fn_->vkGetPipelineCacheData(device_, pipeline_cache_, &size, nullptr);
  }));
  std::string data(size, '\0');
  VKAD_TRY(vk("vkGetPipelineCacheData", [&] {
    return fn_->vkGetPipelineCacheData(device_, pipeline_cache_, &size, data.data());
  }));
  data.resize(size);
  // Data a driver would not recognise as its own is not worth keeping; data the file already
  // holds (every pipeline came from it) is not written again.
  if (!pipeline_cache_header_matches(data, properties_) ||
      (current.outcome == CacheRead::kHit && current.payload == data)) {
    pipelines_unsaved_ = 0;
    return {};
  }
  VKAD_TRY(write_cache_file(pipeline_cache_dir_, pipeline_cache_file_name(properties_),
                            CacheKind::kPipelineCache, pipeline_cache_key(properties_), data));
  pipelines_unsaved_ = 0;
  return {};
}

Device::~Device() {
  if (pipeline_cache_ != VK_NULL_HANDLE) {
    if (Status s = save_pipeline_cache(); !s.ok()) {
      log(LogLevel::kWarning, "pipeline cache not saved: " + s.message());
    }
    fn_->vkDestroyPipelineCache(device_, pipeline_cache_, nullptr);
  }
  if (device_ != VK_NULL_HANDLE && allocator_) {
    // Shutdown is the one place a device-wide wait is right for a device vkad owns: everything
    // is going away. An imported device is the embedder's: its streams already waited for
    // vkad's own submissions, so what the deleter holds is complete; the device stays.
    if (!imported_) fn_->vkDeviceWaitIdle(device_);
    deleter_.destroy_all([this](Garbage&& g) { destroy_now(std::move(g)); });
    allocator_.reset();
    if (!imported_) fn_->vkDestroyDevice(device_, nullptr);
  } else if (device_ != VK_NULL_HANDLE && !imported_) {
    fn_->vkDestroyDevice(device_, nullptr);
  }
  if (sink_added_) instance_->remove_sink(this);
}

int Device::attach_stream(SerialTracker* tracker) {
  for (int i = 0; i < kMaxStreams; ++i) {
    if (!stream_slots_[i]) {
      stream_slots_[i] = true;
      deleter_.set_tracker(i, tracker);
      return i;
    }
  }
  return -1;
}

void Device::detach_stream(int index) {
  // A stream waits for its own work before detaching, so whatever is still queued on its slot
  // is complete: collect it before the tracker goes away.
  collect_garbage();
  deleter_.set_tracker(index, nullptr);
  stream_slots_[index] = false;
}

void Device::release(const ResourceUse& use, Garbage garbage) {
  deleter_.release(use, std::move(garbage), [this](Garbage&& g) { destroy_now(std::move(g)); });
}

size_t Device::collect_garbage() {
  return deleter_.collect([this](Garbage&& g) { destroy_now(std::move(g)); });
}

void Device::destroy_now(Garbage&& g) {
  switch (g.type) {
    case VK_OBJECT_TYPE_BUFFER:
      fn_->vkDestroyBuffer(device_, reinterpret_cast<VkBuffer>(g.handle), nullptr);
      allocator_->free(g.allocation);
      --live_.buffers;
      break;
    case VK_OBJECT_TYPE_PIPELINE:
      fn_->vkDestroyPipeline(device_, reinterpret_cast<VkPipeline>(g.handle), nullptr);
      --live_.pipelines;
      break;
    case VK_OBJECT_TYPE_PIPELINE_LAYOUT:
      fn_->vkDestroyPipelineLayout(device_, reinterpret_cast<VkPipelineLayout>(g.handle), nullptr);
      break;
    case VK_OBJECT_TYPE_DESCRIPTOR_SET_LAYOUT:
      fn_->vkDestroyDescriptorSetLayout(device_, reinterpret_cast<VkDescriptorSetLayout>(g.handle),
                                        nullptr);
      break;
    case VK_OBJECT_TYPE_SHADER_MODULE:
      fn_->vkDestroyShaderModule(device_, reinterpret_cast<VkShaderModule>(g.handle), nullptr);
      break;
    case VK_OBJECT_TYPE_QUERY_POOL:
      fn_->vkDestroyQueryPool(device_, reinterpret_cast<VkQueryPool>(g.handle), nullptr);
      --live_.query_pools;
      break;
    default: break;
  }
}

}  // namespace vkad::rhi
