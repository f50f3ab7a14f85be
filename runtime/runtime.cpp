#include "runtime/runtime.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "abi/print_records.h"
#include "base/cache_file.h"
#include "runtime/kernel_checks.h"
#include "runtime/spirv_interface.h"

namespace vkad::runtime {

namespace {

// False when the product overflows 64 bits.
std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF64; }

// Every Runtime of the process gets its own id, the high half of its handles.
std::atomic<uint32_t> g_next_runtime_id{1};

}  // namespace

const char* adstack_tier_name(AdstackTier t) {
  switch (t) {
    case AdstackTier::kDefault: return "default";
    case AdstackTier::kAuto: return "auto";
    case AdstackTier::kHeap: return "heap";
    case AdstackTier::kPrivate: return "private";
  }
  return "?";
}

// RuntimeOptions::adstack_tier, with kDefault resolved from VKAD_ADSTACK_TIER.
static Result<AdstackTier> resolve_adstack_tier(AdstackTier t) {
  if (t != AdstackTier::kDefault) return t;
  const char* env = std::getenv("VKAD_ADSTACK_TIER");
  std::string v = env ? env : "";
  if (v.empty() || v == "auto") return AdstackTier::kAuto;
  if (v == "heap") return AdstackTier::kHeap;
  if (v == "private") return AdstackTier::kPrivate;
  return make_error(ErrorCode::kInvalidArgument, "environment variable VKAD_ADSTACK_TIER is '" + v +
                                                     "'; expected heap, private or auto");
}

const char* adstack_specialize_name(AdstackSpecialize s) {
  switch (s) {
    case AdstackSpecialize::kDefault: return "default";
    case AdstackSpecialize::kOff: return "off";
    case AdstackSpecialize::kAuto: return "auto";
    case AdstackSpecialize::kAll: return "all";
  }
  return "?";
}

// RuntimeOptions::adstack_specialize, with kDefault resolved from VKAD_ADSTACK_SPECIALIZE.
static Result<AdstackSpecialize> resolve_adstack_specialize(AdstackSpecialize s) {
  if (s != AdstackSpecialize::kDefault) return s;
  const char* env = std::getenv("VKAD_ADSTACK_SPECIALIZE");
  std::string v = env ? env : "";
  if (v.empty() || v == "auto") return AdstackSpecialize::kAuto;
  if (v == "off") return AdstackSpecialize::kOff;
  if (v == "all") return AdstackSpecialize::kAll;
  return make_error(
      ErrorCode::kInvalidArgument,
      "environment variable VKAD_ADSTACK_SPECIALIZE is '" + v + "'; expected off, auto or all");
}

std::string handle_string(uint64_t id) {
  return std::to_string(id >> 32) + ":" + std::to_string(id & 0xffffffffu);
}

Runtime::Runtime() { graphs_ = make_graphs(*this); }

Result<std::unique_ptr<Runtime>> Runtime::create(const RuntimeOptions& options) {
  // A zero cap would dispatch no workgroups: every kernel would silently do nothing.
  if (options.max_groups == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "RuntimeOptions::max_groups is 0; it must be at least 1");
  }
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->options_ = options;
  rt->ndarray_pool_ = NdArrayPool(options.ndarray_pool_bytes);
  rt->pipelines_ =
      PipelineCache(options.pipeline_cache_capacity, options.pipeline_hash_for_testing);
  if (const char* e = std::getenv("VKAD_BACKGROUND_PIPELINES"); e && std::string(e) == "0") {
    rt->options_.background_pipelines = false;
  }
  VKAD_ASSIGN_OR_RETURN(rt->options_.adstack_tier, resolve_adstack_tier(options.adstack_tier));
  VKAD_ASSIGN_OR_RETURN(rt->options_.adstack_specialize,
                        resolve_adstack_specialize(options.adstack_specialize));
  rt->stats_.adstack_tier = rt->options_.adstack_tier;
  rt->runtime_id_ = g_next_runtime_id.fetch_add(1);
  if (rt->runtime_id_ == 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "Runtime::create: 2^32 runtimes were created in this process; handle ids "
                      "would repeat");
  }
  rt->cache_dir_ = resolve_cache_dir(options.cache_dir, CacheEnv::from_process());
  rhi::DeviceOptions device_options = options.device;
  device_options.pipeline_cache_dir = rt->cache_dir_;
  VKAD_ASSIGN_OR_RETURN(rt->device_, rhi::Device::create(device_options));
  rt->stats_.pipeline_cache_loaded = rt->device_->pipeline_cache_load().loaded;
  rt->stats_.pipeline_cache_bytes_loaded = rt->device_->pipeline_cache_load().bytes;
  if (options.max_groups > rt->device_->caps().max_workgroup_count[0]) {
    return make_error(ErrorCode::kInvalidArgument,
                      "RuntimeOptions::max_groups is " + std::to_string(options.max_groups) +
                          ", more than device '" + rt->device_->caps().device_name +
                          "' dispatches (maxComputeWorkGroupCount[0] = " +
                          std::to_string(rt->device_->caps().max_workgroup_count[0]) + ")");
  }
  VKAD_ASSIGN_OR_RETURN(
      rt->stream_,
      rt->device_->create_stream({options.sync_mode, "vkad runtime stream", options.wait_spin_ns}));
  const rhi::Capabilities& caps = rt->device_->caps();
  rt->limits_.device_name = caps.device_name;
  rt->limits_.max_groups = options.max_groups;
  rt->limits_.max_workgroup_count_x = caps.max_workgroup_count[0];
  rt->limits_.max_storage_buffer_range = caps.max_storage_buffer_range;
  rt->limits_.max_loop_passes = caps.max_loop_passes;
  rt->limits_.enforce_loop_limit = options.enforce_loop_limit;
  rt->retirement_ =
      RetirementQueue<CtxBuffers>(options.retirement_depth, options.retirement_policy);
  VKAD_TRY(rt->reserve_submissions(options.retirement_depth));
  // 256 KiB chunks: about a thousand launches' args each; 32 chunks kept (8 MiB) covers the
  // launches a retirement depth of a few flushes keeps in flight.
  const uint64_t align = std::max<uint64_t>(caps.min_storage_buffer_offset_alignment, 16);
  rt->upload_ring_.emplace(rhi::MemoryUsage::kUpload, kRingChunkBytes, align, 32, "vkad args ring");
  // The readback ring also takes every graph replay's error words (as many bytes as its args):
  // as many chunks kept as the upload ring.
  rt->readback_ring_.emplace(rhi::MemoryUsage::kReadback, kRingChunkBytes, align, 32,
                             "vkad readback ring");
  return rt;
}

Runtime::~Runtime() {
  // create() may have failed part-way: nothing to flush without a device and a stream.
  if (!device_ || !stream_) return;
  graphs_->drop_capture();  // a running capture's threads stopped; nothing more is captured
  // Flush what was recorded and wait for this stream's work only; then release everything.
  Status s = flush().status();
  if (s.ok()) s = drain_all();
  if (!s.ok()) retirement_.abandon_all();
  list_ = rhi::CommandList();
  ctx_buffers_ = {};
  arrays_.clear();
  graphs_->drop_all();  // their bundles go back to the stream before it is destroyed
  heaps_ = {};
  upload_ring_.reset();
  readback_ring_.reset();
  ndarray_pool_.clear();
  spare_ctx_.clear();
  kernels_.clear();
  pipelines_.clear();
  stream_.reset();  // waits for its own last submission
  device_.reset();
  graphs_.reset();  // before the runtime's members, as when it was the last of them
}

// ---------------------------------------------------------------- kernels

Result<KernelHandle> Runtime::register_kernel(const CompiledKernel& kernel, bool generic_on_demand,
                                              KernelHandle reserved) {
  VKAD_EXCLUSIVE_USE("register_kernel");
  if (reserved.id != 0) {
    std::lock_guard<std::mutex> lock(reserved_mu_);
    if (reserved_kernels_.count(reserved.id) == 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "register_kernel: kernel '" + kernel.name +
                            "': " + handle_string(reserved.id) +
                            " is not a handle reserve_kernel_handle() gave and no kernel has");
    }
  }
  VKAD_TRY(device_->status());
  const rhi::Capabilities& dc = device_->caps();
  VKAD_TRY(
      check_kernel(kernel, {dc.device_name, dc.max_workgroup_size[0], dc.max_workgroup_invocations,
                            dc.shader_float64, dc.shader_int64}));
  const std::string kname = "register_kernel: kernel '" + kernel.name + "'";
  // Drivers trust their input: every module and its interface is validated before any of them
  // reaches one (on a cache miss; cached pipelines were checked when they were created).
  auto validate = [&]() -> Status {
    for (const CompiledTask& t : kernel.tasks) {
      VKAD_TRY(check_module(t.spirv, {"main", kernel.binding_count(), 8, t.local_size},
                            kname + " task '" + t.name + "'"));
    }
    return {};
  };
  uint64_t id = reserved.id;
  if (id == 0) {
    VKAD_ASSIGN_OR_RETURN(id, issue_id());
  }
  bool hit = false;
  VKAD_ASSIGN_OR_RETURN(uint64_t key,
                        pipelines_.acquire(*device_, kernel, validate, generic_on_demand, &hit,
                                           options_.background_pipelines));
  if (hit) ++stats_.pipeline_cache_hits;
  auto k = std::make_shared<Kernel>();
  k->desc = kernel;
  k->id = id;
  k->hash = key;
  k->args_bytes = kernel.args_bytes();
  k->array_count = kernel.array_count();
  k->has_adstacks = kernel.has_adstacks();
  for (const CompiledTask& t : kernel.tasks) {
    k->private_tier.push_back(!t.adstacks.empty() &&
                              declares_spec_id(t.spirv, adstack::kPrivateTierSpecId));
  }
  kernels_.emplace(id, std::move(k));
  if (reserved.id != 0) {
    std::lock_guard<std::mutex> lock(reserved_mu_);
    reserved_kernels_.erase(id);
  }
  return KernelHandle{id};
}

Status Runtime::unregister_kernel(KernelHandle kernel) {
  VKAD_EXCLUSIVE_USE("unregister_kernel");
  VKAD_TRY(device_->status());
  auto it = kernels_.find(kernel.id);
  if (it == kernels_.end()) return dead_handle("unregister_kernel", "kernel", kernel.id);
  const uint64_t key = it->second->hash;
  kernels_.erase(it);
  pipelines_.release(key);
  return {};
}

Result<uint64_t> Runtime::issue_id() {
  uint32_t serial = next_serial_.load(std::memory_order_relaxed);
  do {
    if (serial == 0) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "this runtime has issued 2^32 - 1 handles; create a new Runtime");
    }
  } while (!next_serial_.compare_exchange_weak(serial, serial + 1, std::memory_order_relaxed));
  return runtime_id_ << 32 | serial;
}

Result<KernelHandle> Runtime::reserve_kernel_handle() {
  // No UseGuard: the one call another thread may make while this runtime is in use.
  VKAD_ASSIGN_OR_RETURN(uint64_t id, issue_id());
  std::lock_guard<std::mutex> lock(reserved_mu_);
  reserved_kernels_.insert(id);
  return KernelHandle{id};
}

Status Runtime::dead_handle(const std::string& where, const char* what, uint64_t id) const {
  std::string h = std::string(what) + " handle " + handle_string(id);
  uint64_t owner = id >> 32;
  if (owner != 0 && owner != runtime_id_) {
    return make_error(ErrorCode::kInvalidArgument,
                      where + ": " + h + " belongs to runtime " + std::to_string(owner) +
                          ", not to this one (runtime " + std::to_string(runtime_id_) + ")");
  }
  return make_error(ErrorCode::kNotFound, where + ": " + h + " was freed or never existed");
}

// ---------------------------------------------------------------- ndarrays

Result<NdArrayHandle> Runtime::create_ndarray(DType dtype, std::vector<uint32_t> shape,
                                              const std::string& name, bool pooled) {
  VKAD_EXCLUSIVE_USE("create_ndarray");
  VKAD_TRY(device_->status());
  std::string label = name.empty() ? "ndarray " + std::to_string(next_serial_.load()) : name;
  VKAD_ASSIGN_OR_RETURN(
      uint64_t bytes, ndarray_bytes(dtype, shape, label, device_->caps().max_storage_buffer_range));
  VKAD_ASSIGN_OR_RETURN(uint64_t id, issue_id());
  rhi::Buffer buffer = pooled ? ndarray_pool_.take(bytes, *stream_) : rhi::Buffer();
  if (buffer.valid()) {
    device_->set_name(VK_OBJECT_TYPE_BUFFER, reinterpret_cast<uint64_t>(buffer.handle()), label);
  } else {
    Result<rhi::Buffer> made =
        device_->create_buffer({bytes, rhi::MemoryUsage::kDeviceLocal, label});
    if (!made.ok() && made.status().code() == ErrorCode::kOutOfDeviceMemory &&
        !ndarray_pool_.empty()) {
      // The pool's idle buffers give way to an array the program asks for.
      ndarray_pool_.clear();
      stream_->recycle();  // their memory back to the allocator once past their last use
      made = device_->create_buffer({bytes, rhi::MemoryUsage::kDeviceLocal, label});
    }
    VKAD_TRY(made.status());
    buffer = std::move(made).value();
  }
  arrays_.emplace(id, NdArray{dtype, std::move(shape), std::move(buffer), label, bytes, pooled});
  return NdArrayHandle{id};
}

Status Runtime::free_ndarray(NdArrayHandle array) {
  VKAD_EXCLUSIVE_USE("free_ndarray");
  VKAD_TRY(device_->status());
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("free_ndarray", "ndarray", array.id);
  // A running capture's pieces not submitted yet bind buffers not marked used: submitted first.
  VKAD_TRY(graphs_->drain_run());
  // A pooled array's buffer waits in the pool for the next pooled array of its size; a mapped
  // view the host may still hold keeps it out (the view must not see another array's data).
  if (it->second.pooled && !host_views_.count(array.id))
    ndarray_pool_.put(std::move(it->second.buffer), it->second.bytes, *stream_);
  arrays_.erase(it);  // Buffer -> deferred deleter at the serial of its last use
  return {};
}

Result<std::vector<uint32_t>> Runtime::shape(NdArrayHandle array) const {
  VKAD_EXCLUSIVE_USE("shape");
  VKAD_TRY(device_->status());
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("shape", "ndarray", array.id);
  return it->second.shape;
}

Result<uint64_t> Runtime::write_count(NdArrayHandle array) const {
  VKAD_EXCLUSIVE_USE("write_count");
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("write_count", "ndarray", array.id);
  return it->second.writes;
}

Result<std::string> Runtime::last_writer(NdArrayHandle array) const {
  VKAD_EXCLUSIVE_USE("last_writer");
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("last_writer", "ndarray", array.id);
  const NdArray& a = it->second;
  std::string what;
  switch (a.writer) {
    case NdArray::Writer::kNone: break;
    case NdArray::Writer::kLaunch: {
      auto k = kernels_.find(a.writer_kernel);
      what = k == kernels_.end() ? "a launch (of a kernel since unregistered)"
                                 : "a launch of '" + k->second->desc.name + "'";
      break;
    }
    case NdArray::Writer::kUpload: what = "an upload"; break;
    case NdArray::Writer::kFill: what = "a fill"; break;
    case NdArray::Writer::kZero: what = "a zero"; break;
    case NdArray::Writer::kCopy: what = "a copy into it"; break;
  }
  return what;
}

void Runtime::note_write(NdArray& a, NdArray::Writer what, uint64_t kernel) {
  ++a.writes;
  a.writer = what;
  a.writer_kernel = kernel;
}

Result<uint32_t> Runtime::extent(NdArrayHandle array, uint32_t axis) const {
  VKAD_EXCLUSIVE_USE("extent");
  VKAD_TRY(device_->status());
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("extent", "ndarray", array.id);
  const std::vector<uint32_t>& shape = it->second.shape;
  if (axis >= shape.size()) {
    return make_error(ErrorCode::kInvalidArgument, "extent: axis " + std::to_string(axis) +
                                                       " of '" + it->second.name + "', which has " +
                                                       std::to_string(shape.size()) + " axes");
  }
  return shape[axis];
}

Result<DType> Runtime::dtype(NdArrayHandle array) const {
  VKAD_EXCLUSIVE_USE("dtype");
  VKAD_TRY(device_->status());
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("dtype", "ndarray", array.id);
  return it->second.dtype;
}

Result<std::string> Runtime::name(NdArrayHandle array) const {
  VKAD_EXCLUSIVE_USE("name");
  VKAD_TRY(device_->status());
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("name", "ndarray", array.id);
  return it->second.name;
}

namespace {

// The bytes of one element holding `value` (little-endian), for fill '<name>'. One rule with
// launch's scalar check: a value the dtype cannot hold is refused, never wrapped or saturated.
// Integers take the value truncated toward zero (as a cast does).
Result<uint64_t> fill_pattern(DType dtype, double value, const std::string& name) {
  const double t = std::trunc(value);
  bool fits = true;
  switch (dtype) {
    case DType::kF32: fits = !std::isfinite(value) || std::fabs(value) <= FLT_MAX; break;
    case DType::kF64: break;
    case DType::kI32: fits = t >= -2147483648.0 && t <= 2147483647.0; break;
    case DType::kU32: fits = t >= 0.0 && t <= 4294967295.0; break;
    case DType::kI64: fits = t >= -9223372036854775808.0 && t < 9223372036854775808.0; break;
    case DType::kBool: fits = value == 0.0 || value == 1.0; break;
  }
  if (!fits) {  // NaN fails every integer comparison above, so it lands here too
    return make_error(ErrorCode::kInvalidArgument, "fill '" + name + "': value " +
                                                       format_double(value) + " does not fit " +
                                                       dtype_name(dtype));
  }
  uint64_t pattern = 0;
  switch (dtype) {
    case DType::kF32: {
      const float f = static_cast<float>(value);
      uint32_t w;
      std::memcpy(&w, &f, 4);
      pattern = w;
      break;
    }
    case DType::kF64: std::memcpy(&pattern, &value, 8); break;
    case DType::kI32:
    case DType::kU32:
    case DType::kI64: {
      const int64_t i = static_cast<int64_t>(t);  // in range: checked above
      pattern = dtype == DType::kI64 ? static_cast<uint64_t>(i) : static_cast<uint32_t>(i);
      break;
    }
    case DType::kBool: pattern = value == 1.0 ? 1 : 0; break;
  }
  return pattern;
}

}  // namespace

Result<Runtime::CapturedFill> Runtime::fill_step(NdArrayHandle array, double value) const {
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("fill", "ndarray", array.id);
  const NdArray& a = it->second;
  VKAD_ASSIGN_OR_RETURN(const uint64_t pattern, fill_pattern(a.dtype, value, a.name));
  const uint32_t lo = static_cast<uint32_t>(pattern), hi = static_cast<uint32_t>(pattern >> 32);
  // vkCmdFillBuffer repeats 32 bits: an 8-byte pattern with unequal halves is `wide`. fill()
  // stages it from the host; a graph, which cannot, has the list write it (CommandList::fill64)
  // at every replay.
  const bool wide = dtype_bytes(a.dtype) == 8 && lo != hi;
  return CapturedFill{array, wide ? pattern : lo, wide, value};
}

Status Runtime::fill(NdArrayHandle array, double value) {
  VKAD_EXCLUSIVE_USE("fill");
  VKAD_TRY(device_->status());
  VKAD_ASSIGN_OR_RETURN(const CapturedFill f, fill_step(array, value));
  note_write(arrays_.find(array.id)->second, NdArray::Writer::kFill);
  if (graphs_->capturing()) {
    graphs_->captured_fill(f, /*last=*/true);
    return {};
  }
  NdArray& a = arrays_.find(array.id)->second;
  if (f.wide) {
    std::vector<unsigned char> host(a.bytes);
    for (uint64_t off = 0; off < a.bytes; off += 8) std::memcpy(host.data() + off, &f.pattern, 8);
    return record_host_copy(a, host.data());
  }
  VKAD_TRY(ensure_list());
  return timed(
      "fill", [&] { return "fill '" + a.name + "'"; },
      [&] {
        list_.barrier(rhi::Barrier::kComputeToTransfer);
        list_.fill(a.buffer, static_cast<uint32_t>(f.pattern), 0, a.bytes);
        list_.barrier(rhi::Barrier::kTransferToCompute);
      });
}

Status Runtime::copy(NdArrayHandle src, NdArrayHandle dst) {
  VKAD_EXCLUSIVE_USE("copy");
  VKAD_TRY(device_->status());
  VKAD_TRY(graphs_->not_while_capturing("copy"));
  auto s = arrays_.find(src.id);
  if (s == arrays_.end()) return dead_handle("copy", "ndarray", src.id);
  auto d = arrays_.find(dst.id);
  if (d == arrays_.end()) return dead_handle("copy", "ndarray", dst.id);
  if (src.id == dst.id) {
    return make_error(ErrorCode::kInvalidArgument,
                      "copy '" + s->second.name + "': source and destination are one array");
  }
  if (s->second.dtype != d->second.dtype || s->second.shape != d->second.shape) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "copy '" + s->second.name + "' into '" + d->second.name + "': dtypes or shapes differ");
  }
  VKAD_TRY(ensure_list());
  note_write(d->second, NdArray::Writer::kCopy);
  return timed(
      "copy", [&] { return "copy '" + s->second.name + "' -> '" + d->second.name + "'"; },
      [&] {
        // After launches and after other copies / fills (a tape's snapshots copy back to back).
        list_.barrier(rhi::Barrier::kComputeToTransfer);
        list_.barrier(rhi::Barrier::kTransferToTransfer);
        list_.copy(s->second.buffer, d->second.buffer, s->second.bytes);
        list_.barrier(rhi::Barrier::kTransferToCompute);
      });
}

Status Runtime::zero_many(std::span<const NdArrayHandle> arrays) {
  VKAD_EXCLUSIVE_USE("zero_many");
  VKAD_TRY(device_->status());
  for (NdArrayHandle h : arrays) {  // all checked before anything is recorded
    if (arrays_.find(h.id) == arrays_.end()) return dead_handle("zero_many", "ndarray", h.id);
  }
  if (arrays.empty()) return {};
  for (NdArrayHandle h : arrays) note_write(arrays_.find(h.id)->second, NdArray::Writer::kZero);
  if (graphs_->capturing()) {  // captured as fills; a replay batches consecutive fills alike
    for (size_t i = 0; i < arrays.size(); ++i) {
      graphs_->captured_fill({arrays[i], 0, false, 0.0}, /*last=*/i + 1 == arrays.size());
    }
    return {};
  }
  VKAD_TRY(ensure_list());
  return timed(
      "fill",
      [&] {
        return arrays.size() == 1 ? "zero '" + arrays_.find(arrays[0].id)->second.name + "'"
                                  : "zero " + std::to_string(arrays.size()) + " arrays";
      },
      [&] {
        // One barrier pair for all: the fills write distinct buffers (or the same one twice,
        // with the same value), so no transfer->transfer dependency is needed between them.
        list_.barrier(rhi::Barrier::kComputeToTransfer);
        for (NdArrayHandle h : arrays) {
          NdArray& a = arrays_.find(h.id)->second;
          list_.fill(a.buffer, 0, 0, a.bytes);
        }
        list_.barrier(rhi::Barrier::kTransferToCompute);
      });
}

Status Runtime::upload(NdArrayHandle array, const void* data, uint64_t bytes) {
  VKAD_EXCLUSIVE_USE("upload");
  VKAD_TRY(device_->status());
  VKAD_TRY(graphs_->not_while_capturing("upload"));
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("upload", "ndarray", array.id);
  NdArray& a = it->second;
  if (data == nullptr) {
    return make_error(ErrorCode::kInvalidArgument,
                      "upload to '" + a.name + "': the data pointer is null");
  }
  if (bytes != a.bytes) {
    return make_error(ErrorCode::kInvalidArgument,
                      "upload to '" + a.name + "': " + std::to_string(bytes) +
                          " bytes given, the array holds " + std::to_string(a.bytes));
  }
  note_write(a, NdArray::Writer::kUpload);
  return record_host_copy(a, data);
}

Status Runtime::download(NdArrayHandle array, void* out, uint64_t bytes) {
  VKAD_EXCLUSIVE_USE("download");
  VKAD_TRY(device_->status());
  VKAD_TRY(graphs_->not_while_capturing("download"));
  auto it = arrays_.find(array.id);
  if (it == arrays_.end()) return dead_handle("download", "ndarray", array.id);
  NdArray& a = it->second;
  if (out == nullptr) {
    return make_error(ErrorCode::kInvalidArgument,
                      "download from '" + a.name + "': the output pointer is null");
  }
  if (bytes != a.bytes) {
    return make_error(ErrorCode::kInvalidArgument,
                      "download from '" + a.name + "': " + std::to_string(bytes) +
                          " bytes requested, the array holds " + std::to_string(a.bytes));
  }
  // Small readbacks land in the readback ring (no buffer made); large ones in their own buffer.
  VKAD_TRY(ensure_list());
  rhi::Buffer own;
  const std::byte* from = nullptr;
  list_.barrier(rhi::Barrier::kComputeToTransfer);
  if (bytes <= readback_ring_->chunk_bytes()) {
    VKAD_ASSIGN_OR_RETURN(HostRing::Slot slot,
                          readback_ring_->allocate(*device_, bytes, &ctx_buffers_.readback_chunks));
    list_.copy(a.buffer, *slot.buffer, bytes, 0, slot.offset);
    from = slot.data;
  } else {
    VKAD_ASSIGN_OR_RETURN(
        own, device_->create_buffer({bytes, rhi::MemoryUsage::kReadback, a.name + " readback"}));
    list_.copy(a.buffer, own, bytes);
    from = own.mapped();
  }
  VKAD_ASSIGN_OR_RETURN(rhi::StreamSemaphore sem, flush());
  const double wait_begin = timeline_ ? TimelineRecorder::now_us() : 0;
  if (!sem.wait()) {
    VKAD_TRY(device_->status());
    return make_error(ErrorCode::kTimeout, "download from '" + a.name + "' did not complete");
  }
  if (timeline_) {
    timeline_->host("download '" + a.name + "'", "wait", wait_begin, TimelineRecorder::now_us());
  }
  std::memcpy(out, from, bytes);
  // An own readback buffer was used only by `sem`, which is complete: released at once.
  own.reset();
  VKAD_TRY(drain_all());
  return errors_.take();
}

// ---------------------------------------------------------------- launch

Status Runtime::check_args(const Kernel& k, std::span<const Arg> args) {
  const CompiledKernel& d = k.desc;
  if (args.size() != d.params.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "launch of '" + d.name + "': " + std::to_string(args.size()) +
                          " arguments given, the kernel takes " + std::to_string(d.params.size()));
  }
  checked_arrays_.assign(args.size(), nullptr);
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelParam& p = d.params[i];
    const Arg& a = args[i];
    // Built only for an error: a launch checks every argument, and most launches are fine.
    auto where = [&] {
      return "launch of '" + d.name + "', argument " + std::to_string(i) + " ('" + p.name + "')";
    };
    if (a.kind != p.kind) {
      return make_error(ErrorCode::kInvalidArgument,
                        where() + ": expected " +
                            (p.kind == ParamKind::kScalar ? "a scalar" : "an ndarray") + ", got " +
                            (a.kind == ParamKind::kScalar ? "a scalar" : "an ndarray"));
    }
    if (p.kind == ParamKind::kScalar) {
      if (a.dtype != p.dtype) {
        return make_error(
            ErrorCode::kInvalidArgument,
            where() + ": expected " + dtype_name(p.dtype) + ", got " + dtype_name(a.dtype));
      }
      // The args buffer holds the parameter's own width: a value that does not fit would be
      // truncated (or, for f32, converted with undefined behaviour).
      bool fits = true;
      switch (p.dtype) {
        case DType::kF32: fits = !std::isfinite(a.f) || std::fabs(a.f) <= FLT_MAX; break;
        case DType::kI32: fits = a.i >= INT32_MIN && a.i <= INT32_MAX; break;
        case DType::kU32: fits = a.i >= 0 && a.i <= UINT32_MAX; break;
        case DType::kBool: fits = a.i == 0 || a.i == 1; break;
        default: break;
      }
      if (!fits) {
        return make_error(ErrorCode::kInvalidArgument,
                          where() + ": value " +
                              (is_float_dtype(p.dtype) ? format_double(a.f) : std::to_string(a.i)) +
                              " does not fit " + dtype_name(p.dtype));
      }
      continue;
    }
    auto it = arrays_.find(a.array.id);
    if (it == arrays_.end()) return dead_handle(where(), "ndarray", a.array.id);
    NdArray& arr = it->second;
    checked_arrays_[i] = &arr;
    if (arr.dtype != p.dtype || arr.shape.size() != p.rank) {
      return make_error(ErrorCode::kInvalidArgument,
                        where() + ": expected a rank-" + std::to_string(p.rank) + " " +
                            dtype_name(p.dtype) + " ndarray, got '" + arr.name + "' " +
                            dtype_name(arr.dtype) + shape_string(arr.shape));
    }
  }
  return {};
}

// The args of a launch planned `lp` into args_scratch_: scalars, shapes, zeroed error words,
// adstack rows (abi/kernel_abi.h), from plan_pipelines' inputs. Encoded in host memory: launch
// specialization reads words back, and the mapped args buffer may be write-combined (slow to
// read).
void Runtime::encode_planned_args(const Kernel& k, const LaunchPlan& lp) {
  const CompiledKernel& d = k.desc;
  static const std::vector<std::vector<uint32_t>> kNoAdstackWords;
  std::vector<std::vector<uint32_t>>& adstack_words = plan_adstack_words_;  // reused
  if (k.has_adstacks) {
    adstack_words.resize(d.tasks.size());
    for (uint32_t t = 0; t < d.tasks.size(); ++t) {
      if (d.tasks[t].adstacks.empty()) {
        adstack_words[t].clear();
        continue;
      }
      adstack_words[t].assign(adstack::args_words(d.tasks[t].adstacks.size()), 0);
      adstack::write_args(lp.tasks[t].row, lp.tasks[t].groups * d.tasks[t].local_size,
                          adstack_words[t].data());
    }
  }
  args_scratch_.resize(k.args_bytes);  // encode_args writes every byte
  abi::encode_args(d, plan_scalars_, plan_inputs_.shapes,
                   k.has_adstacks ? adstack_words : kNoAdstackWords, args_scratch_.data());
}

// launch and prepare: the plan of every task (runtime/launch_plan.h: ranges, workgroups,
// adstack rows and tiers, heap needs), the args encoded into args_scratch_, and each task's
// pipeline (made here on first use: the private-tier and specialized variants). Records and
// allocates nothing else, so an error leaves no trace.
Status Runtime::plan_pipelines(const Kernel& k, std::span<const Arg> args, PlannedLaunch* out,
                               bool background) {
  const CompiledKernel& d = k.desc;
  // One pass over the arguments gives the planner its inputs and the args encoder its values.
  LaunchInputs& inputs = plan_inputs_;  // reused: no allocation per launch
  inputs.ints.assign(d.params.size(), 0);
  inputs.shapes.assign(d.params.size(), nullptr);
  std::vector<abi::ScalarValue>& scalars = plan_scalars_;
  scalars.assign(d.params.size(), abi::ScalarValue{});
  out->arrays.clear();
  for (uint32_t i = 0; i < d.params.size(); ++i) {
    if (d.params[i].kind == ParamKind::kScalar) {
      inputs.ints[i] = args[i].i;
      scalars[i] = {args[i].f, args[i].i};
    } else {
      NdArray& arr = *checked_arrays_[i];  // check_args found it
      inputs.shapes[i] = &arr.shape;
      out->arrays.push_back(&arr.buffer);
    }
  }
  // Two captures (16 bytes): std::function keeps the lambda inline, no allocation per launch.
  auto chooser = [this, &k](uint32_t t, const adstack::RowLayout& row, PrivateLengths* len) {
    const AdstackTier policy = options_.adstack_tier;
    return choose_tier(k.private_tier[t], policy == AdstackTier::kHeap,
                       policy == AdstackTier::kPrivate, options_.adstack_private_budget_bytes,
                       kMaxPrivateTierBytes, options_.adstack_private_min_length, row, len);
  };
  VKAD_TRY(plan_launch(d, inputs, limits_, chooser, &out->lp));
  const std::vector<TaskPlan>& plan = out->lp.tasks;
  encode_planned_args(k, out->lp);
  // Each task's pipeline, found once: the generic one, or a variant (private tier, launch
  // constants specialized; made on first use).
  out->pipelines.assign(d.tasks.size(), nullptr);
  out->specialized = out->spec_misses = out->spec_pending = 0;
  for (size_t t = 0; t < d.tasks.size(); ++t) {
    const uint32_t task = static_cast<uint32_t>(t);
    PipelineCache::VariantKey& variant = plan_variant_;  // reused: its values' storage too
    variant.private_tier = plan[t].private_tier();
    variant.len = variant.private_tier ? plan[t].private_len : PrivateLengths{};
    variant.spec_values.clear();
    const AdstackSpecialize spec = options_.adstack_specialize;
    const uint32_t limit = variant.private_tier ? options_.adstack_specialize_max_private_capacity
                                                : options_.adstack_specialize_max_capacity;
    bool small = true;
    for (uint32_t c : plan[t].row.capacity) small = small && c <= limit;
    if (!d.tasks[t].spec_words.empty() &&
        (spec == AdstackSpecialize::kAll || (spec == AdstackSpecialize::kAuto && small))) {
      for (uint32_t w : d.tasks[t].spec_words) {
        uint32_t value;
        std::memcpy(&value, args_scratch_.data() + w, 4);
        variant.spec_values.push_back(value);
      }
    }
    if (batch_prepare_ && options_.background_pipelines) {
      // prepare() in a batch: made on threads, taken in at its end (made at once below where
      // background_pipelines is off).
      pipelines_.start(*device_, k.hash, task, variant, options_.adstack_specialize_max_variants);
      continue;
    }
    const bool wanted = !variant.spec_values.empty();
    bool pending = false;
    VKAD_ASSIGN_OR_RETURN(
        out->pipelines[t],
        pipelines_.variant(*device_, k.hash, task, &variant,
                           options_.adstack_specialize_max_variants, background, &pending));
    // The cache clears the values of a variant past the cap or still being made (the tier's
    // generic pipeline).
    if (wanted) {
      ++(pending                       ? out->spec_pending
         : variant.spec_values.empty() ? out->spec_misses
                                       : out->specialized);
    }
  }
  return {};
}

Status Runtime::prepare(KernelHandle kernel, std::span<const Arg> args) {
  VKAD_EXCLUSIVE_USE("prepare");
  VKAD_TRY(device_->status());
  auto kit = kernels_.find(kernel.id);
  if (kit == kernels_.end()) return dead_handle("prepare", "kernel", kernel.id);
  VKAD_TRY(check_args(*kit->second, args));
  VKAD_TRY(plan_pipelines(*kit->second, args, &planned_, /*background=*/false));
  // Its generic pipelines too, where they are being made on threads (background_pipelines):
  // ready means nothing left to wait for (in a batch: at its end).
  if (!batch_prepare_ || !options_.background_pipelines) {
    VKAD_TRY_CTX(pipelines_.finish_making(kit->second->hash),
                 "prepare: kernel '" + kit->second->desc.name + "'");
  }
  // The rings' first chunks too: a first capture that runs took 1.3 ms of wave's 4 ms first
  // iteration on an H200 making the readback ring's (its pieces' error words). Out of memory
  // here is not the launch's: a ring then makes its chunk when first used, as without this.
  (void)upload_ring_->reserve(*device_);
  (void)readback_ring_->reserve(*device_);
  ++stats_.prepares;
  return {};
}

void Runtime::end_prepare_batch() {
  batch_prepare_ = false;
  pipelines_.finish_background();
}

Status Runtime::check_launch(KernelHandle kernel, std::span<const Arg> args) {
  VKAD_EXCLUSIVE_USE("launch");
  VKAD_TRY(device_->status());
  auto kit = kernels_.find(kernel.id);
  if (kit == kernels_.end()) return dead_handle("launch", "kernel", kernel.id);
  return check_args(*kit->second, args);
}

Status Runtime::launch(KernelHandle kernel, std::span<const Arg> args, LaunchId* id) {
  VKAD_EXCLUSIVE_USE("launch");
  // omit_next_barrier() asks it of this launch only: a refused one drops it.
  const bool omit_barrier = graphs_->take_omit_barrier();
  if (batch_prepare_) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "launch: inside a batch of prepares (begin_prepare_batch without "
                      "end_prepare_batch)");
  }
  VKAD_TRY(device_->status());
  auto kit = kernels_.find(kernel.id);
  if (kit == kernels_.end()) return dead_handle("launch", "kernel", kernel.id);
  const std::shared_ptr<const Kernel>& k = kit->second;
  VKAD_TRY(check_args(*k, args));

  // Plan every task and find its pipeline before recording anything, so a bad range records
  // nothing.
  VKAD_TRY(plan_pipelines(*k, args, &planned_, options_.background_specialization));
  // (check_args found the arrays: no lookup on the launch path)
  for (size_t p = 0; p < checked_arrays_.size() && p < k->desc.params.size(); ++p) {
    if (k->desc.params[p].written && checked_arrays_[p] != nullptr)
      note_write(*checked_arrays_[p], NdArray::Writer::kLaunch, k->id);
  }
  if (graphs_->capturing()) {
    graphs_->captured_launch(k, args, omit_barrier);
    return {};
  }
  if (planned_.lp.any_heap_task) VKAD_TRY(ensure_heaps(planned_.lp.heap_need));
  VKAD_TRY(ensure_list());
  VKAD_TRY(record_launch(k, planned_, planned_.arrays, args_scratch_.data(), id));
  return auto_flush();
}

// ---------------------------------------------------------------- flush / retire

Status Runtime::save_pipeline_cache() {
  VKAD_EXCLUSIVE_USE("save_pipeline_cache");
  // The save merges into the device's VkPipelineCache, which must then be unused: a pipeline
  // being made on a thread (background_specialization) reads it. Its pipeline is saved too.
  pipelines_.finish_background();
  return device_->save_pipeline_cache();
}

Status Runtime::reset_memory_peaks() {
  VKAD_EXCLUSIVE_USE("reset_memory_peaks");
  device_->allocator().reset_peaks();
  return {};
}

Result<RuntimeStats> Runtime::stats() const {
  VKAD_EXCLUSIVE_USE("stats");
  RuntimeStats s = stats_;
  s.retirement = retirement_.counters();
  s.live = device_->live();
  s.ctx_bytes_recording = ctx_bytes_;
  s.pipelines_cached = pipelines_.size();
  s.pipelines_created = pipelines_.created();
  s.pipeline_create_ms = pipelines_.create_ms();
  s.adstack_private_pipelines = pipelines_.private_variant_count();
  s.adstack_specialize = options_.adstack_specialize;
  s.adstack_specialized_pipelines = pipelines_.specialized_variant_count();
  s.pipelines_pending = pipelines_.pending_count();
  s.ndarrays = arrays_.size();
  s.memory_block_bytes = device_->allocator().stats().block_bytes;
  s.memory_used_bytes = device_->allocator().stats().used_bytes;
  s.memory_peak_block_bytes = device_->allocator().stats().peak_block_bytes;
  s.memory_peak_used_bytes = device_->allocator().stats().peak_used_bytes;
  s.live_descriptor_sets = stream_->live_descriptor_sets();
  s.ring_chunks_held = upload_ring_->chunks_held() + readback_ring_->chunks_held();
  s.ring_chunks_created = upload_ring_->chunks_created() + readback_ring_->chunks_created();
  for (const auto& [id, a] : arrays_) s.user_bytes += a.bytes;
  s.args_ring_bytes = upload_ring_->bytes_held();
  s.readback_ring_bytes = readback_ring_->bytes_held();
  s.spare_block_bytes = device_->allocator().spare_bytes();
  s.ndarray_pool_bytes = ndarray_pool_.bytes();
  s.ndarray_pool_reuses = ndarray_pool_.reuses();
  s.flush_profile = profile_;
  return s;
}

}  // namespace vkad::runtime
