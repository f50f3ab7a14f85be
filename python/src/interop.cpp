// Binds Session._from_dlpack_capsule and interop_info; implements NdArray's DLPack protocol.
//
// NdArray.__dlpack__ / __dlpack_device__ (a view of vkad's memory: kDLCPU on host-visible
// devices, kDLCUDA through cuda_interop.h on NVIDIA GPUs) and Session._from_dlpack_capsule (a
// copy into a new vkad array). docs/interop.md, "Sharing arrays with PyTorch, JAX and numpy",
// states the synchronisation and lifetime rules implemented here.
#include "runtime/interop.h"

#include <atomic>
#include <climits>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "rhi/device.h"

using namespace nb::literals;

namespace vkad_py {

using NdArrayMemory = vkad::runtime::Runtime::Interop::NdArrayMemory;

std::atomic<bool> g_interpreter_gone{false};

namespace {

[[noreturn]] void buffer_error(const std::string& message) {
  PyErr_SetString(PyExc_BufferError, message.c_str());
  throw nb::python_error();
}

// The CUDA interop of the session, made on first use (nullptr, with st.cuda_error set, where
// there is none). Called with `mu` held.
vkad::cuda::Interop* cuda_of(State& st) {
  if (st.cuda_tried) return st.cuda.get();
  st.cuda_tried = true;
  vkad::runtime::Runtime& rt = st.get().runtime();
  const vkad::rhi::Capabilities& caps = rt.caps();
  if (!caps.export_memory_fd) {
    st.cuda_error = "the device '" + caps.device_name +
                    "' does not export its memory as opaque fds (VK_KHR_external_memory_fd)";
    return nullptr;
  }
  Result<std::unique_ptr<vkad::cuda::Interop>> r = vkad::cuda::Interop::create(caps.device_uuid);
  if (!r.ok()) {
    st.cuda_error = r.status().message();
    return nullptr;
  }
  st.cuda = std::move(r).value();
  vkad::cuda::Interop* cu = st.cuda.get();
  rt.interop().set_block_freed_hook([cu](uint64_t id) { cu->block_freed(id); });
  // Without an imported timeline, exports wait on the host (cuda_interop.h, "Ordering").
  if (caps.export_semaphore_fd) {
    Result<int> fd = rt.interop().export_timeline_fd();
    if (fd.ok()) (void)cu->import_timeline(*fd);
  }
  return cu;
}

bool dl_dtype(DType t, vkad::dlpack::DataType* out) {
  using namespace vkad::dlpack;
  switch (t) {
    case DType::kF32: *out = {kDLFloat, 32, 1}; return true;
    case DType::kF64: *out = {kDLFloat, 64, 1}; return true;
    case DType::kI32: *out = {kDLInt, 32, 1}; return true;
    case DType::kU32: *out = {kDLUInt, 32, 1}; return true;
    case DType::kI64: *out = {kDLInt, 64, 1}; return true;
    case DType::kBool: return false;  // held as one u32 per element: no DLPack bool view
  }
  return false;
}

// What a capsule's manager_ctx points at: the tensor handed out and what it holds.
struct Export {
  vkad::dlpack::ManagedTensor legacy{};
  vkad::dlpack::ManagedTensorVersioned versioned{};
  PyObject* owner = nullptr;  // the NdArray (a strong reference: the array outlives the export)
  bool host_view = false;     // Runtime::hold_host_view was taken
  uint64_t cuda_block = 0;    // block held in the session's Interop (0: none)
  int64_t shape[8] = {};
  int64_t strides[8] = {};
};

// The DLPack deleter: may run on any thread (the consumer's), with or without the GIL.
void release_export(Export* e) {
  if (g_interpreter_gone.load()) return;  // the interpreter is gone: leak rather than crash
  // During finalization (Py_IsInitialized() is already false then) a consumer collected with
  // the modules' globals (a numpy view held by __main__) releases its export on the thread
  // that finalizes, which holds the GIL: the array's reference must be dropped then too, or the
  // array outlives the interpreter and nanobind reports it (and its types) as leaked. Another
  // thread could not take the GIL any more: the export is left as it is.
  const bool finalizing = !Py_IsInitialized();
  if (finalizing && !PyGILState_Check()) return;
  PyGILState_STATE gil = finalizing ? PyGILState_UNLOCKED : PyGILState_Ensure();
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);  // a deleter may run while an exception is pending
  {
    NdArray* a = nb::inst_ptr<NdArray>(e->owner);
    StatePtr st = a->st;  // the array may die below; the state must live to the end
    if (e->host_view) {
      if (st->mu.try_lock()) {
        if (st->session) st->session->runtime().interop().release_host_view(a->handle);
        st->mu.unlock();
      } else {
        std::lock_guard<std::mutex> l(st->pending_mu);
        st->pending_views.push_back(a->handle);
      }
    }
    if (e->cuda_block != 0 && st->cuda) st->cuda->release_block(e->cuda_block);
    --a->exports;
    --st->exports;
    Py_DECREF(e->owner);  // may free the array (a deferred Session.free, or collection)
    if (st->exports == 0 && st->closing) {  // close() waited for the last consumer
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> l(st->mu);
      st->closing.reset();
      st->cuda.reset();
    }
  }
  PyErr_Restore(type, value, trace);
  if (!finalizing) PyGILState_Release(gil);
  delete e;
}

void delete_legacy(vkad::dlpack::ManagedTensor* m) {
  release_export(static_cast<Export*>(m->manager_ctx));
}
void delete_versioned(vkad::dlpack::ManagedTensorVersioned* m) {
  release_export(static_cast<Export*>(m->manager_ctx));
}

// A capsule destroyed under its original name was never consumed: its tensor is ours to free.
void capsule_destructor(PyObject* capsule) {
  using namespace vkad::dlpack;
  if (PyCapsule_IsValid(capsule, kCapsuleVersioned)) {
    auto* m =
        static_cast<ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kCapsuleVersioned));
    if (m && m->deleter) m->deleter(m);
  } else if (PyCapsule_IsValid(capsule, kCapsule)) {
    auto* m = static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsule));
    if (m && m->deleter) m->deleter(m);
  }
}

// DLPack's stream argument for a CUDA export: None = the legacy default stream (1), -1 = no
// synchronisation, otherwise a CUstream (2 = per-thread default). 0 is ambiguous and refused.
int64_t cuda_stream(nb::handle stream) {
  if (stream.is_none()) return 1;
  if (!PyLong_Check(stream.ptr())) {
    invalid(std::string("__dlpack__: stream must be an int or None, got ") +
            nb::type_name(stream.type()).c_str());
  }
  int64_t v = 0;
  if (!nb::try_cast<int64_t>(stream, v)) {
    invalid(std::string("__dlpack__: stream ") + nb::repr(stream).c_str() + " is out of range");
  }
  if (v == 0) {
    invalid(
        "__dlpack__: stream 0 is ambiguous for CUDA (DLPack: use 1 for the legacy default "
        "stream, 2 for the per-thread default stream)");
  }
  return v;
}

// Where the array's memory can be viewed: (kDLCPU, 0), (kDLCUDA, ordinal), or a BufferError.
std::pair<int32_t, int32_t> dlpack_device(NdArray& a, NdArrayMemory* mem) {
  State& st = *a.st;
  Locked l(st);
  *mem = take(st.get().runtime().interop().ndarray_memory(a.handle));
  if (mem->host) return {vkad::dlpack::kDLCPU, 0};
  if (!mem->exportable) {
    buffer_error("__dlpack__ of " + a.label() + ": its memory is neither host-visible nor " +
                 "exportable on '" + st.get().device_name() + "'");
  }
  vkad::cuda::Interop* cu = cuda_of(st);
  if (cu == nullptr)
    buffer_error("__dlpack__ of " + a.label() + ": no CUDA view: " + st.cuda_error);
  return {vkad::dlpack::kDLCUDA, cu->ordinal()};
}

// __dlpack__'s max_version: whether the consumer reads versioned (1.x) capsules.
bool dlpack_versioned(nb::handle max_version) {
  if (max_version.is_none()) return false;
  int64_t major = 0;
  if (!nb::isinstance<nb::tuple>(max_version) || nb::len(max_version) < 1 ||
      !nb::try_cast<int64_t>(nb::borrow<nb::tuple>(max_version)[0], major)) {
    invalid(std::string("__dlpack__: max_version must be a (major, minor) tuple of ints, got ") +
            nb::repr(max_version).c_str());
  }
  return major >= 1;
}

// __dlpack__'s dl_device, where given, must be the array's own (vkad does not copy across).
void check_dl_device(const NdArray& a, nb::handle dl_device, int32_t dev_type, int32_t dev_id) {
  if (dl_device.is_none()) return;
  int32_t want_type = 0, want_id = 0;
  if (!nb::isinstance<nb::tuple>(dl_device) || nb::len(dl_device) != 2 ||
      !nb::try_cast<int32_t>(nb::borrow<nb::tuple>(dl_device)[0], want_type) ||
      !nb::try_cast<int32_t>(nb::borrow<nb::tuple>(dl_device)[1], want_id)) {
    invalid(std::string("__dlpack__: dl_device must be a (device type, device id) tuple of "
                        "ints, got ") +
            nb::repr(dl_device).c_str());
  }
  if (want_type != dev_type || want_id != dev_id) {
    buffer_error("__dlpack__ of " + a.label() + ": dl_device " + nb::str(dl_device).c_str() +
                 " requested; the array is on (" + std::to_string(dev_type) + ", " +
                 std::to_string(dev_id) + ") and vkad does not copy across devices");
  }
}

// The address a DLPack consumer reads `a` at, recorded in `e`: a host view once the array's
// last vkad use is done, or its block's CUDA mapping with the consumer's stream ordered after
// that use.
void* dlpack_data(NdArray& a, nb::handle stream, int32_t dev_type, const NdArrayMemory& mem,
                  Export* e) {
  State& st = *a.st;
  const vkad::NdArrayHandle h = a.handle;
  if (dev_type == vkad::dlpack::kDLCPU) {
    if (!stream.is_none()) {
      invalid("__dlpack__ of " + a.label() + ": stream must be None for a CPU (host-visible) " +
              "array, got " + nb::str(stream).c_str());
    }
    check(blocking(st, [&](vkad::Session& s) { return s.runtime().interop().wait_ndarray(h); }));
    Locked l(st);
    check(st.get().runtime().interop().hold_host_view(h));
    e->host_view = true;
    return mem.host;
  }
  const int64_t s = cuda_stream(stream);
  Locked l(st);
  vkad::runtime::Runtime& rt = st.get().runtime();
  vkad::cuda::Interop* cu = st.cuda.get();
  Result<uint64_t> base = cu->acquire_block(mem.block_id, mem.block_bytes,
                                            [&] { return rt.interop().export_ndarray_fd(h); });
  if (!base.ok()) buffer_error("__dlpack__ of " + a.label() + ": " + base.status().message());
  e->cuda_block = mem.block_id;
  void* data = reinterpret_cast<void*>(static_cast<uintptr_t>(*base + mem.offset));
  if (mem.last_use != vkad::rhi::kNoSerial && s != -1) {
    Status ordered;
    if (cu->has_timeline()) {
      // The consumer's stream waits on the GPU for the array's last vkad submission.
      ordered = cu->wait_on_stream(mem.last_use.value(), static_cast<uintptr_t>(s));
    } else {
      nb::gil_scoped_release release;
      ordered = rt.interop().wait_ndarray(h);
    }
    if (!ordered.ok()) {
      cu->release_block(mem.block_id);
      raise(ordered);
    }
  }
  return data;
}

// The capsule owning export `raw` of `t`: versioned (1.x) or legacy.
nb::object dlpack_capsule(Export* raw, const vkad::dlpack::Tensor& t, bool versioned) {
  using namespace vkad::dlpack;
  PyObject* cap = nullptr;
  if (versioned) {
    raw->versioned.version = {kMajorVersion, kMinorVersion};
    raw->versioned.manager_ctx = raw;
    raw->versioned.deleter = delete_versioned;
    raw->versioned.flags = 0;
    raw->versioned.dl_tensor = t;
    cap = PyCapsule_New(&raw->versioned, kCapsuleVersioned, capsule_destructor);
  } else {
    raw->legacy.dl_tensor = t;
    raw->legacy.manager_ctx = raw;
    raw->legacy.deleter = delete_legacy;
    cap = PyCapsule_New(&raw->legacy, kCapsule, capsule_destructor);
  }
  if (cap == nullptr) {
    release_export(raw);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

// What from_dlpack copies of a DLPack tensor: its extents (rank 1 to 8, each 1 to 2^32 - 1),
// their product, its dtype (one vkad holds), checked to be compact row-major memory.
void dlpack_layout(const vkad::dlpack::Tensor& t, const std::string& where,
                   std::vector<uint32_t>* shape, uint64_t* count, DType* dtype) {
  if (t.ndim < 1 || t.ndim > 8) {
    invalid(where + ": a tensor of rank " + std::to_string(t.ndim) +
            "; vkad arrays have rank 1 to 8 (hold a scalar in shape (1,))");
  }
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] <= 0 || t.shape[i] > UINT32_MAX) {
      invalid(where + ": extent " + std::to_string(t.shape[i]) + " of axis " + std::to_string(i) +
              " is out of range (1 to 2^32 - 1)");
    }
    shape->push_back(static_cast<uint32_t>(t.shape[i]));
    *count *= static_cast<uint64_t>(t.shape[i]);
  }
  nb::dlpack::dtype nd{t.dtype.code, t.dtype.bits, t.dtype.lanes};
  if (!dtype_of(nd, dtype)) {
    invalid(where + ": DLPack dtype (code " + std::to_string(t.dtype.code) + ", " +
            std::to_string(t.dtype.bits) + " bits, " + std::to_string(t.dtype.lanes) +
            " lanes) is not one vkad holds (float32, float64, int32, uint32, int64, bool)");
  }
  if (t.strides == nullptr) return;  // only compact row-major memory is copied as is
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) {
      std::string got = "(";
      for (int j = 0; j < t.ndim; ++j) got += (j ? ", " : "") + std::to_string(t.strides[j]);
      invalid(where + ": strides " + got + (t.ndim == 1 ? ",)" : ")") + " of shape " +
              shape_string(*shape) + " are not C-contiguous; make it contiguous first " +
              "(numpy.ascontiguousarray, torch's .contiguous())");
    }
    expect *= t.shape[i];
  }
}

}  // namespace

nb::tuple ndarray_dlpack_device(NdArray& a) {
  a.check_live("__dlpack_device__");
  NdArrayMemory mem;
  auto [type, id] = dlpack_device(a, &mem);
  return nb::make_tuple(type, id);
}

nb::object ndarray_dlpack(nb::handle self, nb::handle stream, nb::handle max_version,
                          nb::handle dl_device, nb::handle copy) {
  using namespace vkad::dlpack;
  NdArray& a = nb::cast<NdArray&>(self);
  a.check_live("__dlpack__");
  State& st = *a.st;
  DataType dtype{};
  if (!dl_dtype(a.dtype, &dtype)) {
    buffer_error("__dlpack__ of " + a.label() + ": bool arrays are held as one u32 per element " +
                 "on the device and have no DLPack view; cast to u32 in a kernel to share it");
  }
  const bool versioned = dlpack_versioned(max_version);
  // copy=True: a new vkad array holding a copy, exported in its place (flagged as copied).
  if (!copy.is_none() && PyObject_IsTrue(copy.ptr()) == 1) {
    nb::object b = new_array(a.st, a.shape, a.dtype, a.name.empty() ? "" : a.name + " (copy)");
    uint32_t captured = 0;
    {
      Locked l(st);
      check(st.get().copy(a.handle, nb::cast<NdArray&>(b).handle));
      captured = st.get().captured_launches();
    }
    pad_capture(st, captured);
    nb::object cap = ndarray_dlpack(b, stream, max_version, dl_device, nb::none());
    if (versioned) {
      auto* m =
          static_cast<ManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), kCapsuleVersioned));
      if (m) m->flags |= kFlagIsCopied;
    }
    return cap;
  }
  NdArrayMemory mem;
  auto [dev_type, dev_id] = dlpack_device(a, &mem);
  check_dl_device(a, dl_device, dev_type, dev_id);
  auto e = std::make_unique<Export>();
  void* data = dlpack_data(a, stream, dev_type, mem, e.get());
  // From here nothing fails: the export is counted and owned by the capsule.
  const int nd = static_cast<int>(a.shape.size());
  int64_t stride = 1;
  for (int i = nd - 1; i >= 0; --i) {
    e->shape[i] = a.shape[i];
    e->strides[i] = stride;
    stride *= a.shape[i];
  }
  Tensor t{};
  t.data = data;
  t.device = {dev_type, dev_id};
  t.ndim = nd;
  t.dtype = dtype;
  t.shape = e->shape;
  t.strides = e->strides;
  t.byte_offset = 0;
  e->owner = self.ptr();
  Py_INCREF(e->owner);
  ++a.exports;
  ++st.exports;
  return dlpack_capsule(e.release(), t, versioned);
}

nb::object Arrays::from_dlpack_capsule(nb::handle capsule, const std::string& name) {
  using namespace vkad::dlpack;
  const std::string where = "from_dlpack" + (name.empty() ? std::string() : " '" + name + "'");
  if (!PyCapsule_CheckExact(capsule.ptr())) {
    invalid(where + ": expected a DLPack capsule, got " + nb::type_name(capsule.type()).c_str());
  }
  const char* cname = PyCapsule_GetName(capsule.ptr());
  const std::string cap_name = cname ? cname : "";
  if (cap_name == kUsedCapsule || cap_name == kUsedCapsuleVersioned) {
    invalid(where + ": this DLPack capsule was already consumed (a capsule is imported once; " +
            "ask the producer for a new one with x.__dlpack__())");
  }
  const bool versioned = cap_name == kCapsuleVersioned;
  if (!versioned && cap_name != kCapsule) {
    invalid(where + ": a capsule named '" + cap_name + "' is not a DLPack tensor (expected '" +
            kCapsule + "' or '" + kCapsuleVersioned + "')");
  }
  void* p = PyCapsule_GetPointer(capsule.ptr(), cap_name.c_str());
  if (p == nullptr) throw nb::python_error();
  if (PyCapsule_SetName(capsule.ptr(), versioned ? kUsedCapsuleVersioned : kUsedCapsule) != 0) {
    throw nb::python_error();
  }
  // Ours now: the deleter runs when this scope ends, whatever happens.
  struct Consumed {
    void* p;
    bool versioned;
    ~Consumed() {
      if (versioned) {
        auto* m = static_cast<ManagedTensorVersioned*>(p);
        if (m->deleter) m->deleter(m);
      } else {
        auto* m = static_cast<ManagedTensor*>(p);
        if (m->deleter) m->deleter(m);
      }
    }
  } consumed{p, versioned};
  const Tensor& t = versioned ? static_cast<ManagedTensorVersioned*>(p)->dl_tensor
                              : static_cast<ManagedTensor*>(p)->dl_tensor;
  if (versioned && static_cast<ManagedTensorVersioned*>(p)->version.major != kMajorVersion) {
    invalid(where + ": DLPack version " +
            std::to_string(static_cast<ManagedTensorVersioned*>(p)->version.major) +
            ".x is not supported (vkad reads 1.x)");
  }
  std::vector<uint32_t> shape;
  uint64_t count = 1;
  DType dtype;
  dlpack_layout(t, where, &shape, &count, &dtype);
  const int32_t dev = t.device.device_type;
  const auto* src = static_cast<const std::byte*>(t.data) + t.byte_offset;
  const uint64_t elem = t.dtype.bits / 8;
  if (dev == kDLCPU || dev == kDLCUDAHost || dev == kDLCUDAManaged) {
    nb::object out = new_array(st, shape, dtype, name);
    NdArray& a = nb::cast<NdArray&>(out);
    if (dtype == DType::kBool) {  // the device holds one u32 per bool
      std::vector<uint32_t> words(count);
      for (uint64_t i = 0; i < count; ++i) words[i] = src[i] != std::byte{0};
      Locked l(*st);
      check(st->get().upload(a.handle, words.data(), count * 4));
    } else {
      Locked l(*st);
      check(st->get().upload(a.handle, src, count * elem));
    }
    return out;
  }
  if (dev != kDLCUDA) {
    invalid(where + ": DLPack device type " + std::to_string(dev) +
            " is not one vkad reads (CPU 1, CUDA 2, CUDA host 3, CUDA managed 13)");
  }
  if (dtype == DType::kBool) invalid(where + ": bool tensors on CUDA are not imported");
  nb::object out = new_array(st, shape, dtype, name);
  copy_from_cuda(nb::cast<NdArray&>(out), t, src, count * elem, where);
  return out;
}

void Arrays::copy_from_cuda(NdArray& a, const vkad::dlpack::Tensor& t, const std::byte* src,
                            uint64_t bytes, const std::string& where) {
  Locked l(*st);
  vkad::runtime::Runtime& rt = st->get().runtime();
  NdArrayMemory mem = take(rt.interop().ndarray_memory(a.handle));
  vkad::cuda::Interop* cu = mem.exportable ? cuda_of(*st) : nullptr;
  if (cu == nullptr) {
    invalid(where + ": a CUDA tensor, and this session has no CUDA view of its memory: " +
            (mem.exportable ? st->cuda_error : "its device memory is not exportable"));
  }
  if (t.device.device_id != cu->ordinal()) {
    invalid(where + ": the tensor is on CUDA device " + std::to_string(t.device.device_id) +
            ", this session's device is CUDA device " + std::to_string(cu->ordinal()));
  }
  const NdArrayHandle h = a.handle;
  Result<uint64_t> base = cu->acquire_block(mem.block_id, mem.block_bytes,
                                            [&] { return rt.interop().export_ndarray_fd(h); });
  check(base.status());
  Status copied;
  {
    nb::gil_scoped_release release;
    copied = cu->copy_and_wait(*base + mem.offset, reinterpret_cast<uintptr_t>(src), bytes,
                               /*legacy default stream*/ 1);
  }
  cu->release_block(mem.block_id);
  check(copied);
}

nb::dict Arrays::interop_info() {
  Locked l(*st);
  vkad::runtime::Runtime& rt = st->get().runtime();
  nb::dict d;
  d["export_memory_fd"] = rt.caps().export_memory_fd;
  d["export_semaphore_fd"] = rt.caps().export_semaphore_fd;
  vkad::cuda::Interop* cu = rt.caps().export_memory_fd ? cuda_of(*st) : nullptr;
  d["cuda"] = cu != nullptr;
  d["cuda_error"] = st->cuda_error;
  d["cuda_ordinal"] = cu ? cu->ordinal() : -1;
  d["cuda_timeline_semaphore"] = cu != nullptr && cu->has_timeline();
  d["cuda_mapped_blocks"] = cu ? cu->mapped_blocks() : 0;
  d["exports"] = st->exports;
  return d;
}

void bind_interop(nb::class_<Session>& session) {
  session
      .def("_from_dlpack_capsule", on<&Session::arrays>(&Arrays::from_dlpack_capsule), "capsule"_a,
           "name"_a = "")
      .def("interop_info", on<&Session::arrays>(&Arrays::interop_info),
           nb::sig("def interop_info(self) -> dict[str, object]"),
           "What DLPack exchange can use on this device: exportable memory and semaphore, "
           "CUDA (and why not), mapped blocks, live exports.");
}

}  // namespace vkad_py
