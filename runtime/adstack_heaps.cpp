#include "runtime/adstack_heaps.h"

#include <algorithm>
#include <string>

namespace vkad::runtime {

uint64_t next_heap_bytes(uint64_t have, uint64_t need, uint64_t max_range) {
  if (have >= std::max<uint64_t>(need, 1)) return have;
  uint64_t bytes = std::max<uint64_t>({need, 2 * have, 4096});
  return std::min<uint64_t>(bytes, std::max<uint64_t>(need, max_range));
}

Status AdstackHeaps::ensure(rhi::Device& device,
                            const std::array<uint64_t, adstack::kHeapCount>& need,
                            std::vector<rhi::Buffer>* retired, uint64_t* retired_bytes,
                            uint64_t* growths) {
  for (uint32_t h = 0; h < adstack::kHeapCount; ++h) {
    const uint64_t have = heaps_[h].valid() ? heaps_[h].size() : 0;
    const uint64_t bytes = next_heap_bytes(have, need[h], device.caps().max_storage_buffer_range);
    if (bytes == have) continue;
    VKAD_ASSIGN_OR_RETURN(
        rhi::Buffer fresh,
        device.create_buffer(
            {bytes, rhi::MemoryUsage::kDeviceLocal,
             std::string("adstack heap ") + adstack::heap_name(static_cast<adstack::Heap>(h))}));
    if (heaps_[h].valid()) {
      // The old heap may still be used by recorded or in-flight work: the caller retires it.
      *retired_bytes += heaps_[h].size();
      retired->push_back(std::move(heaps_[h]));
      ++*growths;
    }
    heaps_[h] = std::move(fresh);
    ++generation_;
  }
  return {};
}

uint64_t AdstackHeaps::bytes() const {
  uint64_t b = 0;
  for (const rhi::Buffer& buf : heaps_) b += buf.valid() ? buf.size() : 0;
  return b;
}

}  // namespace vkad::runtime
