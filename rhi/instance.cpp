#include "rhi/instance.h"

#include <volk.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "rhi/vk_check.h"

namespace vkad::rhi {

namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts) {
    if (std::strcmp(e.extensionName, name) == 0) return true;
  }
  return false;
}

// Owns the instances for static destruction; index = validation on/off.
struct Registry {
  std::mutex mutex;
  std::shared_ptr<Instance> instances[2];
};

Registry& registry() {
  static Registry r;
  return r;
}

// At exit: drops the registry's references, destroying every instance no device still holds.
// Registered with atexit right after the first vkCreateInstance, i.e. after the driver was
// loaded and had registered its own exit handlers, so this runs BEFORE the driver tears itself
// down (exit handlers run in reverse order). Destroying the instance from the registry's static
// destructor instead (constructed before the driver was loaded, so destroyed after it) crashed
// every program at exit on NVIDIA.
void release_at_exit() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& inst : r.instances) inst.reset();
}

}  // namespace

Result<std::shared_ptr<Instance>> Instance::shared(bool validation) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::shared_ptr<Instance>& slot = r.instances[validation ? 1 : 0];
  if (!slot) {
    VKAD_ASSIGN_OR_RETURN(std::unique_ptr<Instance> created, create(validation));
    slot = std::move(created);
    static const bool registered = std::atexit(release_at_exit) == 0;
    (void)registered;
  }
  return slot;
}

namespace {

// volkInitialize, once per process (under the registry lock, like every create()).
Status load_vulkan_once() {
  static bool volk_ready = false;
  if (volk_ready) return {};
  if (volkInitialize() != VK_SUCCESS) {
    return make_error(ErrorCode::kNoDevice,
                      "no Vulkan loader (libvulkan.so.1) found; install libvulkan1 and a driver "
                      "(mesa-vulkan-drivers provides lavapipe)");
  }
  volk_ready = true;
  return {};
}

// Whether validation can be had: the Khronos layer installed and VK_EXT_debug_utils there to
// report its messages.
Status validation_available(bool debug_utils) {
  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> props(n);
  vkEnumerateInstanceLayerProperties(&n, props.data());
  bool found = false;
  for (const auto& p : props) found |= std::strcmp(p.layerName, kValidationLayer) == 0;
  if (!found) {
    return make_error(ErrorCode::kUnsupported,
                      std::string("validation requested but layer ") + kValidationLayer +
                          " is not installed (Debian: vulkan-validationlayers)");
  }
  if (!debug_utils) {
    return make_error(ErrorCode::kUnsupported,
                      "validation requested but VK_EXT_debug_utils is unavailable");
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<Instance>> Instance::create(bool validation) {
  // Called under the registry lock, so volk's globals are written by one thread at a time and
  // only before any device exists that could read them concurrently: volkInitialize once, the
  // instance-level trampolines once (with the first instance).
  static bool instance_functions_loaded = false;
  VKAD_TRY(load_vulkan_once());
  std::unique_ptr<Instance> inst(new Instance());
  inst->validation_ = validation;
  inst->loader_version_ = volkGetInstanceVersion();
  if (inst->loader_version_ < VK_API_VERSION_1_2) {
    return make_error(
        ErrorCode::kUnsupported,
        "the Vulkan loader supports only Vulkan " + std::to_string(inst->loader_version_ >> 22) +
            "." + std::to_string((inst->loader_version_ >> 12) & 0x3ff) + "; vkad needs 1.2");
  }

  uint32_t n = 0;
  vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data());
  std::vector<const char*> extensions;
  inst->debug_utils_ = has_extension(exts, VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  if (inst->debug_utils_) extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);

  std::vector<const char*> layers;
  if (validation) {
    VKAD_TRY(validation_available(inst->debug_utils_));
    layers.push_back(kValidationLayer);
  }

  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "vkad";
  app.pEngineName = "vkad";
  app.apiVersion =
      inst->loader_version_ >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_2;
  VkDebugUtilsMessengerCreateInfoEXT messenger_info{
      VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  messenger_info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                                   VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  messenger_info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  messenger_info.pfnUserCallback = &Instance::on_debug_message;
  messenger_info.pUserData = inst.get();

  VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  ici.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  ici.ppEnabledExtensionNames = extensions.data();
  ici.enabledLayerCount = static_cast<uint32_t>(layers.size());
  ici.ppEnabledLayerNames = layers.data();
  // Chained so that messages from instance creation itself are caught too.
  if (validation) ici.pNext = &messenger_info;
  VKAD_TRY(vk_call("vkCreateInstance",
                   [&] { return vkCreateInstance(&ici, nullptr, &inst->instance_); }));
  if (!instance_functions_loaded) {
    volkLoadInstanceOnly(inst->instance_);
    instance_functions_loaded = true;
  }
  if (validation) {
    VKAD_TRY(vk_call("vkCreateDebugUtilsMessengerEXT", [&] {
      return vkCreateDebugUtilsMessengerEXT(inst->instance_, &messenger_info, nullptr,
                                            &inst->messenger_);
    }));
  }
  return inst;
}

Instance::~Instance() {
  if (messenger_ != VK_NULL_HANDLE) vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
  if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
}

void Instance::add_sink(ValidationSink* sink) {
  std::lock_guard<std::mutex> lock(sinks_mutex_);
  sinks_.push_back(sink);
}

void Instance::remove_sink(ValidationSink* sink) {
  std::lock_guard<std::mutex> lock(sinks_mutex_);
  sinks_.erase(std::remove(sinks_.begin(), sinks_.end(), sink), sinks_.end());
}

VKAPI_ATTR VkBool32 VKAPI_CALL Instance::on_debug_message(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
    const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  auto* self = static_cast<Instance*>(user);
  if (severity < VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) return VK_FALSE;
  std::string msg = data && data->pMessage ? data->pMessage : "(no message)";
  log(severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT ? LogLevel::kError
                                                                : LogLevel::kWarning,
      "validation: " + msg);
  std::lock_guard<std::mutex> lock(self->sinks_mutex_);
  for (ValidationSink* sink : self->sinks_) sink->on_validation_message(msg);
  return VK_FALSE;
}

}  // namespace vkad::rhi
