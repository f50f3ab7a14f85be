#include "rhi/device.h"

#include <volk.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace vkad::rhi {

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

DeviceKind to_kind(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return DeviceKind::kDiscreteGpu;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return DeviceKind::kIntegratedGpu;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return DeviceKind::kVirtualGpu;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return DeviceKind::kCpu;
    default: return DeviceKind::kOther;
  }
}

int compute_queue_family(VkPhysicalDevice pd, uint32_t* count_out) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, fams.data());
  int best = -1;
  // Prefer a compute-only family (async compute on discrete GPUs), else any compute family.
  for (uint32_t i = 0; i < n; ++i) {
    if (!(fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
    bool compute_only = !(fams[i].queueFlags & VK_QUEUE_GRAPHICS_BIT);
    if (best < 0 || (compute_only && (fams[best].queueFlags & VK_QUEUE_GRAPHICS_BIT))) {
      best = static_cast<int>(i);
    }
  }
  if (best >= 0 && count_out) *count_out = fams[best].queueCount;
  return best;
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts) {
    if (std::strcmp(e.extensionName, name) == 0) return true;
  }
  return false;
}

}  // namespace

const std::vector<std::string>& Capabilities::feature_names() {
  static const std::vector<std::string> names = {
      "timeline_semaphore", "int64", "float64", "float16", "atomic_float32_add",
      "atomic_float64_add", "atomic_int64", "buffer_device_address", "timestamps"};
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
      return make_error(ErrorCode::kUnsupported, "device '" + caps.device_name +
                                                     "' lacks required feature '" + name + "'");
    }
  }
  return {};
}

std::string Capabilities::to_string() const {
  std::ostringstream o;
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  o << "device:                 " << device_name << " (" << device_kind_name(kind) << ")\n"
    << "driver:                 " << driver_name << "\n"
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
    << "timestamps:             " << yn(timestamps) << " (period " << timestamp_period_ns
    << " ns)\n"
    << "subgroup size:          " << subgroup_size << "\n"
    << "loop passes per thread: "
    << (max_loop_passes ? std::to_string(max_loop_passes) + " (the driver silently leaves loops past it)"
                        : std::string("no limit"))
    << "\n"
    << "max storage buffer:     " << max_storage_buffer_range << " bytes\n"
    << "max workgroup count:    " << max_workgroup_count[0] << " x " << max_workgroup_count[1]
    << " x " << max_workgroup_count[2] << "\n"
    << "max workgroup size:     " << max_workgroup_size[0] << " x " << max_workgroup_size[1]
    << " x " << max_workgroup_size[2] << " (" << max_workgroup_invocations
    << " invocations)\n"
    << "max push constants:     " << max_push_constants_size << " bytes\n";
  for (size_t i = 0; i < heaps.size(); ++i) {
    o << "memory heap " << i << ":          " << (heaps[i].size >> 20) << " MiB"
      << (heaps[i].device_local ? " (device-local)" : "") << "\n";
  }
  return o.str();
}

Device::Device() : fn_(std::make_unique<VolkDeviceTable>()) {}

void Device::on_validation_message(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(validation_mutex_);
    if (validation_messages_.size() < 256) validation_messages_.push_back(message);
  }
  validation_count_.fetch_add(1);
}

std::vector<std::string> Device::validation_messages() const {
  std::lock_guard<std::mutex> lock(validation_mutex_);
  return validation_messages_;
}

void Device::clear_validation_messages() {
  std::lock_guard<std::mutex> lock(validation_mutex_);
  validation_messages_.clear();
  validation_count_ = 0;
}

Status Device::status() const {
  if (lost_) {
    return make_error(ErrorCode::kDeviceLost,
                      "the Vulkan device '" + caps_.device_name + "' was lost; recreate it");
  }
  return {};
}

void Device::set_name(VkObjectType type, uint64_t handle, const std::string& name) {
  if (!debug_utils_ || handle == 0) return;
  VkDebugUtilsObjectNameInfoEXT info{VK_STRUCTURE_TYPE_DEBUG_UTILS_OBJECT_NAME_INFO_EXT};
  info.objectType = type;
  info.objectHandle = handle;
  info.pObjectName = name.c_str();
  vkSetDebugUtilsObjectNameEXT(device_, &info);  // a loader trampoline: dispatches per device
}

Result<std::unique_ptr<Device>> Device::create(const DeviceOptions& options) {
  std::unique_ptr<Device> dev(new Device());
  dev->validation_enabled_ = options.enable_validation || env_flag("VKAD_VALIDATION");
  VKAD_ASSIGN_OR_RETURN(dev->instance_, Instance::shared(dev->validation_enabled_));
  dev->debug_utils_ = dev->instance_->debug_utils();
  dev->instance_->add_sink(dev.get());
  dev->sink_added_ = true;
  VkInstance instance = dev->instance_->handle();

  // --- choose the physical device ---
  uint32_t count = 0;
  VKAD_TRY(dev->vk("vkEnumeratePhysicalDevices",
                   [&] { return vkEnumeratePhysicalDevices(instance, &count, nullptr); }));
  std::vector<VkPhysicalDevice> pds(count);
  VKAD_TRY(dev->vk("vkEnumeratePhysicalDevices", [&] {
    return vkEnumeratePhysicalDevices(instance, &count, pds.data());
  }));
  std::vector<PhysicalDeviceInfo> infos;
  for (VkPhysicalDevice pd : pds) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(pd, &p);
    infos.push_back({p.deviceName, to_kind(p.deviceType), p.apiVersion,
                     compute_queue_family(pd, nullptr) >= 0});
  }
  DeviceSelection sel;
  sel.forced = options.device;
  if (sel.forced.empty() && std::getenv("VKAD_DEVICE")) sel.forced = std::getenv("VKAD_DEVICE");
  sel.min_api_version = VK_API_VERSION_1_2;
  VKAD_ASSIGN_OR_RETURN(size_t chosen, choose_device(infos, sel));
  dev->physical_ = pds[chosen];
  dev->queue_family_ = static_cast<uint32_t>(compute_queue_family(dev->physical_, &dev->queue_count_));

  // --- capabilities ---
  uint32_t ext_count = 0;
  vkEnumerateDeviceExtensionProperties(dev->physical_, nullptr, &ext_count, nullptr);
  std::vector<VkExtensionProperties> dev_exts(ext_count);
  vkEnumerateDeviceExtensionProperties(dev->physical_, nullptr, &ext_count, dev_exts.data());
  bool has_atomic_float = has_extension(dev_exts, VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
  bool has_push_descriptor =
      options.push_descriptors && has_extension(dev_exts, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);

  VkPhysicalDeviceShaderAtomicFloatFeaturesEXT atomic_f{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  if (has_atomic_float) f12.pNext = &atomic_f;
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &f12;
  vkGetPhysicalDeviceFeatures2(dev->physical_, &f2);

  VkPhysicalDevicePushDescriptorPropertiesKHR push_props{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR};
  VkPhysicalDeviceVulkan11Properties p11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES};
  VkPhysicalDeviceVulkan12Properties p12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES};
  p11.pNext = &p12;
  if (has_push_descriptor) p12.pNext = &push_props;
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &p11;
  vkGetPhysicalDeviceProperties2(dev->physical_, &p2);
  const VkPhysicalDeviceLimits& lim = p2.properties.limits;

  uint32_t qn = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(dev->physical_, &qn, nullptr);
  std::vector<VkQueueFamilyProperties> fams(qn);
  vkGetPhysicalDeviceQueueFamilyProperties(dev->physical_, &qn, fams.data());

  Capabilities& c = dev->caps_;
  c.device_name = p2.properties.deviceName;
  c.driver_name = p12.driverName;
  c.kind = to_kind(p2.properties.deviceType);
  c.api_version = p2.properties.apiVersion;
  c.vendor_id = p2.properties.vendorID;
  c.timeline_semaphore = f12.timelineSemaphore;
  c.shader_int64 = f2.features.shaderInt64;
  c.shader_float64 = f2.features.shaderFloat64;
  c.shader_float16 = f12.shaderFloat16;
  c.atomic_float32_add = has_atomic_float && atomic_f.shaderBufferFloat32AtomicAdd;
  c.atomic_float64_add = has_atomic_float && atomic_f.shaderBufferFloat64AtomicAdd;
  c.atomic_int64 = f12.shaderBufferInt64Atomics && f2.features.shaderInt64;
  c.buffer_device_address = f12.bufferDeviceAddress;
  c.preserve_nan_inf_f32 = p12.shaderSignedZeroInfNanPreserveFloat32;
  c.preserve_nan_inf_f64 = p12.shaderSignedZeroInfNanPreserveFloat64 && c.shader_float64;
  c.push_descriptor = has_push_descriptor && push_props.maxPushDescriptors > 0;
  c.max_push_descriptors = c.push_descriptor ? push_props.maxPushDescriptors : 0;
  c.timestamps = fams[dev->queue_family_].timestampValidBits != 0 && lim.timestampPeriod > 0;
  c.timestamp_period_ns = lim.timestampPeriod;
  c.subgroup_size = p11.subgroupSize;
  c.max_storage_buffer_range = lim.maxStorageBufferRange;
  if (p12.driverID == VK_DRIVER_ID_MESA_LLVMPIPE) c.max_loop_passes = 65535;
  for (int i = 0; i < 3; ++i) {
    c.max_workgroup_count[i] = lim.maxComputeWorkGroupCount[i];
    c.max_workgroup_size[i] = lim.maxComputeWorkGroupSize[i];
  }
  c.max_workgroup_invocations = lim.maxComputeWorkGroupInvocations;
  c.max_push_constants_size = lim.maxPushConstantsSize;
  c.min_storage_buffer_offset_alignment = lim.minStorageBufferOffsetAlignment;
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(dev->physical_, &mem);
  for (uint32_t i = 0; i < mem.memoryHeapCount; ++i) {
    c.heaps.push_back({mem.memoryHeaps[i].size,
                       (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  }
  VKAD_TRY(check_required_features(c, options.required_features));

  // --- logical device: enable exactly what we detected ---
  VkPhysicalDeviceShaderAtomicFloatFeaturesEXT atomic_on{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
  atomic_on.shaderBufferFloat32AtomicAdd = c.atomic_float32_add;
  atomic_on.shaderBufferFloat64AtomicAdd = c.atomic_float64_add;
  VkPhysicalDeviceVulkan12Features on12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  on12.timelineSemaphore = c.timeline_semaphore;
  on12.shaderFloat16 = c.shader_float16;
  on12.bufferDeviceAddress = c.buffer_device_address;
  on12.hostQueryReset = f12.hostQueryReset;
  on12.shaderBufferInt64Atomics = c.atomic_int64;
  if (has_atomic_float) on12.pNext = &atomic_on;
  VkPhysicalDeviceFeatures2 on2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  on2.pNext = &on12;
  on2.features.shaderInt64 = c.shader_int64;
  on2.features.shaderFloat64 = c.shader_float64;
  std::vector<const char*> dev_ext_names;
  if (has_atomic_float) dev_ext_names.push_back(VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
  if (c.push_descriptor) dev_ext_names.push_back(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);

  dev->queue_count_ = std::min<uint32_t>(dev->queue_count_, kMaxStreams);
  std::vector<float> priorities(dev->queue_count_, 1.0f);
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = dev->queue_family_;
  qci.queueCount = dev->queue_count_;
  qci.pQueuePriorities = priorities.data();
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.pNext = &on2;
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<uint32_t>(dev_ext_names.size());
  dci.ppEnabledExtensionNames = dev_ext_names.data();
  VKAD_TRY(dev->vk("vkCreateDevice", [&] {
    return vkCreateDevice(dev->physical_, &dci, nullptr, &dev->device_);
  }));
  volkLoadDeviceTable(dev->fn_.get(), dev->device_);
  dev->set_name(VK_OBJECT_TYPE_DEVICE, reinterpret_cast<uint64_t>(dev->device_),
                "vkad device (" + c.device_name + ")");
  dev->allocator_ = std::make_unique<MemoryAllocator>(*dev, options.memory_block_bytes,
                                                      options.memory_limit_bytes,
                                                      options.spare_blocks_per_memory_type);
  return dev;
}

Device::~Device() {
  if (device_ != VK_NULL_HANDLE) {
    // Shutdown is the one place a device-wide wait is right: everything is going away.
    fn_->vkDeviceWaitIdle(device_);
    deleter_.destroy_all([this](Garbage&& g) { destroy_now(std::move(g)); });
    allocator_.reset();
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
