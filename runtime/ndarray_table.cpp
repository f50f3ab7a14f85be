#include "runtime/ndarray_table.h"

namespace vkad::runtime {

std::string shape_string(const std::vector<uint32_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

Result<uint64_t> ndarray_bytes(abi::DType dtype, const std::vector<uint32_t>& shape,
                               const std::string& label, uint64_t max_range) {
  if (!abi::valid_dtype(dtype)) {
    return make_error(ErrorCode::kInvalidArgument, "ndarray '" + label + "': dtype value " +
                                                       std::to_string(static_cast<int>(dtype)) +
                                                       " is not a DType");
  }
  if (shape.size() > abi::kMaxNdArrayRank) {
    return make_error(ErrorCode::kInvalidArgument,
                      "ndarray '" + label + "': rank " + std::to_string(shape.size()) + " (shape " +
                          shape_string(shape) + "); ranks 1 to " +
                          std::to_string(abi::kMaxNdArrayRank) + " are supported");
  }
  uint64_t elems = 1, bytes = 0;
  bool overflow = false;
  for (uint32_t d : shape)
    overflow = overflow || __builtin_mul_overflow(elems, uint64_t{d}, &elems);
  if (overflow || __builtin_mul_overflow(elems, uint64_t{abi::dtype_bytes(dtype)}, &bytes)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "ndarray '" + label + "': shape " + shape_string(shape) + " of " +
                          abi::dtype_name(dtype) + " overflows 64 bits of bytes");
  }
  if (shape.empty() || elems == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "ndarray '" + label + "': shape " + shape_string(shape) + " is empty");
  }
  if (bytes > max_range) {
    return make_error(ErrorCode::kInvalidArgument,
                      "ndarray '" + label + "' of " + std::to_string(bytes) +
                          " bytes exceeds the device's storage buffer range of " +
                          std::to_string(max_range));
  }
  return bytes;
}

rhi::Buffer NdArrayPool::take(uint64_t bytes, rhi::Stream& stream) {
  for (bool refreshed : {false, true}) {
    const rhi::Serial done = refreshed ? stream.refresh_completed() : stream.completed_cached();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->bytes != bytes || it->buffer.use().last[stream.index()] > done) continue;
      rhi::Buffer b = std::move(it->buffer);
      bytes_ -= it->bytes;
      kept_.erase(it);
      ++reuses_;
      return b;
    }
  }
  return {};
}

void NdArrayPool::put(rhi::Buffer buffer, uint64_t bytes, const rhi::Stream& stream) {
  const rhi::ResourceUse& use = buffer.use();
  for (int s = 0; s < static_cast<int>(use.last.size()); ++s) {
    if (s != stream.index() && use.last[s] != rhi::kNoSerial) return;  // destroyed as usual
  }
  if (bytes > capacity_) return;
  kept_.push_back({std::move(buffer), bytes});
  bytes_ += bytes;
  while (bytes_ > capacity_) {
    bytes_ -= kept_.front().bytes;
    kept_.pop_front();  // to the deferred deleter
  }
}

void NdArrayPool::clear() {
  kept_.clear();
  bytes_ = 0;
}

}  // namespace vkad::runtime
