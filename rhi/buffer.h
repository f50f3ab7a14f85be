// A VkBuffer with its sub-allocated memory. Move-only. Destroying (or reset()) never calls
// vkDestroyBuffer directly: the buffer goes to the device's deferred deleter and is destroyed
// once the last submission that recorded it has completed.
#pragma once

#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "rhi/deferred_deleter.h"
#include "rhi/memory_allocator.h"

namespace vkad::rhi {

class Device;

struct BufferDesc {
  uint64_t size = 0;
  MemoryUsage usage = MemoryUsage::kDeviceLocal;
  std::string name;  // debug-utils name; shows in capture tools and validation messages
};

class Buffer {
 public:
  Buffer() = default;
  Buffer(Device* device, VkBuffer buffer, Allocation allocation, uint64_t size);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer() { reset(); }

  // Hands the buffer to the deferred deleter now (see class comment). Safe on an empty Buffer.
  void reset();

  bool valid() const { return buffer_ != VK_NULL_HANDLE; }
  VkBuffer handle() const { return buffer_; }
  uint64_t size() const { return size_; }
  // Host pointer for kUpload / kReadback buffers (coherent memory); null for device-local.
  std::byte* mapped() const { return allocation_.mapped; }
  // Recorded by CommandList whenever a command uses this buffer.
  ResourceUse& use() { return use_; }
  const ResourceUse& use() const { return use_; }

 private:
  Device* device_ = nullptr;  // borrowed; the device outlives its buffers
  VkBuffer buffer_ = VK_NULL_HANDLE;
  Allocation allocation_;
  uint64_t size_ = 0;
  ResourceUse use_;
};

}  // namespace vkad::rhi
