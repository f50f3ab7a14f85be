// The runtime's own memory given back (runtime.h, release_idle_memory) and the ndarray pool of
// create_ndarray's `pooled` arrays: what a program that frees everything, or that makes a new
// tape per iteration, relies on to see its memory come back and no Vulkan object made anew.
#include "runtime/runtime.h"

namespace vkad::runtime {

rhi::Buffer Runtime::take_pooled(uint64_t bytes) {
  for (bool refreshed : {false, true}) {
    const rhi::Serial done = refreshed ? stream_->refresh_completed() : stream_->completed_cached();
    for (auto it = ndarray_pool_.begin(); it != ndarray_pool_.end(); ++it) {
      if (it->bytes != bytes || it->buffer.use().last[stream_->index()] > done) continue;
      rhi::Buffer b = std::move(it->buffer);
      ndarray_pool_bytes_ -= it->bytes;
      ndarray_pool_.erase(it);
      return b;
    }
  }
  return {};
}

void Runtime::pool_buffer(rhi::Buffer buffer, uint64_t bytes) {
  // Only buffers this runtime's stream alone used: completion is then one serial to compare.
  const rhi::ResourceUse& use = buffer.use();
  for (int s = 0; s < static_cast<int>(use.last.size()); ++s) {
    if (s != stream_->index() && use.last[s] != rhi::kNoSerial) return;  // destroyed as usual
  }
  if (bytes > options_.ndarray_pool_bytes) return;
  ndarray_pool_.push_back({std::move(buffer), bytes});
  ndarray_pool_bytes_ += bytes;
  while (ndarray_pool_bytes_ > options_.ndarray_pool_bytes) {
    ndarray_pool_bytes_ -= ndarray_pool_.front().bytes;
    ndarray_pool_.pop_front();  // to the deferred deleter
  }
}

Status Runtime::release_idle_memory() {
  VKAD_EXCLUSIVE_USE("release_idle_memory");
  VKAD_TRY(not_while_capturing("release_idle_memory"));
  // Every entry complete and released first: only then is nothing below in use by the device.
  // A device error that synchronize reports (a kernel's, found after every wait and drain) does
  // not keep the memory; any other failure means work may still be in flight: nothing freed.
  Status s = synchronize();
  if (!s.ok() && s.code() != ErrorCode::kDeviceError) return s;
  upload_ring_->release_all();
  readback_ring_->release_all();
  heaps_.clear();  // recorded bundles see the generation change and bind the new heaps
  stats_.adstack_heap_bytes = 0;
  spare_ctx_.clear();
  spare_ctx_.shrink_to_fit();
  ndarray_pool_.clear();
  ndarray_pool_bytes_ = 0;
  stream_->recycle();  // the device's deferred deleter: everything above is past its last use
  device_->allocator().release_spare_blocks();
  return s;
}

}  // namespace vkad::runtime
