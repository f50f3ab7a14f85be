// The runtime's own memory given back (runtime.h, release_idle_memory): what a program that
// frees everything relies on to see its memory come back.
#include "runtime/runtime.h"

namespace vkad::runtime {

Status Runtime::release_idle_memory() {
  VKAD_EXCLUSIVE_USE("release_idle_memory");
  VKAD_TRY(graphs_->not_while_capturing("release_idle_memory"));
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
  stream_->recycle();  // the device's deferred deleter: everything above is past its last use
  device_->allocator().release_spare_blocks();
  return s;
}

}  // namespace vkad::runtime
