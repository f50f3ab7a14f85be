#include "rhi/buffer.h"

#include <volk.h>

#include <utility>

#include "rhi/device.h"

namespace vkad::rhi {

Buffer::Buffer(Device* device, VkBuffer buffer, Allocation allocation, uint64_t size)
    : buffer_(buffer, Release{device, allocation, {}}), size_(size) {}

void Buffer::Release::operator()(VkBuffer buffer) noexcept {
  device->release(use,
                  Garbage{VK_OBJECT_TYPE_BUFFER, reinterpret_cast<uint64_t>(buffer), allocation});
}

void Buffer::reset() {
  buffer_.reset();
  buffer_.deleter().use = {};
}

Result<Buffer> Device::create_buffer(const BufferDesc& desc) {
  VKAD_TRY(status());
  if (desc.size == 0) {
    return make_error(ErrorCode::kInvalidArgument, "buffer '" + desc.name + "' has size 0");
  }
  VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  info.size = desc.size;
  info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  VKAD_TRY(vk("vkCreateBuffer", [&] { return fn_->vkCreateBuffer(device_, &info, nullptr, &buffer); }));
  VkMemoryRequirements reqs;
  fn_->vkGetBufferMemoryRequirements(device_, buffer, &reqs);
  Result<Allocation> alloc = allocator_->allocate(reqs, desc.usage);
  if (!alloc.ok()) {
    fn_->vkDestroyBuffer(device_, buffer, nullptr);
    return make_error(alloc.status().code(), "buffer '" + desc.name + "' (" +
                                                 std::to_string(desc.size) +
                                                 " bytes): " + alloc.status().message());
  }
  Status bound = vk("vkBindBufferMemory", [&] {
    return fn_->vkBindBufferMemory(device_, buffer, alloc->memory, alloc->offset);
  });
  if (!bound.ok()) {
    fn_->vkDestroyBuffer(device_, buffer, nullptr);
    allocator_->free(*alloc);
    return bound;
  }
  set_name(VK_OBJECT_TYPE_BUFFER, reinterpret_cast<uint64_t>(buffer),
           desc.name.empty() ? "vkad buffer" : desc.name);
  ++live_.buffers;
  ++live_.created;
  return Buffer(this, buffer, *alloc, desc.size);
}

}  // namespace vkad::rhi
