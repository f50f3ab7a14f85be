// The C ABI over vkad::Session. Every entry point catches nothing because nothing throws; it
// checks its pointers, converts, and hands back an owned vkad_status on error.
#include "api/vkad_c.h"

#include <vulkan/vulkan.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

#include "api/devices.h"
#include "api/session.h"
#include "api/tape.h"
#include "base/log.h"
#include "ir/text.h"
#include "runtime/runtime.h"

struct vkad_status {
  vkad_code code;
  std::string message;
};

struct vkad_session {
  std::unique_ptr<vkad::Session> s;
  std::string device_name;
};

struct vkad_tape {
  vkad_session* session;  // borrowed: outlives the tape (checked in Debug builds)
  vkad::Tape tape;
  vkad::Differentiated d;                // vkad_tape_launch's scratch (reused: no allocation)
  std::vector<vkad::runtime::Arg> args;  // ... and its arguments'
  std::vector<vkad::TapeSeed> seeds;     // vkad_tape_backward's
};

namespace {

using vkad::ErrorCode;
using vkad::Status;

static_assert(static_cast<int>(ErrorCode::kInternal) == VKAD_INTERNAL, "codes must match");
static_assert(static_cast<int>(vkad::runtime::DType::kBool) == VKAD_BOOL, "dtypes must match");

// C ABI lifetimes (vkad_c.h, "Lifetimes"): in builds without NDEBUG every session and status
// handed out is registered, and a call through one that is not live -- destroyed or freed
// already, or never made by vkad -- aborts with a message naming the call and the pointer,
// where it would otherwise be a use-after-free. Release builds skip the registry (a lock and a
// hash lookup per call) and trust the caller, as Vulkan does without its validation layer.
#ifndef NDEBUG
constexpr bool kCheckLifetimes = true;
#else
constexpr bool kCheckLifetimes = false;
#endif

class LiveSet {
 public:
  explicit LiveSet(const char* what) : what_(what) {}
  void add(const void* p) {
    std::lock_guard<std::mutex> l(mu_);
    live_.insert(p);
  }
  // Aborts unless `p` is live; with `remove`, it is live no more.
  void expect(const char* fn, const void* p, bool remove) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      std::fprintf(stderr,
                   "vkad: %s: %s %p is not live (%s already, or never returned by vkad); this is "
                   "a use-after-free in the caller. Aborting.\n",
                   fn, what_, p, remove ? "destroyed or freed" : "destroyed");
      std::fflush(stderr);
      std::abort();
    }
    if (remove) live_.erase(it);
  }

 private:
  const char* what_;
  std::mutex mu_;
  std::unordered_set<const void*> live_;
};
LiveSet& live_sessions() {
  static LiveSet* s = new LiveSet("session");  // never destroyed: usable during exit
  return *s;
}
LiveSet& live_tapes() {
  static LiveSet* s = new LiveSet("tape");
  return *s;
}
LiveSet& live_statuses() {
  static LiveSet* s = new LiveSet("status");
  return *s;
}

// Out of host memory while reporting an error: this static object is returned, and
// vkad_status_free recognises it and does not free it.
vkad_status g_out_of_memory{VKAD_OUT_OF_HOST_MEMORY, "out of host memory"};

vkad_status* make(vkad_code code, std::string message) {
  auto* st = new (std::nothrow) vkad_status{code, std::move(message)};
  if (st == nullptr) return &g_out_of_memory;
  if (kCheckLifetimes) live_statuses().add(st);
  return st;
}

// A vkad_dtype as the integer the caller stored. A C caller may store any int in an enum
// object, and loading a C++ enum holding a value outside its range is undefined behaviour
// (UBSan's -fsanitize=enum aborts on it), so the bits are copied out, never read as the enum.
uint32_t dtype_bits(const vkad_dtype& d) {
  static_assert(sizeof(vkad_dtype) == sizeof(uint32_t), "vkad_dtype is an int-sized enum");
  uint32_t v;
  std::memcpy(&v, &d, sizeof v);
  return v;
}

vkad_status* from(const Status& s) {
  if (s.ok()) return nullptr;
  return make(static_cast<vkad_code>(s.code()), s.message());
}

vkad_status* invalid(const char* fn, const char* what) {
  return make(VKAD_INVALID_ARGUMENT, std::string(fn) + ": " + what);
}

#define VKAD_C_CHECK_SESSION(fn)                                 \
  if (session == nullptr) return invalid(fn, "session is NULL"); \
  if (kCheckLifetimes) live_sessions().expect(fn, session, false)

// A tape call: the tape, and (Debug builds) its session, must be live.
#define VKAD_C_CHECK_TAPE(fn)                              \
  if (tape == nullptr) return invalid(fn, "tape is NULL"); \
  if (kCheckLifetimes) {                                   \
    live_tapes().expect(fn, tape, false);                  \
    live_sessions().expect(fn, tape->session, false);      \
  }

// Copies a caller's versioned struct into a zeroed full-size one: an older (smaller) struct
// gets defaults for the fields it lacks; a larger one comes from a newer header.
template <typename T>
vkad_status* read_versioned(const char* fn, const T* in, T* out) {
  std::memset(out, 0, sizeof(T));
  if (in->struct_size < sizeof(uint32_t) || in->struct_size > sizeof(T)) {
    return make(VKAD_INVALID_ARGUMENT,
                std::string(fn) + ": struct_size " + std::to_string(in->struct_size) +
                    " is not one this library knows (at most " + std::to_string(sizeof(T)) +
                    "; set it to sizeof the struct)");
  }
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(in), in->struct_size);
  return nullptr;
}

// Writes at most out->struct_size bytes of `full` into a caller's versioned result struct.
template <typename T>
vkad_status* write_versioned(const char* fn, const T& full, T* out) {
  const uint32_t n = out->struct_size;
  if (n < sizeof(uint32_t) || n > sizeof(T)) {
    return make(VKAD_INVALID_ARGUMENT, std::string(fn) + ": out->struct_size " + std::to_string(n) +
                                           " is not one this library knows");
  }
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(&full), n);
  out->struct_size = n;
  return nullptr;
}

vkad::runtime::Arg to_arg(const vkad_arg& a) {
  using vkad::runtime::Arg;
  if (a.is_ndarray) return Arg::ndarray({a.array});
  Arg r;
  r.kind = vkad::runtime::ParamKind::kScalar;
  r.dtype = static_cast<vkad::runtime::DType>(dtype_bits(a.dtype));  // checked by to_args
  r.f = a.f;
  r.i = a.i;
  return r;
}

}  // namespace

extern "C" {

uint32_t vkad_version(void) {
  return (VKAD_C_API_VERSION_MAJOR << 22) | (VKAD_C_API_VERSION_MINOR << 12) |
         VKAD_C_API_VERSION_PATCH;
}

const char* vkad_version_string(void) {
#define VKAD_STR2(x) #x
#define VKAD_STR(x) VKAD_STR2(x)
  return VKAD_STR(VKAD_C_API_VERSION_MAJOR) "." VKAD_STR(VKAD_C_API_VERSION_MINOR) "." VKAD_STR(
      VKAD_C_API_VERSION_PATCH);
}

vkad_code vkad_status_code(const vkad_status* status) {
  if (status == nullptr) return VKAD_OK;
  if (kCheckLifetimes && status != &g_out_of_memory)
    live_statuses().expect("vkad_status_code", status, false);
  return status->code;
}
const char* vkad_status_message(const vkad_status* status) {
  if (status == nullptr) return "";
  if (kCheckLifetimes && status != &g_out_of_memory) {
    live_statuses().expect("vkad_status_message", status, false);
  }
  return status->message.c_str();
}
void vkad_status_free(vkad_status* status) {
  if (status == nullptr || status == &g_out_of_memory) return;
  if (kCheckLifetimes) live_statuses().expect("vkad_status_free", status, true);
  delete status;
}

void vkad_set_log_callback(vkad_log_callback callback, void* user) {
  struct Bridge {
    static void call(vkad::LogLevel level, const char* message, void* u) {
      auto* pair = static_cast<std::pair<vkad_log_callback, void*>*>(u);
      pair->first(static_cast<int>(level), message, pair->second);
    }
  };
  // The sink's user pointer must outlive every message in flight, so the pairs are kept (a few
  // bytes per call; callers set a callback once or twice per process).
  static std::vector<std::unique_ptr<std::pair<vkad_log_callback, void*>>> kept;
  static std::mutex mu;
  if (callback == nullptr) {
    vkad::set_log_sink(nullptr, nullptr);
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  kept.push_back(std::make_unique<std::pair<vkad_log_callback, void*>>(callback, user));
  vkad::set_log_sink(&Bridge::call, kept.back().get());
}

// vkad_session_options' compile and graph-pass fields into `so`, whose defaults stand where a
// field is 0 (each default written once, in api/session.h); NULL, or the error naming a field
// out of range.
static vkad_status* session_options_from(const vkad_session_options& o, vkad::SessionOptions* so) {
  so->compile.optimize = o.optimize != 0;
  if (o.check_finite != 0) so->compile.check_finite = true;
  const struct {
    const char* name;
    int32_t value;
    bool* out;
  } switches[] = {
      {"fuse_graph_launches", o.fuse_graph_launches, &so->fuse_graph_launches},
      {"schedule_graph_launches", o.schedule_graph_launches, &so->schedule_graph_launches},
      {"block_stencils", o.block_stencils, &so->block_stencils}};
  for (const auto& sw : switches) {
    if (sw.value < -1 || sw.value > 1) {
      return invalid("vkad_session_create", (std::string(sw.name) + " " + std::to_string(sw.value) +
                                             ": use 0 (the default), 1 (on) or -1 (off)")
                                                .c_str());
    }
    if (sw.value != 0) *sw.out = sw.value > 0;
  }
  if (o.resident_max_range < -1) {
    return invalid("vkad_session_create",
                   ("resident_max_range " + std::to_string(o.resident_max_range) +
                    ": use 0 (the default), -1 (off) or a positive count")
                       .c_str());
  }
  if (o.resident_max_range != 0) {
    so->resident_max_range =
        o.resident_max_range < 0 ? 0u : static_cast<uint32_t>(o.resident_max_range);
  }
  if (o.graph_passes != nullptr) so->graph_passes = o.graph_passes;
  return nullptr;
}

vkad_status* vkad_session_create(const vkad_session_options* options, vkad_session** out) {
  if (out == nullptr) return invalid("vkad_session_create", "out is NULL");
  vkad_session_options o{};
  o.struct_size = sizeof o;
  if (options != nullptr) {
    if (vkad_status* e = read_versioned("vkad_session_create", options, &o)) return e;
  }
  vkad::runtime::RuntimeOptions ro;
  if (o.device != nullptr) ro.device.device = o.device;
  ro.device.enable_validation = o.validation != 0;
  if (o.retirement_depth != 0) ro.retirement_depth = o.retirement_depth;
  if (o.spare_memory_blocks < -1) {
    return invalid("vkad_session_create",
                   ("spare_memory_blocks " + std::to_string(o.spare_memory_blocks) +
                    ": use 0 (the default), -1 (none) or a positive count")
                       .c_str());
  }
  if (o.spare_memory_blocks != 0) {
    ro.device.spare_blocks_per_memory_type =
        o.spare_memory_blocks < 0 ? 0u : static_cast<uint32_t>(o.spare_memory_blocks);
  }
  if (o.external != nullptr) {
    vkad_external_device e{};
    if (vkad_status* err = read_versioned("vkad_session_create (external)", o.external, &e)) {
      return err;
    }
    vkad::rhi::ExternalDevice x;
    x.instance = static_cast<VkInstance>(e.instance);
    x.physical_device = static_cast<VkPhysicalDevice>(e.physical_device);
    x.device = static_cast<VkDevice>(e.device);
    x.queue_family = e.queue_family;
    x.first_queue = e.first_queue;
    x.queue_count = e.queue_count == 0 ? 1 : e.queue_count;
    const vkad_external_features& f = e.enabled;
    x.enabled.timeline_semaphore = f.timeline_semaphore != 0;
    x.enabled.host_query_reset = f.host_query_reset != 0;
    x.enabled.shader_int64 = f.shader_int64 != 0;
    x.enabled.shader_float64 = f.shader_float64 != 0;
    x.enabled.shader_float16 = f.shader_float16 != 0;
    x.enabled.buffer_int64_atomics = f.buffer_int64_atomics != 0;
    x.enabled.buffer_device_address = f.buffer_device_address != 0;
    x.enabled.atomic_float32_add = f.atomic_float32_add != 0;
    x.enabled.atomic_float64_add = f.atomic_float64_add != 0;
    x.enabled.push_descriptor = f.push_descriptor != 0;
    ro.device.external = x;
  }
  if (o.cache_dir != nullptr) ro.cache_dir = std::string(o.cache_dir);
  vkad::SessionOptions so;
  if (vkad_status* e = session_options_from(o, &so)) return e;
  auto s = vkad::Session::create_with_runtime(ro, so);
  if (!s.ok()) return from(s.status());
  auto* session = new (std::nothrow) vkad_session();
  if (session == nullptr) return make(VKAD_OUT_OF_HOST_MEMORY, "vkad_session_create: no memory");
  session->s = std::move(s).value();
  session->device_name = session->s->device_name();
  if (kCheckLifetimes) live_sessions().add(session);
  *out = session;
  return nullptr;
}

void vkad_session_destroy(vkad_session* session) {
  if (session == nullptr) return;
  if (kCheckLifetimes) live_sessions().expect("vkad_session_destroy", session, true);
  delete session;
}

const char* vkad_session_device_uuid(const vkad_session* session) {
  if (session == nullptr) return "";
  if (kCheckLifetimes) live_sessions().expect("vkad_session_device_uuid", session, false);
  return session->s->device_uuid().c_str();
}

vkad_status* vkad_device_count(uint32_t* count) {
  if (count == nullptr) return invalid("vkad_device_count", "count is NULL");
  auto list = vkad::devices();
  if (!list.ok()) return from(list.status());
  *count = static_cast<uint32_t>(list->size());
  return nullptr;
}

vkad_status* vkad_device_get(uint32_t index, vkad_device_info* out) {
  if (out == nullptr) return invalid("vkad_device_get", "out is NULL");
  auto list = vkad::devices();
  if (!list.ok()) return from(list.status());
  if (index >= list->size()) {
    return make(VKAD_NOT_FOUND, "vkad_device_get: device index " + std::to_string(index) +
                                    " out of range: " + std::to_string(list->size()) +
                                    " device(s) present");
  }
  const vkad::DeviceInfo& d = (*list)[index];
  vkad_device_info full{};
  full.struct_size = sizeof full;
  full.index = d.index;
  auto put = [](char* dst, size_t cap, const std::string& src) {
    const size_t n = std::min(cap - 1, src.size());
    std::memcpy(dst, src.data(), n);
    dst[n] = '\0';
  };
  put(full.name, sizeof full.name, d.name);
  put(full.kind, sizeof full.kind, d.kind);
  full.cpu = d.cpu ? 1 : 0;
  std::memcpy(full.uuid, d.uuid_bytes.data(), sizeof full.uuid);
  put(full.uuid_string, sizeof full.uuid_string, d.uuid);
  put(full.driver_name, sizeof full.driver_name, d.driver_name);
  put(full.driver_info, sizeof full.driver_info, d.driver_info);
  full.vendor_id = d.vendor_id;
  full.device_id = d.device_id;
  full.api_version = d.api_version;
  full.usable = d.usable ? 1 : 0;
  full.automatic = d.automatic ? 1 : 0;
  return write_versioned("vkad_device_get", full, out);
}

const char* vkad_session_device_name(const vkad_session* session) {
  if (session == nullptr) return "";
  if (kCheckLifetimes) live_sessions().expect("vkad_session_device_name", session, false);
  return session->device_name.c_str();
}

vkad_status* vkad_compile(vkad_session* session, const char* ir_text, vkad_kernel* out) {
  VKAD_C_CHECK_SESSION("vkad_compile");
  if (ir_text == nullptr) return invalid("vkad_compile", "ir_text is NULL");
  if (out == nullptr) return invalid("vkad_compile", "out is NULL");
  auto k = session->s->compile(std::string_view(ir_text));
  if (!k.ok()) return from(k.status());
  *out = k->id;
  return nullptr;
}

vkad_status* vkad_differentiate(vkad_session* session, const char* ir_text,
                                vkad_differentiated* out) {
  VKAD_C_CHECK_SESSION("vkad_differentiate");
  if (ir_text == nullptr) return invalid("vkad_differentiate", "ir_text is NULL");
  if (out == nullptr) return invalid("vkad_differentiate", "out is NULL");
  auto parsed = vkad::codegen::parse(ir_text);
  if (!parsed.ok()) return from(parsed.status());
  uint32_t marked = 0;
  for (const auto& p : parsed->params) marked += p.needs_grad ? 1 : 0;
  if (marked > VKAD_MAX_GRADIENTS) {
    return invalid(
        "vkad_differentiate",
        ("kernel '" + parsed->name + "' has " + std::to_string(marked) +
         " parameters marked grad; the C ABI returns at most " + std::to_string(VKAD_MAX_GRADIENTS))
            .c_str());
  }
  auto d = session->s->differentiate(*parsed);
  if (!d.ok()) return from(d.status());
  vkad_differentiated full{};
  full.struct_size = sizeof full;
  full.forward = d->forward.id;
  full.adjoint = d->adjoint.id;
  full.forward_params = d->forward_params;
  full.gradient_count = static_cast<uint32_t>(d->gradients.size());
  for (size_t i = 0; i < d->gradients.size(); ++i) {
    full.gradients[i] = {d->gradients[i].param, d->gradients[i].grad_param};
  }
  vkad_status* e = write_versioned("vkad_differentiate", full, out);
  if (e != nullptr) {  // a failed call changes nothing
    (void)session->s->release(d->forward);
    (void)session->s->release(d->adjoint);
  }
  return e;
}

vkad_status* vkad_kernel_release(vkad_session* session, vkad_kernel kernel) {
  VKAD_C_CHECK_SESSION("vkad_kernel_release");
  return from(session->s->release({kernel}));
}

vkad_status* vkad_ndarray_create(vkad_session* session, vkad_dtype dtype, uint32_t rank,
                                 const uint32_t* shape, const char* name, vkad_ndarray* out) {
  VKAD_C_CHECK_SESSION("vkad_ndarray_create");
  if (out == nullptr) return invalid("vkad_ndarray_create", "out is NULL");
  if (shape == nullptr && rank > 0) return invalid("vkad_ndarray_create", "shape is NULL");
  if (dtype_bits(dtype) > VKAD_BOOL) {
    return invalid("vkad_ndarray_create",
                   ("dtype " + std::to_string(static_cast<int32_t>(dtype_bits(dtype))) +
                    " is not a vkad_dtype")
                       .c_str());
  }
  if (rank > 64) {  // the runtime names the real limit; this only bounds the copy below
    return invalid("vkad_ndarray_create",
                   ("rank " + std::to_string(rank) + " is too large").c_str());
  }
  std::vector<uint32_t> dims(shape, shape + rank);
  auto h = session->s->ndarray(static_cast<vkad::runtime::DType>(dtype_bits(dtype)),
                               std::move(dims), name != nullptr ? name : "");
  if (!h.ok()) return from(h.status());
  *out = h->id;
  return nullptr;
}

vkad_status* vkad_ndarray_free(vkad_session* session, vkad_ndarray array) {
  VKAD_C_CHECK_SESSION("vkad_ndarray_free");
  return from(session->s->free({array}));
}
vkad_status* vkad_ndarray_zero(vkad_session* session, vkad_ndarray array) {
  VKAD_C_CHECK_SESSION("vkad_ndarray_zero");
  return from(session->s->zero({array}));
}
vkad_status* vkad_ndarray_fill(vkad_session* session, vkad_ndarray array, double value) {
  VKAD_C_CHECK_SESSION("vkad_ndarray_fill");
  return from(session->s->fill({array}, value));
}
vkad_status* vkad_upload(vkad_session* session, vkad_ndarray array, const void* data,
                         uint64_t bytes) {
  VKAD_C_CHECK_SESSION("vkad_upload");
  return from(session->s->upload({array}, data, bytes));
}
vkad_status* vkad_download(vkad_session* session, vkad_ndarray array, void* out, uint64_t bytes) {
  VKAD_C_CHECK_SESSION("vkad_download");
  return from(session->s->download({array}, out, bytes));
}

// vkad_launch's and vkad_prepare's arguments, checked; `where` names the call in errors.
static vkad_status* to_args(const char* where, const vkad_arg* args, uint32_t arg_count,
                            std::vector<vkad::runtime::Arg>* a) {
  if (args == nullptr && arg_count > 0) return invalid(where, "args is NULL");
  a->reserve(arg_count);
  for (uint32_t i = 0; i < arg_count; ++i) {
    if (!args[i].is_ndarray && dtype_bits(args[i].dtype) > VKAD_BOOL) {
      return invalid(where, ("argument " + std::to_string(i) + ": dtype " +
                             std::to_string(static_cast<int32_t>(dtype_bits(args[i].dtype))) +
                             " is not a vkad_dtype")
                                .c_str());
    }
    a->push_back(to_arg(args[i]));
  }
  return nullptr;
}

vkad_status* vkad_prepare(vkad_session* session, vkad_kernel kernel, const vkad_arg* args,
                          uint32_t arg_count) {
  VKAD_C_CHECK_SESSION("vkad_prepare");
  std::vector<vkad::runtime::Arg> a;
  if (vkad_status* bad = to_args("vkad_prepare", args, arg_count, &a)) return bad;
  return from(session->s->prepare({kernel}, a));
}

vkad_status* vkad_launch(vkad_session* session, vkad_kernel kernel, const vkad_arg* args,
                         uint32_t arg_count, uint64_t* launch_id) {
  VKAD_C_CHECK_SESSION("vkad_launch");
  std::vector<vkad::runtime::Arg> a;
  if (vkad_status* bad = to_args("vkad_launch", args, arg_count, &a)) return bad;
  vkad::runtime::LaunchId id;
  Status s = session->s->launch({kernel}, a, &id);
  if (s.ok() && launch_id != nullptr) *launch_id = id.value;
  return from(s);
}

vkad_status* vkad_launch_loop(vkad_session* session, const vkad_loop_launch* body,
                              uint32_t body_count, uint32_t count, int* rolled) {
  VKAD_C_CHECK_SESSION("vkad_launch_loop");
  if (rolled != nullptr) *rolled = 0;
  if (body == nullptr && body_count > 0) return invalid("vkad_launch_loop", "body is NULL");
  std::vector<vkad::LoopLaunch> b(body_count);
  for (uint32_t j = 0; j < body_count; ++j) {
    const std::string where = "vkad_launch_loop: launch " + std::to_string(j) + " of the body";
    b[j].kernel = {body[j].kernel};
    if (vkad_status* bad = to_args(where.c_str(), body[j].args, body[j].arg_count, &b[j].args)) {
      return bad;
    }
    if (body[j].step != nullptr) b[j].step.assign(body[j].step, body[j].step + body[j].arg_count);
  }
  vkad::LoopInfo info;
  Status s = session->s->launch_loop(b, count, &info);
  if (s.ok() && rolled != nullptr) *rolled = info.rolled ? 1 : 0;
  return from(s);
}

vkad_status* vkad_flush(vkad_session* session) {
  VKAD_C_CHECK_SESSION("vkad_flush");
  return from(session->s->flush());
}
vkad_status* vkad_synchronize(vkad_session* session) {
  VKAD_C_CHECK_SESSION("vkad_synchronize");
  return from(session->s->synchronize());
}

vkad_status* vkad_release_idle_memory(vkad_session* session) {
  VKAD_C_CHECK_SESSION("vkad_release_idle_memory");
  return from(session->s->release_idle_memory());
}

vkad_status* vkad_reset_memory_peaks(vkad_session* session) {
  VKAD_C_CHECK_SESSION("vkad_reset_memory_peaks");
  return from(session->s->reset_memory_peaks());
}

vkad_status* vkad_session_set_print_sink(vkad_session* session, vkad_print_sink sink, void* user) {
  VKAD_C_CHECK_SESSION("vkad_session_set_print_sink");
  if (sink == nullptr) {
    session->s->set_print_sink(nullptr);
    return nullptr;
  }
  session->s->set_print_sink([sink, user](std::string_view line) {
    const std::string text(line);  // NUL-terminated for C
    sink(text.c_str(), text.size(), user);
  });
  return nullptr;
}

vkad_status* vkad_timeline_begin(vkad_session* session, uint64_t max_events) {
  VKAD_C_CHECK_SESSION("vkad_timeline_begin");
  return vkad_timeline_begin_sampled(session, max_events, 0);
}

vkad_status* vkad_timeline_begin_sampled(vkad_session* session, uint64_t max_events,
                                         uint32_t replay_sample) {
  VKAD_C_CHECK_SESSION("vkad_timeline_begin_sampled");
  return from(session->s->begin_timeline(
      max_events == 0 ? vkad::runtime::kTimelineMaxEvents : max_events,
      replay_sample == 0 ? vkad::runtime::kTimelineReplaySample : replay_sample));
}

vkad_status* vkad_timeline_end(vkad_session* session, const char* trace_path, char* summary,
                               size_t size, size_t* summary_needed, uint64_t* event_count) {
  VKAD_C_CHECK_SESSION("vkad_timeline_end");
  if (summary == nullptr && size != 0) return invalid("vkad_timeline_end", "summary is NULL");
  vkad::Result<vkad::Timeline> t = session->s->end_timeline();
  if (!t.ok()) return from(t.status());
  if (event_count != nullptr) *event_count = t->events.size();
  const std::string text = t->summary();
  if (summary_needed != nullptr) *summary_needed = text.size() + 1;
  if (size != 0) {
    const size_t n = std::min(text.size(), size - 1);
    std::memcpy(summary, text.data(), n);
    summary[n] = '\0';
  }
  if (trace_path != nullptr) return from(t->write_chrome_trace(trace_path));
  return nullptr;
}

vkad_status* vkad_tape_create(vkad_session* session, vkad_tape** out) {
  VKAD_C_CHECK_SESSION("vkad_tape_create");
  if (out == nullptr) return invalid("vkad_tape_create", "out is NULL");
  auto* tape = new (std::nothrow) vkad_tape{session, vkad::Tape(*session->s), {}, {}, {}};
  if (tape == nullptr) return make(VKAD_OUT_OF_HOST_MEMORY, "vkad_tape_create: no memory");
  if (kCheckLifetimes) live_tapes().add(tape);
  *out = tape;
  return nullptr;
}

void vkad_tape_destroy(vkad_tape* tape) {
  if (tape == nullptr) return;
  if (kCheckLifetimes) {
    live_tapes().expect("vkad_tape_destroy", tape, true);
    live_sessions().expect("vkad_tape_destroy", tape->session, false);
  }
  delete tape;
}

vkad_status* vkad_tape_launch(vkad_tape* tape, const vkad_differentiated* d, const vkad_arg* args,
                              uint32_t arg_count, uint64_t* launch_id) {
  VKAD_C_CHECK_TAPE("vkad_tape_launch");
  if (d == nullptr) return invalid("vkad_tape_launch", "d is NULL");
  vkad_differentiated full;
  if (vkad_status* e = read_versioned("vkad_tape_launch", d, &full)) return e;
  if (full.gradient_count > VKAD_MAX_GRADIENTS) {
    return invalid("vkad_tape_launch", ("d->gradient_count " + std::to_string(full.gradient_count) +
                                        " is past VKAD_MAX_GRADIENTS")
                                           .c_str());
  }
  tape->d.forward = {full.forward};
  tape->d.adjoint = {full.adjoint};
  tape->d.forward_params = full.forward_params;
  tape->d.gradients.resize(full.gradient_count);
  for (uint32_t i = 0; i < full.gradient_count; ++i) {
    tape->d.gradients[i].param = full.gradients[i].param;
    tape->d.gradients[i].grad_param = full.gradients[i].grad_param;
  }
  tape->args.clear();
  if (vkad_status* bad = to_args("vkad_tape_launch", args, arg_count, &tape->args)) return bad;
  vkad::runtime::LaunchId id;
  Status s = tape->tape.launch(tape->d, tape->args, &id);
  if (s.ok() && launch_id != nullptr) *launch_id = id.value;
  return from(s);
}

vkad_status* vkad_tape_backward(vkad_tape* tape, const vkad_seed* seeds, uint32_t count) {
  VKAD_C_CHECK_TAPE("vkad_tape_backward");
  if (seeds == nullptr && count > 0) return invalid("vkad_tape_backward", "seeds is NULL");
  tape->seeds.clear();
  for (uint32_t i = 0; i < count; ++i) {
    tape->seeds.push_back({{seeds[i].array}, seeds[i].value, seeds[i].data, seeds[i].bytes});
  }
  return from(tape->tape.backward(tape->seeds));
}

vkad_status* vkad_tape_grad(const vkad_tape* tape, vkad_ndarray array, vkad_ndarray* out) {
  VKAD_C_CHECK_TAPE("vkad_tape_grad");
  if (out == nullptr) return invalid("vkad_tape_grad", "out is NULL");
  vkad::Result<vkad::NdArrayHandle> g = tape->tape.grad({array});
  if (!g.ok()) return from(g.status());
  *out = g->id;
  return nullptr;
}

vkad_status* vkad_tape_scalar_grad(const vkad_tape* tape, const vkad_differentiated* d,
                                   uint32_t param, vkad_ndarray* out) {
  VKAD_C_CHECK_TAPE("vkad_tape_scalar_grad");
  if (d == nullptr) return invalid("vkad_tape_scalar_grad", "d is NULL");
  if (out == nullptr) return invalid("vkad_tape_scalar_grad", "out is NULL");
  vkad_differentiated full;
  if (vkad_status* e = read_versioned("vkad_tape_scalar_grad", d, &full)) return e;
  vkad::Differentiated cd;
  cd.forward = {full.forward};
  cd.adjoint = {full.adjoint};
  cd.forward_params = full.forward_params;
  const uint32_t n = std::min<uint32_t>(full.gradient_count, VKAD_MAX_GRADIENTS);
  for (uint32_t i = 0; i < n; ++i) {
    cd.gradients.push_back({full.gradients[i].param, full.gradients[i].grad_param, {}});
  }
  vkad::Result<vkad::NdArrayHandle> g = tape->tape.scalar_grad(cd, param);
  if (!g.ok()) return from(g.status());
  *out = g->id;
  return nullptr;
}

vkad_status* vkad_tape_set_grad(vkad_tape* tape, vkad_ndarray array, vkad_ndarray grad) {
  VKAD_C_CHECK_TAPE("vkad_tape_set_grad");
  return from(tape->tape.set_grad({array}, {grad}));
}

vkad_status* vkad_tape_reset(vkad_tape* tape) {
  VKAD_C_CHECK_TAPE("vkad_tape_reset");
  tape->tape.reset();
  return nullptr;
}

vkad_status* vkad_tape_set_checkpoint(vkad_tape* tape, uint32_t launches_per_segment) {
  VKAD_C_CHECK_TAPE("vkad_tape_set_checkpoint");
  return from(tape->tape.set_checkpoint_every(launches_per_segment));
}

vkad_status* vkad_tape_set_memory_budget(vkad_tape* tape, uint64_t bytes) {
  VKAD_C_CHECK_TAPE("vkad_tape_set_memory_budget");
  return from(tape->tape.set_memory_budget(bytes));
}

vkad_status* vkad_tape_fill(vkad_tape* tape, vkad_ndarray array, double value) {
  VKAD_C_CHECK_TAPE("vkad_tape_fill");
  return from(tape->tape.fill(vkad::NdArrayHandle{array}, value));
}

vkad_status* vkad_tape_checkpoint_plan(const vkad_tape* tape, vkad_checkpoint_plan* out) {
  VKAD_C_CHECK_TAPE("vkad_tape_checkpoint_plan");
  if (out == nullptr) return invalid("vkad_tape_checkpoint_plan", "out is NULL");
  vkad::Result<vkad::codegen::CheckpointPlan> got = tape->tape.checkpoint_plan();
  if (!got.ok()) return from(got.status());
  vkad_checkpoint_plan full{};
  full.struct_size = sizeof full;
  full.launches = got->launches;
  full.levels = static_cast<uint32_t>(got->segments.size());
  static_assert(sizeof full.segments / sizeof full.segments[0] ==
                vkad::codegen::kMaxCheckpointLevels);
  for (size_t i = 0; i < got->segments.size(); ++i) full.segments[i] = got->segments[i];
  full.peak_bytes = got->peak_bytes;
  full.min_bytes = got->min_bytes;
  return write_versioned("vkad_tape_checkpoint_plan", full, out);
}

vkad_status* vkad_tape_keeps_intermediate_gradients(const vkad_tape* tape, int* out) {
  VKAD_C_CHECK_TAPE("vkad_tape_keeps_intermediate_gradients");
  if (out == nullptr) return invalid("vkad_tape_keeps_intermediate_gradients", "out is NULL");
  *out = tape->tape.keeps_intermediate_gradients() ? 1 : 0;
  return nullptr;
}

vkad_status* vkad_begin_capture(vkad_session* session, const char* name) {
  VKAD_C_CHECK_SESSION("vkad_begin_capture");
  return from(session->s->begin_capture(name != nullptr ? name : ""));
}
vkad_status* vkad_begin_capture_flags(vkad_session* session, const char* name, uint32_t flags) {
  VKAD_C_CHECK_SESSION("vkad_begin_capture_flags");
  if ((flags & ~(VKAD_CAPTURE_BACKGROUND_REWORK | VKAD_CAPTURE_RUN)) != 0) {
    return invalid("vkad_begin_capture_flags",
                   "flags has bits other than VKAD_CAPTURE_BACKGROUND_REWORK and VKAD_CAPTURE_RUN");
  }
  vkad::CaptureOptions options;
  options.background_rework = (flags & VKAD_CAPTURE_BACKGROUND_REWORK) != 0;
  options.run = (flags & VKAD_CAPTURE_RUN) != 0;
  return from(session->s->begin_capture(name != nullptr ? name : "", options));
}
vkad_status* vkad_graph_finish_rework(vkad_session* session, vkad_graph graph) {
  VKAD_C_CHECK_SESSION("vkad_graph_finish_rework");
  return from(session->s->finish_rework(vkad::GraphHandle{graph}));
}
vkad_status* vkad_end_capture(vkad_session* session, vkad_graph* out) {
  VKAD_C_CHECK_SESSION("vkad_end_capture");
  if (out == nullptr) return invalid("vkad_end_capture", "out is NULL");
  auto g = session->s->end_capture();
  if (!g.ok()) return from(g.status());
  *out = g->id;
  return nullptr;
}
vkad_status* vkad_replay(vkad_session* session, vkad_graph graph, const vkad_graph_update* updates,
                         uint32_t update_count, uint64_t* first_launch_id) {
  VKAD_C_CHECK_SESSION("vkad_replay");
  if (updates == nullptr && update_count > 0) return invalid("vkad_replay", "updates is NULL");
  std::vector<vkad::runtime::GraphUpdate> u(update_count);
  for (uint32_t i = 0; i < update_count; ++i) {
    std::vector<vkad::runtime::Arg> one;
    if (vkad_status* bad = to_args("vkad_replay (update)", &updates[i].value, 1, &one)) return bad;
    u[i] = {updates[i].launch, updates[i].param, one[0]};
  }
  vkad::runtime::LaunchId first;
  vkad_status* st = from(session->s->replay({graph}, u, &first));
  if (st == nullptr && first_launch_id != nullptr) *first_launch_id = first.value;
  return st;
}
vkad_status* vkad_graph_release(vkad_session* session, vkad_graph graph) {
  VKAD_C_CHECK_SESSION("vkad_graph_release");
  return from(session->s->release_graph(vkad::GraphHandle{graph}));
}

vkad_status* vkad_graph_launch_name(const vkad_session* session, vkad_graph graph, uint32_t index,
                                    uint32_t* count, char* name, size_t size, size_t* needed) {
  VKAD_C_CHECK_SESSION("vkad_graph_launch_name");
  if (count == nullptr) return invalid("vkad_graph_launch_name", "count is NULL");
  if (name == nullptr && size != 0) return invalid("vkad_graph_launch_name", "name is NULL");
  vkad::Result<std::vector<std::string>> names =
      session->s->graph_launch_names(vkad::GraphHandle{graph});
  if (!names.ok()) return from(names.status());
  *count = static_cast<uint32_t>(names->size());
  if (index >= names->size()) {
    return invalid("vkad_graph_launch_name",
                   ("index " + std::to_string(index) + " is past the graph's " +
                    std::to_string(names->size()) + " launches")
                       .c_str());
  }
  const std::string& n = (*names)[index];
  if (needed != nullptr) *needed = n.size() + 1;
  if (size < n.size() + 1) {
    return invalid("vkad_graph_launch_name",
                   ("the name of launch " + std::to_string(index) + " needs " +
                    std::to_string(n.size() + 1) + " bytes, size is " + std::to_string(size))
                       .c_str());
  }
  std::memcpy(name, n.c_str(), n.size() + 1);
  return nullptr;
}
vkad_status* vkad_graph_launch_index(const vkad_session* session, vkad_graph graph,
                                     const char* name, uint32_t* out) {
  VKAD_C_CHECK_SESSION("vkad_graph_launch_index");
  if (name == nullptr || out == nullptr) {
    return invalid("vkad_graph_launch_index", name == nullptr ? "name is NULL" : "out is NULL");
  }
  vkad::Result<uint32_t> i = session->s->graph_launch(vkad::GraphHandle{graph}, name);
  if (!i.ok()) return from(i.status());
  *out = *i;
  return nullptr;
}

vkad_status* vkad_session_stats(const vkad_session* session, vkad_stats* out) {
  VKAD_C_CHECK_SESSION("vkad_session_stats");
  if (out == nullptr) return invalid("vkad_session_stats", "out is NULL");
  vkad::Result<vkad::SessionStats> got = session->s->stats();
  if (!got.ok()) return from(got.status());
  const vkad::SessionStats& st = *got;
  vkad_stats full{};
  full.struct_size = sizeof full;
  full.launches = st.launches;
  full.flushes = st.flushes;
  full.forced_waits = st.forced_waits;
  full.ndarrays = st.ndarrays;
  full.kernels_cached = st.kernels_cached;
  full.memory_block_bytes = st.memory_block_bytes;
  full.memory_used_bytes = st.memory_used_bytes;
  full.adstack_heap_bytes = st.adstack_heap_bytes;
  full.vulkan_objects_created = st.vulkan_objects_created;
  full.kernels_compiled = st.kernels_compiled;
  full.compile_cache_hits = st.compile_cache_hits;
  full.disk_cache_hits = st.disk_cache_hits;
  full.disk_cache_misses = st.disk_cache_misses;
  full.disk_cache_rebuilt = st.disk_cache_rebuilt;
  full.pipeline_cache_loaded = st.pipeline_cache_loaded ? 1 : 0;
  full.user_bytes = st.user_bytes;
  full.runtime_bytes = st.runtime_bytes;
  full.args_ring_bytes = st.args_ring_bytes;
  full.readback_ring_bytes = st.readback_ring_bytes;
  full.spare_block_bytes = st.spare_block_bytes;
  full.ndarray_pool_bytes = st.ndarray_pool_bytes;
  full.live_buffers = st.live_buffers;
  full.dispatches = st.dispatches;
  full.memory_peak_block_bytes = st.memory_peak_block_bytes;
  full.memory_peak_used_bytes = st.memory_peak_used_bytes;
  full.barriers = st.barriers;
  return write_versioned("vkad_session_stats", full, out);
}

}  // extern "C"
