// Device memory from large VkDeviceMemory blocks, carved by SubAllocator. Vulkan limits the
// number of live allocations (maxMemoryAllocationCount, often 4096), so buffers never get a
// VkDeviceMemory of their own unless they are larger than half a block.
#pragma once

#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "rhi/device_plan.h"
#include "rhi/sub_allocator.h"

namespace vkad::rhi {

class Device;

enum class MemoryUsage : uint8_t {
  // GPU data (ndarrays, heaps); mapped only where the device's memory is host-visible. With
  // Capabilities::export_memory_fd its blocks are exportable (opaque fd) and every buffer
  // bound to them is created with VkExternalMemoryBufferCreateInfo (Device::create_buffer).
  kDeviceLocal,
  kUpload,    // host-visible + coherent, written by the host, read by the GPU
  kReadback,  // host-visible + coherent (+ cached where available), read by the host
};
const char* memory_usage_name(MemoryUsage usage);

struct Allocation {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::byte* mapped = nullptr;  // host pointer at `offset` for host-visible usages
  int memory_type = -1;
  int block = -1;  // index into the allocator's block table
  // Unique over the allocator's life for each VkDeviceMemory (handles may be reused after a free).
  uint64_t block_id = 0;
  bool valid() const { return memory != VK_NULL_HANDLE; }
};

// The VkDeviceMemory block an allocation lives in (MemoryAllocator::block_info).
struct BlockInfo {
  uint64_t id = 0;            // Allocation::block_id
  uint64_t bytes = 0;         // the block's allocationSize
  bool exportable = false;    // allocated with VkExportMemoryAllocateInfo (opaque fd)
  bool host_coherent = true;  // mapped memory needs no flush / invalidate
};

struct MemoryStats {
  uint64_t block_bytes = 0;  // VkDeviceMemory bytes currently allocated
  uint64_t used_bytes = 0;   // bytes handed out to live allocations
  uint64_t blocks = 0;
  uint64_t allocations = 0;
  // The most of each held at once since the allocator was made or reset_peaks: the device
  // memory a workload needs, which the current figures no longer show once it has freed.
  uint64_t peak_block_bytes = 0;
  uint64_t peak_used_bytes = 0;
};

class MemoryAllocator {
 public:
  // `spare_blocks`: empty shared blocks kept per memory type (see DeviceOptions).
  MemoryAllocator(Device& device, uint64_t block_bytes, uint64_t limit_bytes,
                  uint32_t spare_blocks = 1);
  ~MemoryAllocator();  // frees every block; all allocations must have been freed

  // kOutOfDeviceMemory (message names size, usage and the failing call) when neither an
  // existing block nor a new one can hold it; no state changes in that case.
  Result<Allocation> allocate(const VkMemoryRequirements& reqs, MemoryUsage usage);
  void free(const Allocation& allocation);
  const MemoryStats& stats() const { return stats_; }
  // The peaks start again from what is held now.
  void reset_peaks() {
    stats_.peak_block_bytes = stats_.block_bytes;
    stats_.peak_used_bytes = stats_.used_bytes;
  }
  // The empty blocks kept for reuse (spare_blocks per memory type): their bytes, and freeing
  // them all (returns how many were freed). Blocks holding a live allocation are never touched.
  uint64_t spare_bytes() const;
  size_t release_spare_blocks();
  // The block of a live allocation.
  BlockInfo block_info(const Allocation& allocation) const;
  // Called with a block's id just before its VkDeviceMemory is freed (so a layer that imported
  // the block elsewhere -- CUDA -- can drop its mapping). Set once; called on the thread that
  // frees, which is the device's owner's.
  void set_block_freed_hook(std::function<void(uint64_t)> hook) { block_freed_ = std::move(hook); }

 private:
  struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    std::unique_ptr<SubAllocator> ranges;
    std::byte* mapped = nullptr;
    int memory_type = -1;
    bool dedicated = false;
    bool exportable = false;
    uint64_t id = 0;
  };
  Result<int> new_block(int memory_type, uint64_t size, bool host_visible, bool dedicated,
                        bool exportable);
  void free_block(int index);
  // An allocation of `bytes` made: the used bytes, their peak and the count.
  void count_allocation(uint64_t bytes) {
    stats_.used_bytes += bytes;
    stats_.peak_used_bytes = std::max(stats_.peak_used_bytes, stats_.used_bytes);
    ++stats_.allocations;
  }

  Device& device_;
  uint64_t block_bytes_;
  uint64_t limit_bytes_;
  uint32_t spare_blocks_;
  std::vector<MemoryTypeInfo> memory_types_;
  std::vector<Block> blocks_;  // a freed slot has memory == VK_NULL_HANDLE and is reused
  MemoryStats stats_;
  uint64_t next_block_id_ = 1;
  std::function<void(uint64_t)> block_freed_;
};

}  // namespace vkad::rhi
