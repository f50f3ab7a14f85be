// Declares what vkad._vkad's sources share: errors, state, bound objects, Session, bind functions.
//
// vkad._vkad: the nanobind binding of vkad's front door (api/session.h) for the Python package
// (python/vkad). It stays thin: kernels come in as IR text (the Python builder prints it), the
// dtype/shape conveniences live in Python, and vkad.Tape is a Python class over vkad._Tape, this
// binding's vkad::Tape (tape.cpp): a launch inside `with t:`, a Session.loop on it, backward,
// checkpointing and scalar gradients are vkad::Tape's, so the front doors share one tape and
// its messages. What lives here is what must be fast or must touch memory: launch (arguments
// converted against the kernel's parameters), numpy upload and download (one copy at most), and the
// locking that lets blocking waits release the GIL.
//
// Threads: a vkad::Session is externally synchronised. Every Session call takes the session's
// mutex; a blocking call (download, synchronize, flush, compile, close) releases the GIL first,
// so other Python threads run while it waits. A non-blocking call tries the mutex while holding
// the GIL and releases the GIL only when it has to wait for it (no deadlock: the mutex holder
// never needs the GIL while holding the mutex).
//
// Errors: every vkad Status that is not ok is raised as the vkad.Error subclass of its code,
// carrying vkad's message. Python-side misuse (a wrong argument count or type) raises
// InvalidArgumentError with a message naming the kernel, the argument and what was expected.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "api/tape.h"
#include "cuda_interop.h"
#include "dlpack.h"
#include "ir/launch_access.h"
#include "runtime/interop.h"
#include "runtime/runtime.h"
#include "vkad.h"

namespace nb = nanobind;

namespace vkad_py {

using vkad::Arg;
using vkad::DType;
using vkad::ErrorCode;
using vkad::KernelHandle;
using vkad::NdArrayHandle;
using vkad::Result;
using vkad::Status;
using vkad::runtime::ParamKind;

// ------------------------------------------------------------------ errors (module.cpp)

constexpr int kCodes = static_cast<int>(ErrorCode::kInternal) + 1;
extern PyObject* g_error;           // vkad.Error once registered
extern PyObject* g_errors[kCodes];  // one subclass per ErrorCode (index 0 unused)

// Raises `s` as the vkad.Error subclass of its code (a RuntimeError before _set_errors).
[[noreturn]] void raise(const Status& s);
// Raises InvalidArgumentError with `message`.
[[noreturn]] void invalid(const std::string& message);
inline void check(const Status& s) {
  if (!s.ok()) raise(s);
}
template <typename T>
T take(Result<T> r) {
  if (!r.ok()) raise(r.status());
  return std::move(r).value();
}

// ------------------------------------------------------------------ session state

struct Kernel;
struct Tape;

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
  // vkad::Tapes whose Python objects died while another thread held `mu`: destroyed (their
  // gradients freed) by the next call.
  std::vector<std::unique_ptr<vkad::Tape>> pending_tapes;
  // Every live _Tape of the session (under pending_mu): close() destroys their vkad::Tapes
  // before the session.
  std::vector<Tape*> tapes;
  // The tape recording (inside `with t:`; Session.launch and Session.loop record on it) and
  // its Python object, held while it records; null / None otherwise.
  Tape* recording = nullptr;
  nb::object recording_obj = nb::none();
  // The live arrays with `array.grad` set, by handle id (changed with the GIL held): a tape's
  // backward gives their gradients to its vkad::Tape (Tape::set_grad).
  std::unordered_map<uint64_t, struct NdArray*> with_grad;
  // The graph being captured (a Graph) or None: launches append their kernel to it.
  nb::object capture = nb::none();
  // Session.loop's body is running: launches are traced, everything else is refused.
  std::unique_ptr<LoopTrace> loop;
  // The tapes' checks of step loops recorded first in a recording (vkad::TapeLoopChecks),
  // filled by Session.prepare_loop and the tapes' loops, shared by every tape of the session.
  std::shared_ptr<vkad::TapeLoopChecks> loop_checks = std::make_shared<vkad::TapeLoopChecks>();
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
      for (NdArrayHandle h : pending_views) session->runtime().interop().release_host_view(h);
      for (NdArrayHandle h : pending_arrays) (void)session->free(h);
      for (KernelHandle k : pending_kernels) (void)session->release(k);
    }
    pending_tapes.clear();  // their gradients freed while the session lives (close drains first)
    pending_views.clear();
    pending_arrays.clear();
    pending_kernels.clear();
  }
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (session) session->set_print_sink(nullptr);  // no Python from a destructor
    pending_tapes.clear();                          // (no _Tape lives: each holds this State)
    session.reset();                                // frees its blocks through `cuda`'s hook first
    closing.reset();
    cuda.reset();
  }
};
using StatePtr = std::shared_ptr<State>;

// Inside Session.loop's body only launches are traced: anything else would run once, at the
// trace, where the loop means it per iteration (or would wait on launches not yet made).
[[noreturn]] void outside_loop();

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

inline const char* tname(DType t) { return vkad::runtime::dtype_name(t); }

// "(2, 3)", "(4,)": a shape as Python writes a tuple.
std::string shape_string(const std::vector<uint32_t>& shape);

// ------------------------------------------------------------------ ndarrays (ndarray.cpp)

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
  // A gradient a tape owns, viewed (Tape.grad): `owner` (the _Tape) is kept alive by it, and
  // frees it; this object never does.
  nb::object owner = nb::none();

  NdArray() = default;
  NdArray(const NdArray&) = delete;
  NdArray& operator=(const NdArray&) = delete;
  ~NdArray() {
    // Garbage collection frees the device array (after its in-flight launches, as
    // Session::free does). If another thread is inside the session, the next call frees it.
    if (st && !grad.is_none()) st->with_grad.erase(handle.id);
    if ((freed && !free_deferred) || !st || !owner.is_none()) return;
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

// The vkad dtype of a DLPack description nanobind reports; false where vkad holds none.
bool dtype_of(const nb::dlpack::dtype& d, DType* out);

using HostArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

// A new device array of the session (contents undefined) as a Python NdArray.
nb::object new_array(const StatePtr& st, std::vector<uint32_t> shape, DType dtype,
                     const std::string& name);

// ------------------------------------------------------------------ DLPack (interop.cpp)

// Set by a Py_AtExit callback (registered at import), which runs at the very end of
// Py_FinalizeEx: past it no Python object may be touched.
extern std::atomic<bool> g_interpreter_gone;

// NdArray.__dlpack__ and NdArray.__dlpack_device__ (docs/interop.md).
nb::object ndarray_dlpack(nb::handle self, nb::handle stream, nb::handle max_version,
                          nb::handle dl_device, nb::handle copy);
nb::tuple ndarray_dlpack_device(NdArray& a);

// ------------------------------------------------------------------ kernels and graphs

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
  // What it reads and writes (Session::launch_access), which the loop's prepare needs.
  std::shared_ptr<const vkad::codegen::KernelAccess> access;
  // The forward kernel's vkad::Differentiated (handles, parameter count, gradients): what
  // vkad::Tape records a launch of it as.
  std::shared_ptr<const vkad::Differentiated> diff;

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
  // k null: a Session.loop's rolled launch or a checkpointing tape's copy (no Python kernel;
  // no scalars to update).
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

// Per parameter, a KernelBuilder's element shape (empty: none given, IR text).
using Elements = std::vector<std::vector<uint32_t>>;

struct Differentiated {
  nb::object forward, adjoint;  // Kernels
};

// Leaves a tuple of vkad objects and numbers out of the cyclic GC (launch.cpp: why a tape's
// records are).
void untrack_if_atomic(nb::handle tuple);

// One Python value as the launch argument of parameter `i` of `k` (launch.cpp); `call` names
// the call in errors.
Arg to_arg(const Kernel& k, const State& st, size_t i, nb::handle v, const char* call = "launch");

// ------------------------------------------------------------------ loops and tapes

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

// vkad._Tape (tape.cpp): the session's vkad::Tape and what the Python side keeps beside it.
// python/vkad/tape.py's Tape wraps one.
struct Tape {
  StatePtr st;
  std::unique_ptr<vkad::Tape> tape;  // null once the session closed
  // The recording as Python sees it (Tape.launches): a (kernel, args) tuple per launch, a
  // LoopRecord per Session.loop and (None, (array, value)) per fill a checkpointing tape
  // recorded. It keeps the recorded kernels and arrays alive, whose handles
  // `tape` holds, until the next recording.
  nb::list launches;
  // Per record of `tape` (a loop's body counts per launch): its forward Kernel (alive through
  // `launches`), for the adjoints a capture gets (Graph::add); and per loop's first record its
  // body's recorded launches.
  std::vector<Kernel*> record_kernels;
  std::unordered_map<size_t, uint32_t> loop_lens;
  // array handle id -> the caller's gradient given to tape->set_grad (its handle id).
  std::unordered_map<uint64_t, uint64_t> caller_grads;

  explicit Tape(StatePtr state);
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  vkad::Tape& get();  // raises when the session is closed
  // Forgets the Python side of the recording (reset(), and the GC's tp_clear): false with a
  // Python error set where the list could not be emptied.
  bool clear_record();
  // After tape->launch accepted a launch of `k` with `args` (the Python tuple): its record.
  void record(nb::handle kernel, Kernel* k, nb::handle args);
  // Session.zero / fill of `array` inside the recording: vkad::Tape::fill, and where that
  // recorded it (checkpointing) its record, (None, (array, value)).
  void fill(nb::handle array, NdArrayHandle handle, double value);
  // Session.copy inside the recording: vkad::Tape::copy, and where that recorded it (a launch
  // of the differentiated copy) its record, (None, (src, dst)).
  void copy(nb::handle src, nb::handle dst, NdArrayHandle a, NdArrayHandle b);
  // After tape->launch_loop recorded a Session.loop: its LoopRecord (`rec`, the Python object).
  void record_loop(nb::object rec, const struct LoopRecord& loop);
};

// The launches of a Session.loop in the Graph being captured, as launch_loop made them (`info`,
// also when it failed part way): one (no Python kernel) when rolled, the reworked plan's (none
// with a Python kernel: their scalars cannot be updated either), else the body's `n` launches
// in order, info.launches of them, `of(j)` the j-th's kernel (loop.cpp).
void add_loop_to_capture(State& st, const vkad::LoopInfo& info, size_t n,
                         const std::function<Kernel*(size_t)>& of);

// The Graph being captured gets a null launch (no Python kernel, no scalars to update) for each
// launch the session made that it has not seen, up to `captured` (vkad::Session::
// captured_launches, read under the lock after the call): the copy kernels' launches of
// Session.copy and of a checkpointing tape's copies (launch.cpp).
void pad_capture(State& st, uint32_t captured);

// ------------------------------------------------------------------ session

// A Python Session's C++ side is the State its arrays and kernels share and, beside it, the parts
// below, one per concern, each holding that State and defined in the source of its concern. The
// module binds their calls as Session methods (on() below), so Python sees one vkad.Session.

// Session's arrays (ndarray.cpp, interop.cpp): creation, numpy upload, free, zero, fill and copy,
// and DLPack import. The arrays a call is given are checked to be this session's and live (own).
struct Arrays {
  StatePtr st;

  nb::object empty(nb::handle shape_obj, DType dtype, const std::string& name);
  nb::object from_numpy(const HostArray& host, const std::string& name);
  NdArray& own(nb::handle obj, const char* what);
  void free(nb::handle obj);
  void zero(nb::handle obj);
  // One barrier pair around one fill per array (Session::zero(span)); every array is checked
  // (type, session, then the runtime's handle check) before anything is recorded.
  void zero_many(nb::handle arrays);
  void fill(nb::handle obj, double value);
  void copy(nb::handle src, nb::handle dst);

  // ---- DLPack import and CUDA interop (interop.cpp)

  // A new vkad array holding a copy of a DLPack tensor (a capsule from x.__dlpack__(); vkad's
  // Python from_dlpack asks for it). The capsule is consumed: renamed "used_..." and its deleter
  // called once the bytes are copied (also on every error after the rename). Host memory
  // (kDLCPU, kDLCUDAHost, kDLCUDAManaged) is uploaded (one copy); kDLCUDA memory is copied on the
  // device into the new array's CUDA mapping (cuMemcpyDtoDAsync on the legacy default stream,
  // which the producer was asked to order its work before, then a host wait for the copy).
  nb::object from_dlpack_capsule(nb::handle capsule, const std::string& name);
  // from_dlpack's kDLCUDA path: `bytes` at `src` on the tensor's CUDA device copied into `a`
  // through its block's CUDA mapping, on the legacy default stream, then a host wait.
  void copy_from_cuda(NdArray& a, const vkad::dlpack::Tensor& t, const std::byte* src,
                      uint64_t bytes, const std::string& where);
  nb::dict interop_info();
};

// Session's kernels (kernel.cpp): IR text compiled, differentiated (reverse and forward mode) and
// released, each as a Python Kernel holding the State.
struct Kernels {
  StatePtr st;

  nb::object make_kernel(KernelHandle h, const std::string& name, std::vector<ParamInfo> params);
  nb::object compile(const std::string& text, const Elements& elements);
  nb::object differentiate(const std::string& text, const Elements& elements);
  // Session.jvp: the forward-mode (tangent) kernel of IR text (autodiff/forward_mode.h),
  // compiled: the forward's parameters, then `<name>_dot` per grad parameter (a scalar's a
  // scalar, an ndarray's an ndarray, with its element shape).
  nb::object jvp(const std::string& text, const Elements& elements);
  void release(Kernel& k);
};

// Session's launches (launch.cpp): a launch's arguments converted and checked against its
// kernel, then run -- on the recording tape where it records it, added to the graph being
// captured -- or traced inside Session.loop's body; prepare makes a launch's pipelines ahead,
// bind fixes some of its arguments.
struct Launches {
  StatePtr st;

  // The Kernel a launch or prepare names (a Differentiated stands for its forward), checked
  // against this session and the argument count; `where` names the call in errors.
  Kernel* kernel_for(nb::handle kernel, size_t nargs, const char* where, bool check_count = true);
  // The hot path: no Python-level wrapper, arguments converted in place.
  void launch(nb::handle kernel, nb::args args);
  // launch()'s second half, for arguments converted already (`args`: the Python tuple a tape
  // records; a null handle where the caller has none, which only a launch no tape records may
  // pass). Inside `with t:` a differentiated kernel's launch is the tape's (vkad::Tape::launch).
  // `note`: what makes this launch, for its device errors (Runtime::set_launch_note); a launch
  // recorded on a tape is its entry.
  void launch_converted(nb::handle kernel, Kernel* k, std::span<const Arg> span, nb::handle args,
                        const char* note = nullptr, uint64_t note_index = 0);
  // Makes the pipelines launch(kernel, *args) would use, launching nothing (GIL released
  // while the driver compiles them).
  void prepare(nb::handle kernel, nb::args args);
  // Session.bind: `kernel` with the arguments named in `named` fixed (converted and checked
  // here, once); the Bound launches it with the others, given positionally in parameter order.
  // `self`: the Python Session, which the Bound keeps alive (and with it this object).
  nb::object bind(nb::handle self, nb::handle kernel, nb::kwargs named);
  // Session.loop's body: the launch traced (docs/graphs.md, "Step loops") -- its arguments
  // converted, the loop index's as its first iteration's value -- and nothing run. `value(i)`: the
  // Python argument of parameter i.
  // Defined in launch.cpp, where its only callers are.
  template <typename Value>
  void trace(nb::handle kernel, Kernel* k, Value&& value);
};

// Session's step loops (loop.cpp): Session.loop's trace begun, ended by running the traced body
// (on the recording tape, in the graph being captured) or prepared; its adjoints' kernels are
// checked as a launch's are (`launches`, the same Session's).
struct Loops {
  StatePtr st;
  Launches& launches;

  // Session.loop's halves (python/vkad/__init__.py): begin starts the trace and returns the
  // symbolic index; end runs the traced body `count` times (vkad::Session::launch_loop),
  // checks and records it on the tape, and adds its launches to the graph being captured.
  nb::object loop_begin(int64_t start);
  void loop_abort();
  // Session.prepare_loop's second half: the traced body's rolled kernel, and its adjoint's where
  // its kernels are differentiated and every gradient array is known (`array.grad`), rolled,
  // compiled, registered and their pipelines made (vkad::Session::ready_loop); nothing launched
  // or recorded. True where the loop will run as one resident kernel.
  bool loop_prepare(uint32_t count);
  void loop_end(uint32_t count);
  // The adjoint loop of a loop's recorded launches (`entries`, `count` iterations): the body
  // reversed, each launch's adjoint with its forward's args at the last iteration, steps negated
  // (the loop runs from the last iteration down), then the gradient of each differentiated
  // parameter from `grad(primal arg, entry, gradient index, adjoint kernel)`, which returns
  // nullopt where it has none (the body is then nullopt). `kernels` gets the adjoint kernels.
  // Defined in loop.cpp, where its only callers are.
  template <typename Grad>
  std::optional<std::vector<vkad::LoopLaunch>> adjoint_body(const std::vector<LoopEntry>& entries,
                                                            uint32_t count, Grad&& grad,
                                                            std::vector<Kernel*>* kernels);
  // The vkad::Tape loop of a traced body (its differentiated launches as such, the others as
  // plain kernels).
  static std::vector<vkad::TapeLoopLaunch> tape_loop(const LoopTrace& t);
  // Before a recorded loop's checks: its rolled kernel, and its adjoint's where every gradient
  // array is known now (`array.grad` set, as DiffTaichi's lazy_grad does), rolled and compiled
  // on threads of the session's (vkad::Session::prepare_loop) while the tape's check runs.
  void prepare_loops(const LoopTrace& t, std::span<const vkad::LoopLaunch> body, uint32_t count);
  // The adjoint loop of `t`'s differentiated launches with each gradient its array's
  // `array.grad` -- what can be rolled before a backward exists -- or nullopt where there is
  // no differentiated launch or a gradient is unset (the tape would make it at backward).
  std::optional<std::vector<vkad::LoopLaunch>> adjoint_of_set_grads(const LoopTrace& t,
                                                                    uint32_t count);
};

// Session's graphs (graph.cpp): a capture begun and ended (launches add their kernels to the
// Graph it returns meanwhile), a background rework awaited, and replays with scalar updates.
struct Graphs {
  StatePtr st;

  // Session.capture's halves: begin returns the Graph (its handle set by end).
  nb::object begin_capture(const std::string& name, bool background, bool run);
  void end_capture();
  // Waits (GIL released) for a background rework and installs it.
  void finish_rework(Graph& g);
  // A launch or parameter index of a replay update: a Python int in [0, 2^32), or a clear error.
  static uint32_t update_index(nb::handle v, const std::string& what);
  // A replay update's launch: its index, or its name in Graph.launch_names.
  static uint32_t update_launch(const Graph& g, nb::handle v, const std::string& which);
  // updates: (launch index or name, parameter index, value) triples, converted like launch
  // arguments.
  void replay(Graph& g, nb::handle updates);
};

// vkad.Session: creation, synchronisation, statistics, device queries, close and debugging
// (session.cpp, debugging.cpp) are its own calls; the rest are its parts'. Not copied: the parts
// refer to each other.
struct Session {
  StatePtr st = std::make_shared<State>();
  Arrays arrays{st};
  Kernels kernels{st};
  Launches launches{st};
  Loops loops{st, launches};
  Graphs graphs{st};

  // ---- Creation, synchronisation, statistics, device queries and close (session.cpp)

  Session(nb::handle device, bool validation, size_t retirement_depth, uint32_t spare_memory_blocks,
          std::optional<std::string> cache_dir, bool specialize_shapes, bool check_finite);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  void flush();
  void synchronize();
  void release_idle_memory();
  void reset_memory_peaks();
  void close();
  nb::dict stats();
  std::vector<std::string> validation_messages();
  std::string device_name();
  std::string device_uuid();
  // What the device can do that changes what a kernel may use or how vkad lowers it.
  nb::dict capabilities();

  // ---- Debugging (debugging.cpp)

  // Kernels' print lines to `fn(line)` (None: stdout), called when their launches retire, with
  // the GIL taken, inside whichever session call retired them: it must not call the session.
  void set_print_sink(nb::object fn);
  void begin_timeline(uint64_t max_events, uint32_t replay_sample);
  vkad::Timeline end_timeline();
};

// A Session call of one of its parts as the module binds it: `method` of the part `Part`
// (&Session::arrays, ...) run on the Session the call is made on, which is the bound method's
// self, so the Python signature and errors are the method's own.
template <auto Part, typename P, typename R, typename... A>
auto on(R (P::*method)(A...)) {
  return [method](Session& s, A... a) -> R { return ((s.*Part).*method)(std::forward<A>(a)...); };
}

// ------------------------------------------------------------------ bind functions
// NB_MODULE (module.cpp) calls them in this order; each binds its source's classes and Session
// calls.

// vkad.Session and its creation, synchronisation, statistics and close (session.cpp).
nb::class_<Session> bind_session(nb::module_& m);
// vkad.NdArray and Session's array calls (ndarray.cpp).
void bind_ndarrays(nb::module_& m, nb::class_<Session>& session);
// Session._from_dlpack_capsule and Session.interop_info (interop.cpp).
void bind_interop(nb::class_<Session>& session);
// vkad.Kernel, vkad.Differentiated and Session's kernel calls (kernel.cpp).
void bind_kernels(nb::module_& m, nb::class_<Session>& session);
// vkad.BoundLaunch and Session.launch / bind / prepare (launch.cpp).
void bind_launches(nb::module_& m, nb::class_<Session>& session);
// vkad.LoopIndex, vkad.LoopRecord and Session.loop's halves (loop.cpp).
void bind_loops(nb::module_& m, nb::class_<Session>& session);
// vkad._Tape, behind vkad.Tape (tape.cpp).
void bind_tape(nb::module_& m, nb::class_<Session>& session);
// vkad.Graph and Session's capture and replay (graph.cpp).
void bind_graphs(nb::module_& m, nb::class_<Session>& session);
// vkad.Timeline and Session's debugging calls (debugging.cpp).
void bind_debugging(nb::module_& m, nb::class_<Session>& session);

}  // namespace vkad_py
