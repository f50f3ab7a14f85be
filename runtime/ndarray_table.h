// The ndarray table: what a runtime knows of each live ndarray, keyed by handle id, and the
// rule that decides whether an ndarray can exist (pure: ndarray_bytes, unit-tested).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "abi/kernel_abi.h"
#include "base/status.h"
#include "rhi/buffer.h"
#include "rhi/stream.h"

namespace vkad::runtime {

struct NdArray {
  abi::DType dtype;
  std::vector<uint32_t> shape;
  rhi::Buffer buffer;
  std::string name;
  uint64_t bytes = 0;
  bool pooled = false;  // Runtime::create_ndarray's `pooled`: freed into the ndarray pool
  // Writes recorded into it so far (Runtime::write_count): launches that may write it, fills,
  // zeroes, copies into it and uploads. The last one: its kind, and a launch's kernel handle id
  // (no name kept per launch: the launch path stays free of allocations).
  enum class Writer : uint8_t { kNone, kLaunch, kUpload, kFill, kZero, kCopy };
  uint64_t writes = 0;
  Writer writer = Writer::kNone;
  uint64_t writer_kernel = 0;
};
using NdArrayTable = std::unordered_map<uint64_t, NdArray>;

// Freed pooled ndarrays' buffers (Runtime::create_ndarray's `pooled`), oldest first, bounded to
// `capacity` bytes (the oldest evicted to the device's deferred deleter). Only buffers one stream
// alone used are kept, so whether one's every use has completed is one serial to compare.
class NdArrayPool {
 public:
  explicit NdArrayPool(uint64_t capacity = 0) : capacity_(capacity) {}
  // A kept buffer of `bytes` whose last use on `stream` has completed (the completed serial
  // read again if none has by the cached one), counted as a reuse; else an invalid Buffer.
  rhi::Buffer take(uint64_t bytes, rhi::Stream& stream);
  // Keeps `buffer` (of `bytes`) if `stream` alone used it and it fits the capacity; otherwise it
  // is destroyed as usual (dropped here).
  void put(rhi::Buffer buffer, uint64_t bytes, const rhi::Stream& stream);
  bool empty() const { return kept_.empty(); }
  void clear();                                // every kept buffer to the deferred deleter
  uint64_t bytes() const { return bytes_; }    // bytes kept
  uint64_t reuses() const { return reuses_; }  // take() calls that returned a buffer

 private:
  struct Kept {
    rhi::Buffer buffer;
    uint64_t bytes = 0;
  };
  uint64_t capacity_ = 0;
  std::deque<Kept> kept_;
  uint64_t bytes_ = 0;
  uint64_t reuses_ = 0;
};

// The bytes of an ndarray of `dtype` and `shape` called `label`, or kInvalidArgument naming it:
// an unknown dtype, a rank outside 1..kMaxNdArrayRank, a zero extent, a size that overflows 64
// bits, or more than `max_range` bytes (the device's storage buffer range).
Result<uint64_t> ndarray_bytes(abi::DType dtype, const std::vector<uint32_t>& shape,
                               const std::string& label, uint64_t max_range);
// "(3, 5)", as error messages print a shape.
std::string shape_string(const std::vector<uint32_t>& shape);

}  // namespace vkad::runtime
