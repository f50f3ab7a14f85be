// The ndarray table: what a runtime knows of each live ndarray, keyed by handle id, and the
// rule that decides whether an ndarray can exist (pure: ndarray_bytes, unit-tested).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "abi/kernel_abi.h"
#include "base/status.h"
#include "rhi/buffer.h"

namespace vkad::runtime {

struct NdArray {
  abi::DType dtype;
  std::vector<uint32_t> shape;
  rhi::Buffer buffer;
  std::string name;
  uint64_t bytes = 0;
  bool pooled = false;  // Runtime::create_ndarray's `pooled`: freed into the ndarray pool
};
using NdArrayTable = std::unordered_map<uint64_t, NdArray>;

// The bytes of an ndarray of `dtype` and `shape` called `label`, or kInvalidArgument naming it:
// an unknown dtype, a rank outside 1..kMaxNdArrayRank, a zero extent, a size that overflows 64
// bits, or more than `max_range` bytes (the device's storage buffer range).
Result<uint64_t> ndarray_bytes(abi::DType dtype, const std::vector<uint32_t>& shape,
                               const std::string& label, uint64_t max_range);
// "(3, 5)", as error messages print a shape.
std::string shape_string(const std::vector<uint32_t>& shape);

}  // namespace vkad::runtime
