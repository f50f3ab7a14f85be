// Per-launch host-visible memory without a Vulkan object per launch (the launch's args, small
// upload staging, readback): fixed-size chunks of one host-visible buffer each, suballocated
// front to back, recycled through the retirement queue -- the shape of Dawn's ring-buffer
// allocator and wgpu's staging belt.
//
// The lifetime rule: a slot is used only by the command list being recorded when it was
// handed out (and is read back by the host when that list retires). A chunk is used by the
// lists recorded while it was open. When it fills up it is *closed*: moved into the payload of
// the list being recorded now (`closing`), which retires after every list that used the chunk
// (the retirement queue is in submission order). When that payload retires, recycle() puts the
// chunk back into the free pool. So a chunk is never written while a submission may read it,
// and in the steady state no buffer is created or destroyed: the pool grows to the chunks the
// retirement depth keeps in flight, then stays.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "rhi/buffer.h"
#include "rhi/device.h"

namespace vkad::runtime {

// The chunk size of the runtime's rings: about a thousand launches' args.
inline constexpr uint64_t kRingChunkBytes = 256ull << 10;

// The suballocation of one chunk: pure (unit-tested without a device).
class RingCursor {
 public:
  RingCursor(uint64_t capacity, uint64_t alignment)
      : capacity_(capacity), alignment_(alignment == 0 ? 1 : alignment) {}
  // The offset of `bytes` (aligned to the alignment), or nullopt when the chunk cannot hold
  // them after what it handed out; reset() starts over (the chunk was recycled).
  std::optional<uint64_t> take(uint64_t bytes) {
    const uint64_t at = (head_ + alignment_ - 1) / alignment_ * alignment_;
    if (at >= capacity_ || bytes > capacity_ - at) return std::nullopt;
    head_ = at + bytes;
    return at;
  }
  void reset() { head_ = 0; }
  uint64_t used() const { return head_; }

 private:
  uint64_t capacity_, alignment_, head_ = 0;
};

class HostRing {
 public:
  struct Slot {
    rhi::Buffer* buffer = nullptr;  // the chunk; borrowed, valid while the slot's list lives
    uint64_t offset = 0;
    std::byte* data = nullptr;  // mapped (coherent) memory at `offset`
  };
  // `usage`: kUpload or kReadback. `alignment`: the device's minStorageBufferOffsetAlignment
  // (a slot may be bound as a storage buffer range). `max_free`: chunks kept in the pool.
  HostRing(rhi::MemoryUsage usage, uint64_t chunk_bytes, uint64_t alignment, uint32_t max_free,
           std::string name)
      : usage_(usage),
        chunk_bytes_(chunk_bytes),
        alignment_(alignment),
        max_free_(max_free),
        name_(std::move(name)),
        cursor_(chunk_bytes, alignment) {}

  // A slot of `bytes`. When the open chunk is full it goes into `closing` (the payload of the
  // list being recorded) and the next comes from the pool, or is created. A slot larger than a
  // chunk gets a buffer of its own, closed at once (so released when this list retires).
  // kOutOfDeviceMemory leaves the ring as it was.
  Result<Slot> allocate(rhi::Device& device, uint64_t bytes, std::vector<rhi::Buffer>* closing);
  // The ring's first chunk made now, into the pool, where the ring has never made one: its
  // first slots then take no buffer creation (a capture that runs hands out slots per piece).
  Status reserve(rhi::Device& device);
  // Chunks from a retired payload: back into the pool; past max_free they are released.
  void recycle(std::vector<rhi::Buffer>& chunks);
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t chunks_created() const { return created_; }
  size_t free_chunks() const { return free_.size(); }
  // Chunks the ring owns now (the open one and the pool), not those in flight.
  size_t chunks_held() const { return free_.size() + (open_.valid() ? 1 : 0); }
  uint64_t bytes_held() const { return chunks_held() * chunk_bytes_; }
  // Releases the open chunk and the pool (to the deferred deleter). Only when no recorded or
  // in-flight list holds a slot of the open chunk (the runtime calls it after synchronizing);
  // the next allocate makes a chunk again.
  void release_all() {
    open_.reset();
    cursor_.reset();
    free_.clear();
    free_.shrink_to_fit();
  }

 private:
  rhi::MemoryUsage usage_;
  uint64_t chunk_bytes_, alignment_;
  uint32_t max_free_;
  std::string name_;
  rhi::Buffer open_;  // the chunk slots come from; invalid before the first allocate
  RingCursor cursor_;
  std::vector<rhi::Buffer> free_;
  uint64_t created_ = 0;
};

}  // namespace vkad::runtime
