// Runtime::Interop (interop.h): sharing an ndarray's memory with another API
// -- where the bytes are, waiting for their last use, host views of
// non-coherent memory, and opaque fds of the memory block and of the timeline semaphore.
#include "runtime/interop.h"

namespace vkad::runtime {

Result<Runtime::Interop::NdArrayMemory> Runtime::Interop::ndarray_memory(NdArrayHandle array) {
  VKAD_EXCLUSIVE_USE("ndarray_memory");
  VKAD_TRY(rt_.device_->status());
  VKAD_TRY(rt_.graphs_->not_while_capturing("ndarray_memory"));
  if (rt_.arrays_.find(array.id) == rt_.arrays_.end()) {
    return rt_.dead_handle("ndarray_memory", "ndarray", array.id);
  }
  VKAD_TRY(rt_.flush().status());
  const NdArray& a = rt_.arrays_.find(array.id)->second;
  const rhi::Allocation& alloc = a.buffer.allocation();
  const rhi::BlockInfo block = rt_.device_->allocator().block_info(alloc);
  NdArrayMemory m;
  m.host = alloc.mapped;
  m.host_coherent = block.host_coherent;
  m.block_id = block.id;
  m.block_bytes = block.bytes;
  m.offset = alloc.offset;
  m.bytes = a.bytes;
  m.exportable = block.exportable;
  m.last_use = a.buffer.use().last[rt_.stream_->index()];
  return m;
}

Status Runtime::Interop::wait_ndarray(NdArrayHandle array) {
  VKAD_EXCLUSIVE_USE("wait_ndarray");
  VKAD_TRY(rt_.device_->status());
  auto it = rt_.arrays_.find(array.id);
  if (it == rt_.arrays_.end()) return rt_.dead_handle("wait_ndarray", "ndarray", array.id);
  const rhi::Serial last = it->second.buffer.use().last[rt_.stream_->index()];
  if (last != rhi::kNoSerial && last <= rt_.stream_->last_submitted() &&
      !rt_.stream_->wait_for(last, UINT64_MAX)) {
    VKAD_TRY(rt_.device_->status());
    return make_error(ErrorCode::kTimeout,
                      "wait for '" + it->second.name + "': its last submission did not complete");
  }
  return rt_.device_->invalidate_mapped(it->second.buffer.allocation());
}

Status Runtime::Interop::hold_host_view(NdArrayHandle array) {
  VKAD_EXCLUSIVE_USE("hold_host_view");
  auto it = rt_.arrays_.find(array.id);
  if (it == rt_.arrays_.end()) return rt_.dead_handle("hold_host_view", "ndarray", array.id);
  const rhi::Allocation& alloc = it->second.buffer.allocation();
  if (alloc.mapped == nullptr) {
    return make_error(ErrorCode::kUnsupported,
                      "host view of '" + it->second.name + "': its memory is not host-visible");
  }
  if (!rt_.device_->allocator().block_info(alloc).host_coherent) ++rt_.host_views_[array.id];
  return {};
}

void Runtime::Interop::release_host_view(NdArrayHandle array) {
  auto it = rt_.host_views_.find(array.id);
  if (it != rt_.host_views_.end() && --it->second == 0) rt_.host_views_.erase(it);
}

Status CommandQueue::sync_host_views(bool to_device) {
  for (const auto& [id, count] : host_views_) {
    auto a = arrays_.find(id);
    if (a == arrays_.end()) continue;
    const rhi::Allocation& alloc = a->second.buffer.allocation();
    VKAD_TRY(to_device ? device_->flush_mapped(alloc) : device_->invalidate_mapped(alloc));
  }
  return {};
}

Result<int> Runtime::Interop::export_ndarray_fd(NdArrayHandle array) {
  VKAD_EXCLUSIVE_USE("export_ndarray_fd");
  VKAD_TRY(rt_.device_->status());
  auto it = rt_.arrays_.find(array.id);
  if (it == rt_.arrays_.end()) return rt_.dead_handle("export_ndarray_fd", "ndarray", array.id);
  return rt_.device_->export_memory_fd(it->second.buffer.allocation());
}

Result<int> Runtime::Interop::export_timeline_fd() {
  VKAD_EXCLUSIVE_USE("export_timeline_fd");
  VKAD_TRY(rt_.device_->status());
  return rt_.stream_->export_timeline_fd();
}

void Runtime::Interop::set_block_freed_hook(std::function<void(uint64_t)> hook) {
  rt_.device_->allocator().set_block_freed_hook(std::move(hook));
}

Runtime::Interop Runtime::interop() { return Interop(*this); }

}  // namespace vkad::runtime
