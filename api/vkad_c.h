/* vkad's C ABI: the front door (api/session.h) for embedders in C and for other languages'
 * foreign-function interfaces.
 *
 * Conventions
 *  - Objects are opaque pointers (vkad_session) or 64-bit handles (vkad_kernel, vkad_ndarray;
 *    0 is never valid). A handle of another session, or a freed one, is an error, never a crash.
 *  - Every fallible call returns a vkad_status*: NULL means success; otherwise an owned error
 *    object (code + message) that the caller frees with vkad_status_free. Out-parameters are
 *    written only on success. Nothing aborts on bad input: a NULL session, NULL out-pointer or a
 *    struct_size the library does not know is VKAD_INVALID_ARGUMENT naming the parameter.
 *  - Option and result structs begin with `struct_size` (set it to sizeof the struct you
 *    compiled against): a newer library accepts an older, smaller struct and uses defaults for
 *    the fields it lacks, so the ABI grows without breaking callers.
 *  - The library never writes to stderr on its own: messages go to the log callback
 *    (vkad_set_log_callback; by default they are written to stderr, NULL silences them).
 *  - Blocking points: vkad_download, vkad_synchronize and vkad_session_destroy wait for the
 *    device (only for this session's own work). Every other call records or submits and returns.
 *  - Threads: a session is used by one thread at a time; distinct sessions are independent.
 *    An overlapping call from a second thread fails with VKAD_FAILED_PRECONDITION.
 *  - Lifetimes: a vkad_session* is live from vkad_session_create until vkad_session_destroy, a
 *    vkad_status* from the call that returned it until vkad_status_free; destroy / free each
 *    exactly once (NULL is accepted and ignored) and use neither afterwards. Kernels and
 *    ndarrays die with their session. Breaking this rule is a use-after-free that no error
 *    value can report: in a build of the library without NDEBUG (Debug) every call checks its
 *    session or status against a registry of live ones and aborts with a message on stderr
 *    ("vkad: vkad_launch: session 0x... is not live ...") -- the one case where the library
 *    writes to stderr or aborts. Release builds do not check (as Vulkan without validation).
 */
#ifndef VKAD_C_H_
#define VKAD_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions the shared library libvkad_c exports: it is built with hidden
 * visibility, so these are its only symbols (ELF; the attribute changes nothing for callers or
 * for the static library). */
#if defined(__GNUC__) || defined(__clang__)
#define VKAD_C_API __attribute__((visibility("default")))
#else
#define VKAD_C_API
#endif

/* Version of the library: major << 22 | minor << 12 | patch (Vulkan's encoding). The numbers
 * come from the file VERSION at the top of the source tree, through the generated
 * vkad_version.h (as do CMake's project version and the Python package's). */
#include "vkad_version.h"
#define VKAD_C_API_VERSION_MAJOR VKAD_VERSION_MAJOR
#define VKAD_C_API_VERSION_MINOR VKAD_VERSION_MINOR
#define VKAD_C_API_VERSION_PATCH VKAD_VERSION_PATCH
VKAD_C_API uint32_t vkad_version(void);
VKAD_C_API const char* vkad_version_string(void);

/* Error codes (the values of vkad::ErrorCode). */
typedef enum vkad_code {
  VKAD_OK = 0,
  VKAD_INVALID_ARGUMENT = 1,
  VKAD_NOT_FOUND = 2,
  VKAD_FAILED_PRECONDITION = 3,
  VKAD_OUT_OF_DEVICE_MEMORY = 4,
  VKAD_OUT_OF_HOST_MEMORY = 5,
  VKAD_DEVICE_LOST = 6,
  VKAD_UNSUPPORTED = 7,
  VKAD_NO_DEVICE = 8,
  VKAD_TIMEOUT = 9,
  VKAD_DEVICE_ERROR = 10,
  VKAD_VULKAN_ERROR = 11,
  VKAD_INTERNAL = 12
} vkad_code;

typedef struct vkad_status vkad_status;
/* The error's code (VKAD_OK for NULL) and message ("" for NULL); valid until vkad_status_free. */
VKAD_C_API vkad_code vkad_status_code(const vkad_status* status);
VKAD_C_API const char* vkad_status_message(const vkad_status* status);
VKAD_C_API void vkad_status_free(vkad_status* status); /* NULL is fine */

/* The log callback: level 0 debug, 1 info, 2 warning, 3 error. Called from any thread (validation
 * messages arrive on the thread that made the Vulkan call); must be thread-safe. `message` is
 * valid during the call only. Process-wide; NULL drops every message. */
typedef void (*vkad_log_callback)(int level, const char* message, void* user);
VKAD_C_API void vkad_set_log_callback(vkad_log_callback callback, void* user);

typedef enum vkad_dtype {
  VKAD_F32 = 0,
  VKAD_F64 = 1,
  VKAD_I32 = 2,
  VKAD_U32 = 3,
  VKAD_I64 = 4,
  VKAD_BOOL = 5
} vkad_dtype;

typedef struct vkad_session vkad_session;
typedef uint64_t vkad_kernel;
typedef uint64_t vkad_ndarray;
typedef uint64_t vkad_graph;

/* Optional features an imported device was created with (Vulkan cannot be asked): vkad uses a
 * feature only where it is stated here and supported. */
typedef struct vkad_external_features {
  int timeline_semaphore, host_query_reset, shader_int64, shader_float64, shader_float16;
  int buffer_int64_atomics, buffer_device_address;
  int atomic_float32_add, atomic_float64_add; /* VK_EXT_shader_atomic_float */
  int push_descriptor;                        /* VK_KHR_push_descriptor */
} vkad_external_features;

/* An embedder's Vulkan device for the session to share (handles as the Vulkan types, cast to
 * void pointers so this header needs no Vulkan headers). Created through the same loader
 * (libvulkan.so.1), Vulkan >= 1.2, queues [first_queue, first_queue + queue_count) of
 * queue_family created with compute. vkad never destroys these objects and never waits for the
 * whole device. The embedder must not use those queues while a vkad call runs. */
typedef struct vkad_external_device {
  uint32_t struct_size;
  void* instance;        /* VkInstance */
  void* physical_device; /* VkPhysicalDevice */
  void* device;          /* VkDevice */
  uint32_t queue_family;
  uint32_t first_queue;
  uint32_t queue_count; /* 0 means 1 */
  vkad_external_features enabled;
} vkad_external_device;

/* One Vulkan device, as vkad_device_get describes it (C++: vkad::DeviceInfo, api/devices.h).
 * Strings are NUL-terminated (cut to their arrays). */
typedef struct vkad_device_info {
  uint32_t struct_size; /* set by the caller to sizeof(vkad_device_info) */
  uint32_t index;       /* what vkad_session_options::device takes as a number */
  char name[256];
  char kind[32];        /* "discrete GPU", "integrated GPU", "virtual GPU", "CPU" or "other" */
  int cpu;              /* a CPU implementation (lavapipe) */
  uint8_t uuid[16];     /* VkPhysicalDeviceIDProperties::deviceUUID; on NVIDIA the CUDA UUID */
  char uuid_string[40]; /* "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; also a device option value */
  char driver_name[256];
  char driver_info[256];
  uint32_t vendor_id, device_id, api_version;
  int usable;    /* Vulkan >= 1.2 with a compute queue: a session can be created on it */
  int automatic; /* the device a session with no device option takes (VKAD_DEVICE counted) */
} vkad_device_info;

/* The number of Vulkan devices (usable or not). VKAD_NO_DEVICE without a Vulkan loader. */
VKAD_C_API vkad_status* vkad_device_count(uint32_t* count);
/* Device `index` (0 <= index < vkad_device_count) into *out (out->struct_size set first).
 * VKAD_NOT_FOUND for an index past the last device. */
VKAD_C_API vkad_status* vkad_device_get(uint32_t index, vkad_device_info* out);

typedef struct vkad_session_options {
  uint32_t struct_size;
  /* NULL or "": automatic; else a device UUID ("GPU-..." or vkad_device_info::uuid_string),
   * an index, or a name substring */
  const char* device;
  int validation;                       /* Khronos validation layer (also VKAD_VALIDATION=1) */
  uint32_t retirement_depth;            /* 0: the default (runtime/runtime.h, 3) */
  const vkad_external_device* external; /* NULL: vkad creates its own device */
  int optimize;                         /* run spirv-opt on compiled kernels */
  /* Empty 64 MiB device-memory blocks kept per memory type once their last array is freed
   * (so a free / allocate cycle does not go back to the driver): 0 = the default (1), -1 =
   * none (every empty block is given back at once), n > 0 = n. */
  int32_t spare_memory_blocks;
  /* The on-disk caches of compiled kernels and driver pipelines (docs/caches.md):
   * NULL = automatic (VKAD_CACHE=0 turns them off, else VKAD_CACHE_DIR, else
   * $XDG_CACHE_HOME/vkad, else ~/.cache/vkad); "" = off; else that directory. */
  const char* cache_dir;
  /* The graph passes at vkad_end_capture (docs/reference.md, "Graphs"): 0 = the default (on),
   * 1 = on, -1 = off. VKAD_GRAPH_FUSION=0 / VKAD_GRAPH_SCHEDULE=0 turn them off regardless. */
  int32_t fuse_graph_launches;
  int32_t schedule_graph_launches;
  /* Resident step loops: captured loops of launches over at most this many elements are
   * rolled into one kernel. 0 = the default (256), -1 = off, n > 0 = n; VKAD_GRAPH_RESIDENT
   * wins when set. */
  int32_t resident_max_range;
  /* Debug mode (docs/debugging.md, "NaN and infinity checks"): every float value a kernel
   * (forward or adjoint) stores or atomically adds into an ndarray is checked; the first NaN or
   * infinity of a launch is reported by the next download / synchronize as VKAD_DEVICE_ERROR
   * naming the kernel, the task and the statement. 0 = off (also VKAD_CHECK_FINITE=1 turns it
   * on). */
  int32_t check_finite;
  /* Blocked stencils (docs/graphs.md, "Blocked stencils"): consecutive captured launches of a
   * stencil kernel run up to 8 per dispatch at end_capture. 0 = the default (on), 1 = on, -1 =
   * off; VKAD_GRAPH_BLOCK=0 turns it off regardless. */
  int32_t block_stencils;
  /* The graph passes at vkad_end_capture as pipeline text (docs/graphs.md, "Graph passes"):
   * NULL or "" = the default ("rename, roll, block, recompute, prune, slice, hoist, schedule,
   * fuse"), "none" = no pass; the switches above and the VKAD_GRAPH_* variables edit it. Text
   * that does not parse is VKAD_INVALID_ARGUMENT naming what is wrong. */
  const char* graph_passes;
} vkad_session_options;

/* options may be NULL (all defaults). VKAD_NO_DEVICE when there is no usable Vulkan device. */
VKAD_C_API vkad_status* vkad_session_create(const vkad_session_options* options,
                                            vkad_session** out);
/* Blocks until this session's submissions are done, then frees everything. NULL is fine. */
VKAD_C_API void vkad_session_destroy(vkad_session* session);
/* The device's name; valid while the session lives. */
VKAD_C_API const char* vkad_session_device_name(const vkad_session* session);
/* The device's UUID as vkad_device_info::uuid_string; valid while the session lives. */
VKAD_C_API const char* vkad_session_device_uuid(const vkad_session* session);

/* Kernels from the IR text form (docs/reference.md). Parse errors name line and column. */
VKAD_C_API vkad_status* vkad_compile(vkad_session* session, const char* ir_text, vkad_kernel* out);

/* One differentiated parameter: forward parameter `param` has its gradient in adjoint
 * parameter `grad_param`. */
typedef struct vkad_gradient {
  uint32_t param;
  uint32_t grad_param;
} vkad_gradient;

#define VKAD_MAX_GRADIENTS 64
typedef struct vkad_differentiated {
  uint32_t struct_size;
  vkad_kernel forward;
  vkad_kernel adjoint;
  uint32_t forward_params; /* the adjoint takes these, then one array per gradient */
  uint32_t gradient_count;
  vkad_gradient gradients[VKAD_MAX_GRADIENTS];
} vkad_differentiated;

/* Builds the adjoint of the kernel in `ir_text`, compiles and registers both. `out->struct_size`
 * must be set by the caller. VKAD_INVALID_ARGUMENT when no parameter is marked grad, or more
 * than VKAD_MAX_GRADIENTS are. */
VKAD_C_API vkad_status* vkad_differentiate(vkad_session* session, const char* ir_text,
                                           vkad_differentiated* out);
VKAD_C_API vkad_status* vkad_kernel_release(vkad_session* session, vkad_kernel kernel);

/* ndarrays: rank 1..8, every extent > 0. */
VKAD_C_API vkad_status* vkad_ndarray_create(vkad_session* session, vkad_dtype dtype, uint32_t rank,
                                            const uint32_t* shape, const char* name,
                                            vkad_ndarray* out);
VKAD_C_API vkad_status* vkad_ndarray_free(vkad_session* session, vkad_ndarray array);
/* Recorded on the device, ordered with launches; no wait. fill converts `value` to the
 * array's dtype (integers truncate toward zero; bool takes 0 or 1) and fails with
 * VKAD_INVALID_ARGUMENT, changing nothing, for a value the dtype cannot hold (1e20 into i32,
 * -1 into u32, 1e300 into f32, NaN into an integer). */
VKAD_C_API vkad_status* vkad_ndarray_zero(vkad_session* session, vkad_ndarray array);
VKAD_C_API vkad_status* vkad_ndarray_fill(vkad_session* session, vkad_ndarray array, double value);
/* `bytes` must equal the array's size. upload copies `data` before it returns (no wait). */
VKAD_C_API vkad_status* vkad_upload(vkad_session* session, vkad_ndarray array, const void* data,
                                    uint64_t bytes);
/* BLOCKS until the array's last writer has finished. */
VKAD_C_API vkad_status* vkad_download(vkad_session* session, vkad_ndarray array, void* out,
                                      uint64_t bytes);

/* A launch argument: a scalar of `dtype`, or an ndarray. Build them with the helpers below. */
typedef struct vkad_arg {
  uint32_t is_ndarray;
  vkad_dtype dtype;
  double f;  /* f32, f64 */
  int64_t i; /* i32, u32, i64, bool */
  vkad_ndarray array;
} vkad_arg;

static inline vkad_arg vkad_arg_f32(float v) {
  vkad_arg a = {0, VKAD_F32, v, 0, 0};
  return a;
}
static inline vkad_arg vkad_arg_f64(double v) {
  vkad_arg a = {0, VKAD_F64, v, 0, 0};
  return a;
}
static inline vkad_arg vkad_arg_i32(int32_t v) {
  vkad_arg a = {0, VKAD_I32, 0, v, 0};
  return a;
}
static inline vkad_arg vkad_arg_u32(uint32_t v) {
  vkad_arg a = {0, VKAD_U32, 0, (int64_t)v, 0};
  return a;
}
static inline vkad_arg vkad_arg_ndarray(vkad_ndarray h) {
  vkad_arg a = {1, VKAD_F32, 0, 0, h};
  return a;
}

/* Asynchronous: validates and records. launch_id (may be NULL) receives the launch's sequence
 * number, which device errors name. */
VKAD_C_API vkad_status* vkad_launch(vkad_session* session, vkad_kernel kernel, const vkad_arg* args,
                                    uint32_t arg_count, uint64_t* launch_id);
/* BLOCKS while it makes the pipelines vkad_launch with these arguments would use (the
 * specialized adstack variants, otherwise made inside the first such launch: tens of ms on
 * NVIDIA); launches nothing. Errors as vkad_launch's. Call it before a hot loop. */
VKAD_C_API vkad_status* vkad_prepare(vkad_session* session, vkad_kernel kernel,
                                     const vkad_arg* args, uint32_t arg_count);
/* One launch of a step loop's body (vkad_launch_loop): its kernel, its arguments in the loop's
 * first iteration and, per argument, what an i32 scalar gains per iteration (step NULL: none
 * steps; else arg_count entries, 0 for an argument that stays). */
typedef struct vkad_loop_launch {
  vkad_kernel kernel;
  const vkad_arg* args;
  const int32_t* step;
  uint32_t arg_count;
} vkad_loop_launch;
/* A step loop (docs/graphs.md, "Step loops"): `count` iterations of `body` (body_count launches),
 * iteration r launching each with its stepping scalars advanced by r * step -- the results of
 * those launches one by one. Where every launch of the body qualifies for a resident kernel
 * (1-d parallel tasks whose ranges do not step and are at most the session's
 * resident_max_range, at most 31 arrays -- 94 where the device's pipelines bind more storage
 * buffers than its push descriptors --, count >= 4) it is one launch of the rolled kernel
 * (compiled at the first loop of its shape, kept), else the launches one by one. `rolled` (may
 * be NULL) gets 1 or 0 accordingly. Asynchronous. Fails, launching nothing, where a launch
 * would fail in the first or the last iteration, or a step is on anything but an i32 scalar or
 * takes it past i32 (VKAD_INVALID_ARGUMENT naming the body's launch and the iteration). A tape
 * does not record it (vkad_tape_launch records launches one at a time). */
VKAD_C_API vkad_status* vkad_launch_loop(vkad_session* session, const vkad_loop_launch* body,
                                         uint32_t body_count, uint32_t count, int* rolled);
/* Submits what was recorded; no wait. */
VKAD_C_API vkad_status* vkad_flush(vkad_session* session);
/* BLOCKS until everything this session submitted has finished; reports device errors. */
VKAD_C_API vkad_status* vkad_synchronize(vkad_session* session);
/* BLOCKS like vkad_synchronize, then returns the runtime's idle memory (rings, adstack heaps,
 * spare memory blocks) to the driver; arrays, kernels and graphs are kept. Between phases of a
 * program: the next launches make what they need again. */
VKAD_C_API vkad_status* vkad_release_idle_memory(vkad_session* session);
/* Starts vkad_stats' memory peaks again from what is held now (to measure one phase). */
VKAD_C_API vkad_status* vkad_reset_memory_peaks(vkad_session* session);
/* A timeline of what runs between the two calls (docs/debugging.md, vkad::Session::
 * begin_timeline): each launch, fill, copy and upload timed on the device, submissions and
 * waits on the host. max_events: events kept (0: the default, 1,000,000). vkad_timeline_end
 * waits for the device; it writes a Chrome trace / Perfetto JSON file to trace_path (NULL: no
 * file) and the per-kernel summary table NUL-terminated into summary (size bytes, truncated to
 * fit; NULL when size is 0), with *summary_needed (may be NULL) its full length + 1 and
 * *event_count (may be NULL) the number of events kept. VKAD_FAILED_PRECONDITION for an end
 * without a begin, a second begin, or either while capturing. */
/* Where the session's kernels' print statements (and the lines saying a launch dropped
 * records) go (docs/debugging.md, vkad::Session::set_print_sink): `sink` is called with each
 * line, NUL-terminated and without its newline (`length` bytes; valid during the call only),
 * on the thread whose vkad call retired the launch (a flush, a synchronize, a download, a later
 * launch), in launch order. NULL: stdout (the default). `user` is passed back unchanged. */
typedef void (*vkad_print_sink)(const char* line, size_t length, void* user);
VKAD_C_API vkad_status* vkad_session_set_print_sink(vkad_session* session, vkad_print_sink sink,
                                                    void* user);
VKAD_C_API vkad_status* vkad_timeline_begin(vkad_session* session, uint64_t max_events);
/* As vkad_timeline_begin, with a graph's first replay and every replay_sample-th after it timed
 * launch by launch and the others as one event each (0: the default, 16; 1: every replay). */
VKAD_C_API vkad_status* vkad_timeline_begin_sampled(vkad_session* session, uint64_t max_events,
                                                    uint32_t replay_sample);
VKAD_C_API vkad_status* vkad_timeline_end(vkad_session* session, const char* trace_path,
                                          char* summary, size_t size, size_t* summary_needed,
                                          uint64_t* event_count);

/* Captured launch sequences: launches (vkad_launch, vkad_tape_launch, vkad_tape_backward,
 * zero / fill) between vkad_begin_capture and vkad_end_capture are checked and planned but
 * not run; vkad_replay runs them all with one call (asynchronous, like a launch), binding the
 * same arrays (a freed one fails the replay, naming it, with nothing run). While capturing,
 * vkad_flush submits nothing and upload, download and synchronize fail with
 * VKAD_FAILED_PRECONDITION. A replay may replace scalar arguments: `updates[i]` names a
 * captured launch (0-based, capture order), its parameter and the new value; kept for later
 * replays. `first_launch_id` (may be NULL) receives the sequence number of the graph's first
 * launch in this replay; device errors name these numbers. */
typedef struct vkad_graph_update {
  uint32_t launch;
  uint32_t param;
  vkad_arg value;
} vkad_graph_update;
VKAD_C_API vkad_status* vkad_begin_capture(vkad_session* session,
                                           const char* name /* NULL: "graph" */);
VKAD_C_API vkad_status* vkad_end_capture(vkad_session* session, vkad_graph* out);
VKAD_C_API vkad_status* vkad_replay(vkad_session* session, vkad_graph graph,
                                    const vkad_graph_update* updates, uint32_t update_count,
                                    uint64_t* first_launch_id);
VKAD_C_API vkad_status* vkad_graph_release(vkad_session* session, vkad_graph graph);
/* The names of a graph's launches, in the numbering vkad_graph_update::launch takes
 * (vkad::Session::graph_launch_names): the kernel's name, "#k" appended to its k-th repeat.
 * `*count` receives how many launches the graph has; the name of launch `index` is written
 * NUL-terminated into `name` (`size` bytes; may be NULL when size is 0) and `*needed` (may be
 * NULL) receives its length + 1. VKAD_INVALID_ARGUMENT when index >= *count or the name does
 * not fit (nothing written then but *count and *needed). vkad_graph_launch_index finds a name's
 * launch (VKAD_NOT_FOUND, the graph's names in the message, when none has it). */
VKAD_C_API vkad_status* vkad_graph_launch_name(const vkad_session* session, vkad_graph graph,
                                               uint32_t index, uint32_t* count, char* name,
                                               size_t size, size_t* needed);
VKAD_C_API vkad_status* vkad_graph_launch_index(const vkad_session* session, vkad_graph graph,
                                                const char* name, uint32_t* out);
/* vkad_begin_capture with flags (0: the same). VKAD_CAPTURE_BACKGROUND_REWORK: vkad_end_capture
 * returns at once and the graph's rework (scheduling, fusion, the compiles of the kernels they
 * make) runs on a thread of its own; replays run the launches as captured until the first one
 * that finds it done installs it (docs/graphs.md, "The rework in the background").
 * VKAD_CAPTURE_RUN: the capture also runs what it captures, in order, while it goes on
 * (docs/graphs.md, "A capture that runs"); vkad_end_capture returns once every step is submitted.
 * Unknown flags: VKAD_INVALID_ARGUMENT. */
#define VKAD_CAPTURE_BACKGROUND_REWORK 1u
#define VKAD_CAPTURE_RUN 2u
VKAD_C_API vkad_status* vkad_begin_capture_flags(vkad_session* session, const char* name,
                                                 uint32_t flags);
/* Waits for the graph's background rework, if one is pending, and installs it (replays run the
 * reworked graph from then on); nothing for another graph. */
VKAD_C_API vkad_status* vkad_graph_finish_rework(vkad_session* session, vkad_graph graph);

/* Tapes (api/tape.h): a tape launches and records forwards of differentiated kernels, and
 * vkad_tape_backward zeroes their gradients (one barrier pair for all), seeds, and launches
 * the adjoints last-first. Gradient arrays (same dtype and shape as their array) are made by the
 * first backward that needs them and kept across vkad_tape_reset, so a loop of reset / launches
 * / backward allocates nothing after its first iteration; the gradient of an array freed
 * meanwhile is freed by the next reset or backward, the rest by vkad_tape_destroy. A tape
 * borrows its session: destroy every tape before its session (Debug builds abort otherwise, as
 * for a dead session). A recorded launch keeps its arrays' handles, not copies: keep them alive
 * and unchanged until backward (docs/tape.md). */
typedef struct vkad_tape vkad_tape;
VKAD_C_API vkad_status* vkad_tape_create(vkad_session* session, vkad_tape** out);
VKAD_C_API void vkad_tape_destroy(vkad_tape* tape); /* NULL is fine */
/* Launches d->forward with the arguments (as vkad_launch: asynchronous, launch_id may be NULL)
 * and records it. `d` is what vkad_differentiate wrote (its struct_size set). Fails, recording
 * and launching nothing, when arg_count is not d->forward_params, when it passes one array for
 * a parameter it writes and one it reads (in place: its adjoint would read what it wrote;
 * VKAD_INVALID_ARGUMENT naming both parameters), when the launch
 * would overwrite what an earlier launch of the recording read or wrote through a differentiated
 * parameter (VKAD_INVALID_ARGUMENT naming both launches, the array and the row: backward would
 * give wrong gradients; api/tape_hazards.h), or as vkad_launch fails. */
VKAD_C_API vkad_status* vkad_tape_launch(vkad_tape* tape, const vkad_differentiated* d,
                                         const vkad_arg* args, uint32_t arg_count,
                                         uint64_t* launch_id);
/* d(objective)/d(array) for one output: `value` for every element, or when `data` is not NULL,
 * `bytes` of host data (exactly the array's size; copied before the call returns). */
typedef struct vkad_seed {
  vkad_ndarray array;
  double value;
  const void* data;
  uint64_t bytes;
} vkad_seed;
/* Records: zero every gradient of the recording, seed, launch the adjoints last-first; no wait.
 * VKAD_INVALID_ARGUMENT, nothing recorded, when nothing was recorded since the last reset, a
 * seed's array is not a differentiated argument of any recorded launch, or its data has the
 * wrong size. seeds may be NULL when count is 0. */
VKAD_C_API vkad_status* vkad_tape_backward(vkad_tape* tape, const vkad_seed* seeds, uint32_t count);
/* The gradient array of `array` (the tape's, or the one given to vkad_tape_set_grad).
 * VKAD_INVALID_ARGUMENT when the tape holds none for it. */
VKAD_C_API vkad_status* vkad_tape_grad(const vkad_tape* tape, vkad_ndarray array,
                                       vkad_ndarray* out);
/* The gradient of differentiated scalar parameter `param` (f32 / f64, marked grad) of
 * d->forward: a 1-element array the tape made at a backward, holding d(objective)/d(value)
 * summed over every recorded launch of d->forward (vkad::Tape::scalar_grad). VKAD_INVALID_-
 * ARGUMENT when `param` is no such parameter or no backward ran over a launch of it. */
VKAD_C_API vkad_status* vkad_tape_scalar_grad(const vkad_tape* tape, const vkad_differentiated* d,
                                              uint32_t param, vkad_ndarray* out);
/* Makes `grad` (the caller's; never freed by the tape) the gradient of `array`: same dtype and
 * shape, or VKAD_INVALID_ARGUMENT. */
VKAD_C_API vkad_status* vkad_tape_set_grad(vkad_tape* tape, vkad_ndarray array, vkad_ndarray grad);
/* Forgets the recorded launches; keeps the gradients (except those of freed arrays). */
VKAD_C_API vkad_status* vkad_tape_reset(vkad_tape* tape);
/* Checkpointing across launches (vkad::Tape::set_checkpoint_every, api/tape.h): the recording
 * may reuse state arrays; the tape copies what each segment of `launches_per_segment` launches
 * overwrites and, in backward, launches each segment's forward again. 0 turns it off. An error
 * (VKAD_FAILED_PRECONDITION) while launches are recorded: set it before a recording or after
 * vkad_tape_reset. */
VKAD_C_API vkad_status* vkad_tape_set_checkpoint(vkad_tape* tape, uint32_t launches_per_segment);
/* Checkpointing within a memory budget (vkad::Tape::set_memory_budget, docs/tape.md): the
 * tape's copies stay within `bytes` of device memory and backward runs the forward again the
 * fewest times that allows. 0 turns it off; replaces vkad_tape_set_checkpoint (and is replaced
 * by it). VKAD_FAILED_PRECONDITION while launches are recorded. A budget below what the
 * recording needs: VKAD_INVALID_ARGUMENT from the launch or the backward that finds it, the
 * message naming the least bytes that would do. */
VKAD_C_API vkad_status* vkad_tape_set_memory_budget(vkad_tape* tape, uint64_t bytes);
/* A fill of `array` in its place on the tape (vkad::Tape::fill): a plain fill where no recorded
 * launch was passed the array; recorded by a checkpointing tape (run again by backward, the
 * array's gradient zeroed there); VKAD_INVALID_ARGUMENT without checkpointing otherwise. */
VKAD_C_API vkad_status* vkad_tape_fill(vkad_tape* tape, vkad_ndarray array, double value);
/* The schedule the next backward runs for the recording so far (vkad::Tape::checkpoint_plan). */
typedef struct vkad_checkpoint_plan {
  uint32_t struct_size;  /* set by the caller to sizeof(vkad_checkpoint_plan) */
  uint32_t launches;     /* the recording's */
  uint32_t levels;       /* levels of checkpoints; every launch runs this many times */
  uint32_t segments[24]; /* launches per segment per level, outermost first (`levels` of them) */
  uint64_t peak_bytes;   /* the copies held at once, at most */
  uint64_t min_bytes;    /* the least any schedule for this recording holds */
} vkad_checkpoint_plan;
/* VKAD_FAILED_PRECONDITION without checkpointing or a recording; VKAD_INVALID_ARGUMENT (the
 * least bytes named) where the budget fits no schedule. */
VKAD_C_API vkad_status* vkad_tape_checkpoint_plan(const vkad_tape* tape, vkad_checkpoint_plan* out);
/* Whether vkad_tape_grad of an array a recorded launch overwrote holds d(objective)/d(its
 * value after that launch) (1: checkpointing off) or is 0 on the overwritten elements (0: a
 * checkpointed tape gives d(objective)/d(the array as the recording found it); input gradients
 * are the same either way). vkad::Tape::keeps_intermediate_gradients, docs/tape.md. */
VKAD_C_API vkad_status* vkad_tape_keeps_intermediate_gradients(const vkad_tape* tape, int* out);

typedef struct vkad_stats {
  uint32_t struct_size;
  uint64_t launches, flushes, forced_waits, ndarrays, kernels_cached;
  uint64_t memory_block_bytes, memory_used_bytes, adstack_heap_bytes;
  uint64_t vulkan_objects_created; /* constant over a steady-state training loop */
  /* Kernels compiled, and compiles answered from the session's memory; kernels read from the
   * on-disk cache, compiled because it had no usable file, and of those rebuilt over a corrupt
   * or stale file; 1 if the driver's pipeline cache was read from disk at creation. */
  uint64_t kernels_compiled, compile_cache_hits;
  uint64_t disk_cache_hits, disk_cache_misses, disk_cache_rebuilt;
  uint64_t pipeline_cache_loaded;
  /* Device memory by owner (vkad::SessionStats): the user's live ndarrays; the runtime's own
   * (args ring + readback ring + adstack heaps + spare memory blocks + freed tape gradients
   * pooled for the next tape), which vkad_release_idle_memory returns to the driver; live
   * VkBuffers. */
  uint64_t user_bytes, runtime_bytes, args_ring_bytes, readback_ring_bytes, spare_block_bytes;
  uint64_t ndarray_pool_bytes, live_buffers;
  /* Compute dispatches recorded (a launch's tasks; a replay's launches again). */
  uint64_t dispatches;
  /* The most device memory held at once (blocks; of which in live buffers) since the session
   * was made or vkad_reset_memory_peaks. */
  uint64_t memory_peak_block_bytes, memory_peak_used_bytes;
  /* Compute barriers recorded after those dispatches (a replay's again): the dispatches the
   * next one waited behind; a graph's schedule leaves out those between independent launches. */
  uint64_t barriers;
} vkad_stats;
/* Fails (VKAD_FAILED_PRECONDITION) while another thread is inside the session. */
VKAD_C_API vkad_status* vkad_session_stats(const vkad_session* session, vkad_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* VKAD_C_H_ */
