#include "rhi/memory_allocator.h"

#include <volk.h>

#include <algorithm>

#include "rhi/device.h"

namespace vkad::rhi {

const char* memory_usage_name(MemoryUsage usage) {
  switch (usage) {
    case MemoryUsage::kDeviceLocal: return "device-local";
    case MemoryUsage::kUpload: return "upload";
    case MemoryUsage::kReadback: return "readback";
  }
  return "?";
}

MemoryAllocator::MemoryAllocator(Device& device, uint64_t block_bytes, uint64_t limit_bytes,
                                 uint32_t spare_blocks)
    : device_(device),
      block_bytes_(block_bytes),
      limit_bytes_(limit_bytes),
      spare_blocks_(spare_blocks) {
  // Memory types never change for a device: read them once, not on every allocation (the
  // runtime allocates an args buffer per launch).
  VkPhysicalDeviceMemoryProperties props;
  vkGetPhysicalDeviceMemoryProperties(device_.physical_device(), &props);
  for (uint32_t i = 0; i < props.memoryTypeCount; ++i) {
    memory_types_.push_back({props.memoryTypes[i].propertyFlags, props.memoryTypes[i].heapIndex});
  }
}

MemoryAllocator::~MemoryAllocator() {
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i].memory != VK_NULL_HANDLE) free_block(static_cast<int>(i));
  }
}

Result<int> MemoryAllocator::new_block(int memory_type, uint64_t size, bool host_visible,
                                       bool dedicated, bool exportable) {
  if (limit_bytes_ != 0 && stats_.block_bytes + size > limit_bytes_) {
    return make_error(ErrorCode::kOutOfDeviceMemory,
                      "vkAllocateMemory of " + std::to_string(size) +
                          " bytes would pass the device memory limit of " +
                          std::to_string(limit_bytes_) + " bytes (" +
                          std::to_string(stats_.block_bytes) + " in use)");
  }
  VkMemoryAllocateInfo info{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  info.allocationSize = size;
  info.memoryTypeIndex = static_cast<uint32_t>(memory_type);
  VkExportMemoryAllocateInfo export_info{VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO};
  export_info.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
  if (exportable) info.pNext = &export_info;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VKAD_TRY(device_.vk("vkAllocateMemory", [&] {
    return device_.fn().vkAllocateMemory(device_.handle(), &info, nullptr, &memory);
  }));
  void* mapped = nullptr;
  if (host_visible) {
    Status s = device_.vk("vkMapMemory", [&] {
      return device_.fn().vkMapMemory(device_.handle(), memory, 0, VK_WHOLE_SIZE, 0, &mapped);
    });
    if (!s.ok()) {
      device_.fn().vkFreeMemory(device_.handle(), memory, nullptr);
      return s;
    }
  }
  device_.set_name(VK_OBJECT_TYPE_DEVICE_MEMORY, reinterpret_cast<uint64_t>(memory),
                   std::string("vkad block ") + (dedicated ? "(dedicated) " : "") + "type " +
                       std::to_string(memory_type));
  int index = -1;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i].memory == VK_NULL_HANDLE) {
      index = static_cast<int>(i);
      break;
    }
  }
  if (index < 0) {
    index = static_cast<int>(blocks_.size());
    blocks_.emplace_back();
  }
  Block& b = blocks_[index];
  b.memory = memory;
  b.ranges = std::make_unique<SubAllocator>(size);
  b.mapped = static_cast<std::byte*>(mapped);
  b.memory_type = memory_type;
  b.dedicated = dedicated;
  b.exportable = exportable;
  b.id = next_block_id_++;
  stats_.block_bytes += size;
  stats_.peak_block_bytes = std::max(stats_.peak_block_bytes, stats_.block_bytes);
  ++stats_.blocks;
  ++device_.live_mut().memory_blocks;
  ++device_.live_mut().created;
  return index;
}

void MemoryAllocator::free_block(int index) {
  Block& b = blocks_[index];
  if (block_freed_) block_freed_(b.id);
  stats_.block_bytes -= b.ranges->capacity();
  --stats_.blocks;
  --device_.live_mut().memory_blocks;
  device_.fn().vkFreeMemory(device_.handle(), b.memory, nullptr);  // unmaps implicitly
  b = Block{};
}

Result<Allocation> MemoryAllocator::allocate(const VkMemoryRequirements& reqs, MemoryUsage usage) {
  const std::vector<MemoryTypeInfo>& types = memory_types_;
  uint32_t required = 0, preferred = 0;
  switch (usage) {
    case MemoryUsage::kDeviceLocal: preferred = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT; break;
    case MemoryUsage::kUpload:
      required = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
      break;
    case MemoryUsage::kReadback:
      required = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
      preferred = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
      break;
  }
  int type = choose_memory_type(types, reqs.memoryTypeBits, required, preferred);
  if (type < 0) {
    return make_error(ErrorCode::kUnsupported,
                      std::string("no memory type for ") + memory_usage_name(usage) + " buffers");
  }
  // Map every block of a host-visible type, whatever the request: on unified-memory devices
  // (lavapipe, integrated GPUs) device-local and upload buffers share one type and one block.
  bool host_visible = (types[type].property_flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;
  uint64_t alignment = reqs.alignment;
  // Large requests get a block of their own, so they neither waste nor fragment shared blocks.
  bool dedicated = reqs.size > block_bytes_ / 2;
  // Exportable blocks hold only buffers created exportable (Vulkan requires the buffer to
  // name the handle type of the memory it is bound to).
  const bool exportable = usage == MemoryUsage::kDeviceLocal && device_.caps().export_memory_fd;
  if (!dedicated) {
    for (size_t i = 0; i < blocks_.size(); ++i) {
      Block& b = blocks_[i];
      if (b.memory == VK_NULL_HANDLE || b.dedicated || b.memory_type != type ||
          b.exportable != exportable) {
        continue;
      }
      if (auto offset = b.ranges->allocate(reqs.size, alignment)) {
        count_allocation(reqs.size);
        return Allocation{b.memory,  *offset,
                          reqs.size, b.mapped ? b.mapped + *offset : nullptr,
                          type,      static_cast<int>(i),
                          b.id};
      }
    }
  }
  size_t shared_of_type = 0;
  for (const Block& b : blocks_) {
    shared_of_type += b.memory != VK_NULL_HANDLE && !b.dedicated && b.memory_type == type;
  }
  const uint64_t size = dedicated ? reqs.size
                                  : shared_block_bytes(types[type].property_flags, block_bytes_,
                                                       shared_of_type, reqs.size + alignment);
  VKAD_ASSIGN_OR_RETURN(int index, new_block(type, size, host_visible, dedicated, exportable));
  Block& b = blocks_[index];
  auto offset = b.ranges->allocate(reqs.size, alignment);
  count_allocation(reqs.size);
  return Allocation{b.memory, *offset, reqs.size, b.mapped ? b.mapped + *offset : nullptr,
                    type,     index,   b.id};
}

BlockInfo MemoryAllocator::block_info(const Allocation& a) const {
  BlockInfo info;
  if (!a.valid() || a.block < 0 || a.block >= static_cast<int>(blocks_.size())) return info;
  const Block& b = blocks_[a.block];
  if (b.memory != a.memory) return info;
  info.id = b.id;
  info.bytes = b.ranges->capacity();
  info.exportable = b.exportable;
  info.host_coherent =
      (memory_types_[b.memory_type].property_flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
  return info;
}

void MemoryAllocator::free(const Allocation& a) {
  if (!a.valid() || a.block < 0 || a.block >= static_cast<int>(blocks_.size())) return;
  Block& b = blocks_[a.block];
  if (b.memory != a.memory || !b.ranges->free(a.offset)) return;
  stats_.used_bytes -= a.size;
  --stats_.allocations;
  if (!b.ranges->empty()) return;
  // Keep up to spare_blocks_ empty shared blocks per memory type so a free/allocate cycle does
  // not thrash vkAllocateMemory; dedicated blocks and further empty blocks go back at once.
  uint32_t empty_others = 0;
  if (!b.dedicated) {
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const Block& o = blocks_[i];
      if (static_cast<int>(i) != a.block && o.memory != VK_NULL_HANDLE && !o.dedicated &&
          o.memory_type == b.memory_type && o.ranges->empty()) {
        ++empty_others;
      }
    }
  }
  if (b.dedicated || empty_others >= spare_blocks_) free_block(a.block);
}

uint64_t MemoryAllocator::spare_bytes() const {
  uint64_t bytes = 0;
  for (const Block& b : blocks_) {
    if (b.memory != VK_NULL_HANDLE && b.ranges->empty()) bytes += b.ranges->capacity();
  }
  return bytes;
}

size_t MemoryAllocator::release_spare_blocks() {
  size_t freed = 0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i].memory != VK_NULL_HANDLE && blocks_[i].ranges->empty()) {
      free_block(static_cast<int>(i));
      ++freed;
    }
  }
  return freed;
}

}  // namespace vkad::rhi
