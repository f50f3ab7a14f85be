#include "runtime/host_ring.h"

#include <utility>

namespace vkad::runtime {

Result<HostRing::Slot> HostRing::allocate(rhi::Device& device, uint64_t bytes,
                                          std::vector<rhi::Buffer>* closing) {
  if (bytes > chunk_bytes_) {
    VKAD_ASSIGN_OR_RETURN(rhi::Buffer own,
                          device.create_buffer({bytes, usage_, name_ + " (large)"}));
    closing->push_back(std::move(own));
    return Slot{&closing->back(), 0, closing->back().mapped()};
  }
  std::optional<uint64_t> at = open_.valid() ? cursor_.take(bytes) : std::nullopt;
  if (!at) {
    rhi::Buffer next;
    if (!free_.empty()) {
      next = std::move(free_.back());
      free_.pop_back();
    } else {
      VKAD_ASSIGN_OR_RETURN(next, device.create_buffer({chunk_bytes_, usage_, name_}));
      ++created_;
    }
    if (open_.valid()) closing->push_back(std::move(open_));
    open_ = std::move(next);
    cursor_.reset();
    at = cursor_.take(bytes);
    if (!at) {
      return make_error(ErrorCode::kInternal, name_ + ": a slot of " + std::to_string(bytes) +
                                                  " bytes does not fit a chunk of " +
                                                  std::to_string(chunk_bytes_));
    }
  }
  return Slot{&open_, *at, open_.mapped() + *at};
}

Status HostRing::reserve(rhi::Device& device) {
  if (created_ > 0 || open_.valid() || !free_.empty()) return {};
  VKAD_ASSIGN_OR_RETURN(rhi::Buffer chunk, device.create_buffer({chunk_bytes_, usage_, name_}));
  ++created_;
  free_.push_back(std::move(chunk));
  return {};
}

void HostRing::recycle(std::vector<rhi::Buffer>& chunks) {
  for (rhi::Buffer& c : chunks) {
    if (free_.size() < max_free_ && c.size() == chunk_bytes_) free_.push_back(std::move(c));
  }
  chunks.clear();  // what the pool did not take goes to the deferred deleter
}

}  // namespace vkad::runtime
