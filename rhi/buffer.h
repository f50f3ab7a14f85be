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
#include "rhi/unique_handle.h"

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
  Buffer(Buffer&& other) noexcept = default;
  Buffer& operator=(Buffer&& other) noexcept = default;
  ~Buffer() { reset(); }

  // Hands the buffer to the deferred deleter now (see class comment). Safe on an empty Buffer.
  void reset();

  bool valid() const { return static_cast<bool>(buffer_); }
  VkBuffer handle() const { return buffer_.get(); }
  uint64_t size() const { return size_; }
  // Host pointer for kUpload / kReadback buffers (coherent memory); null for device-local.
  std::byte* mapped() const { return buffer_.deleter().allocation.mapped; }
  // Where the buffer's memory lives (block, offset, size).
  const Allocation& allocation() const { return buffer_.deleter().allocation; }
  // Recorded by CommandList whenever a command uses this buffer.
  ResourceUse& use() { return buffer_.deleter().use; }
  const ResourceUse& use() const { return buffer_.deleter().use; }

 private:
  // Hands the buffer and its memory to the device's deferred deleter with the submissions that
  // used it.
  struct Release {
    Device* device = nullptr;  // borrowed; the device outlives its buffers
    Allocation allocation;
    ResourceUse use;
    void operator()(VkBuffer buffer) noexcept;
  };

  UniqueHandle<VkBuffer, Release> buffer_;
  uint64_t size_ = 0;
};

}  // namespace vkad::rhi
