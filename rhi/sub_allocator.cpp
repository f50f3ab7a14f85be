#include "rhi/sub_allocator.h"

#include <iterator>

namespace vkad::rhi {

SubAllocator::SubAllocator(uint64_t capacity) : capacity_(capacity) {
  if (capacity > 0) insert_free(0, capacity);
}

void SubAllocator::insert_free(uint64_t offset, uint64_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void SubAllocator::erase_free(uint64_t offset, uint64_t size) {
  free_by_offset_.erase(offset);
  auto [lo, hi] = free_by_size_.equal_range(size);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == offset) {
      free_by_size_.erase(it);
      return;
    }
  }
}

std::optional<uint64_t> SubAllocator::allocate(uint64_t size, uint64_t alignment) {
  if (size == 0) size = 1;
  if (alignment == 0) alignment = 1;
  for (auto it = free_by_size_.lower_bound(size); it != free_by_size_.end(); ++it) {
    uint64_t range_start = it->second;
    uint64_t range_size = it->first;
    uint64_t aligned = (range_start + alignment - 1) & ~(alignment - 1);
    uint64_t padding = aligned - range_start;
    if (padding + size > range_size) continue;
    erase_free(range_start, range_size);
    // The padding stays with the allocation (returned on free), so no tiny slivers appear.
    uint64_t taken = padding + size;
    if (taken < range_size) insert_free(range_start + taken, range_size - taken);
    allocated_.emplace(aligned, std::make_pair(range_start, taken));
    used_ += taken;
    return aligned;
  }
  return std::nullopt;
}

bool SubAllocator::free(uint64_t offset) {
  auto it = allocated_.find(offset);
  if (it == allocated_.end()) return false;
  uint64_t start = it->second.first;
  uint64_t size = it->second.second;
  allocated_.erase(it);
  used_ -= size;
  // Merge with the free neighbours on both sides.
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    uint64_t next_size = next->second;
    erase_free(next->first, next_size);
    size += next_size;
  }
  auto after = free_by_offset_.lower_bound(start);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      uint64_t prev_start = prev->first;
      uint64_t prev_size = prev->second;
      erase_free(prev_start, prev_size);
      start = prev_start;
      size += prev_size;
    }
  }
  insert_free(start, size);
  return true;
}

uint64_t SubAllocator::largest_free_range() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

}  // namespace vkad::rhi
