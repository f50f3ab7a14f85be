// The process-wide Vulkan instance (one per validation setting), shared by every Device.
//
// Why process-wide: the NVIDIA driver allows only ~30 VkInstance lifetimes per process (round 31
// of create/destroy fails with VK_ERROR_INCOMPATIBLE_DRIVER), so a DSL that re-creates its
// backend (a runtime per test, a notebook re-run) would stop working; and an instance per
// runtime is wasted start-up time anyway.
//
// Contract:
//  - Instance::shared(validation) creates the instance on first use and returns the same one on
//    every later call with the same setting. Thread-safe. The registry keeps it alive until
//    process exit (an atexit handler), so an instance is created at most twice per process.
//  - Every Device holds a shared_ptr, so an instance outlives every device made from it, even
//    a device destroyed during static destruction.
//  - Instance-level entry points are loaded once into volk's globals (they are loader
//    trampolines that dispatch on the object passed, so they serve every instance); device-level
//    calls go through each Device's own table (Device::fn()), never through volk's globals.
//  - Validation messages (severity >= warning) are delivered to every registered sink of this
//    instance: a message is counted by each live device of the instance, never dropped.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"

namespace vkad::rhi {

// Receives validation messages. Called on any thread, under the instance's sink lock.
class ValidationSink {
 public:
  virtual ~ValidationSink() = default;
  virtual void on_validation_message(const std::string& message) = 0;
};

class Instance {
 public:
  // The shared instance for this validation setting; created on first use. kNoDevice without a
  // Vulkan loader; kUnsupported when validation is asked for but the layer is missing.
  static Result<std::shared_ptr<Instance>> shared(bool validation);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const { return instance_; }
  bool validation() const { return validation_; }
  bool debug_utils() const { return debug_utils_; }
  // Loader's instance version (>= 1.2).
  uint32_t loader_version() const { return loader_version_; }

  // Borrowed: the sink must be removed before it is destroyed.
  void add_sink(ValidationSink* sink);
  void remove_sink(ValidationSink* sink);

 private:
  Instance() = default;
  static Result<std::unique_ptr<Instance>> create(bool validation);
  static VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(
      VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT types,
      const VkDebugUtilsMessengerCallbackDataEXT* data, void* user);

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  bool validation_ = false;
  bool debug_utils_ = false;
  uint32_t loader_version_ = 0;
  std::mutex sinks_mutex_;
  std::vector<ValidationSink*> sinks_;
};

}  // namespace vkad::rhi
