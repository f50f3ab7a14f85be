// vkad._vkad: the nanobind binding of vkad's front door (api/session.h) for the Python package
// (python/vkad). It stays thin: kernels come in as IR text (the Python builder prints it), the
// Tape (vkad::Tape's behaviour, over zero_many) and the dtype/shape conveniences live in Python;
// the tape's check that a launch does not overwrite what an earlier one read is vkad::Tape's own
// (vkad::TapeHazards, run by launch below), so both front doors refuse with the same message.
// What lives here is what must be fast or must touch memory: launch (arguments converted against
// the kernel's parameters), numpy upload and download (one copy at most), and the locking that lets
// blocking waits release the GIL.
//
// Threads: a vkad::Session is externally synchronised. Every call below takes the session's
// mutex; a blocking call (download, synchronize, flush, compile, close) releases the GIL first,
// so other Python threads run while it waits. A non-blocking call tries the mutex while holding
// the GIL and releases the GIL only when it has to wait for it (no deadlock: the mutex holder
// never needs the GIL while holding the mutex).
//
// Errors: every vkad Status that is not ok is raised as the vkad.Error subclass of its code,
// carrying vkad's message. Python-side misuse (a wrong argument count or type) raises
// InvalidArgumentError with a message naming the kernel, the argument and what was expected.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "api/tape_hazards.h"
#include "autodiff/forward_mode.h"
#include "cuda_interop.h"
#include "dlpack.h"
#include "rhi/device.h"
#include "runtime/runtime.h"
#include "vkad.h"
#include "vkad_version.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using vkad::Arg;
using vkad::DType;
using vkad::ErrorCode;
using vkad::KernelHandle;
using vkad::NdArrayHandle;
using vkad::Result;
using vkad::Status;
using vkad::runtime::ParamKind;

// ------------------------------------------------------------------ errors

constexpr int kCodes = static_cast<int>(ErrorCode::kInternal) + 1;
PyObject* g_error = PyExc_RuntimeError;  // vkad.Error once registered
PyObject* g_errors[kCodes] = {};         // one subclass per ErrorCode (index 0 unused)

[[noreturn]] void raise(const Status& s) {
  int c = static_cast<int>(s.code());
  PyObject* cls = c > 0 && c < kCodes && g_errors[c] ? g_errors[c] : g_error;
  PyErr_SetString(cls, s.message().c_str());
  throw nb::python_error();
}
[[noreturn]] void invalid(const std::string& message) {
  raise(Status(ErrorCode::kInvalidArgument, message));
}
void check(const Status& s) {
  if (!s.ok()) raise(s);
}
template <typename T>
T take(Result<T> r) {
  if (!r.ok()) raise(r.status());
  return std::move(r).value();
}

// ------------------------------------------------------------------ session state

struct Kernel;

// Session.loop's trace (docs/graphs.md, "Step loops"): while its body runs, launches are collected
// here with the loop index's arguments at the first iteration and their step, and run nothing.
struct LoopEntry {
  nb::object kernel;  // as launched: a Kernel or a Differentiated
  Kernel* k = nullptr;
  std::vector<Arg> args;      // the first iteration's
  std::vector<int32_t> step;  // per parameter: 1 where the loop index (+ c) was passed
  nb::tuple values;           // the Python arguments, the index as the first iteration's int
  bool recorded = false;      // a differentiated kernel launched while a tape records
};
struct LoopTrace {
  int64_t start = 0;
  std::vector<LoopEntry> entries;
  // The thread whose body is traced: another thread's calls on the session go on as usual
  // (a session may be shared by threads).
  std::thread::id owner = std::this_thread::get_id();
  bool mine() const { return owner == std::this_thread::get_id(); }
};

// What a Session, its arrays and its kernels share. Arrays and kernels keep it alive, so a
// handle never outlives the vkad::Session that issued it.
struct State {
  // CUDA's view of the session's memory (DLPack exports on NVIDIA GPUs), made by the first
  // CUDA export. Declared before `session`, and reset after it in ~State: freeing the
  // session's blocks calls into it (Runtime::set_block_freed_hook).
  std::unique_ptr<vkad::cuda::Interop> cuda;
  std::string cuda_error;  // why there is none, once tried
  bool cuda_tried = false;
  std::unique_ptr<vkad::Session> session;  // null once closed
  std::mutex mu;                           // held around every call into `session`
  // DLPack exports not yet released by their consumers (changed with the GIL held). While
  // there are any, close() parks the session in `closing` (its memory must outlive them) and
  // the last export's deleter destroys it.
  uint64_t exports = 0;
  std::unique_ptr<vkad::Session> closing;
  // Handles whose Python objects died while another thread held `mu`: freed by the next call.
  std::mutex pending_mu;
  std::vector<NdArrayHandle> pending_arrays;
  std::vector<NdArrayHandle> pending_views;  // host views released while `mu` was held
  std::vector<KernelHandle> pending_kernels;
  // The recording tape (a Python list) or None, and its TapeHazards; see Session.launch.
  nb::object tape = nb::none();
  nb::object hazards = nb::none();
  // A checkpointed tape's hook, called with (kernel, args) before a recorded launch runs (it
  // copies what the launch will overwrite), or None.
  nb::object before_launch = nb::none();
  // The graph being captured (a Graph) or None: launches append their kernel to it.
  nb::object capture = nb::none();
  // Session.loop's body is running: launches are traced, everything else is refused.
  std::unique_ptr<LoopTrace> loop;
  // The tape's check of a loop recorded from an empty record, by its recorded launches: the
  // record it left (LoopCheck, below). At most kLoopChecks, the oldest dropped first.
  std::vector<std::shared_ptr<struct LoopCheck>> loop_checks;
  // Session.set_print_sink's callable, or None. The runtime's sink calls it through this State
  // (with the GIL taken), so no Python object lives in the C++ session; the sink is taken off
  // before the session is destroyed (stdout then).
  nb::object print_sink = nb::none();

  vkad::Session& get() {
    if (!session) raise(Status(ErrorCode::kFailedPrecondition, "the session is closed"));
    return *session;
  }
  // Called with `mu` held.
  void drain_pending() {
    std::lock_guard<std::mutex> l(pending_mu);
    if (session) {
      for (NdArrayHandle h : pending_views) session->runtime().release_host_view(h);
      for (NdArrayHandle h : pending_arrays) (void)session->free(h);
      for (KernelHandle k : pending_kernels) (void)session->release(k);
    }
    pending_views.clear();
    pending_arrays.clear();
    pending_kernels.clear();
  }
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (session) session->set_print_sink(nullptr);  // no Python from a destructor
    session.reset();                                // frees its blocks through `cuda`'s hook first
    closing.reset();
    cuda.reset();
  }
};
using StatePtr = std::shared_ptr<State>;

// Inside Session.loop's body only launches are traced: anything else would run once, at the
// trace, where the loop means it per iteration (or would wait on launches not yet made).
[[noreturn]] void outside_loop() {
  invalid(
      "Session.loop: its body may only launch kernels (it is traced once, with a symbolic loop "
      "index, and its launches repeated); zero, fill, copy, upload, read back, capture, bind or "
      "compile before or after the loop");
}

// Holds the session mutex for a non-blocking call (see the thread notes at the top).
class Locked {
 public:
  explicit Locked(State& st) : st_(st) {
    if (st.loop && st.loop->mine()) outside_loop();
    if (!st.mu.try_lock()) {
      nb::gil_scoped_release release;
      st.mu.lock();
    }
    st.drain_pending();
  }
  ~Locked() { st_.mu.unlock(); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  State& st_;
};

// Runs `f(session)` (which must not touch Python) with the GIL released and the session mutex
// held; kFailedPrecondition if the session was closed (by another thread, meanwhile too).
template <typename F>
auto blocking(State& st, F&& f) -> decltype(f(std::declval<vkad::Session&>())) {
  if (st.loop && st.loop->mine()) outside_loop();
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> l(st.mu);
  st.drain_pending();
  if (!st.session) return Status(ErrorCode::kFailedPrecondition, "the session is closed");
  return f(*st.session);
}

const char* tname(DType t) { return vkad::runtime::dtype_name(t); }

std::string shape_string(const std::vector<uint32_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

// ------------------------------------------------------------------ ndarrays

struct NdArray {
  StatePtr st;
  NdArrayHandle handle;
  DType dtype = DType::kF32;
  std::vector<uint32_t> shape;
  std::string name;
  bool freed = false;
  // DLPack exports of this array not yet released; Session.free while there are any marks the
  // array freed and leaves the device free to the destructor, which runs after the last
  // export's deleter dropped its reference (free_deferred).
  uint32_t exports = 0;
  bool free_deferred = false;
  // The caller's gradient array (Python `a.grad`), which a Tape uses when set; None otherwise.
  nb::object grad = nb::none();

  NdArray() = default;
  NdArray(const NdArray&) = delete;
  NdArray& operator=(const NdArray&) = delete;
  ~NdArray() {
    // Garbage collection frees the device array (after its in-flight launches, as
    // Session::free does). If another thread is inside the session, the next call frees it.
    if ((freed && !free_deferred) || !st) return;
    if (st->mu.try_lock()) {
      if (st->session) (void)st->session->free(handle);
      st->mu.unlock();
    } else {
      std::lock_guard<std::mutex> l(st->pending_mu);
      st->pending_arrays.push_back(handle);
    }
  }
  uint64_t size() const {
    uint64_t n = 1;
    for (uint32_t e : shape) n *= e;
    return n;
  }
  uint64_t nbytes() const { return size() * vkad::runtime::dtype_bytes(dtype); }
  std::string label() const {
    return name.empty() ? "ndarray " + vkad::runtime::handle_string(handle.id)
                        : "ndarray '" + name + "'";
  }
  // A freed array whose device free waits for DLPack consumers is dead to vkad's calls.
  void check_live(const std::string& where) const {
    if (free_deferred) {
      raise(Status(ErrorCode::kNotFound, where + ": " + label() +
                                             " was freed (its memory stays while DLPack " +
                                             "consumers hold it)"));
    }
  }
};

// numpy's name of each dtype, and the DLPack description nanobind reports for it.
const char* numpy_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI32: return "int32";
    case DType::kU32: return "uint32";
    case DType::kI64: return "int64";
    case DType::kBool: return "bool";
  }
  return "?";
}
bool dtype_of(const nb::dlpack::dtype& d, DType* out) {
  using C = nb::dlpack::dtype_code;
  auto code = static_cast<C>(d.code);
  if (d.lanes != 1) return false;
  if (code == C::Float && d.bits == 32)
    *out = DType::kF32;
  else if (code == C::Float && d.bits == 64)
    *out = DType::kF64;
  else if (code == C::Int && d.bits == 32)
    *out = DType::kI32;
  else if (code == C::UInt && d.bits == 32)
    *out = DType::kU32;
  else if (code == C::Int && d.bits == 64)
    *out = DType::kI64;
  else if (code == C::Bool && d.bits == 8)
    *out = DType::kBool;
  else
    return false;
  return true;
}
std::string describe(const nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>& a) {
  std::vector<uint32_t> shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(static_cast<uint32_t>(a.shape(i)));
  DType t;
  return "a numpy array of shape " + shape_string(shape) + " and dtype " +
         (dtype_of(a.dtype(), &t) ? numpy_name(t) : "unsupported by vkad");
}

using HostArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

// Host -> device from the numpy buffer itself (vkad copies it into staging before returning);
// only a bool array is converted first (the device holds one u32 per bool).
void upload(NdArray& a, const HostArray& host) {
  a.check_live("upload");
  DType t;
  bool same_shape = host.ndim() == a.shape.size();
  for (size_t i = 0; same_shape && i < host.ndim(); ++i) same_shape = host.shape(i) == a.shape[i];
  if (!dtype_of(host.dtype(), &t) || t != a.dtype || !same_shape) {
    invalid("upload to " + a.label() + " (" + tname(a.dtype) + ", shape " + shape_string(a.shape) +
            "): got " + describe(host));
  }
  State& st = *a.st;
  if (t == DType::kBool) {
    const auto* b = static_cast<const uint8_t*>(host.data());
    std::vector<uint32_t> words(host.size());
    for (size_t i = 0; i < words.size(); ++i) words[i] = b[i] != 0;
    Locked l(st);
    check(st.get().upload(a.handle, words.data(), words.size() * 4));
    return;
  }
  Locked l(st);
  check(st.get().upload(a.handle, host.data(), host.nbytes()));
}

nb::object numpy_module() {
  static PyObject* np = nullptr;  // leaked on purpose: module objects outlive static destructors
  if (!np) np = nb::module_::import_("numpy").release().ptr();
  return nb::borrow(np);
}

// Device -> a new numpy array (the one copy); blocks with the GIL released.
nb::object download(NdArray& a) {
  a.check_live("numpy");
  nb::object np = numpy_module();
  nb::list shape;
  for (uint32_t e : a.shape) shape.append(e);
  bool is_bool = a.dtype == DType::kBool;
  nb::object out = np.attr("empty")(nb::tuple(shape), is_bool ? "uint32" : numpy_name(a.dtype));
  auto view = nb::cast<nb::ndarray<nb::c_contig, nb::device::cpu>>(out);
  void* data = view.data();
  uint64_t bytes = view.nbytes();
  Status status =
      blocking(*a.st, [&](vkad::Session& s) { return s.download(a.handle, data, bytes); });
  check(status);
  return is_bool ? out.attr("astype")("bool") : out;
}

// A new device array of the session (contents undefined) as a Python NdArray.
// `pooled`: Runtime::create_ndarray's (a tape's gradients: reused across tapes when freed).
nb::object new_array(const StatePtr& st, std::vector<uint32_t> shape, DType dtype,
                     const std::string& name, bool pooled = false) {
  NdArrayHandle h;
  {
    Locked l(*st);
    h = take(pooled ? st->get().runtime().create_ndarray(dtype, shape, name, true)
                    : st->get().ndarray(dtype, shape, name));
  }
  auto* a = new NdArray();
  a->st = st;
  a->handle = h;
  a->dtype = dtype;
  a->shape = std::move(shape);
  a->name = name;
  return nb::cast(a, nb::rv_policy::take_ownership);
}

// ------------------------------------------------------------------ DLPack
// NdArray.__dlpack__ / __dlpack_device__ (a view of vkad's memory: kDLCPU on host-visible
// devices, kDLCUDA through cuda_interop.h on NVIDIA GPUs) and Session._from_dlpack_capsule (a
// copy into a new vkad array). docs/interop.md, "Sharing arrays with PyTorch, JAX and numpy",
// states the synchronisation and lifetime rules implemented here.

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
  rt.set_block_freed_hook([cu](uint64_t id) { cu->block_freed(id); });
  // Without an imported timeline, exports wait on the host (cuda_interop.h, "Ordering").
  if (caps.export_semaphore_fd) {
    Result<int> fd = rt.export_timeline_fd();
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

// Set by a Py_AtExit callback (registered at import), which runs at the very end of
// Py_FinalizeEx: past it no Python object may be touched.
std::atomic<bool> g_interpreter_gone{false};

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
        if (st->session) st->session->runtime().release_host_view(a->handle);
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
std::pair<int32_t, int32_t> dlpack_device(NdArray& a, vkad::runtime::Runtime::NdArrayMemory* mem) {
  State& st = *a.st;
  Locked l(st);
  *mem = take(st.get().runtime().ndarray_memory(a.handle));
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

nb::tuple ndarray_dlpack_device(NdArray& a) {
  a.check_live("__dlpack_device__");
  vkad::runtime::Runtime::NdArrayMemory mem;
  auto [type, id] = dlpack_device(a, &mem);
  return nb::make_tuple(type, id);
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
void* dlpack_data(NdArray& a, nb::handle stream, int32_t dev_type,
                  const vkad::runtime::Runtime::NdArrayMemory& mem, Export* e) {
  State& st = *a.st;
  const vkad::NdArrayHandle h = a.handle;
  if (dev_type == vkad::dlpack::kDLCPU) {
    if (!stream.is_none()) {
      invalid("__dlpack__ of " + a.label() + ": stream must be None for a CPU (host-visible) " +
              "array, got " + nb::str(stream).c_str());
    }
    check(blocking(st, [&](vkad::Session& s) { return s.runtime().wait_ndarray(h); }));
    Locked l(st);
    check(st.get().runtime().hold_host_view(h));
    e->host_view = true;
    return mem.host;
  }
  const int64_t s = cuda_stream(stream);
  Locked l(st);
  vkad::runtime::Runtime& rt = st.get().runtime();
  vkad::cuda::Interop* cu = st.cuda.get();
  Result<uint64_t> base =
      cu->acquire_block(mem.block_id, mem.block_bytes, [&] { return rt.export_ndarray_fd(h); });
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
      ordered = rt.wait_ndarray(h);
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
    {
      Locked l(st);
      check(st.get().copy(a.handle, nb::cast<NdArray&>(b).handle));
    }
    nb::object cap = ndarray_dlpack(b, stream, max_version, dl_device, nb::none());
    if (versioned) {
      auto* m =
          static_cast<ManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), kCapsuleVersioned));
      if (m) m->flags |= kFlagIsCopied;
    }
    return cap;
  }
  vkad::runtime::Runtime::NdArrayMemory mem;
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

// ------------------------------------------------------------------ kernels

struct ParamInfo {
  std::string name;
  bool array = false;
  DType dtype = DType::kF32;
  uint32_t rank = 0;
  bool grad = false;
  // A KernelBuilder parameter's element shape (element=(2,): a Vector in the last axis): the
  // extents its array's trailing axes must have; empty for IR text and scalar elements.
  std::vector<uint32_t> element;
};

struct Kernel {
  StatePtr st;
  KernelHandle handle;
  std::string name;
  std::vector<ParamInfo> params;
  bool released = false;
  // Set on the forward kernel of differentiate(): its adjoint (a Kernel) and, per gradient,
  // (forward parameter index, gradient name). Launches of such a kernel are what a Tape records.
  nb::object adjoint = nb::none();
  std::vector<std::pair<uint32_t, std::string>> gradients;
  // What it reads and writes (Session::launch_access), which the tape's check needs.
  std::shared_ptr<const vkad::codegen::KernelAccess> access;
  // The clearing adjoint (Session::clearing_adjoint), made on first use by a checkpointed tape.
  nb::object clearing = nb::none();

  Kernel() = default;
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;
  ~Kernel() {
    if (released || !st) return;
    if (st->mu.try_lock()) {
      if (st->session) (void)st->session->release(handle);
      st->mu.unlock();
    } else {
      std::lock_guard<std::mutex> l(st->pending_mu);
      st->pending_kernels.push_back(handle);
    }
  }
  std::string signature() const {
    std::string out = name + "(";
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamInfo& p = params[i];
      out +=
          (i ? ", " : "") + p.name + ": " +
          (p.array ? "ndarray<" + std::string(tname(p.dtype)) + ", " + std::to_string(p.rank) + ">"
                   : std::string(tname(p.dtype)));
    }
    return out + ")";
  }
};

// A captured launch sequence (Session.capture); released when collected or by release().
struct Graph {
  StatePtr st;
  vkad::GraphHandle handle;  // 0 while the capture is open
  std::string name;
  // The Kernel of each captured launch, in order (for updates' dtypes), held alive through
  // `held` (each kernel once): a pointer per launch, not a Python lookup and list append.
  std::vector<Kernel*> kernels;
  std::unordered_set<const Kernel*> seen;
  nb::list held;
  // k null: a Session.loop's rolled launch (no Python kernel; its scalars cannot be updated).
  void add(Kernel* k) {
    kernels.push_back(k);
    if (k && seen.insert(k).second) held.append(nb::find(k));
  }
  bool released = false;

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    // Best effort: a graph holds no device memory of its own; the session frees the rest.
    if (released || !st || handle.id == 0) return;
    if (st->mu.try_lock()) {
      if (st->session) (void)st->session->release_graph(handle);
      st->mu.unlock();
    }
  }
};

// Graph.launch_names: each launch's kernel name, '#k' on its k-th repeat (as
// vkad::Session::graph_launch_names names them); nullopt for a Session.loop's rolled launch.
std::vector<std::optional<std::string>> launch_names(const Graph& g) {
  std::vector<std::optional<std::string>> out;
  std::unordered_map<std::string, uint32_t> seen;
  out.reserve(g.kernels.size());
  for (const Kernel* k : g.kernels) {
    if (!k) {
      out.emplace_back();
      continue;
    }
    const uint32_t n = seen[k->name]++;
    out.emplace_back(n == 0 ? k->name : k->name + "#" + std::to_string(n));
  }
  return out;
}

// Per parameter, a KernelBuilder's element shape (empty: none given, IR text).
using Elements = std::vector<std::vector<uint32_t>>;

std::vector<ParamInfo> params_of(const vkad::codegen::Kernel& k, const Elements& elements = {}) {
  std::vector<ParamInfo> out;
  for (size_t i = 0; i < k.params.size(); ++i) {
    const auto& p = k.params[i];
    out.push_back({p.name, p.kind == ParamKind::kNdArray, p.dtype, p.rank, p.needs_grad});
    if (i < elements.size() && out.back().array && elements[i].size() <= p.rank) {
      out.back().element = elements[i];
    }
  }
  return out;
}

// One Python value as the launch argument of parameter `i` of `k`.
// A tape keeps one (kernel, args) tuple per recorded launch, ~10^4 an iteration. Tracked, they
// pile up in the cyclic GC's older generations, and that growth is what makes CPython run full
// collections (several ms each, over every tracked object of the process) in the middle of a
// recording. Their items are kernels and numbers, which the GC does not track, and NdArrays,
// which it tracks only because they take weak references: an NdArray shows the GC no reference
// of its own (its `grad` is a C++ member), so no cycle the GC could find passes through one.
// Such a tuple can be in no collectable cycle -- CPython's own rule (it untracks a tuple of
// untracked items once it survives a collection), with NdArrays counted as atomic -- and is
// untracked at once. A tuple holding anything else stays tracked.
bool gc_atomic(PyObject* item) {
  return !(PyObject_IS_GC(item) && PyObject_GC_IsTracked(item)) ||
         nb::isinstance<NdArray>(nb::handle(item));
}
void untrack_if_atomic(nb::handle tuple) {
  PyObject* t = tuple.ptr();
  if (t == nullptr || !PyTuple_Check(t) || !PyObject_GC_IsTracked(t)) return;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) {
    if (!gc_atomic(PyTuple_GET_ITEM(t, i))) return;
  }
  PyObject_GC_UnTrack(t);
}

// The "<call> '<kernel>', argument i ('name': type)" that begins an argument's error; built only
// when one is raised (a launch passes ~10 arguments, ~10^4 times an iteration).
struct ArgWhere {
  const Kernel& k;
  size_t i;
  const char* call;
  std::string operator()() const {
    const ParamInfo& p = k.params[i];
    return std::string(call) + " '" + k.name + "', argument " + std::to_string(i) + " ('" + p.name +
           "': " +
           (p.array ? "ndarray<" + std::string(tname(p.dtype)) + ", " + std::to_string(p.rank) + ">"
                    : std::string(tname(p.dtype))) +
           ")";
  }
};

std::string type_name_of(nb::handle v) { return nb::type_name(v.type()).c_str(); }

Arg array_arg(const ParamInfo& p, const State& st, nb::handle v, const ArgWhere& where) {
  NdArray* a = nullptr;
  if (!nb::try_cast<NdArray*>(v, a) || a == nullptr) {
    invalid(where() + ": expected a vkad ndarray, got " + type_name_of(v));
  }
  if (a->st.get() != &st) invalid(where() + ": " + a->label() + " belongs to another session");
  if (a->free_deferred) a->check_live(where());
  // The IR sees only the rank: an element of 2 components read from an array with 3 would
  // drop the third without an error.
  if (!p.element.empty() && a->shape.size() == p.rank &&
      !std::equal(p.element.begin(), p.element.end(), a->shape.end() - p.element.size())) {
    invalid(where() + ": " + a->label() + " has shape " + shape_string(a->shape) +
            "; the parameter's elements are of shape " + shape_string(p.element) +
            " (KernelBuilder.ndarray(..., element=...)), held in its last " +
            std::to_string(p.element.size()) + " axes, so those must be " +
            shape_string(p.element));
  }
  return Arg::ndarray(a->handle);
}

// Integers: Python ints and numpy integers (anything with __index__), range checked.
Arg integer_arg(const ParamInfo& p, nb::handle v, const ArgWhere& where) {
  if (!PyIndex_Check(v.ptr())) invalid(where() + ": expected an integer, got " + type_name_of(v));
  nb::object idx = nb::steal(PyNumber_Index(v.ptr()));
  if (!idx.is_valid()) throw nb::python_error();
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(idx.ptr(), &overflow);
  long long lo = p.dtype == DType::kI32 ? INT32_MIN : p.dtype == DType::kU32 ? 0 : LLONG_MIN;
  long long hi = p.dtype == DType::kI32   ? INT32_MAX
                 : p.dtype == DType::kU32 ? UINT32_MAX
                                          : LLONG_MAX;
  if (overflow || x < lo || x > hi) {
    invalid(where() + ": " + nb::str(idx).c_str() + " is out of range for " + tname(p.dtype));
  }
  if (p.dtype == DType::kI32) return Arg::i32(static_cast<int32_t>(x));
  if (p.dtype == DType::kU32) return Arg::u32(static_cast<uint32_t>(x));
  return Arg::i64(x);
}

Arg to_arg(const Kernel& k, const State& st, size_t i, nb::handle v, const char* call = "launch") {
  const ParamInfo& p = k.params[i];
  const ArgWhere where{k, i, call};
  if (p.array) return array_arg(p, st, v, where);
  if (p.dtype == DType::kF32 || p.dtype == DType::kF64) {
    double d = PyFloat_AsDouble(v.ptr());
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      invalid(where() + ": expected a number, got " + type_name_of(v));
    }
    // Passed on as a double: the runtime's range check (a finite value past FLT_MAX does not
    // fit f32) must see the value the caller gave, not one narrowed to +-inf here.
    Arg a = Arg::f64(d);
    a.dtype = p.dtype;
    return a;
  }
  if (p.dtype == DType::kBool) {
    if (!PyBool_Check(v.ptr()) && !PyIndex_Check(v.ptr())) {
      invalid(where() + ": expected a bool, got " + type_name_of(v));
    }
    return Arg::boolean(PyObject_IsTrue(v.ptr()) == 1);
  }
  return integer_arg(p, v, where);
}

struct Differentiated {
  nb::object forward, adjoint;  // Kernels
};

// Session.loop's index inside its body: the loop's step t plus `offset` (t + 1, t - 1, ...),
// symbolic -- the body is traced once. Passed to a kernel's i32 scalar, that argument steps by 1
// per iteration. Anything that needs its value (int(t), t * 2, an `if`) is refused.
struct LoopIndex {
  int64_t offset = 0;
  std::string repr() const {
    if (offset == 0) return "vkad.LoopIndex(t)";
    return "vkad.LoopIndex(t " + std::string(offset < 0 ? "- " : "+ ") +
           std::to_string(offset < 0 ? -offset : offset) + ")";
  }
};

// What a tape records for a Session.loop (an entry of Tape.launches beside the (kernel, args)
// tuples): its differentiated launches, in body order, and its iterations. backward launches
// their adjoints as a loop too: body reversed, iterations last first.
struct LoopRecord {
  std::vector<LoopEntry> entries;
  int64_t start = 0;
  uint32_t count = 0;
};

// A step loop's tape check, kept (State::loop_checks): from an empty record, the same launches
// -- kernels, arguments (array handles are never reused, shapes never change), steps and count
// -- leave the same record, so a recording that starts with a loop checked before (by
// Session.prepare_loop, or an earlier iteration's recording) takes the record instead of
// checking ~10^4 launches again.
struct LoopCheck {
  std::vector<vkad::LoopLaunch> launches;  // the recorded ones, in body order
  uint32_t count = 0;
  vkad::TapeHazards after;
};
constexpr size_t kLoopChecks = 8;

bool same_arg(const Arg& a, const Arg& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.i == b.i && a.array.id == b.array.id &&
         std::memcmp(&a.f, &b.f, sizeof a.f) == 0;
}

// The launches of a traced body a tape records (its differentiated kernels'), as a LoopCheck
// keys them.
std::vector<vkad::LoopLaunch> recorded_launches(const LoopTrace& t) {
  std::vector<vkad::LoopLaunch> out;
  for (const LoopEntry& e : t.entries) {
    if (!e.k->adjoint.is_none()) out.push_back({e.k->handle, e.args, e.step});
  }
  return out;
}

bool same_launches(std::span<const vkad::LoopLaunch> a, std::span<const vkad::LoopLaunch> b) {
  if (a.size() != b.size()) return false;
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j].kernel.id != b[j].kernel.id || a[j].args.size() != b[j].args.size() ||
        a[j].step != b[j].step) {
      return false;
    }
    for (size_t p = 0; p < a[j].args.size(); ++p) {
      if (!same_arg(a[j].args[p], b[j].args[p])) return false;
    }
  }
  return true;
}

// A Python Tape's vkad::TapeHazards (api/tape_hazards.h): what its recording read and wrote.
struct TapeHazards {
  vkad::TapeHazards hazards;
  // Why backward must refuse this recording ("" when it may run): a loop failed part way.
  std::string broken;
};

// ------------------------------------------------------------------ session

struct Session {
  StatePtr st = std::make_shared<State>();

  Session(nb::handle device, bool validation, size_t retirement_depth, uint32_t spare_memory_blocks,
          std::optional<std::string> cache_dir, bool specialize_shapes, bool check_finite) {
    vkad::SessionOptions o;
    o.compile.specialize_shapes = specialize_shapes;
    o.compile.check_finite = check_finite;
    if (!device.is_none()) o.device = nb::str(device).c_str();
    o.validation = validation;
    o.retirement_depth = retirement_depth;
    o.spare_memory_blocks = spare_memory_blocks;
    o.cache_dir = std::move(cache_dir);
    Result<std::unique_ptr<vkad::Session>> r = [&] {
      nb::gil_scoped_release release;
      return vkad::Session::create(o);
    }();
    st->session = take(std::move(r));
  }

  nb::object make_kernel(KernelHandle h, const std::string& name, std::vector<ParamInfo> params) {
    auto* k = new Kernel();
    k->st = st;
    k->handle = h;
    k->name = name;
    k->params = std::move(params);
    return nb::cast(k, nb::rv_policy::take_ownership);
  }

  nb::object compile(const std::string& text, const Elements& elements) {
    vkad::codegen::Kernel k;
    Result<KernelHandle> h = blocking(*st, [&](vkad::Session& s) -> Result<KernelHandle> {
      VKAD_ASSIGN_OR_RETURN(k, vkad::codegen::parse(text));
      return s.compile(k);
    });
    return make_kernel(take(std::move(h)), k.name, params_of(k, elements));
  }

  nb::object differentiate(const std::string& text, const Elements& elements) {
    vkad::codegen::Kernel k;
    std::shared_ptr<const vkad::codegen::KernelAccess> access;
    Result<vkad::Differentiated> r =
        blocking(*st, [&](vkad::Session& s) -> Result<vkad::Differentiated> {
          VKAD_ASSIGN_OR_RETURN(k, vkad::codegen::parse(text));
          VKAD_ASSIGN_OR_RETURN(vkad::Differentiated d, s.differentiate(k));
          access = s.launch_access(d.forward);
          return d;
        });
    vkad::Differentiated d = take(std::move(r));
    std::vector<ParamInfo> fparams = params_of(k, elements), aparams = fparams;
    nb::object forward = make_kernel(d.forward, k.name, fparams);
    Kernel& fk = nb::cast<Kernel&>(forward);
    fk.access = std::move(access);
    for (const vkad::GradientParam& g : d.gradients) {
      ParamInfo gp = fparams[g.param];
      gp.name = g.name;
      gp.grad = false;
      if (!gp.array) {  // a scalar's gradient: a 1-element array (autodiff/reverse_mode.h)
        gp.array = true;
        gp.rank = 1;
        gp.element.clear();
      }
      aparams.push_back(gp);
      fk.gradients.emplace_back(g.param, g.name);
    }
    fk.adjoint = make_kernel(d.adjoint, k.name + "_adjoint", aparams);
    auto* out = new Differentiated{forward, fk.adjoint};
    return nb::cast(out, nb::rv_policy::take_ownership);
  }

  // Session.jvp: the forward-mode (tangent) kernel of IR text (autodiff/forward_mode.h),
  // compiled: the forward's parameters, then `<name>_dot` per grad parameter (a scalar's a
  // scalar, an ndarray's an ndarray, with its element shape).
  nb::object jvp(const std::string& text, const Elements& elements) {
    vkad::codegen::Kernel k, j;
    Result<KernelHandle> h = blocking(*st, [&](vkad::Session& s) -> Result<KernelHandle> {
      VKAD_ASSIGN_OR_RETURN(k, vkad::codegen::parse(text));
      VKAD_ASSIGN_OR_RETURN(j, vkad::codegen::make_jvp(k, s.target()));
      return s.compile(j);
    });
    KernelHandle handle = take(std::move(h));
    Elements all(elements.begin(), elements.end());
    all.resize(k.params.size());
    for (size_t p = 0; p < k.params.size(); ++p) {
      if (k.params[p].needs_grad) all.push_back(all[p]);
    }
    return make_kernel(handle, j.name, params_of(j, all));
  }

  void release(Kernel& k) {
    if (k.st != st) invalid("release: kernel '" + k.name + "' belongs to another session");
    Locked l(*st);
    check(st->get().release(k.handle));
    k.released = true;
  }

  nb::object empty(nb::handle shape_obj, DType dtype, const std::string& name) {
    return make_empty(shape_obj, dtype, name, false);
  }
  nb::object make_empty(nb::handle shape_obj, DType dtype, const std::string& name, bool pooled) {
    std::vector<uint32_t> shape;
    nb::object extents =
        PyIndex_Check(shape_obj.ptr()) ? nb::make_tuple(shape_obj) : nb::borrow(shape_obj);
    for (nb::handle e : extents) {
      nb::object index = nb::steal(PyNumber_Index(e.ptr()));
      if (!index.is_valid()) throw nb::python_error();
      int overflow = 0;  // past long long: out of range like any other (not OverflowError)
      long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      if (PyErr_Occurred()) throw nb::python_error();
      if (overflow != 0 || v < 0 || v > UINT32_MAX) {
        invalid("ndarray '" + name + "': extent " + std::string(nb::str(index).c_str()) +
                " out of range (0 .. " + std::to_string(UINT32_MAX) + ")");
      }
      shape.push_back(static_cast<uint32_t>(v));
    }
    return new_array(st, std::move(shape), dtype, name, pooled);
  }

  nb::object from_numpy(const HostArray& host, const std::string& name) {
    DType t;
    if (!dtype_of(host.dtype(), &t)) {
      invalid("ndarray '" + name + "': " + describe(host) +
              "; vkad holds float32, float64, int32, uint32, int64 and bool");
    }
    nb::list shape;
    for (size_t i = 0; i < host.ndim(); ++i) shape.append(host.shape(i));
    nb::object a = empty(shape, t, name);
    upload(nb::cast<NdArray&>(a), host);
    return a;
  }

  // A new vkad array holding a copy of a DLPack tensor (a capsule from x.__dlpack__(); vkad's
  // Python from_dlpack asks for it). The capsule is consumed: renamed "used_..." and its deleter
  // called once the bytes are copied (also on every error after the rename). Host memory
  // (kDLCPU, kDLCUDAHost, kDLCUDAManaged) is uploaded (one copy); kDLCUDA memory is copied on the
  // device into the new array's CUDA mapping (cuMemcpyDtoDAsync on the legacy default stream,
  // which the producer was asked to order its work before, then a host wait for the copy).
  nb::object from_dlpack_capsule(nb::handle capsule, const std::string& name) {
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

  // from_dlpack's kDLCUDA path: `bytes` at `src` on the tensor's CUDA device copied into `a`
  // through its block's CUDA mapping, on the legacy default stream, then a host wait.
  void copy_from_cuda(NdArray& a, const vkad::dlpack::Tensor& t, const std::byte* src,
                      uint64_t bytes, const std::string& where) {
    Locked l(*st);
    vkad::runtime::Runtime& rt = st->get().runtime();
    vkad::runtime::Runtime::NdArrayMemory mem = take(rt.ndarray_memory(a.handle));
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
    Result<uint64_t> base =
        cu->acquire_block(mem.block_id, mem.block_bytes, [&] { return rt.export_ndarray_fd(h); });
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

  nb::dict interop_info() {
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

  NdArray& own(nb::handle obj, const char* what) {
    NdArray* a = nullptr;
    if (!nb::try_cast<NdArray*>(obj, a) || !a) {
      invalid(std::string(what) + ": expected a vkad ndarray, got " +
              nb::type_name(obj.type()).c_str());
    }
    if (a->st != st) invalid(std::string(what) + ": " + a->label() + " belongs to another session");
    a->check_live(what);
    return *a;
  }

  void free(nb::handle obj) {
    NdArray& a = own(obj, "free");
    if (a.exports > 0) {  // DLPack consumers still use its memory: freed after the last one
      a.freed = a.free_deferred = true;
      return;
    }
    Locked l(*st);
    check(st->get().free(a.handle));
    a.freed = true;
  }
  void zero(nb::handle obj) {
    NdArray& a = own(obj, "zero");
    Locked l(*st);
    check(st->get().zero(a.handle));
  }
  // One barrier pair around one fill per array (Session::zero(span)); every array is checked
  // (type, session, then the runtime's handle check) before anything is recorded.
  void zero_many(nb::handle arrays) {
    std::vector<NdArrayHandle> handles;
    for (nb::handle obj : arrays) handles.push_back(own(obj, "zero_many").handle);
    Locked l(*st);
    check(st->get().zero(std::span<const NdArrayHandle>(handles)));
  }
  void fill(nb::handle obj, double value) {
    NdArray& a = own(obj, "fill");
    Locked l(*st);
    check(st->get().fill(a.handle, value));
  }

  void copy(nb::handle src, nb::handle dst) {
    NdArray& a = own(src, "copy");
    NdArray& b = own(dst, "copy");
    Locked l(*st);
    check(st->get().copy(a.handle, b.handle));
  }

  // The forward kernel's clearing adjoint (vkad::Session::clearing_adjoint), kept on it.
  nb::object clearing_adjoint(Kernel& fwd) {
    if (fwd.st != st)
      invalid("clearing_adjoint: kernel '" + fwd.name + "' belongs to another session");
    if (fwd.adjoint.is_none())
      invalid("clearing_adjoint: '" + fwd.name + "' is not differentiated");
    if (!fwd.clearing.is_none()) return fwd.clearing;
    vkad::Differentiated d;
    d.forward = fwd.handle;
    Result<KernelHandle> h = [&] {
      Locked l(*st);
      return st->get().clearing_adjoint(d);
    }();
    Kernel& adj = nb::cast<Kernel&>(fwd.adjoint);
    fwd.clearing = make_kernel(take(std::move(h)), fwd.name + "_clearing_adjoint", adj.params);
    return fwd.clearing;
  }

  // The hot path: no Python-level wrapper, arguments converted in place.
  // The Kernel a launch or prepare names (a Differentiated stands for its forward), checked
  // against this session and the argument count; `where` names the call in errors.
  Kernel* kernel_for(nb::handle kernel, size_t nargs, const char* where, bool check_count = true) {
    Kernel* k = nullptr;
    if (!nb::try_cast<Kernel*>(kernel, k) || !k) {
      Differentiated* d = nullptr;
      if (nb::try_cast<Differentiated*>(kernel, d) && d) k = nb::cast<Kernel*>(d->forward);
    }
    if (!k)
      invalid(std::string(where) + ": expected a vkad Kernel, got " +
              nb::type_name(kernel.type()).c_str());
    if (k->st != st)
      invalid(std::string(where) + " '" + k->name + "': the kernel belongs to another session");
    if (check_count && nargs != k->params.size()) {
      invalid(std::string(where) + " '" + k->name + "': " + std::to_string(nargs) +
              " arguments given, the kernel takes " + std::to_string(k->params.size()) + ": " +
              k->signature());
    }
    return k;
  }

  void launch(nb::handle kernel, nb::args args) {
    Kernel* k = kernel_for(kernel, args.size(), "launch");
    if (st->loop && st->loop->mine()) {
      trace(kernel, k, [&](size_t i) { return nb::handle(args[i]); });
      return;
    }
    Arg buf[16];
    std::vector<Arg> heap;
    Arg* a = buf;
    if (args.size() > 16) {
      heap.resize(args.size());
      a = heap.data();
    }
    for (size_t i = 0; i < args.size(); ++i) a[i] = to_arg(*k, *st, i, args[i]);
    launch_converted(kernel, k, std::span<const Arg>(a, args.size()), args);
  }

  // Session.loop's body: the launch traced (docs/graphs.md, "Step loops") -- its arguments
  // converted, the loop index's as its first iteration's value -- and nothing run. `value(i)`: the
  // Python argument of parameter i.
  template <typename Value>
  void trace(nb::handle kernel, Kernel* k, Value&& value) {
    LoopTrace& t = *st->loop;
    LoopEntry e;
    e.kernel = nb::borrow(kernel);
    e.k = k;
    const size_t n = k->params.size();
    e.args.resize(n);
    e.step.assign(n, 0);
    nb::tuple values = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(n)));
    for (size_t i = 0; i < n; ++i) {
      nb::handle v = value(i);
      nb::object pv;
      LoopIndex* li = nullptr;
      if (nb::try_cast<LoopIndex*>(v, li) && li) {
        const ParamInfo& p = k->params[i];
        if (p.array || p.dtype != DType::kI32) {
          invalid("Session.loop: launch '" + k->name + "', argument " + std::to_string(i) + " ('" +
                  p.name + "'): the loop index steps an i32 scalar; this parameter is " +
                  (p.array ? "an ndarray" : std::string("a ") + tname(p.dtype) + " scalar"));
        }
        pv = nb::int_(t.start + li->offset);
        e.step[i] = 1;
      } else {
        pv = nb::borrow(v);
      }
      e.args[i] = to_arg(*k, *st, i, pv);
      PyTuple_SET_ITEM(values.ptr(), static_cast<Py_ssize_t>(i), pv.release().ptr());
    }
    e.values = std::move(values);
    e.recorded = !st->tape.is_none() && !k->adjoint.is_none();
    t.entries.push_back(std::move(e));
  }

  // The tape's check of every recorded launch of `count` iterations of `t`, in order, recorded
  // as accepted; a refused one puts `saved` back and raises its message, naming the iteration.
  void check_loop(const LoopTrace& t, uint32_t count, vkad::TapeHazards& hz,
                  vkad::TapeHazards* saved) {
    std::vector<Arg> a;
    for (uint32_t r = 0; r < count; ++r) {
      for (size_t j = 0; j < t.entries.size(); ++j) {
        const LoopEntry& e = t.entries[j];
        if (!e.recorded) continue;
        a = e.args;
        for (size_t p = 0; p < a.size(); ++p) a[p].i += int64_t{r} * e.step[p];
        Status c = hz.check(st->get(), e.k->access, a);
        if (!c.ok()) {
          hz = std::move(*saved);
          check(c.with_context("Session.loop: launch " + std::to_string(j) + " of the body ('" +
                               e.k->name + "'), iteration " + std::to_string(r) +
                               " (t = " + std::to_string(t.start + r) + ")"));
        }
        hz.record();
      }
    }
  }
  // check_loop's work on a thread of its own (extents from a snapshot: that thread may not call
  // into the session) while this one readies the loops of `ready` (vkad::Session::ready_loop:
  // this loop's, and its adjoint's for backward): the check's ~1 us per launch and the rolled
  // kernels' registrations and pipelines overlap. False
  // where a launch is refused (or the thread failed): check_loop then gives the message.
  bool check_loop_beside(const LoopTrace& t, uint32_t count, vkad::TapeHazards& hz,
                         std::span<const std::span<const vkad::LoopLaunch>> ready) {
    std::unordered_map<uint64_t, std::vector<uint32_t>> shapes;
    for (const LoopEntry& e : t.entries) {
      for (const Arg& x : e.args) {
        if (x.kind != ParamKind::kNdArray || shapes.count(x.array.id)) continue;
        Result<std::vector<uint32_t>> sh = st->get().shape(x.array);
        if (sh.ok()) shapes.emplace(x.array.id, std::move(*sh));
      }
    }
    const vkad::TapeHazards::Extent extent = [&shapes](NdArrayHandle a,
                                                       uint32_t d) -> std::optional<uint32_t> {
      auto it = shapes.find(a.id);
      if (it == shapes.end() || d >= it->second.size()) return std::nullopt;
      return it->second[d];
    };
    bool accepted = false;
    auto work = [&]() noexcept {
      try {
        std::vector<Arg> a;
        for (uint32_t r = 0; r < count; ++r) {
          for (const LoopEntry& e : t.entries) {
            if (!e.recorded) continue;
            a = e.args;
            for (size_t p = 0; p < a.size(); ++p) a[p].i += int64_t{r} * e.step[p];
            if (!hz.accepts(extent, e.k->access, a)) return;
            hz.record();
          }
        }
        accepted = true;
      } catch (...) {
        accepted = false;
      }
    };
    std::thread checker;
    try {
      checker = std::thread(work);
    } catch (...) {
      work();  // no thread: here
    }
    try {
      for (std::span<const vkad::LoopLaunch> body : ready) st->get().ready_loop(body, count);
    } catch (...) {
      // out of memory readying it: launch_loop tries again or runs the launches one by one
    }
    if (checker.joinable()) checker.join();
    return accepted;
  }

  std::shared_ptr<LoopCheck> find_loop_check(std::span<const vkad::LoopLaunch> launches,
                                             uint32_t count) const {
    for (const std::shared_ptr<LoopCheck>& c : st->loop_checks) {
      if (c->count == count && same_launches(c->launches, launches)) return c;
    }
    return nullptr;
  }
  void keep_loop_check(std::vector<vkad::LoopLaunch> launches, uint32_t count,
                       const vkad::TapeHazards& after) {
    if (launches.empty()) return;
    auto c = std::make_shared<LoopCheck>();
    c->launches = std::move(launches);
    c->count = count;
    c->after = after;
    if (st->loop_checks.size() >= kLoopChecks) st->loop_checks.erase(st->loop_checks.begin());
    st->loop_checks.push_back(std::move(c));
  }

  // Session.loop's halves (python/vkad/__init__.py): begin starts the trace and returns the
  // symbolic index; end runs the traced body `count` times (vkad::Session::launch_loop),
  // checks and records it on the tape, and adds its launches to the graph being captured.
  nb::object loop_begin(int64_t start) {
    if (st->loop && st->loop->mine()) {
      invalid(
          "Session.loop inside a loop's body: write the inner loop's launches into the "
          "outer body, or run the loops one after the other");
    }
    if (st->loop) {
      invalid(
          "Session.loop: another thread is tracing a loop's body on this session; trace "
          "one at a time");
    }
    if (!st->before_launch.is_none()) {
      invalid(
          "Session.loop: the recording tape checkpoints (checkpoint_every), which copies "
          "per launch; Session.loop runs the body per iteration there");
    }
    {
      Locked l(*st);
      (void)st->get();  // a closed session traces nothing
    }
    st->loop = std::make_unique<LoopTrace>();
    st->loop->start = start;
    return nb::cast(LoopIndex{0});
  }
  void loop_abort() {
    if (st->loop && st->loop->mine()) st->loop.reset();
  }
  // Session.prepare_loop's second half: the traced body's rolled kernel, and its adjoint's where
  // its kernels are differentiated and every gradient array is known (`array.grad`), rolled,
  // compiled, registered and their pipelines made (vkad::Session::ready_loop); nothing launched
  // or recorded. True where the loop will run as one resident kernel.
  bool loop_prepare(uint32_t count) {
    if (!st->loop || !st->loop->mine()) {
      invalid("Session._loop_prepare: no loop body is being traced on this thread");
    }
    std::unique_ptr<LoopTrace> t = std::move(st->loop);
    if (count == 0 || t->entries.empty()) return false;
    std::vector<vkad::LoopLaunch> body;
    for (const LoopEntry& e : t->entries) body.push_back({e.k->handle, e.args, e.step});
    std::optional<std::vector<vkad::LoopLaunch>> adjoint = adjoint_of_set_grads(*t, count);
    Locked l(*st);
    vkad::Session& s = st->get();
    if (adjoint) s.prepare_loop(*adjoint, count);  // compiled beside the forward's
    s.ready_loop(body, count);
    if (adjoint) s.ready_loop(*adjoint, count);
    // A loop too wide to roll: the graph rework's plan of its launches, and its adjoint's,
    // made now, so that its first run launches what a reworked replay would.
    s.rework_loop(body, count);
    if (adjoint) s.rework_loop(*adjoint, count);
    // The tape's check of the loop recorded first in a recording, kept for that recording.
    std::vector<vkad::LoopLaunch> key = recorded_launches(*t);
    if (!key.empty() && !find_loop_check(key, count)) {
      for (LoopEntry& e : t->entries) e.recorded = !e.k->adjoint.is_none();
      vkad::TapeHazards hz;
      const std::span<const vkad::LoopLaunch> ready[] = {body};
      if (check_loop_beside(*t, count, hz, ready)) keep_loop_check(std::move(key), count, hz);
    }
    return s.loop_rolls(body, count);
  }
  void loop_end(uint32_t count) {
    if (!st->loop || !st->loop->mine()) {
      invalid("Session._loop_end: no loop body is being traced on this thread");
    }
    std::unique_ptr<LoopTrace> t = std::move(st->loop);
    if (count == 0 || t->entries.empty()) return;
    std::vector<vkad::LoopLaunch> body;
    bool any_recorded = false;
    for (const LoopEntry& e : t->entries) {
      body.push_back({e.k->handle, e.args, e.step});
      any_recorded = any_recorded || e.recorded;
    }
    TapeHazards* hazards =
        any_recorded && !st->hazards.is_none() ? nb::cast<TapeHazards*>(st->hazards) : nullptr;
    vkad::LoopInfo info;
    {
      Locked l(*st);
      // vkad::Tape::launch's check per launch of the loop, before any runs, on a thread of its
      // own while this one readies the loop (its kernels rolled, compiled, registered, their
      // pipelines made); the hazard record is put back as it was if the loop is refused.
      std::optional<vkad::TapeHazards> saved;
      if (hazards) {
        saved = hazards->hazards;
        // The adjoint's is compiled beside it and registered by backward: readied here it would
        // hold this loop's launch back (H100: 4 ms), readied there it overlaps this loop's run.
        prepare_loops(*t, body, count);
        const bool from_empty = hazards->hazards.launches() == 0;
        std::vector<vkad::LoopLaunch> key;
        if (from_empty) key = recorded_launches(*t);
        std::shared_ptr<LoopCheck> known = from_empty ? find_loop_check(key, count) : nullptr;
        if (known) {
          hazards->hazards = known->after;  // checked before, from an empty record
          st->get().ready_loop(body, count);
        } else {
          const std::span<const vkad::LoopLaunch> ready[] = {body};
          if (!check_loop_beside(*t, count, hazards->hazards, ready)) {
            hazards->hazards = *saved;  // the check again here, for its message
            check_loop(*t, count, hazards->hazards, &*saved);
          }
          if (from_empty) keep_loop_check(std::move(key), count, hazards->hazards);
        }
      }
      // Its launches' device errors name the loop's tape entry (and, launched one by one, the
      // iteration).
      if (hazards) st->get().runtime().set_launch_note("the loop at tape entry", nb::len(st->tape));
      Status run = st->get().launch_loop(body, count, &info);
      st->get().runtime().set_launch_note(nullptr, 0);
      if (!run.ok()) {
        // What did run is in the graph being captured (numbered as the runtime numbered it).
        add_loop_to_capture(info, t->entries.size(), [&](size_t j) { return t->entries[j].k; });
        if (saved) hazards->hazards = std::move(*saved);
        if (hazards && info.launches > 0) {
          // Launched one by one, some ran before one failed: the tape holds none of them, so
          // its backward would leave them out -- refused until the next recording.
          hazards->broken = "a Session.loop failed after " + std::to_string(info.launches) +
                            " of its launches ran (" + run.message() +
                            "); they are not on the tape";
        }
        check(run);
      }
    }
    add_loop_to_capture(info, t->entries.size(), [&](size_t j) { return t->entries[j].k; });
    if (any_recorded) {
      auto* rec = new LoopRecord();
      nb::object obj = nb::cast(rec, nb::rv_policy::take_ownership);
      for (LoopEntry& e : t->entries) {
        if (e.recorded) rec->entries.push_back(std::move(e));
      }
      rec->start = t->start;
      rec->count = count;
      nb::cast<nb::list>(st->tape).append(obj);
    }
  }
  // A loop's launches in the Graph being captured, as launch_loop recorded them (`info`, also
  // when it failed part way): one (no Python kernel) when rolled, the reworked plan's (none
  // with a Python kernel: their scalars cannot be updated either), else the body's `n`
  // launches in order, info.launches of them.
  template <typename KernelOf>
  void add_loop_to_capture(const vkad::LoopInfo& info, size_t n, KernelOf&& of) {
    if (st->capture.is_none()) return;
    Graph* g = nb::cast<Graph*>(st->capture);
    if (info.rolled || info.reworked) {
      for (uint32_t i = 0; i < info.launches; ++i) g->add(nullptr);
      return;
    }
    for (uint32_t i = 0; i < info.launches; ++i) g->add(of(i % n));
  }

  // A differentiated scalar parameter's key in a tape's gradients: (forward Kernel, index).
  static nb::tuple scalar_grad_key(const Kernel* fwd, uint32_t param) {
    return nb::make_tuple(nb::find(fwd), param);
  }
  // The gradient argument of scalar parameter `param` of `fwd` (adjoint parameter `slot` of
  // `adj`): the tape's 1-element array for it, converted as a launch converts it.
  Arg scalar_grad_arg(nb::dict grads, const Kernel* fwd, uint32_t param, const Kernel& adj,
                      size_t slot) {
    nb::object g = grads.get(scalar_grad_key(fwd, param), nb::none());
    return to_arg(adj, *st, slot, g);
  }

  // Tape.backward's loop (python/vkad/tape.py): the adjoint of each of `launches`
  // ((kernel, args) tuples as the binding recorded them), last first, each with the forward's
  // args and then the gradient of each differentiated parameter (`grads`: array handle ->
  // gradient NdArray), launched as Session.launch launches it. A backward launches ~10^4 of
  // them: here each costs the launch alone, where Python's loop doubled it. An error names the
  // launch ("tape.backward: adjoint of launch i: ...") and stops the loop there.
  // The gradient arrays of `grads` by their primal's handle id, each converted once: a lookup
  // per gradient argument instead of a Python int and a dict lookup (~10^4 launches, a few
  // gradients each). One that is not a live array of this session is left out, and a launch
  // that needs it takes the converting path, which names it.
  std::unordered_map<uint64_t, Arg> gradient_args(nb::dict grads) const {
    std::unordered_map<uint64_t, Arg> out;
    for (auto [key, value] : grads) {
      NdArray* g = nullptr;
      if (!nb::try_cast<NdArray*>(value, g) || !g || g->st != st || g->freed || g->free_deferred) {
        continue;
      }
      uint64_t id = 0;
      if (!nb::try_cast<uint64_t>(key, id)) continue;
      out.emplace(id, Arg::ndarray(g->handle));
    }
    return out;
  }

  // A vkad error raised again with `prefix` before its message (as tape.py raised it: the
  // same class, the launch named first); any other exception as it was.
  [[noreturn]] static void raise_named(nb::python_error& e, const std::string& prefix) {
    if (!PyObject_IsSubclass(e.type().ptr(), g_error)) throw;
    const std::string msg = prefix + nb::str(e.value()).c_str();
    PyErr_SetString(e.type().ptr(), msg.c_str());
    throw nb::python_error();
  }

  void launch_adjoints(nb::list launches, nb::dict grads) {
    struct Plan {
      nb::handle adjoint;
      Kernel* k;
    };
    std::unordered_map<const Kernel*, Plan> plans;  // per forward kernel, as tape.py's `plans`
    const std::unordered_map<uint64_t, Arg> grad_args = gradient_args(grads);
    auto plan_of = [&](const Kernel* fwd, size_t nargs) -> const Plan& {
      auto it = plans.find(fwd);
      if (it == plans.end()) {
        if (fwd->adjoint.is_none()) invalid("'" + fwd->name + "' is not differentiated");
        nb::handle adj = fwd->adjoint;
        it = plans.emplace(fwd, Plan{adj, kernel_for(adj, nargs + fwd->gradients.size(), "launch")})
                 .first;
      }
      return it->second;
    };
    std::vector<Arg> a;
    for (size_t i = launches.size(); i-- > 0;) {
      LoopRecord* loop = nullptr;
      if (nb::try_cast<LoopRecord*>(launches[i], loop) && loop) {
        try {
          adjoint_loop(*loop, grads, grad_args, i);
        } catch (nb::python_error& e) {
          raise_named(
              e, "tape.backward: adjoint of launch " + std::to_string(i) + " (a Session.loop): ");
        }
        continue;
      }
      nb::tuple rec = nb::cast<nb::tuple>(launches[i]);
      nb::handle kernel = rec[0];
      nb::tuple args = nb::cast<nb::tuple>(rec[1]);
      try {
        const Kernel* fwd = kernel_for(kernel, args.size(), "launch");
        const Plan& plan = plan_of(fwd, args.size());
        a.resize(args.size() + fwd->gradients.size());
        for (size_t j = 0; j < args.size(); ++j) a[j] = to_arg(*plan.k, *st, j, args[j]);
        for (size_t j = 0; j < fwd->gradients.size(); ++j) {
          const Arg& primal = a[fwd->gradients[j].first];  // converted above
          if (primal.kind != ParamKind::kNdArray) {
            a[args.size() + j] =
                scalar_grad_arg(grads, fwd, fwd->gradients[j].first, *plan.k, args.size() + j);
            continue;
          }
          auto found = grad_args.find(primal.array.id);
          if (found != grad_args.end()) {
            a[args.size() + j] = found->second;
            continue;
          }
          nb::handle x = args[fwd->gradients[j].first];
          NdArray* arr = nullptr;
          nb::object g = nb::try_cast<NdArray*>(x, arr) && arr
                             ? nb::object(grads.get(nb::int_(arr->handle.id), nb::none()))
                             : nb::none();
          a[args.size() + j] = to_arg(*plan.k, *st, args.size() + j, g);
        }
        launch_converted(plan.adjoint, plan.k, a, nb::handle(), "the adjoint of tape entry", i);
      } catch (nb::python_error& e) {
        raise_named(e, "tape.backward: adjoint of launch " + std::to_string(i) + ": ");
      }
    }
  }

  // The adjoint loop of a loop's recorded launches (`entries`, `count` iterations): the body
  // reversed, each launch's adjoint with its forward's args at the last iteration, steps negated
  // (the loop runs from the last iteration down), then the gradient of each differentiated
  // parameter from `grad(primal arg, entry, gradient index, adjoint kernel)`, which returns
  // nullopt where it has none (the body is then nullopt). `kernels` gets the adjoint kernels.
  template <typename Grad>
  std::optional<std::vector<vkad::LoopLaunch>> adjoint_body(const std::vector<LoopEntry>& entries,
                                                            uint32_t count, Grad&& grad,
                                                            std::vector<Kernel*>* kernels) {
    std::vector<vkad::LoopLaunch> body;
    const int64_t last = static_cast<int64_t>(count) - 1;
    for (size_t j = entries.size(); j-- > 0;) {
      const LoopEntry& e = entries[j];
      const Kernel* fwd = e.k;
      const size_t n = e.args.size();
      if (fwd->adjoint.is_none()) invalid("'" + fwd->name + "' is not differentiated");
      Kernel* adj = kernel_for(fwd->adjoint, n + fwd->gradients.size(), "launch");
      vkad::LoopLaunch l;
      l.kernel = adj->handle;
      l.args.resize(n + fwd->gradients.size());
      l.step.assign(l.args.size(), 0);
      for (size_t p = 0; p < n; ++p) {
        l.args[p] = e.args[p];
        l.args[p].i += last * e.step[p];
        l.step[p] = -e.step[p];
      }
      for (size_t g = 0; g < fwd->gradients.size(); ++g) {
        std::optional<Arg> a = grad(l.args[fwd->gradients[g].first], e, g, *adj);
        if (!a) return std::nullopt;
        l.args[n + g] = *a;
      }
      body.push_back(std::move(l));
      if (kernels) kernels->push_back(adj);
    }
    return body;
  }

  // A recorded Session.loop's adjoints (launch_adjoints): its adjoint_body as one loop -- a
  // step loop's backward is then one resident kernel too where its forward was.
  void adjoint_loop(const LoopRecord& loop, nb::dict grads,
                    const std::unordered_map<uint64_t, Arg>& grad_args, size_t entry) {
    std::vector<Kernel*> kernels;
    auto grad = [&](const Arg& primal, const LoopEntry& e, size_t g,
                    const Kernel& adj) -> std::optional<Arg> {
      if (primal.kind != ParamKind::kNdArray) {
        return scalar_grad_arg(grads, e.k, e.k->gradients[g].first, adj, e.args.size() + g);
      }
      auto found = grad_args.find(primal.array.id);
      if (found != grad_args.end()) return found->second;
      // The converting path, which names what is wrong.
      const size_t p = e.k->gradients[g].first;
      NdArray* arr = nullptr;
      nb::object gv = nb::try_cast<NdArray*>(e.values[p], arr) && arr
                          ? nb::object(grads.get(nb::int_(arr->handle.id), nb::none()))
                          : nb::none();
      return to_arg(adj, *st, e.args.size() + g, gv);
    };
    std::vector<vkad::LoopLaunch> body = *adjoint_body(loop.entries, loop.count, grad, &kernels);
    vkad::LoopInfo info;
    Status run;
    {
      Locked l(*st);
      st->get().runtime().set_launch_note(
          "the adjoint (run from the last iteration) of the loop at tape entry", entry);
      run = st->get().launch_loop(body, loop.count, &info);
      st->get().runtime().set_launch_note(nullptr, 0);
    }
    add_loop_to_capture(info, kernels.size(), [&](size_t j) { return kernels[j]; });
    check(run);
  }

  // Before a recorded loop's checks: its rolled kernel, and its adjoint's where every gradient
  // array is known now (`array.grad` set, as DiffTaichi's lazy_grad does), rolled and compiled
  // on threads of the session's (vkad::Session::prepare_loop) while the tape's check runs.
  void prepare_loops(const LoopTrace& t, std::span<const vkad::LoopLaunch> body, uint32_t count) {
    vkad::Session& s = st->get();
    s.prepare_loop(body, count);
    if (std::optional<std::vector<vkad::LoopLaunch>> adj = adjoint_of_set_grads(t, count)) {
      s.prepare_loop(*adj, count);
    }
  }

  // The adjoint loop of `t`'s differentiated launches with each gradient its array's
  // `array.grad` -- what can be rolled before a backward exists -- or nullopt where there is
  // no differentiated launch or a gradient is unset (the tape would make it at backward).
  std::optional<std::vector<vkad::LoopLaunch>> adjoint_of_set_grads(const LoopTrace& t,
                                                                    uint32_t count) {
    std::vector<LoopEntry> differentiated;
    for (const LoopEntry& e : t.entries) {
      if (!e.k->adjoint.is_none()) differentiated.push_back(e);
    }
    if (differentiated.empty()) return std::nullopt;
    auto grad = [&](const Arg&, const LoopEntry& e, size_t g, const Kernel&) -> std::optional<Arg> {
      NdArray* arr = nullptr;
      if (!nb::try_cast<NdArray*>(e.values[e.k->gradients[g].first], arr) || !arr) return {};
      NdArray* ga = nullptr;
      if (arr->grad.is_none() || !nb::try_cast<NdArray*>(arr->grad, ga) || !ga || ga->freed) {
        return std::nullopt;
      }
      return Arg::ndarray(ga->handle);
    };
    return adjoint_body(differentiated, count, grad, nullptr);
  }

  // Tape.backward's first pass: the differentiated (grad) array argument of every recorded
  // launch ((kernel, args) tuples), by array handle, each once, in order of first use; a
  // differentiated scalar parameter as the key (forward Kernel, parameter index) with None (its
  // gradient, a 1-element array, sums d/d(value) over every recorded launch of that kernel).
  nb::dict tape_differentiated(nb::list launches) {
    nb::dict needed;
    for (nb::handle rec_h : launches) {
      LoopRecord* loop = nullptr;
      if (nb::try_cast<LoopRecord*>(rec_h, loop) && loop) {
        for (const LoopEntry& e : loop->entries) {
          for (const auto& [p, name] : e.k->gradients) {
            if (!e.k->params[p].array) {
              nb::tuple key = scalar_grad_key(e.k, p);
              if (!needed.contains(key)) needed[key] = nb::none();
              continue;
            }
            nb::int_ key(e.args[p].array.id);
            if (!needed.contains(key)) needed[key] = e.values[p];
          }
        }
        continue;
      }
      nb::tuple rec = nb::cast<nb::tuple>(rec_h);
      nb::tuple args = nb::cast<nb::tuple>(rec[1]);
      const Kernel* fwd = kernel_for(rec[0], args.size(), "tape.backward");
      for (const auto& [p, name] : fwd->gradients) {
        if (!fwd->params[p].array) {
          nb::tuple key = scalar_grad_key(fwd, p);
          if (!needed.contains(key)) needed[key] = nb::none();
          continue;
        }
        NdArray* arr = nullptr;
        if (!nb::try_cast<NdArray*>(args[p], arr) || !arr) continue;  // the launch refused it
        nb::int_ key(arr->handle.id);
        if (!needed.contains(key)) needed[key] = args[p];
      }
    }
    return needed;
  }

  // launch()'s second half, for arguments converted already (`args`: the Python tuple a tape
  // records; a null handle where the caller has none, which only a launch no tape records may
  // pass).
  // `note`: what makes this launch, for its device errors (Runtime::set_launch_note); a launch
  // recorded on a tape is its entry.
  void launch_converted(nb::handle kernel, Kernel* k, std::span<const Arg> span, nb::handle args,
                        const char* note = nullptr, uint64_t note_index = 0) {
    const bool record = !st->tape.is_none() && !k->adjoint.is_none();
    if (record) note = "tape entry", note_index = nb::len(st->tape);
    if (record && !args.is_valid())
      invalid("launch '" + k->name +
              "': a differentiated kernel launched inside a tape's "
              "recording by tape.backward");
    if (record && !st->before_launch.is_none()) st->before_launch(kernel, args);
    TapeHazards* hazards =
        record && !st->hazards.is_none() ? nb::cast<TapeHazards*>(st->hazards) : nullptr;
    {
      Locked l(*st);
      // vkad::Tape::launch's check, refusing before anything runs.
      if (hazards) check(hazards->hazards.check(st->get(), k->access, span));
      // A checkpointed tape keeps no record, but refuses an in-place launch all the same.
      if (record && !hazards && k->access) {
        check(vkad::TapeHazards::check_aliasing(st->get(), *k->access, span));
      }
      vkad::runtime::Runtime& rt = st->get().runtime();
      rt.set_launch_note(note, note_index);
      const Status launched = st->get().launch(k->handle, span);
      rt.set_launch_note(nullptr, 0);
      check(launched);
      if (hazards) hazards->hazards.record();
    }
    if (record) {
      nb::tuple rec = nb::make_tuple(nb::borrow(kernel), args);
      untrack_if_atomic(args);
      untrack_if_atomic(rec);
      nb::cast<nb::list>(st->tape).append(rec);
    }
    if (!st->capture.is_none()) nb::cast<Graph*>(st->capture)->add(k);
  }

  // Session.bind: `kernel` with the arguments named in `named` fixed (converted and checked
  // here, once); the Bound launches it with the others, given positionally in parameter order.
  nb::object bind(nb::handle self, nb::handle kernel, nb::kwargs named);

  // Session.capture's halves: begin returns the Graph (its handle set by end).
  nb::object begin_capture(const std::string& name, bool background, bool run) {
    {
      Locked l(*st);
      check(st->get().begin_capture(
          name, vkad::CaptureOptions{.background_rework = background, .run = run}));
    }
    auto* g = new Graph();
    g->st = st;
    g->name = name.empty() ? "graph" : name;
    nb::object obj = nb::cast(g, nb::rv_policy::take_ownership);
    st->capture = obj;
    return obj;
  }
  void end_capture() {
    Graph* g = st->capture.is_none() ? nullptr : nb::cast<Graph*>(st->capture);
    // GIL released: end_capture may wait for the previous background rework.
    Result<vkad::GraphHandle> h = blocking(
        *st, [](vkad::Session& s) -> Result<vkad::GraphHandle> { return s.end_capture(); });
    st->capture = nb::none();
    vkad::GraphHandle got = take(std::move(h));
    if (g) g->handle = got;
  }
  // Waits (GIL released) for a background rework and installs it.
  void finish_rework(Graph& g) {
    if (g.st != st)
      invalid("finish_rework of graph '" + g.name + "': the graph belongs to another session");
    if (g.released || g.handle.id == 0) return;
    const vkad::GraphHandle h = g.handle;
    check(blocking(*st, [&](vkad::Session& s) { return s.finish_rework(h); }));
  }
  // A launch or parameter index of a replay update: a Python int in [0, 2^32), or a clear error.
  static uint32_t update_index(nb::handle v, const std::string& what) {
    if (!nb::isinstance<nb::int_>(v) || nb::isinstance<nb::bool_>(v)) {
      invalid(what + " index " + nb::repr(v).c_str() + " is not an int");
    }
    long long i = 0;
    if (!nb::try_cast<long long>(v, i) || i < 0 || i > static_cast<long long>(UINT32_MAX)) {
      invalid(what + " index " + nb::repr(v).c_str() + " is out of range");
    }
    return static_cast<uint32_t>(i);
  }
  // A replay update's launch: its index, or its name in Graph.launch_names.
  static uint32_t update_launch(const Graph& g, nb::handle v, const std::string& which) {
    if (!nb::isinstance<nb::str>(v)) return update_index(v, which + "launch");
    const std::string name = nb::cast<std::string>(v);
    const std::vector<std::optional<std::string>> names = launch_names(g);
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return static_cast<uint32_t>(i);
    }
    std::string some;
    for (size_t i = 0; i < names.size() && i < 8; ++i)
      some += (i ? ", " : "") + (names[i] ? "'" + *names[i] + "'" : std::string("None"));
    invalid(which + "the graph has no launch named '" + name + "' (Graph.launch_names: " + some +
            (names.size() > 8 ? ", ...)" : ")"));
  }
  // updates: (launch index or name, parameter index, value) triples, converted like launch
  // arguments.
  void replay(Graph& g, nb::handle updates) {
    if (g.st != st)
      invalid("replay of graph '" + g.name + "': the graph belongs to another session");
    if (g.released || g.handle.id == 0) {
      invalid("replay of graph '" + g.name +
              "': " + (g.released ? "the graph was released" : "its capture is still open"));
    }
    std::vector<vkad::GraphUpdate> u;
    if (!updates.is_none()) {
      const std::string what = "replay of graph '" + g.name + "': ";
      if (!nb::isinstance<nb::list>(updates) && !nb::isinstance<nb::tuple>(updates)) {
        invalid(what + "updates are a list of (launch, param, value) tuples, not " +
                nb::inst_name(updates).c_str());
      }
      size_t n = 0;
      for (nb::handle item : updates) {
        const std::string which = what + "update " + std::to_string(n++) + ": ";
        if (!nb::isinstance<nb::tuple>(item) || nb::len(item) != 3) {
          invalid(which + nb::repr(item).c_str() +
                  " is not a (launch, param, value) tuple (updates are a list of such tuples)");
        }
        auto t = nb::borrow<nb::tuple>(item);
        const uint32_t launch = update_launch(g, t[0], which),
                       param = update_index(t[1], which + "parameter");
        if (launch >= g.kernels.size()) {
          invalid("replay of graph '" + g.name + "': update of launch " + std::to_string(launch) +
                  "; the graph has " + std::to_string(g.kernels.size()) + " launches");
        }
        Kernel* k = g.kernels[launch];
        if (!k) {
          invalid("replay of graph '" + g.name + "': update of launch " + std::to_string(launch) +
                  ", made by a Session.loop that runs as one resident kernel or as its reworked "
                  "launches (Session.prepare_loop): its scalars are fixed (replace them through "
                  "an array, or capture the loop's launches one by one)");
        }
        if (param >= k->params.size() || k->params[param].array) {
          invalid("replay of graph '" + g.name + "', launch " + std::to_string(launch) + " ('" +
                  k->name + "'): parameter " + std::to_string(param) +
                  " is not a scalar parameter of the kernel");
        }
        u.push_back({launch, param, to_arg(*k, *st, param, t[2])});
      }
    }
    Locked l(*st);
    check(st->get().replay(g.handle, u));
  }

  // Makes the pipelines launch(kernel, *args) would use, launching nothing (GIL released
  // while the driver compiles them).
  void prepare(nb::handle kernel, nb::args args) {
    Kernel* k = kernel_for(kernel, args.size(), "prepare");
    std::vector<Arg> a(args.size());
    for (size_t i = 0; i < args.size(); ++i) a[i] = to_arg(*k, *st, i, args[i]);
    const KernelHandle h = k->handle;
    check(blocking(*st, [&](vkad::Session& s) { return s.prepare(h, a); }));
  }

  void flush() {
    check(blocking(*st, [](vkad::Session& s) { return s.flush(); }));
  }
  void synchronize() {
    check(blocking(*st, [](vkad::Session& s) { return s.synchronize(); }));
  }
  void release_idle_memory() {
    check(blocking(*st, [](vkad::Session& s) { return s.release_idle_memory(); }));
  }
  // Kernels' print lines to `fn(line)` (None: stdout), called when their launches retire, with
  // the GIL taken, inside whichever session call retired them: it must not call the session.
  void set_print_sink(nb::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr()))
      invalid("set_print_sink: a callable taking one str, or None");
    std::function<void(std::string_view)> sink;
    if (!fn.is_none()) {
      State* raw = st.get();  // outlives its session, which holds the sink
      sink = [raw](std::string_view line) {
        nb::gil_scoped_acquire gil;
        try {
          raw->print_sink(nb::str(line.data(), line.size()));
        } catch (nb::python_error& e) {
          e.discard_as_unraisable("vkad: the print sink");
        }
      };
    }
    Locked l(*st);
    st->print_sink = fn;
    st->get().set_print_sink(std::move(sink));
  }
  void begin_timeline(uint64_t max_events, uint32_t replay_sample) {
    check(blocking(*st,
                   [&](vkad::Session& s) { return s.begin_timeline(max_events, replay_sample); }));
  }
  vkad::Timeline end_timeline() {
    return take(blocking(*st, [](vkad::Session& s) { return s.end_timeline(); }));
  }
  void close() {
    nb::gil_scoped_release release;  // destruction waits for this session's work
    std::lock_guard<std::mutex> l(st->mu);
    st->drain_pending();
    if (st->session) st->session->set_print_sink(nullptr);  // stdout from here: no GIL held
    // DLPack consumers still hold its memory: the last one's deleter destroys it.
    if (st->exports > 0 && st->session) {
      st->closing = std::move(st->session);
      return;
    }
    st->session.reset();
    st->cuda.reset();
  }

  nb::dict stats() {
    Locked l(*st);
    vkad::SessionStats s = take(st->get().stats());
    nb::dict d;
    d["launches"] = s.launches;
    d["dispatches"] = s.dispatches;
    d["flushes"] = s.flushes;
    d["forced_waits"] = s.forced_waits;
    d["forced_wait_us"] = static_cast<uint64_t>(s.forced_wait_ms * 1e3);
    d["ndarrays"] = s.ndarrays;
    d["kernels_cached"] = s.kernels_cached;
    d["kernels_compiled"] = s.kernels_compiled;
    d["compile_cache_hits"] = s.compile_cache_hits;
    d["rolled_launches"] = s.rolled_launches;
    d["blocked_launches"] = s.blocked_launches;
    d["rolled_loops"] = s.rolled_loops;
    d["reworked_loops"] = s.reworked_loops;
    d["recomputed_launches"] = s.recomputed_launches;
    d["memory_block_bytes"] = s.memory_block_bytes;
    d["memory_used_bytes"] = s.memory_used_bytes;
    d["adstack_heap_bytes"] = s.adstack_heap_bytes;
    d["vulkan_objects_created"] = s.vulkan_objects_created;
    d["disk_cache_hits"] = s.disk_cache_hits;
    d["disk_cache_misses"] = s.disk_cache_misses;
    d["disk_cache_rebuilt"] = s.disk_cache_rebuilt;
    d["pipeline_cache_loaded"] = s.pipeline_cache_loaded ? 1 : 0;
    d["pipelines_created"] = s.pipelines_created;
    d["pipeline_create_us"] = static_cast<uint64_t>(s.pipeline_create_ms * 1e3);
    d["user_bytes"] = s.user_bytes;
    d["runtime_bytes"] = s.runtime_bytes;
    d["args_ring_bytes"] = s.args_ring_bytes;
    d["readback_ring_bytes"] = s.readback_ring_bytes;
    d["spare_block_bytes"] = s.spare_block_bytes;
    d["ndarray_pool_bytes"] = s.ndarray_pool_bytes;
    d["live_buffers"] = s.live_buffers;
    return d;
  }
  std::vector<std::string> validation_messages() {
    Locked l(*st);
    return st->get().runtime().device().validation_messages();
  }
  std::string device_name() { return st->get().device_name(); }
  std::string device_uuid() { return st->get().device_uuid(); }
  // What the device can do that changes what a kernel may use or how vkad lowers it.
  nb::dict capabilities() {
    const vkad::rhi::Capabilities& c = st->get().runtime().caps();
    nb::dict d;
    d["float64"] = c.shader_float64;
    d["int64"] = c.shader_int64;
    d["atomic_float32_add"] = c.atomic_float32_add;
    d["atomic_float64_add"] = c.atomic_float64_add && c.shader_float64;
    d["subgroup_size"] = c.subgroup_size;
    d["subgroup_arithmetic"] = c.subgroup_arithmetic;
    d["max_workgroup_invocations"] = c.max_workgroup_invocations;
    return d;
  }
};

// ------------------------------------------------------------------ bound launches

// Session.bind's result (docs/python.md, "Bound launches"): a launch with some arguments fixed. A
// step loop launches the same kernels with the same arrays thousands of times and only the step
// changes; calling a Bound converts only what changes and goes straight to the launch, where
// Session.launch converts every argument behind a Python call that builds the argument list.
struct Bound {
  nb::object session;  // the Python Session: keeps it (and `s`) alive
  Session* s = nullptr;
  nb::object kernel;  // as given to bind (a Kernel or a Differentiated)
  Kernel* k = nullptr;
  std::vector<Arg> args;           // per parameter (the free ones' filled per call, in a copy)
  std::vector<nb::object> values;  // per parameter: the bound Python value, None where free
  std::vector<uint32_t> free;      // the free parameters, in parameter order
  std::vector<NdArray*> arrays;    // the bound arrays (held by `values`), checked per call

  std::string free_names() const {
    std::string out;
    for (uint32_t i : free) out += (out.empty() ? "" : ", ") + k->params[i].name;
    return out.empty() ? "none" : out;
  }

  void call(nb::args rest) {
    if (rest.size() != free.size()) {
      invalid("launch '" + k->name + "' (bound): " + std::to_string(rest.size()) +
              " arguments given, the bound launch takes " + std::to_string(free.size()) + " (" +
              free_names() + ")");
    }
    for (NdArray* a : arrays) {
      if (a->free_deferred) a->check_live("launch '" + k->name + "' (bound)");
    }
    if (s->st->loop && s->st->loop->mine()) {  // Session.loop's body: traced, not run
      size_t r = 0;
      s->trace(kernel, k, [&](size_t i) { return values[i].is_none() ? rest[r++] : values[i]; });
      return;
    }
    // The bound arguments copied: another thread may call this Bound while this call runs
    // Python (the tape's hook), so nothing of it is written per call.
    Arg local[16];
    std::vector<Arg> heap;
    Arg* a = local;
    if (args.size() > std::size(local)) {
      heap.assign(args.begin(), args.end());
      a = heap.data();
    } else {
      std::copy(args.begin(), args.end(), local);
    }
    for (size_t i = 0; i < free.size(); ++i) a[free[i]] = to_arg(*k, *s->st, free[i], rest[i]);
    // A tape records the launch with its Python arguments (its backward launches the adjoint
    // with them): built only when one is recording this kernel.
    nb::object recorded;
    if (!s->st->tape.is_none() && !k->adjoint.is_none()) {
      nb::tuple t = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(values.size())));
      for (size_t i = 0, r = 0; i < values.size(); ++i) {
        nb::object v = values[i].is_none() ? nb::borrow(rest[r++]) : values[i];
        PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i), v.release().ptr());
      }
      recorded = std::move(t);
    }
    s->launch_converted(kernel, k, std::span<const Arg>(a, args.size()), recorded);
  }
};

nb::object Session::bind(nb::handle self, nb::handle kernel, nb::kwargs named) {
  {
    Locked l(*st);
    (void)st->get();  // a closed session binds nothing, as it launches nothing
  }
  Kernel* k = kernel_for(kernel, 0, "bind", /*check_count=*/false);
  auto* b = new Bound();
  nb::object out = nb::cast(b, nb::rv_policy::take_ownership);
  b->session = nb::borrow(self);
  b->s = this;
  b->kernel = nb::borrow(kernel);
  b->k = k;
  b->args.resize(k->params.size());
  b->values.assign(k->params.size(), nb::none());
  std::vector<bool> given(k->params.size(), false);
  for (auto [key, value] : named) {
    std::string name;
    if (!nb::try_cast<std::string>(key, name)) invalid("bind: parameter names are strings");
    auto it = std::find_if(k->params.begin(), k->params.end(),
                           [&](const ParamInfo& p) { return p.name == name; });
    if (it == k->params.end())
      invalid("bind '" + k->name + "': no parameter '" + name + "' (" + k->signature() + ")");
    const auto i = static_cast<size_t>(it - k->params.begin());
    b->args[i] = to_arg(*k, *st, i, value, "bind");
    b->values[i] = nb::borrow(value);
    given[i] = true;
    NdArray* a = nullptr;
    if (it->array && nb::try_cast<NdArray*>(value, a) && a) b->arrays.push_back(a);
  }
  for (uint32_t i = 0; i < k->params.size(); ++i) {
    if (!given[i]) b->free.push_back(i);
  }
  return out;
}

// vkad::devices() as a list of dicts (vkad/devices.py makes them Device records).
nb::list list_devices() {
  Result<std::vector<vkad::DeviceInfo>> list = [] {
    nb::gil_scoped_release unlocked;  // the first call creates the Vulkan instance
    return vkad::devices();
  }();
  nb::list out;
  for (const vkad::DeviceInfo& d : take(std::move(list))) {
    nb::dict e;
    e["index"] = d.index;
    e["name"] = d.name;
    e["kind"] = d.kind;
    e["cpu"] = d.cpu;
    e["uuid"] = d.uuid;
    e["driver_name"] = d.driver_name;
    e["driver_info"] = d.driver_info;
    e["vendor_id"] = d.vendor_id;
    e["device_id"] = d.device_id;
    e["api_version"] = std::to_string(d.api_version >> 22) + "." +
                       std::to_string((d.api_version >> 12) & 0x3ff) + "." +
                       std::to_string(d.api_version & 0xfff);
    e["usable"] = d.usable;
    e["unusable"] = d.unusable;
    e["automatic"] = d.automatic;
    out.append(e);
  }
  return out;
}

// The error classes, the device list and DType (NB_MODULE, in parts of a screen each).
void bind_errors_and_types(nb::module_& m) {
  // The exception classes live in vkad/errors.py (typed, documented); vkad/__init__.py hands
  // them over here: the base class, and {error_code_name(code): class}. Until then (and for a
  // code without a class) errors are RuntimeErrors.
  m.def("_set_errors", [](nb::handle base, nb::dict by_name) {
    g_error = nb::borrow(base).release().ptr();  // kept for the life of the process
    for (int c = 1; c < kCodes; ++c) {
      const char* name = vkad::error_code_name(static_cast<ErrorCode>(c));
      g_errors[c] = by_name.contains(name) ? nb::borrow(by_name[name]).release().ptr() : g_error;
    }
  });

  m.def(
      "_devices", &list_devices, nb::sig("def _devices() -> list[dict[str, int | str | bool]]"),
      "vkad::devices(): every Vulkan device, in the order of the indices Session(device=) takes.");

  nb::enum_<DType>(m, "DType", "Element and scalar types.")
      .value("f32", DType::kF32)
      .value("f64", DType::kF64)
      .value("i32", DType::kI32)
      .value("u32", DType::kU32)
      .value("i64", DType::kI64)
      .value("bool", DType::kBool);
}

// vkad.NdArray.
void bind_ndarray(nb::module_& m) {
  nb::class_<NdArray>(m, "NdArray", nb::is_weak_referenceable(),
                      "A device array owned by a Session; freed when collected.")
      .def_prop_ro("shape",
                   [](const NdArray& a) {
                     nb::list l;
                     for (uint32_t e : a.shape) l.append(e);
                     return nb::tuple(l);
                   })
      .def_prop_ro("dtype", [](const NdArray& a) { return a.dtype; })
      .def_prop_ro("name", [](const NdArray& a) { return a.name; })
      .def_prop_ro("size", &NdArray::size)
      .def_prop_ro("nbytes", &NdArray::nbytes)
      .def_prop_ro("handle", [](const NdArray& a) { return a.handle.id; })
      .def_prop_ro(
          "freed", [](const NdArray& a) { return a.freed; }, "Whether Session.free released it.")
      .def_prop_rw(
          "grad", [](const NdArray& a) { return a.grad; },
          [](NdArray& a, nb::object g) {
            if (!g.is_none()) {
              NdArray* ga = nullptr;
              if (!nb::try_cast<NdArray*>(g, ga) || !ga) {
                invalid("NdArray.grad of " + a.label() + ": expected a vkad ndarray or None, got " +
                        nb::type_name(g.type()).c_str());
              }
              if (ga == &a) invalid("NdArray.grad: " + a.label() + " cannot be its own gradient");
              if (ga->st != a.st) {
                invalid("NdArray.grad of " + a.label() + ": " + ga->label() +
                        " belongs to another session");
              }
              if (ga->dtype != a.dtype || ga->shape != a.shape) {
                invalid("NdArray.grad: the gradient " + ga->label() + " is " + tname(ga->dtype) +
                        " of shape " + shape_string(ga->shape) + ", " + a.label() + " is " +
                        tname(a.dtype) + " of shape " + shape_string(a.shape) +
                        "; a gradient has its array's dtype and shape");
              }
            }
            a.grad = std::move(g);
          },
          nb::arg("grad").none(),
          "The caller's gradient array (same dtype and shape), which a Tape uses; None when "
          "unset (the tape then keeps its own).")
      .def("numpy", &download, nb::sig("def numpy(self) -> numpy.typing.NDArray"),
           "Waits for the array's last writer (GIL released) and returns a new numpy array.")
      .def("upload", &upload, "array"_a,
           "Copies a numpy array of the same dtype and shape in (recorded, no wait).")
      .def("__dlpack__", &ndarray_dlpack, "stream"_a.none() = nb::none(),
           "max_version"_a.none() = nb::none(), "dl_device"_a.none() = nb::none(),
           "copy"_a.none() = nb::none(),
           nb::sig("def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, "
                   "int] | None = None, dl_device: tuple[int, int] | None = None, copy: bool | "
                   "None = None) -> object"),
           "A DLPack capsule viewing the array's memory (no copy): kDLCPU on host-visible "
           "devices (after a host wait for the array's last vkad use), kDLCUDA on NVIDIA GPUs "
           "(the consumer's `stream` waits for it on the GPU). The array lives while the "
           "consumer holds it. docs/interop.md.")
      .def("__dlpack_device__", &ndarray_dlpack_device,
           nb::sig("def __dlpack_device__(self) -> tuple[int, int]"),
           "(1, 0) for a host-visible array (kDLCPU), (2, ordinal) for CUDA (kDLCUDA).")
      .def_prop_ro("_dlpack_exports", [](const NdArray& a) { return a.exports; })
      .def("__repr__", [](const NdArray& a) {
        return "vkad.NdArray(" + (a.name.empty() ? "" : "'" + a.name + "', ") +
               std::string(tname(a.dtype)) + ", shape " + shape_string(a.shape) +
               (a.freed ? ", freed" : "") + ")";
      });
}

// vkad.Graph and the loop index a Session.loop body sees.
void bind_graph_and_loop_index(nb::module_& m) {
  nb::class_<Graph>(m, "Graph", "A captured launch sequence (Session.capture).")
      .def_prop_ro("name", [](const Graph& g) { return g.name; })
      .def_prop_ro("launches", [](const Graph& g) { return g.kernels.size(); })
      .def_prop_ro(
          "launch_names",
          [](const Graph& g) {
            nb::list out;
            for (const std::optional<std::string>& n : launch_names(g))
              out.append(n ? nb::object(nb::str(n->c_str())) : nb::none());
            return out;
          },
          nb::sig("def launch_names(self) -> list[str | None]"),
          "A unique name for each captured launch, by the index replay updates take (capture "
          "order: a tape's backward adds its adjoints, '<kernel>_adjoint', last launch first): "
          "the kernel's name, '#k' appended to its k-th repeat ('step', 'step#1', ...); None "
          "for a Session.loop's rolled launch. A replay update may name its launch by it: "
          "g.replay([('step_adjoint#2', 0, 0.5)]). vkad::Session::graph_launch_names in C++.")
      .def(
          "release",
          [](Graph& g) {
            if (g.released || g.handle.id == 0) return;
            Locked l(*g.st);
            check(g.st->get().release_graph(g.handle));
            g.released = true;
          },
          "Drops the graph now (otherwise when collected).")
      .def("__repr__", [](const Graph& g) {
        return "vkad.Graph('" + g.name + "', " + std::to_string(g.kernels.size()) + " launches" +
               (g.released ? ", released" : "") + ")";
      });

  // Session.loop's symbolic index (docs/graphs.md, "Step loops").
  auto symbolic = [](const LoopIndex& t) -> nb::object {
    invalid("Session.loop: " + t.repr() +
            " is symbolic (the body is traced once): pass it, plus or minus an int, to a "
            "kernel's i32 scalar; a value that depends on it otherwise (int(t), t * 2, an if "
            "on it) is not traced -- compute it in the kernel from t");
  };
  nb::class_<LoopIndex>(m, "LoopIndex",
                        "Session.loop's step inside its body: symbolic, t + an int offset.")
      .def("__add__", [](const LoopIndex& t, int64_t c) { return LoopIndex{t.offset + c}; })
      .def("__radd__", [](const LoopIndex& t, int64_t c) { return LoopIndex{t.offset + c}; })
      .def("__sub__", [](const LoopIndex& t, int64_t c) { return LoopIndex{t.offset - c}; })
      .def_prop_ro("offset", [](const LoopIndex& t) { return t.offset; })
      .def("__mul__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__rmul__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__rsub__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__floordiv__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__truediv__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__mod__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__eq__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__ne__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__lt__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__le__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__gt__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__ge__", [symbolic](const LoopIndex& t, nb::handle) { return symbolic(t); })
      .def("__neg__", symbolic)
      .def("__index__", symbolic)
      .def("__int__", symbolic)
      .def("__float__", symbolic)
      .def("__bool__", symbolic)
      .def("__repr__", &LoopIndex::repr);
}

// A tape's record of a Session.loop, and Session.bind's BoundLaunch.
void bind_loop_record_and_bound(nb::module_& m) {
  nb::class_<LoopRecord>(m, "LoopRecord",
                         "A Session.loop as a tape recorded it (an entry of Tape.launches).")
      .def_prop_ro("count", [](const LoopRecord& r) { return r.count; })
      .def_prop_ro("start", [](const LoopRecord& r) { return r.start; })
      .def_prop_ro(
          "body",
          [](const LoopRecord& r) {
            nb::list out;
            for (const LoopEntry& e : r.entries) out.append(nb::make_tuple(e.kernel, e.values));
            return out;
          },
          "(kernel, args) of each recorded launch of the body, args as in its first "
          "iteration")
      .def("__repr__", [](const LoopRecord& r) {
        return "vkad.LoopRecord(" + std::to_string(r.entries.size()) + " launches x " +
               std::to_string(r.count) + " iterations from t = " + std::to_string(r.start) + ")";
      });

  nb::class_<Bound>(m, "BoundLaunch", "A kernel with some arguments fixed (Session.bind).")
      .def("__call__", &Bound::call, "args"_a,
           nb::sig("def __call__(self, *args: NdArray | int | float | bool) -> None"),
           "Launches the kernel with the fixed arguments and these (the free parameters, in "
           "order).")
      .def_prop_ro("kernel", [](const Bound& b) { return b.kernel; })
      .def_prop_ro("free_params",
                   [](const Bound& b) {
                     std::vector<std::string> out;
                     for (uint32_t i : b.free) out.push_back(b.k->params[i].name);
                     return out;
                   })
      .def("__repr__", [](const Bound& b) {
        return "vkad.BoundLaunch('" + b.k->name + "', free: " + b.free_names() + ")";
      });
}

// vkad.Kernel.
void bind_kernel(nb::module_& m) {
  nb::class_<Kernel>(m, "Kernel", "A compiled kernel; released when collected.")
      .def_prop_ro("name", [](const Kernel& k) { return k.name; })
      .def_prop_ro("param_names",
                   [](const Kernel& k) {
                     std::vector<std::string> out;
                     for (const ParamInfo& p : k.params) out.push_back(p.name);
                     return out;
                   })
      .def_prop_ro(
          "params",
          [](const Kernel& k) {
            // (name, dtype, rank): rank 0 for a scalar.
            nb::list out;
            for (const ParamInfo& p : k.params) out.append(nb::make_tuple(p.name, p.dtype, p.rank));
            return out;
          },
          "(name, dtype, rank) per parameter; rank 0 for a scalar.")
      .def_prop_ro(
          "_array_params",
          [](const Kernel& k) {
            nb::list out;
            for (size_t i = 0; i < k.params.size(); ++i) {
              if (k.params[i].array) out.append(i);
            }
            return out;
          },
          "Indices of the ndarray parameters (rank 0 ones included).")
      .def_prop_ro(
          "_written_params",
          [](const Kernel& k) {
            nb::list out;
            if (!k.access) return out;
            for (const vkad::codegen::ParamAccess& pa : k.access->params) {
              bool writes = false;
              for (const vkad::codegen::ArrayAccess& a : pa.accesses) {
                writes = writes || a.kind != vkad::codegen::ArrayAccess::Kind::kRead;
              }
              if (writes) out.append(pa.param);
            }
            return out;
          },
          "Indices of the ndarray parameters the kernel writes (differentiated kernels).")
      .def_prop_ro(
          "adjoint", [](const Kernel& k) { return k.adjoint; },
          nb::sig("def adjoint(self) -> Kernel | None"),
          "The adjoint of a kernel from differentiate(), else None.")
      .def_prop_ro(
          "gradients",
          [](const Kernel& k) {
            nb::list out;
            for (const auto& [p, name] : k.gradients) out.append(nb::make_tuple(p, name));
            return out;
          },
          "(forward parameter index, gradient name) per differentiated parameter.")
      .def_prop_ro("signature", &Kernel::signature)
      .def("__repr__", [](const Kernel& k) { return "vkad.Kernel(" + k.signature() + ")"; });
}

// The tape's hazard record and Session.differentiate's result.
void bind_tape_hazards_and_differentiated(nb::module_& m) {
  nb::class_<TapeHazards>(m, "_TapeHazards",
                          "What a Tape's recording read and wrote (vkad::TapeHazards): launch "
                          "refuses a launch that overwrites it.")
      .def(nb::init<>())
      .def("reset",
           [](TapeHazards& h) {
             h.hazards.reset();
             h.broken.clear();
           })
      .def_prop_ro("broken", [](const TapeHazards& h) { return h.broken; })
      .def_prop_ro("launches", [](const TapeHazards& h) { return h.hazards.launches(); });
  nb::class_<Differentiated>(m, "Differentiated",
                             "A forward kernel and its adjoint (Session.differentiate).")
      .def_ro("forward", &Differentiated::forward, nb::sig("def forward(self) -> Kernel"))
      .def_ro("adjoint", &Differentiated::adjoint, nb::sig("def adjoint(self) -> Kernel"))
      .def_prop_ro(
          "gradients",
          [](const Differentiated& d) {
            // {forward parameter name: gradient parameter name}
            const Kernel& k = nb::cast<const Kernel&>(d.forward);
            nb::dict out;
            for (const auto& [p, name] : k.gradients) out[nb::str(k.params[p].name.c_str())] = name;
            return out;
          },
          "{forward parameter name: gradient parameter name} of the adjoint.");
}

// vkad.Session: creation, kernels, arrays (first half; the class object for the second).
nb::class_<Session> bind_session_kernels_and_arrays(nb::module_& m) {
  static_assert(vkad::runtime::kDefaultRetirementDepth == 3, "the signature below says 3");
  return nb::class_<Session>(m, "Session", "A device, its kernels and ndarrays (vkad::Session).")
      .def(nb::init<nb::handle, bool, size_t, uint32_t, std::optional<std::string>, bool, bool>(),
           "device"_a = nb::none(), "validation"_a = false,
           "retirement_depth"_a = vkad::runtime::kDefaultRetirementDepth,
           "spare_memory_blocks"_a = 1, "cache_dir"_a = nb::none(), "specialize_shapes"_a = true,
           "check_finite"_a = false,
           nb::sig("def __init__(self, device: int | str | None = None, validation: bool = False, "
                   "retirement_depth: int = 3, spare_memory_blocks: int = 1, "
                   "cache_dir: str | None = None, specialize_shapes: bool = True, "
                   "check_finite: bool = False) -> None"),
           "cache_dir: the on-disk kernel and pipeline caches' directory; None = automatic "
           "(VKAD_CACHE=0 turns them off, else VKAD_CACHE_DIR, else $XDG_CACHE_HOME/vkad, else "
           "~/.cache/vkad), \"\" = off. specialize_shapes: besides its generic pipeline, each "
           "kernel gets one per set of array shapes it is launched with (made on a thread while "
           "the first launch runs the generic one; up to 8 per task), its extents constants "
           "(docs/caches.md, 'Kernels specialized to their shapes'); VKAD_SPECIALIZE_SHAPES=0 "
           "turns it off for every session. check_finite: every float value a kernel (forward "
           "or adjoint) stores into an array is checked; the first NaN or infinity is a "
           "vkad.DeviceError naming the kernel and the statement (docs/debugging.md; also "
           "VKAD_CHECK_FINITE=1).")
      .def_prop_ro("device_name", &Session::device_name)
      .def_prop_ro("device_uuid", &Session::device_uuid,
                   "The device's UUID, as vkad.devices() lists it (on NVIDIA the CUDA UUID).")
      .def_prop_ro("capabilities", &Session::capabilities,
                   nb::sig("def capabilities(self) -> dict[str, bool | int]"),
                   "What the device offers kernels: float64, int64, atomic_float32_add / "
                   "atomic_float64_add (hardware float atomic adds: without them vkad adds by "
                   "compare-and-swap), subgroup_size, "
                   "subgroup_arithmetic, max_workgroup_invocations.")
      .def("compile", &Session::compile, "ir"_a, "elements"_a = Elements{},
           nb::sig("def compile(self, ir: str, elements: collections.abc.Sequence["
                   "collections.abc.Sequence[int]] = []) -> Kernel"),
           "Compiles a kernel from the IR text form. `elements`: per parameter, the extents "
           "its array's trailing axes must have at a launch (a KernelBuilder's element shapes).")
      .def("jvp", &Session::jvp, "ir"_a, "elements"_a = Elements{},
           nb::sig("def jvp(self, ir: str, elements: collections.abc.Sequence["
                   "collections.abc.Sequence[int]] = []) -> Kernel"),
           "Compiles the forward-mode (tangent) kernel of a kernel (IR text): its parameters, "
           "then '<name>_dot' per grad parameter (autodiff/forward_mode.h); `elements` as for "
           "compile.")
      .def("differentiate", &Session::differentiate, "ir"_a, "elements"_a = Elements{},
           nb::sig("def differentiate(self, ir: str, elements: collections.abc.Sequence["
                   "collections.abc.Sequence[int]] = []) -> Differentiated"),
           "Compiles a kernel (IR text) and its adjoint; `elements` as for compile (the "
           "adjoint's gradient parameters take their array's).")
      .def("release", &Session::release, "kernel"_a)
      .def("empty", &Session::empty, "shape"_a, "dtype"_a, "name"_a = "",
           nb::sig("def empty(self, shape: int | collections.abc.Sequence[int], dtype: DType, "
                   "name: str = '') -> NdArray"),
           "A new device array (contents undefined until written).")
      .def(
          "_empty_pooled",
          [](Session& s, nb::handle shape, DType dtype, const std::string& name) {
            return s.make_empty(shape, dtype, name, true);
          },
          "shape"_a, "dtype"_a, "name"_a = "",
          "empty() for a tape's gradients: freed into the runtime's ndarray pool and reused by "
          "the next tape's (Runtime::create_ndarray's `pooled`).")
      .def("_from_dlpack_capsule", &Session::from_dlpack_capsule, "capsule"_a, "name"_a = "")
      .def(
          "_owns", [](const Session& s, const NdArray& a) { return a.st == s.st; }, "array"_a,
          "Whether `array` is one of this session's arrays.")
      .def("interop_info", &Session::interop_info,
           nb::sig("def interop_info(self) -> dict[str, object]"),
           "What DLPack exchange can use on this device: exportable memory and semaphore, "
           "CUDA (and why not), mapped blocks, live exports.")
      .def(
          "_from_numpy", &Session::from_numpy, "array"_a, "name"_a = "",
          nb::sig("def _from_numpy(self, array: numpy.typing.NDArray, name: str = '') -> NdArray"));
}

// vkad.Session: launches, tapes, synchronisation, loops, graphs.
// vkad::Timeline (runtime/timeline.h): what Session.end_timeline returns.
void bind_timeline(nb::module_& m) {
  nb::class_<vkad::Timeline>(m, "Timeline",
                             "Device and host events recorded between Session.begin_timeline "
                             "and end_timeline (docs/debugging.md).")
      .def_prop_ro(
          "events",
          [](const vkad::Timeline& t) {
            nb::list out;
            for (const vkad::TimelineEvent& e : t.events) {
              nb::dict d;
              d["name"] = e.name;
              d["category"] = e.category;
              d["gpu"] = e.gpu;
              d["launch"] = e.launch;
              d["graph"] = e.graph;
              d["begin_us"] = e.begin_us;
              d["end_us"] = e.end_us;
              out.append(d);
            }
            return out;
          },
          nb::sig("def events(self) -> list[dict[str, str | bool | int | float]]"),
          "Each event as a dict: name, category, gpu, launch, graph, begin_us, end_us "
          "(microseconds since begin_timeline on the host's clock). Device events first, in "
          "recording order, then host spans.")
      .def_ro("dropped", &vkad::Timeline::dropped, "Events past max_events, not kept.")
      .def_ro("replay_sample", &vkad::Timeline::replay_sample,
              "A graph's first replay and every replay_sample-th were timed launch by launch.")
      .def_ro("replays_timed", &vkad::Timeline::replays_timed,
              "Graph replays timed launch by launch.")
      .def_ro("replays_spanned", &vkad::Timeline::replays_spanned,
              "Graph replays timed as one event (category 'replay').")
      .def_ro("spanned_launches", &vkad::Timeline::spanned_launches,
              "The launches of those replays (not events of their own).")
      .def_ro("gpu_timestamps", &vkad::Timeline::gpu_timestamps,
              "False when the device has no timestamp queries (host spans only).")
      .def_ro("device", &vkad::Timeline::device)
      .def_ro("note", &vkad::Timeline::note)
      .def_ro("clock_uncertainty_us", &vkad::Timeline::clock_uncertainty_us,
              "How far device events may sit from the host clock (durations are exact).")
      .def("chrome_trace_json", &vkad::Timeline::chrome_trace_json)
      .def(
          "save",
          [](const vkad::Timeline& t, const std::string& path) {
            check(t.write_chrome_trace(path));
          },
          "path"_a, "Writes the Chrome trace / Perfetto JSON file.")
      .def("summary", &vkad::Timeline::summary,
           "A table of device time per name: count, total, mean, share.")
      .def(
          "kernels",
          [](const vkad::Timeline& t) {
            nb::list out;
            for (const vkad::TimelineKernelSummary& k : t.summarize()) {
              nb::dict d;
              d["name"] = k.name;
              d["count"] = k.count;
              d["total_us"] = k.total_us;
              d["mean_us"] = k.mean_us;
              d["share"] = k.share;
              out.append(d);
            }
            return out;
          },
          nb::sig("def kernels(self) -> list[dict[str, str | int | float]]"),
          "summary() as data: device time per name, largest total first.");
}

// Session's debugging calls (docs/debugging.md).
void bind_session_debugging(nb::class_<Session>& cls) {
  cls.def("set_print_sink", &Session::set_print_sink, "fn"_a.none(),
          nb::sig("def set_print_sink(self, fn: typing.Callable[[str], object] | None) -> None"),
          "Where kernels' print lines go (docs/debugging.md): fn(line) per line, called when "
          "the launch retires, inside the session call that retired it (it must not call the "
          "session); None: stdout.");
  cls.def("begin_timeline", &Session::begin_timeline,
          "max_events"_a = vkad::runtime::kTimelineMaxEvents,
          "replay_sample"_a = vkad::runtime::kTimelineReplaySample,
          "Starts a timeline (docs/debugging.md): every launch, fill, copy and upload until "
          "end_timeline() is timed on the device -- of a graph's replays, the first and every "
          "replay_sample-th after it launch by launch, the others as one event each (1: every "
          "replay). Waits for the device once. vkad.profile() is the context manager around "
          "it.")
      .def("end_timeline", &Session::end_timeline,
           "Waits for the device and returns the Timeline recorded since begin_timeline().");
}

void bind_session_launches_and_graphs(nb::class_<Session>& cls) {
  cls.def("free", &Session::free, "array"_a, nb::sig("def free(self, array: NdArray) -> None"))
      .def("zero", &Session::zero, "array"_a, nb::sig("def zero(self, array: NdArray) -> None"))
      .def("zero_many", &Session::zero_many, "arrays"_a,
           nb::sig("def zero_many(self, arrays: collections.abc.Iterable[NdArray]) -> None"),
           "Zeroes every array with one barrier pair (recorded, no wait); checks them all first.")
      .def("fill", &Session::fill, "array"_a, "value"_a,
           nb::sig("def fill(self, array: NdArray, value: float) -> None"))
      .def("launch", &Session::launch, "kernel"_a, "args"_a,
           nb::sig("def launch(self, kernel: Kernel | Differentiated, "
                   "*args: NdArray | int | float | bool) -> None"),
           "Records a launch (asynchronous). Scalars are converted to the parameter's dtype.")
      .def(
          "bind",
          [](nb::handle self, nb::handle kernel, nb::kwargs named) {
            return nb::cast<Session&>(self).bind(self, kernel, std::move(named));
          },
          "kernel"_a, "args"_a,
          nb::sig("def bind(self, kernel: Kernel | Differentiated, "
                  "**args: NdArray | int | float | bool) -> BoundLaunch"),
          "The kernel with the arguments named here fixed (checked now): calling the result "
          "with the others, positionally in parameter order, launches it as launch() would "
          "(taped, captured), converting only those. docs/python.md, 'Bound launches'.")
      .def("_launch_adjoints", &Session::launch_adjoints, "launches"_a, "grads"_a,
           nb::sig("def _launch_adjoints(self, launches: list[tuple[Kernel | Differentiated, "
                   "tuple[NdArray | int | float | bool, ...]]], grads: dict[int, NdArray]) "
                   "-> None"),
           "Tape.backward's loop: the adjoints of the recorded launches, last first.")
      .def("_tape_differentiated", &Session::tape_differentiated, "launches"_a,
           nb::sig("def _tape_differentiated(self, launches: list[tuple[Kernel | Differentiated, "
                   "tuple[NdArray | int | float | bool, ...]]]) -> dict[int, NdArray]"),
           "Tape.backward's first pass: each recorded launch's differentiated arrays, by handle.")
      .def("prepare", &Session::prepare, "kernel"_a, "args"_a,
           nb::sig("def prepare(self, kernel: Kernel | Differentiated, "
                   "*args: NdArray | int | float | bool) -> None"),
           "Makes the pipelines a launch with these arguments uses (specialized variants "
           "included), launching nothing; blocks while the driver compiles them.")
      .def("flush", &Session::flush)
      .def("synchronize", &Session::synchronize,
           "Waits for everything submitted (GIL released); raises device errors.")
      .def("close", &Session::close, "Waits for this session's work and frees the device.")
      .def("stats", &Session::stats, nb::sig("def stats(self) -> dict[str, int]"))
      .def("release_idle_memory", &Session::release_idle_memory,
           "Waits like synchronize(), then returns the runtime's idle memory (rings, adstack "
           "heaps, spare memory blocks) to the driver; arrays, kernels and graphs are kept. "
           "stats() tells the user's memory (user_bytes) from the runtime's (runtime_bytes).")
      .def("validation_messages", &Session::validation_messages)
      .def(
          "_set_tape",
          [](Session& s, nb::object tape, nb::object hazards, nb::object before_launch) {
            s.st->tape = std::move(tape);
            s.st->hazards = std::move(hazards);
            s.st->before_launch = std::move(before_launch);
          },
          "tape"_a.none(), "hazards"_a.none() = nb::none(), "before_launch"_a.none() = nb::none())
      .def("copy", &Session::copy, "src"_a, "dst"_a,
           nb::sig("def copy(self, src: NdArray, dst: NdArray) -> None"),
           "Copies src into dst (same dtype and shape) on the device; asynchronous.")
      .def("_clearing_adjoint", &Session::clearing_adjoint, "forward"_a)
      .def("_loop_begin", &Session::loop_begin, "start"_a)
      .def("_loop_end", &Session::loop_end, "count"_a)
      .def("_loop_abort", &Session::loop_abort)
      .def("_loop_prepare", &Session::loop_prepare, "count"_a)
      .def("_begin_capture", &Session::begin_capture, "name"_a, "background"_a = false,
           "run"_a = false)
      .def("finish_rework", &Session::finish_rework, "graph"_a,
           "Waits for the graph's background rework (capture(background=True)) and installs "
           "it: replays run the reworked graph from now on. Nothing for other graphs.")
      .def("_end_capture", &Session::end_capture)
      .def("replay", &Session::replay, "graph"_a, "updates"_a = nb::none(),
           nb::sig("def replay(self, graph: Graph, updates: list[tuple[int, int, int | float | "
                   "bool]] | None = None) -> None"),
           "Runs a captured graph (asynchronous). updates: (launch index, parameter index, "
           "value) triples replacing scalar arguments, kept for later replays.");
}

}  // namespace

NB_MODULE(_vkad, m) {
  m.doc() = "vkad's native binding; use the vkad package, which wraps and re-exports it.";
  Py_AtExit([] { g_interpreter_gone.store(true); });  // release_export's guard
  m.attr("__version__") = VKAD_VERSION_STRING;        // from the file VERSION (vkad_version.h)

  bind_errors_and_types(m);
  bind_ndarray(m);
  bind_graph_and_loop_index(m);
  bind_loop_record_and_bound(m);
  bind_kernel(m);
  bind_tape_hazards_and_differentiated(m);
  bind_timeline(m);
  nb::class_<Session> cls = bind_session_kernels_and_arrays(m);
  bind_session_launches_and_graphs(cls);
  bind_session_debugging(cls);
}
