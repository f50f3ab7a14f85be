// Session's calls on ndarrays (api/session.h, SessionArrays).
#include <algorithm>
#include <string>
#include <utility>

#include "api/session.h"
#include "api/session_core.h"
#include "ir/text.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"

namespace vkad {

namespace {

// A copy kernel's IR: `dst[i...] = src[i...]` over every element of two arrays of `dtype` and
// `rank` (the slice graph pass recognizes it by this text).
std::string copy_kernel_ir(DType dtype, uint32_t rank) {
  return codegen::copy_kernel_text(runtime::dtype_name(dtype), rank);
}

}  // namespace

Result<NdArrayHandle> SessionArrays::ndarray(DType dtype, std::vector<uint32_t> shape,
                                             const std::string& name) {
  return core().rt->create_ndarray(dtype, std::move(shape), name);
}

Status SessionArrays::free(NdArrayHandle array) { return core().rt->free_ndarray(array); }

Status SessionArrays::zero(NdArrayHandle array) { return fill(array, 0.0); }

Status SessionArrays::copy(NdArrayHandle src, NdArrayHandle dst) {
  SessionCore& c = core();
  c.drop_stale_capture();
  if (!c.capture) return c.rt->copy(src, dst);
  // Inside a capture a copy is a launch of a copy kernel (one per dtype and rank, kept while
  // the session lives): a graph step like any other, which the graph passes schedule around
  // what it reads and writes (a checkpointed tape's copies are captured this way).
  VKAD_ASSIGN_OR_RETURN(DType t, dtype(src));
  VKAD_ASSIGN_OR_RETURN(std::vector<uint32_t> shape, this->shape(src));
  VKAD_ASSIGN_OR_RETURN(DType dt, dtype(dst));
  VKAD_ASSIGN_OR_RETURN(std::vector<uint32_t> dshape, this->shape(dst));
  if (src.id == dst.id || t != dt || shape != dshape) {
    return make_error(ErrorCode::kInvalidArgument,
                      "copy " + runtime::handle_string(src.id) + " -> " +
                          runtime::handle_string(dst.id) +
                          (src.id == dst.id ? ": source and destination are one array"
                                            : ": dtypes or shapes differ"));
  }
  const uint64_t key = static_cast<uint64_t>(t) << 32 | shape.size();
  auto k = self().copy_kernels_.find(key);
  if (k == self().copy_kernels_.end()) {
    VKAD_ASSIGN_OR_RETURN(KernelHandle h,
                          self().compile(copy_kernel_ir(t, static_cast<uint32_t>(shape.size()))));
    k = self().copy_kernels_.emplace(key, h).first;
  }
  const Arg args[] = {Arg::ndarray(src), Arg::ndarray(dst)};
  return self().launch(k->second, args);
}

Status SessionArrays::zero(std::span<const NdArrayHandle> arrays) {
  SessionCore& c = core();
  c.drop_stale_capture();
  VKAD_TRY(c.rt->zero_many(arrays));
  if (c.capture) {
    // The fills' barriers order everything before them and after (none for no arrays).
    if (!arrays.empty()) c.capture_barriers.clear();
    c.capture->steps += arrays.size();
  }
  return {};
}

Status SessionArrays::fill(NdArrayHandle array, double value) {
  SessionCore& c = core();
  c.drop_stale_capture();
  VKAD_TRY(c.rt->fill(array, value));
  if (c.capture) {
    c.capture_barriers.clear();
    ++c.capture->steps;
  }
  return {};
}

Status SessionArrays::upload(NdArrayHandle array, const void* data, uint64_t bytes) {
  return core().rt->upload(array, data, bytes);
}

Status SessionArrays::download(NdArrayHandle array, void* out, uint64_t bytes) {
  return core().rt->download(array, out, bytes);
}

Result<std::vector<uint32_t>> SessionArrays::shape(NdArrayHandle array) const {
  return core().rt->shape(array);
}

Result<uint32_t> SessionArrays::extent(NdArrayHandle array, uint32_t axis) const {
  return core().rt->extent(array, axis);
}

Result<DType> SessionArrays::dtype(NdArrayHandle array) const { return core().rt->dtype(array); }

Result<std::string> SessionArrays::name(NdArrayHandle array) const {
  return core().rt->name(array);
}

}  // namespace vkad
