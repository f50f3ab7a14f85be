#include "rhi/buffer.h"

#include <volk.h>

#include <optional>
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
  // Device-local blocks are exportable on such devices (memory_allocator.h, kDeviceLocal).
  VkExternalMemoryBufferCreateInfo external{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  external.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  if (caps_.export_memory_fd && desc.usage == MemoryUsage::kDeviceLocal) info.pNext = &external;
  VkBuffer buffer = VK_NULL_HANDLE;
  VKAD_TRY(
      vk("vkCreateBuffer", [&] { return fn_->vkCreateBuffer(device_, &info, nullptr, &buffer); }));
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

Result<int> Device::export_memory_fd(const Allocation& allocation) {
  VKAD_TRY(status());
  if (!allocator_->block_info(allocation).exportable) {
    return make_error(ErrorCode::kUnsupported,
                      "export of device memory: the block is not exportable on '" +
                          caps_.device_name + "' (Capabilities::export_memory_fd)");
  }
  VkMemoryGetFdInfoKHR info{VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR};
  info.memory = allocation.memory;
  info.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  int fd = -1;
  VKAD_TRY(vk("vkGetMemoryFdKHR", [&] { return fn_->vkGetMemoryFdKHR(device_, &info, &fd); }));
  return fd;
}

namespace {
// The atom-aligned range of the block that covers [offset, offset + size).
VkMappedMemoryRange mapped_range(const Allocation& a, uint64_t atom) {
  VkMappedMemoryRange r{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE};
  r.memory = a.memory;
  r.offset = a.offset / atom * atom;
  // Rounded up to the atom; VK_WHOLE_SIZE would be simpler but touches the whole block.
  r.size = (a.offset + a.size - r.offset + atom - 1) / atom * atom;
  return r;
}
// What flush_mapped / invalidate_mapped hand the driver for `a`: nothing for unmapped or
// host-coherent memory; else its atom-aligned range, the whole block where that would pass it.
std::optional<VkMappedMemoryRange> range_to_sync(const MemoryAllocator& allocator,
                                                 const Allocation& a, uint64_t atom) {
  if (a.mapped == nullptr || allocator.block_info(a).host_coherent) return std::nullopt;
  VkMappedMemoryRange r = mapped_range(a, atom);
  if (r.offset + r.size > allocator.block_info(a).bytes) r.size = VK_WHOLE_SIZE;
  return r;
}
}  // namespace

Status Device::flush_mapped(const Allocation& a) {
  std::optional<VkMappedMemoryRange> r =
      range_to_sync(*allocator_, a, caps_.non_coherent_atom_size);
  if (!r) return {};
  return vk("vkFlushMappedMemoryRanges",
            [&] { return fn_->vkFlushMappedMemoryRanges(device_, 1, &*r); });
}

Status Device::invalidate_mapped(const Allocation& a) {
  std::optional<VkMappedMemoryRange> r =
      range_to_sync(*allocator_, a, caps_.non_coherent_atom_size);
  if (!r) return {};
  return vk("vkInvalidateMappedMemoryRanges",
            [&] { return fn_->vkInvalidateMappedMemoryRanges(device_, 1, &*r); });
}

}  // namespace vkad::rhi
