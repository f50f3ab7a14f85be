#include "rhi/command_list.h"

#include <volk.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>
#include <vector>

#include "rhi/buffer.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "rhi/stream.h"

namespace vkad::rhi {

void CommandList::Abandon::operator()(VkCommandBuffer cb) noexcept {
  if (side >= 0) {
    stream->free_side_now(cb, side);
  } else if (bundle) {
    stream->release_bundle(cb, kNoSerial, -1);
  } else {
    stream->abandon(cb);
  }
}

void CommandList::mark_used(ResourceUse& use) {
  if (bundle_) {
    uses_.push_back(&use);  // deduplicated by end_bundle
    return;
  }
  use.mark(stream_->index(), serial_);
}

void CommandList::execute(Bundle& bundle) {
  // A bundle is freed by its own stream against that stream's serials, and does not nest.
  assert(bundle.stream_ == stream_ && !bundle_);
  for (ResourceUse* use : bundle.uses_) use->mark(stream_->index(), serial_);
  if (bundle.last_use_ < serial_) bundle.last_use_ = serial_;
  VkCommandBuffer cb = bundle.cb_;
  stream_->device().fn().vkCmdExecuteCommands(cb_.get(), 1, &cb);
  bound_ = VK_NULL_HANDLE;
  pushed_bytes_ = 0;
  dispatches_ += bundle.dispatches_;
}

Bundle& Bundle::operator=(Bundle&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    cb_ = std::exchange(other.cb_, VK_NULL_HANDLE);
    uses_ = std::move(other.uses_);
    last_use_ = std::exchange(other.last_use_, kNoSerial);
    dispatches_ = std::exchange(other.dispatches_, 0);
    side_ = std::exchange(other.side_, -1);
  }
  return *this;
}

void Bundle::reset() noexcept {
  if (cb_ != VK_NULL_HANDLE) stream_->release_bundle(cb_, last_use_, side_);
  cb_ = VK_NULL_HANDLE;
  side_ = -1;
  uses_.clear();
  last_use_ = kNoSerial;
  dispatches_ = 0;
}

void CommandList::bind_pipeline(ComputePipeline& pipeline) {
  // Marked at its first bind in this list: a pipeline in use is never destroyed (deferred
  // deleter), so its handle names it until the list is submitted.
  if (pipeline.handle() == bound_) return;
  mark_used(pipeline.use());
  bound_ = pipeline.handle();
  pushed_bytes_ = 0;  // another pipeline's layout may not keep them
  stream_->device().fn().vkCmdBindPipeline(cb_.get(), VK_PIPELINE_BIND_POINT_COMPUTE, bound_);
}

Status CommandList::bind_buffers(ComputePipeline& pipeline, std::span<Buffer* const> buffers,
                                 BufferRange first) {
  if (buffers.size() != pipeline.storage_buffer_count()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "pipeline '" + pipeline.name() + "' expects " +
                          std::to_string(pipeline.storage_buffer_count()) + " buffers, got " +
                          std::to_string(buffers.size()));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] == nullptr || !buffers[i]->valid()) {
      return make_error(ErrorCode::kInvalidArgument, "pipeline '" + pipeline.name() +
                                                         "': buffer for binding " +
                                                         std::to_string(i) + " is empty");
    }
  }
  if (buffers.empty()) return {};
  VkDescriptorSet set = VK_NULL_HANDLE;
  if (bundle_ && !pipeline.push_descriptors()) {
    // A pooled set is recycled by serial; a bundle runs at serials not known yet.
    return make_error(
        ErrorCode::kFailedPrecondition,
        "pipeline '" + pipeline.name() + "': a bundle binds buffers with push descriptors only");
  }
  if (!pipeline.push_descriptors()) {
    VKAD_ASSIGN_OR_RETURN(
        set, stream_->descriptors_.allocate(pipeline.set_layout(),
                                            static_cast<uint32_t>(buffers.size()), serial_));
  }
  // Small fixed arrays cover the common case without a heap allocation per launch (32: an
  // adjoint binds its forward's arrays, their gradients, the args and the adstack heaps --
  // diffmpm's p2g_adjoint 18 -- and a heap pair per launch grew a recording thread's malloc
  // arena by mprotect calls).
  constexpr size_t kInline = 32;
  VkDescriptorBufferInfo inline_infos[kInline];
  VkWriteDescriptorSet inline_writes[kInline];
  std::vector<VkDescriptorBufferInfo> heap_infos;
  std::vector<VkWriteDescriptorSet> heap_writes;
  VkDescriptorBufferInfo* infos = inline_infos;
  VkWriteDescriptorSet* writes = inline_writes;
  if (buffers.size() > kInline) {
    heap_infos.resize(buffers.size());
    heap_writes.resize(buffers.size());
    infos = heap_infos.data();
    writes = heap_writes.data();
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    infos[i] = {buffers[i]->handle(), 0, VK_WHOLE_SIZE};
    if (i == 0)
      infos[0] = {buffers[0]->handle(), first.offset, first.size ? first.size : VK_WHOLE_SIZE};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = static_cast<uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
    mark_used(buffers[i]->use());
  }
  const VolkDeviceTable& fn = stream_->device().fn();
  if (pipeline.push_descriptors()) {
    // The descriptors live in the command buffer: nothing to allocate, recycle or bound.
    fn.vkCmdPushDescriptorSetKHR(cb_.get(), VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout(), 0,
                                 static_cast<uint32_t>(buffers.size()), writes);
    return {};
  }
  fn.vkUpdateDescriptorSets(stream_->device().handle(), static_cast<uint32_t>(buffers.size()),
                            writes, 0, nullptr);
  fn.vkCmdBindDescriptorSets(cb_.get(), VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout(), 0, 1,
                             &set, 0, nullptr);
  return {};
}

void CommandList::push_constants(ComputePipeline& pipeline, const void* data, uint32_t bytes) {
  if (bytes <= pushed_.size()) {
    if (bytes == pushed_bytes_ && pipeline.handle() == bound_ &&
        std::memcmp(pushed_.data(), data, bytes) == 0) {
      return;
    }
    std::memcpy(pushed_.data(), data, bytes);
    pushed_bytes_ = pipeline.handle() == bound_ ? bytes : 0;
  }
  stream_->device().fn().vkCmdPushConstants(cb_.get(), pipeline.layout(),
                                            VK_SHADER_STAGE_COMPUTE_BIT, 0, bytes, data);
}

void CommandList::dispatch(uint32_t x, uint32_t y, uint32_t z) {
  stream_->device().fn().vkCmdDispatch(cb_.get(), x, y, z);
  ++dispatches_;
}

void CommandList::barrier(Barrier kind) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  VkPipelineStageFlags src = 0, dst = 0;
  switch (kind) {
    case Barrier::kComputeToCompute:
      src = dst = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
      mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
      mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
      break;
    case Barrier::kComputeToTransfer:
      src = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
      dst = VK_PIPELINE_STAGE_TRANSFER_BIT;
      mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
      mb.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
      break;
    case Barrier::kTransferToCompute:
      src = VK_PIPELINE_STAGE_TRANSFER_BIT;
      dst = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
      mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
      mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
      break;
    case Barrier::kTransferToTransfer:
      src = dst = VK_PIPELINE_STAGE_TRANSFER_BIT;
      mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
      mb.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
      break;
    case Barrier::kToHost:
      src = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
      dst = VK_PIPELINE_STAGE_HOST_BIT;
      mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
      mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
      break;
  }
  stream_->device().fn().vkCmdPipelineBarrier(cb_.get(), src, dst, 0, 1, &mb, 0, nullptr, 0,
                                              nullptr);
}

void CommandList::copy(Buffer& src, Buffer& dst, uint64_t bytes, uint64_t src_offset,
                       uint64_t dst_offset) {
  mark_used(src.use());
  mark_used(dst.use());
  VkBufferCopy region{src_offset, dst_offset, bytes};
  stream_->device().fn().vkCmdCopyBuffer(cb_.get(), src.handle(), dst.handle(), 1, &region);
}

void CommandList::fill(Buffer& dst, uint32_t value, uint64_t offset, uint64_t bytes) {
  mark_used(dst.use());
  stream_->device().fn().vkCmdFillBuffer(cb_.get(), dst.handle(), offset, bytes, value);
}

void CommandList::fill64(Buffer& dst, uint64_t value, uint64_t bytes) {
  mark_used(dst.use());
  const VolkDeviceTable& fn = stream_->device().fn();
  // vkCmdUpdateBuffer takes at most 65536 bytes, inline in the command buffer.
  constexpr uint64_t kInline = 65536;
  const uint64_t first = std::min(bytes, kInline);
  std::vector<uint64_t> words(first / 8, value);
  fn.vkCmdUpdateBuffer(cb_.get(), dst.handle(), 0, first, words.data());
  for (uint64_t done = first; done < bytes; done *= 2) {
    barrier(Barrier::kTransferToTransfer);
    const VkBufferCopy region{0, done, std::min(done, bytes - done)};
    fn.vkCmdCopyBuffer(cb_.get(), dst.handle(), dst.handle(), 1, &region);
  }
}

void CommandList::reset_queries(QueryPool& pool, uint32_t first, uint32_t count) {
  mark_used(pool.use());
  stream_->device().fn().vkCmdResetQueryPool(cb_.get(), pool.handle(), first, count);
}

void CommandList::write_timestamp(QueryPool& pool, uint32_t index) {
  mark_used(pool.use());
  stream_->device().fn().vkCmdWriteTimestamp(cb_.get(), VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                             pool.handle(), index);
}

void CommandList::copy_timestamps(QueryPool& pool, uint32_t first, uint32_t count, Buffer& dst,
                                  uint64_t dst_offset) {
  mark_used(pool.use());
  mark_used(dst.use());
  stream_->device().fn().vkCmdCopyQueryPoolResults(
      cb_.get(), pool.handle(), first, count, dst.handle(), dst_offset, sizeof(uint64_t),
      VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
}

}  // namespace vkad::rhi
