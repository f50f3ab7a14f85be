// Range bookkeeping for one memory block: which [offset, offset+size) ranges are in use.
// No Vulkan here; MemoryAllocator puts one of these over each VkDeviceMemory block, and the
// unit tests drive it directly (alignment, fragmentation, free/reuse, exhaustion).
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace vkad::rhi {

class SubAllocator {
 public:
  explicit SubAllocator(uint64_t capacity);

  // Best fit: the smallest free range that holds `size` bytes at `alignment` (a power of two).
  // Returns the offset, or nullopt when no free range is large enough (state unchanged).
  std::optional<uint64_t> allocate(uint64_t size, uint64_t alignment);
  // Returns a range from allocate(); neighbours are merged so fragmentation heals.
  // Freeing an offset that is not allocated is ignored and returns false.
  bool free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t bytes_used() const { return used_; }
  size_t allocation_count() const { return allocated_.size(); }
  size_t free_range_count() const { return free_by_offset_.size(); }
  uint64_t largest_free_range() const;
  bool empty() const { return allocated_.empty(); }

 private:
  void insert_free(uint64_t offset, uint64_t size);
  void erase_free(uint64_t offset, uint64_t size);

  uint64_t capacity_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;                  // offset -> size
  std::multimap<uint64_t, uint64_t> free_by_size_;               // size -> offset
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> allocated_;  // offset -> (range start, size)
};

}  // namespace vkad::rhi
