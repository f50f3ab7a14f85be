// Descriptor sets from pools that are recycled by submission serial. Sets are allocated from
// the current pool; when it runs out (VK_ERROR_OUT_OF_POOL_MEMORY / FRAGMENTED_POOL) it is
// retired at the serial of its last use and a fresh or recycled pool takes over. A retired pool
// is reset (freeing all its sets at once) when that serial completes.
#pragma once

#include <vulkan/vulkan.h>

#include <vector>

#include "base/status.h"
#include "rhi/serial_queue.h"

namespace vkad::rhi {

class Device;

class DescriptorAllocator {
 public:
  static constexpr uint32_t kSetsPerPool = 256;
  static constexpr uint32_t kBuffersPerPool = kSetsPerPool * 16;

  explicit DescriptorAllocator(Device& device) : device_(device) {}
  ~DescriptorAllocator();  // caller guarantees no submission uses the sets any more

  // A set for `layout` with `buffer_count` storage-buffer descriptors, to be used by the
  // submission with serial `serial`.
  Result<VkDescriptorSet> allocate(VkDescriptorSetLayout layout, uint32_t buffer_count,
                                   Serial serial);
  // Resets and reuses every retired pool whose serial completed. Non-blocking.
  void recycle(Serial completed);

  size_t pools() const { return pool_count_; }
  size_t live_sets() const { return live_sets_; }

 private:
  struct Pool {
    VkDescriptorPool pool = VK_NULL_HANDLE;
    uint32_t sets = 0;
    Serial last_use = kNoSerial;
  };
  Result<Pool> take_pool();

  Device& device_;
  Pool current_;
  std::vector<Pool> free_;
  SerialQueue<Pool> retired_;
  size_t pool_count_ = 0;
  size_t live_sets_ = 0;
};

}  // namespace vkad::rhi
