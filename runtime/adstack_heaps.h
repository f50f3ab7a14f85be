// The adstack heaps: one device buffer per heap (f32, f64, integers), shared by every adstack
// launch of a runtime and grown on demand. The growth rule is pure (next_heap_bytes, unit-
// tested); a grown heap's old buffer goes back to the caller, which retires it with the list
// that may still use it (never freed under recorded or in-flight work).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "adstack/adstack_layout.h"
#include "base/status.h"
#include "rhi/buffer.h"
#include "rhi/device.h"

namespace vkad::runtime {

// The size of a heap that holds `have` bytes and must hold `need`: unchanged when enough (a
// heap of 0 bytes never is: every heap is bound, so an unused one still exists); else amortised
// doubling, at least 4 KiB, capped at the
// device's binding range unless `need` itself is larger (the planner keeps it within).
uint64_t next_heap_bytes(uint64_t have, uint64_t need, uint64_t max_range);

class AdstackHeaps {
 public:
  // Grows each heap to `need` (next_heap_bytes). A replaced buffer is appended to `retired`
  // with its size added to *retired_bytes; kOutOfDeviceMemory leaves the heaps as they were.
  Status ensure(rhi::Device& device, const std::array<uint64_t, adstack::kHeapCount>& need,
                std::vector<rhi::Buffer>* retired, uint64_t* retired_bytes, uint64_t* growths);
  rhi::Buffer& heap(uint32_t h) { return heaps_[h]; }
  std::array<rhi::Buffer, adstack::kHeapCount>& all() { return heaps_; }
  uint64_t bytes() const;
  void clear() {
    heaps_ = {};
    ++generation_;
  }
  // Changes whenever a heap buffer is replaced: what recorded bundles bound is gone.
  uint64_t generation() const { return generation_; }

 private:
  std::array<rhi::Buffer, adstack::kHeapCount> heaps_;
  uint64_t generation_ = 0;
};

}  // namespace vkad::runtime
