// vkad::Session — the front door. One object holds a device, compiles kernels for that device's
// own target, differentiates them, owns ndarrays and launches asynchronously:
//
//   auto session = vkad::Session::create();           // a GPU if there is one, else lavapipe
//   if (!session.ok()) { report(session.status()); return; }
//   vkad::Session& s = **session;
//   auto d = s.differentiate(forward_kernel);          // forward + adjoint + gradient map
//   auto x = s.ndarray(vkad::DType::kF32, {n}, "x");
//   s.upload(*x, host_x); s.zero(*x_grad); s.fill(*y_grad, 1.0);
//   s.launch(d->forward, {Arg::ndarray(*x), ...});   // recorded, not waited for
//   s.launch(d->adjoint, d->adjoint_args(forward_args, grads));
//   s.download(*x_grad, host_grad);                   // the blocking point
//
// Contract: every fallible call returns Status / Result (nothing throws); a failed call changes
// nothing. Blocking points are download() and synchronize() (and destruction, which waits for
// this session's own work only); everything else records or submits without waiting. A Session
// is externally synchronised (one thread at a time, as runtime::Runtime, which it wraps); two
// sessions on two threads are independent.
//
// The advanced surface (runtime::Runtime, codegen::compile, rhi::) stays available through
// runtime(); a Session never hands out anything that can break its invariants.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "abi/handles.h"
#include "autodiff/adjoint_plan.h"
#include "graph/gather_recompute.h"
#include "graph/graph_rework.h"
#include "graph/graph_schedule.h"
#include "graph/kernel_catalog.h"
#include "graph/resident.h"
#include "ir/ir.h"
#include "ir/launch_access.h"
#include "ir/target.h"
#include "runtime/defaults.h"
#include "runtime/launch_origin.h"
#include "runtime/timeline.h"
#include "spirv/compiler.h"

namespace vkad {
namespace runtime {
class Runtime;
struct RuntimeOptions;
}  // namespace runtime

using runtime::Arg;
using runtime::DType;
using runtime::GraphHandle;
using runtime::GraphUpdate;
using runtime::KernelHandle;
using runtime::LaunchId;
using runtime::NdArrayHandle;
using runtime::Timeline;
using runtime::TimelineEvent;
using runtime::TimelineKernelSummary;

// The compile options a Session uses unless told otherwise: codegen's defaults with
// specialize_shapes on. Besides its generic pipeline (made at compile), a kernel then gets a
// pipeline per shape set it is launched with, its array extents constants the driver folds:
// fewer registers and no spills in gather / scatter kernels (DiffTaichi's diffmpm on an H100:
// g2p_adjoint's 7,680 B of spills gone, p2g_adjoint 167 -> 96 registers; its iteration as
// captured 30.5 -> 28.7 ms). A shape's pipeline is made on a thread at its first launch,
// which runs the generic one (RuntimeOptions::background_specialization), or at once by
// prepare(); at most RuntimeOptions::adstack_specialize_max_variants per task, further shapes
// run the generic one. VKAD_SPECIALIZE_SHAPES=0 in the environment turns it off for every
// session.
inline codegen::CompileOptions default_compile_options() {
  codegen::CompileOptions o;
  o.specialize_shapes = true;
  return o;
}

struct SessionOptions {
  // "" = automatic (a discrete GPU first, lavapipe last; the VKAD_DEVICE environment variable
  // when set), else a device UUID ("GPU-..." as nvidia-smi prints it, or vkad::devices()'s
  // form), a device index, or a substring of its name (api/devices.h lists them).
  std::string device;
  bool validation = false;  // the Khronos validation layer (also VKAD_VALIDATION=1)
  // Submissions in flight before the host waits for the oldest.
  size_t retirement_depth = runtime::kDefaultRetirementDepth;
  // Empty device-memory blocks (64 MiB each) the allocator keeps per memory type after their
  // last array is freed, so a free / allocate cycle does not go back to the driver; 0 gives
  // every empty block back at once (docs/memory.md, "Memory").
  uint32_t spare_memory_blocks = 1;
  // Applied to every kernel this session compiles. A session's default differs from
  // codegen's in one field, specialize_shapes (default_compile_options()).
  codegen::CompileOptions compile = default_compile_options();
  // Fuse element-wise runs of captured launches at end_capture (Session::begin_capture);
  // VKAD_GRAPH_FUSION=0 in the environment turns it off for every session.
  bool fuse_graph_launches = true;
  // Order captured launches by their dependences and drop the barriers between independent
  // ones at end_capture (Session::begin_capture, "Graph scheduling"); VKAD_GRAPH_SCHEDULE=0 in
  // the environment turns it off for every session.
  bool schedule_graph_launches = true;
  // Roll a captured step loop of small launches into one resident kernel at end_capture
  // (graph/resident.h; docs/graphs.md, "Resident step loops"): launches whose ranges are all at
  // most this many elements, repeated with the same kernels and arrays and stepping i32 scalars.
  // 0 turns it off; VKAD_GRAPH_RESIDENT=0 in the environment turns it off for every session,
  // VKAD_GRAPH_RESIDENT=<n> sets the limit. 256: one pass of the largest resident workgroup, so
  // a rolled launch never runs longer than one of its invocations where a dispatch of it would
  // occupy a compute unit or two anyway; wider ranges may do better spread over the GPU.
  uint32_t resident_max_range = 256;
  // Run consecutive captured launches of a stencil kernel (reads of what the run writes at
  // bounded offsets of the thread's cell: neighbour stencils, a time axis, Jacobi sweeps) up to
  // 8 per dispatch, the halo recomputed, at end_capture (graph/stencil_blocking.h;
  // docs/graphs.md, "Blocked stencils"); VKAD_GRAPH_BLOCK=0 in the environment turns it off for
  // every session.
  bool block_stencils = true;
  // The on-disk caches (compiled kernels and the driver's pipeline cache; README, "Caches on
  // disk"): nullopt = automatic (VKAD_CACHE=0 turns them off, else VKAD_CACHE_DIR, else
  // $XDG_CACHE_HOME/vkad, else ~/.cache/vkad); "" = off; else that directory.
  std::optional<std::string> cache_dir;
};

// A snapshot of what a session holds and has done.
struct SessionStats {
  uint64_t launches = 0;
  // Compute dispatches recorded (a launch's tasks; every replay's again): the figure a device's
  // per-dispatch cost multiplies (docs/benchmarks.md, the DiffTaichi race's dispatches column).
  uint64_t dispatches = 0;
  uint64_t flushes = 0;
  uint64_t forced_waits = 0;  // times a flush waited for the oldest submission
  double forced_wait_ms = 0;  // host time those waits took (the device pacing the host)
  uint64_t ndarrays = 0;
  uint64_t kernels_cached = 0;      // pipelines held (kernels registered or kept for reuse)
  uint64_t memory_block_bytes = 0;  // device memory held
  uint64_t memory_used_bytes = 0;   // ... of which in live buffers
  uint64_t adstack_heap_bytes = 0;  // reverse-mode stack storage held now
  // Vulkan objects and memory blocks created so far: constant across the iterations of a
  // training loop in its steady state (launch args and small transfers use recycled rings).
  uint64_t vulkan_objects_created = 0;
  // Kernels compiled to validated SPIR-V, and compiles answered from the session's cache (the
  // same kernel text compiled again: no emission, no validation).
  uint64_t kernels_compiled = 0;
  uint64_t compile_cache_hits = 0;
  // The on-disk kernel cache (SessionOptions::cache_dir): kernels read from it instead of
  // compiled, kernels it did not have (compiled and written), and of those the files found
  // corrupt or stale (rebuilt); 0 when it is off.
  uint64_t disk_cache_hits = 0;
  uint64_t disk_cache_misses = 0;
  uint64_t disk_cache_rebuilt = 0;
  // The driver's pipeline cache was read from disk when the session started.
  bool pipeline_cache_loaded = false;
  // Pipelines the driver made so far (specialized variants included; Runtime::prepare makes
  // a launch's ahead of it) and the milliseconds it took: what a first launch may wait for.
  uint64_t pipelines_created = 0;
  double pipeline_create_ms = 0;
  // Captured launches that graphs captured so far run inside resident kernels (docs/graphs.md,
  // "Resident step loops").
  uint64_t rolled_launches = 0;
  // Captured launches that graphs captured so far run inside blocked stencil dispatches
  // (docs/graphs.md, "Blocked stencils").
  uint64_t blocked_launches = 0;
  // Session::launch_loop calls that ran as one launch of a resident kernel (docs/graphs.md,
  // "Step loops").
  uint64_t rolled_loops = 0;
  // Session::launch_loop calls that launched a plan rework_loop made (docs/graphs.md, "Step
  // loops").
  uint64_t reworked_loops = 0;
  // Captured launches that graphs captured so far run rewritten to compute what they gather
  // from an earlier launch (docs/graphs.md, "Gather recompute").
  uint64_t recomputed_launches = 0;
  // Device memory by owner (Runtime's RuntimeStats). The user's: live ndarrays (user_bytes).
  // The runtime's own, which release_idle_memory() returns to the driver when idle: the args
  // ring, the readback ring, the adstack heaps (adstack_heap_bytes), empty memory blocks kept
  // for reuse (spare_block_bytes) and freed tape gradients kept for the next tape's
  // (ndarray_pool_bytes); runtime_bytes sums them. live_buffers counts the VkBuffers alive (the
  // user's and the runtime's).
  uint64_t user_bytes = 0;
  uint64_t runtime_bytes = 0;
  uint64_t args_ring_bytes = 0;
  uint64_t readback_ring_bytes = 0;
  uint64_t spare_block_bytes = 0;
  uint64_t ndarray_pool_bytes = 0;
  uint64_t live_buffers = 0;
};

// One differentiated parameter: forward parameter `param` (an ndarray marked grad) has its
// gradient in adjoint parameter `grad_param`, called `name` (`<param name>_grad`).
struct GradientParam {
  uint32_t param = 0;
  uint32_t grad_param = 0;
  std::string name;
};

// What differentiate() returns: both kernels registered, and the map from each differentiated
// parameter to its gradient. The adjoint's parameters are the forward's, in order, then one
// gradient array per entry of `gradients`, in that order.
struct Differentiated {
  KernelHandle forward;
  KernelHandle adjoint;
  uint32_t forward_params = 0;
  std::vector<GradientParam> gradients;
  // The adjoint's argument list: the forward's arguments, then `grads` (one ndarray per entry
  // of `gradients`, in order). kInvalidArgument if the counts disagree.
  Result<std::vector<Arg>> adjoint_args(std::span<const Arg> forward_args,
                                        std::span<const NdArrayHandle> grads) const;
};

class PhaseClock;  // api/phase_clock.h: a slow path's phases (VKAD_GRAPH_TRACE)

// One launch of a step loop's body (Session::launch_loop): the kernel, its arguments in the
// loop's first iteration, and per parameter what an i32 scalar argument gains per iteration
// (DiffTaichi's step index t; 0 for every other argument; empty: nothing steps).
struct LoopLaunch {
  KernelHandle kernel;
  std::vector<Arg> args;
  std::vector<int32_t> step;
};
// How Session::launch_loop ran a loop.
struct LoopInfo {
  bool rolled = false;    // one launch of a resident kernel (docs/graphs.md, "Step loops")
  bool reworked = false;  // the launches of the plan Session::rework_loop made
  uint32_t launches = 0;  // launches recorded: 1 when rolled, that plan's launches when
                          // reworked, else count x body size (fewer when launch_loop failed
                          // part way)
};

// How Session::begin_capture treats what it captures.
struct CaptureOptions {
  // end_capture returns at once with the graph as captured and its rework (resident loops,
  // gather recompute, scheduling, fusion and the kernels they make, compiled) runs on a thread
  // of its own. A replay that finds the rework done installs it (registers its kernels, records
  // the reworked graph: a few ms, once) and runs it from then on; until then a replay runs the
  // launches as captured, with the same results (atomic adds may sum in another order). The
  // first iteration of a training loop then costs its recording and one replay as captured,
  // not the rework. Scalar updates made before the install carry over. While the rework runs,
  // compile / differentiate / clearing_adjoint / release(kernel), the next end_capture,
  // release_graph of this graph (which drops the rework) and the destructor wait for it.
  bool background_rework = false;
  // The capture also runs what it captures, in order, as the launches and fills would have run
  // (Runtime::begin_capture's `run`): a thread records the captured steps in pieces and the
  // device runs them while the capture goes on. A training loop's first iteration is then its
  // capture alone -- no replay after it. end_capture returns once every step is submitted.
  bool run = false;
};

class Session {
 public:
  // Creates a device (options.runtime.device picks it) and its runtime. kNoDevice when no Vulkan
  // device qualifies; kInvalidArgument for options out of range.
  static Result<std::unique_ptr<Session>> create(const SessionOptions& options = {});
  // Every runtime option (runtime/runtime.h: flush policy, memory limits, an imported Vulkan
  // device, ...), for embedders that need more than SessionOptions.
  static Result<std::unique_ptr<Session>> create(const runtime::RuntimeOptions& runtime,
                                                 const codegen::CompileOptions& compile);
  // Every runtime option from `runtime`, and from `options` what a session adds over its
  // runtime: compile options and the graph passes (fuse_graph_launches,
  // schedule_graph_launches, resident_max_range). `options`' device, validation,
  // retirement_depth, spare_memory_blocks and cache_dir are not read (`runtime` has them).
  // The C ABI's vkad_session_create comes through here. The other two create()s are this one
  // with SessionOptions' defaults where they say nothing.
  static Result<std::unique_ptr<Session>> create_with_runtime(
      const runtime::RuntimeOptions& runtime, const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The target every kernel is compiled for: this session's device's capabilities.
  const codegen::Target& target() const { return target_; }
  const std::string& device_name() const { return target_.device_name; }
  // The device's UUID as vkad::devices() lists it ("xxxxxxxx-xxxx-..."): which physical device
  // this session runs on, comparable with CUDA's UUIDs (api/devices.h).
  const std::string& device_uuid() const { return device_uuid_; }

  // --- kernels ---
  // Verifies, compiles for target() and registers. Errors name the statement (bad IR), or say
  // what the device lacks (kUnsupported).
  Result<KernelHandle> compile(const codegen::Kernel& kernel);
  // The same from the IR text form (ir/text.h); parse errors name line and column.
  Result<KernelHandle> compile(std::string_view ir_text);
  // Builds the adjoint (codegen::make_adjoint), compiles and registers both kernels. kInvalid-
  // Argument when no parameter is marked grad.
  Result<Differentiated> differentiate(const codegen::Kernel& forward);
  Result<Differentiated> differentiate(std::string_view ir_text);
  // The adjoint of d.forward in which a store's adjoint also clears the seed it read
  // (codegen::make_clearing_adjoint): same parameters as d.adjoint. Built and compiled on the
  // first call per forward, then kept. What a checkpointed Tape (api/tape.h) launches.
  // kInvalidArgument when d.forward is not a live differentiate() result of this session.
  Result<KernelHandle> clearing_adjoint(const Differentiated& d);
  // What the forward kernel of a differentiate() reads and writes of each ndarray, with the
  // launch-uniform rows (ir/launch_access.h): computed once by differentiate, shared with
  // the tapes that record it (api/tape_hazards.h). Null for any other handle, and once released.
  std::shared_ptr<const codegen::KernelAccess> launch_access(KernelHandle forward) const;
  // Drops a kernel (both of a Differentiated are dropped separately). A graph captured with it
  // keeps working (the runtime keeps what a captured launch needs).
  Status release(KernelHandle kernel);

  // --- ndarrays ---
  Result<NdArrayHandle> ndarray(DType dtype, std::vector<uint32_t> shape,
                                const std::string& name = "");
  Status free(NdArrayHandle array);
  // Sets every element to 0 / to `value` converted to the array's dtype (float -> integer
  // truncates toward zero; bool takes 0 or 1). A value the dtype cannot hold (1e20 into i32,
  // -1 into u32, 1e300 into f32, NaN into an integer) is kInvalidArgument and changes nothing,
  // as for launch's scalar arguments (Runtime::fill). Recorded on the device, ordered with
  // launches; nothing waits. An f64 or i64 value whose two 32-bit halves differ is staged from
  // the host (still recorded, still no wait); inside a graph capture it is written by the
  // command buffer itself (rhi::CommandList::fill64), so a replay writes it too.
  Status zero(NdArrayHandle array);
  Status fill(NdArrayHandle array, double value);
  // Copies one array into another of the same dtype and shape on the device, ordered with
  // launches; nothing waits (runtime::Runtime::copy). Not while capturing.
  Status copy(NdArrayHandle src, NdArrayHandle dst);
  // Zeroes every array of `arrays` with one barrier pair around one fill each
  // (runtime::Runtime::zero_many): every handle is checked first, and an error (naming the bad
  // handle) records nothing.
  Status zero(std::span<const NdArrayHandle> arrays);
  // Host <-> device; `bytes` must equal the array's size. upload copies the data before it
  // returns; download blocks until the array's last writer has finished.
  Status upload(NdArrayHandle array, const void* data, uint64_t bytes);
  Status download(NdArrayHandle array, void* out, uint64_t bytes);
  template <typename T>
  Status upload(NdArrayHandle array, std::span<const T> data) {
    return upload(array, data.data(), data.size_bytes());
  }
  template <typename T>
  Status download(NdArrayHandle array, std::span<T> out) {
    return download(array, out.data(), out.size_bytes());
  }
  Result<std::vector<uint32_t>> shape(NdArrayHandle array) const;
  // One axis's extent without copying the shape (kInvalidArgument past the array's rank).
  Result<uint32_t> extent(NdArrayHandle array, uint32_t axis) const;
  Result<DType> dtype(NdArrayHandle array) const;
  Result<std::string> name(NdArrayHandle array) const;  // as given to ndarray()

  // --- execution ---
  // Asynchronous: validates and records; see runtime::Runtime::launch for the errors.
  Status launch(KernelHandle kernel, std::span<const Arg> args, LaunchId* id = nullptr);
  Status launch(KernelHandle kernel, std::initializer_list<Arg> args, LaunchId* id = nullptr) {
    return launch(kernel, std::span<const Arg>(args.begin(), args.size()), id);
  }
  // Makes the pipelines launch(kernel, args) would use, without launching (runtime::Runtime::
  // prepare): moves the creation of specialized variants out of the first launch.
  Status prepare(KernelHandle kernel, std::span<const Arg> args);
  Status prepare(KernelHandle kernel, std::initializer_list<Arg> args) {
    return prepare(kernel, std::span<const Arg>(args.begin(), args.size()));
  }
  // A step loop (docs/graphs.md, "Step loops"): `count` iterations of `body`, iteration r launching
  // each of body's launches in order with its stepping scalars advanced by r x step -- the
  // results of those launches one by one. Where every launch of the body may run in a resident
  // kernel (the rules of "Resident step loops": parallel 1-d tasks whose ranges do not step and
  // are at most SessionOptions::resident_max_range, at most 31 distinct arrays, count >= 4) the
  // loop is one launch of the rolled kernel, compiled at the first loop of its shape and kept
  // while the session lives; otherwise the launches one by one. A step loop's first iteration
  // then costs its device time, not thousands of recorded launches: a graph captured around it
  // holds one launch (or the launches), as launched.
  // Errors, before anything is launched: a body launch whose arguments launch() would refuse
  // in the first or the last iteration (the message names "launch j of the body, iteration
  // r"), a step on anything but an i32 scalar, a stepping scalar that leaves i32
  // (kInvalidArgument). Launched one by one, a failure past those checks (a range out of bounds
  // in some iteration, device memory) leaves the earlier launches recorded: info->launches
  // counts them (also on failure).
  Status launch_loop(std::span<const LoopLaunch> body, uint32_t count, LoopInfo* info = nullptr);
  // Rolls and compiles, on a thread of its own, the resident kernel launch_loop(body, count)
  // would launch, launching nothing: a later launch_loop of a body of the same shape (kernels,
  // steps, which arguments share an array, ranges, count) only registers it. What a front door
  // calls ahead of a loop it is about to check (a tape's per-iteration check) or will run
  // (a recorded loop's adjoint at backward), so that the compile overlaps the caller's work.
  // Nothing where the body does not qualify or the kernel is made already; best effort (a
  // failure shows at launch_loop, which then runs the launches one by one).
  void prepare_loop(std::span<const LoopLaunch> body, uint32_t count);
  // The rest of launch_loop(body, count)'s preparation on the caller's thread: its rolled
  // kernel registered and the pipelines its launch will use made (Runtime::prepare), launching
  // nothing; the launch_loop right after records the launch alone. What a front door runs
  // while another thread checks the loop (the Python tape's check). Nothing where the body does
  // not qualify; best effort.
  void ready_loop(std::span<const LoopLaunch> body, uint32_t count);
  // Whether launch_loop(body, count) runs as one resident kernel (rolling and compiling it
  // where no loop of its shape did yet).
  bool loop_rolls(std::span<const LoopLaunch> body, uint32_t count);
  // For a loop that does not roll (ranges too wide for one workgroup): the graph rework's plan
  // of its count x body launches (gather recompute, scheduling, fusion: what end_capture's
  // rework makes of a captured loop) made now, on the caller's thread, its kernels compiled
  // and registered and their pipelines made; a later launch_loop(body, count) with these very
  // arguments launches the plan's launches instead of the body's one by one (LoopInfo::reworked,
  // SessionStats::reworked_loops): a step loop's first run then costs what a replay of its
  // reworked graph costs. Synchronous, and as slow as a rework (tens of ms for thousands of
  // launches): what a front door calls ahead of a training loop (Python's Session.prepare_loop),
  // not per iteration. The plan may take for granted that an array the body adds into
  // (atomic_add) holds zeros when the loop starts (a gradient the tape zeroed); launch_loop then
  // uses it only inside a capture whose log shows a zero fill of that array with no launch
  // writing it since (launches made through runtime() meanwhile are not in that log), and runs
  // the launches one by one otherwise. A pending background rework is installed first (none
  // while a capture is open: then no plan). Nothing where the loop rolls,
  // nothing is reworked, the arguments are refused or the rework's switches are off; best
  // effort (kernels the device refuses leave the loop as it was). At most 8 plans are kept.
  void rework_loop(std::span<const LoopLaunch> body, uint32_t count);
  // Captured launch sequences (runtime::Runtime::begin_capture, "captured launch sequences"):
  // launches (and zero / fill) between begin_capture and end_capture are checked and planned
  // but not run; replay runs them all with one call, optionally replacing scalar arguments
  // (GraphUpdate: launch index in capture order, parameter, value; kept for later replays).
  // Arrays are bound by reference. Tape::backward can be captured like any launches.
  //
  // Launch fusion (graph/launch_fusion.h; on unless SessionOptions::fuse_graph_launches is
  // false): at end_capture, runs of consecutive captured launches that share arrays only at
  // each invocation's own element ([i] of a 1-d task over the same range, as a substep loop's
  // element-wise kernels do, forward and adjoint), or N-d launches over one box whose written
  // arrays the others touch only at other known rows, become one launch of a fused kernel (compiled
  // once per distinct run and kept while the session lives), so a replay dispatches them with
  // no barrier between them. Results are those of the launches one by one. Updates still name
  // the captured launch and its parameter. A fused run is one launch for LaunchIds, stats and
  // device errors: an error in it names the fused kernel ("fused_<first kernel>_x<count>") and
  // the task "fused" (which member failed is not told apart: rerun with fusion off,
  // VKAD_GRAPH_FUSION=0, to see it).
  //
  // Graph scheduling (graph/graph_schedule.h; on unless SessionOptions::schedule_graph_launches
  // is false): at end_capture, before fusion, the launches between two fills are ordered by
  // their dependences (each as early as what it reads and writes allows, capture order among
  // equals) and a replay records a barrier only before a launch that conflicts with one since
  // the last barrier, so independent launches run concurrently. Conflicts are judged per array
  // and per row of its first axis where a launch-uniform index and the launch's arguments
  // decide it (x[f, p] of step f and of step f + 1 are different rows); two atomic adds to one
  // array commute. A launch of a kernel this session did not compile keeps everything in
  // place around it. Results are those of the launches in capture order (atomic adds may sum
  // in another order); the graph's launches are numbered (LaunchIds, device errors) in the
  // order they run. Where the schedule relied on rows that a scalar parameter decides, an
  // update of that parameter makes this and every later replay run the launches as captured
  // (the graph keeps that form too), so an update never breaks the schedule's premise.
  // The graph as captured already goes without the barriers the capture can tell are not
  // needed: while capturing, a launch that conflicts on no whole array with the launches
  // captured since the last barrier (or fill) is recorded without one before it (judged per
  // array, never per row, so no update can break it). That graph is what a background
  // rework's first replays and a capture that runs (CaptureOptions::run) execute, and what
  // end_capture keeps where the rework changes nothing.
  Status begin_capture(const std::string& name = "", CaptureOptions options = {});
  Result<GraphHandle> end_capture();
  // Waits for `graph`'s background rework (CaptureOptions::background_rework), if it has one
  // pending, and installs it: replays run the reworked graph from now on. Nothing for a graph
  // without one. What a test or a benchmark calls to reach the steady state at a known point.
  Status finish_rework(GraphHandle graph);
  Status replay(GraphHandle graph, std::span<const GraphUpdate> updates = {},
                LaunchId* first = nullptr);
  Status release_graph(GraphHandle graph);
  // A name for each launch of `graph`, indexed as GraphUpdate::launch numbers them (capture
  // order; a tape's backward adds its adjoints '<kernel>_adjoint', last launch first): the
  // launch's kernel name, with '#k' appended to its k-th repeat (k = 1, 2, ...), so every name
  // is unique and says which launch an update reaches. graph_launch() is the inverse.
  // kNotFound for a dead handle.
  Result<std::vector<std::string>> graph_launch_names(GraphHandle graph) const;
  Result<uint32_t> graph_launch(GraphHandle graph, std::string_view name) const;
  // Submits what was recorded; never waits for the device.
  Status flush();
  // Waits for everything this session submitted; reports device errors (kDeviceError).
  Status synchronize();
  // Synchronizes, then returns the runtime's idle memory (rings, adstack heaps, spare memory
  // blocks) to the driver; the user's ndarrays, kernels and graphs are kept
  // (Runtime::release_idle_memory). For between phases of a program: the next launches make
  // what they need again.
  Status release_idle_memory();
  // Where kernels' print statements write (Runtime::set_print_sink; default stdout).
  void set_print_sink(std::function<void(std::string_view line)> sink);
  // A timeline of what runs from begin_timeline to end_timeline (runtime/timeline.h): each
  // launch (a tape's forward and adjoint kernels, a graph's replayed launches named by their
  // kernel and graph), fill, copy and upload timed on the device by timestamp queries, and the
  // host's submissions and waits. Timeline::write_chrome_trace writes a Chrome trace / Perfetto
  // file, Timeline::summary a per-kernel table. begin waits for the device once; with no
  // timeline begun nothing is recorded (docs/debugging.md has the costs). A graph's first
  // replay and every `replay_sample`-th after it are timed launch by launch, the others as one
  // event each (1: every replay). kFailedPrecondition while capturing, on a second begin, or on
  // an end with no begin; kInvalidArgument for a replay_sample of 0.
  Status begin_timeline(uint64_t max_events = runtime::kTimelineMaxEvents,
                        uint32_t replay_sample = runtime::kTimelineReplaySample);
  Result<Timeline> end_timeline();

  // kFailedPrecondition while another thread is inside this session (runtime/use_guard.h).
  Result<SessionStats> stats() const;
  // The advanced surface (runtime/runtime.h). Outlives nothing: valid while the session is.
  runtime::Runtime& runtime() { return *rt_; }

 private:
  Session() = default;
  // The graph rework at end_capture (api/graph_fusion.cpp; its pure steps graph/graph_rework.h).
  // Per original captured launch: its launch in the fused graph and parameter map.
  struct FusedGraph {
    std::string name;
    std::vector<uint32_t> launch;
    std::vector<std::vector<uint32_t>> param;  // empty: the launch was not merged
    std::vector<std::vector<bool>> scalars;    // which of its parameters are scalars
    std::vector<std::string> kernel;           // its kernel's name
    // Graph scheduling relied on rows these scalar parameters decide (per captured launch):
    // an update of one switches to `original`, the graph as captured, for good; `applied` is
    // every update so far, in captured numbering, that the switch replays onto it.
    std::vector<std::vector<bool>> pinned;
    GraphHandle original{0};
    bool on_original = false;
    std::vector<NdArrayHandle> owned;  // blocked stencils' stashes, freed with the graph
    std::vector<GraphUpdate> applied;
    // A background rework's: the updates replays made before the install (captured
    // numbering), applied with the next replay's.
    std::vector<GraphUpdate> carried;
  };
  static std::vector<bool> scalar_params(std::span<const Arg> args);
  // A kernel a rework compiled: registered under its reserved handle at the install.
  // A stash a blocked stencil needs: its placeholder id in the plan's arguments, its type and
  // length.
  struct StashNeed {
    uint64_t placeholder = 0;
    DType dtype = DType::kF32;
    uint32_t elements = 0;
  };
  // Allocates each stash and puts it in place of its placeholder in `w`'s arguments; the
  // arrays go to `owned` (freed with what uses them).
  Status materialize_stashes(std::span<const StashNeed> needs, ReworkPlan* w,
                             std::vector<NdArrayHandle>* owned);
  uint64_t next_stash_placeholder_ = uint64_t{1} << 62;
  // Stashes of step-loop plans: graphs may record their launches, so they live as long as the
  // session.
  std::vector<NdArrayHandle> loop_stashes_;
  struct PendingKernel {
    KernelHandle handle;
    std::shared_ptr<const runtime::CompiledKernel> compiled;
  };
  // What a graph rework decided before anything of it reaches the runtime (prepare_rework:
  // on the caller's thread, or on a background one); install_rework applies it.
  struct PreparedRework {
    GraphHandle graph;  // as captured
    std::string name;
    std::vector<CapturedStep> captured;
    bool rework = false;  // false: the graph stays as captured
    ReworkPlan w;
    std::vector<uint32_t> roll_index;
    std::vector<bool> rolled;
    size_t blocked = 0;  // captured launches in blocked stencil dispatches
    // The blocked stencils' stashes (graph/stencil_blocking.h): `w.steps` names each by a
    // placeholder array id until materialize_stashes allocates it on the caller's thread.
    std::vector<StashNeed> stashes;
    std::vector<size_t> recompute_pins;
    std::vector<std::vector<bool>> pinned;
    bool any_rolled = false, any_recomputed = false, reordered = false, relaxed = false,
         rows_used = false;
    // Compiled by the rework, registered at the install (also when it is dropped: the
    // session's caches name them).
    std::vector<PendingKernel> kernels;
    // The IR `w.launches` points into, kept while this lives (a kernel may be released).
    std::vector<std::shared_ptr<const codegen::Kernel>> ir;
  };
  // The graph rework of end_capture, in two halves. prepare_rework reads the session's kernel
  // tables and caches and the extents snapshot_extents took, and touches no runtime state
  // (its kernels get reserved handles): it may run on another thread while the caller's goes
  // on, as long as nothing else uses those tables (join_rework). install_rework registers the
  // kernels and records the reworked graph; it returns the graph to replay (`p.graph` where
  // nothing was reworked). `keep_captured`: the graph as captured stays (a background
  // rework's: the caller holds it).
  std::unique_ptr<PreparedRework> prepare_rework(GraphHandle graph,
                                                 std::vector<CapturedStep> captured,
                                                 const std::string& name);
  void plan_rework(PreparedRework* p);
  Result<GraphHandle> install_rework(PreparedRework& p, bool keep_captured);
  // Registers p.kernels; false where one is refused (its handle is then forgotten).
  bool register_rework_kernels(PreparedRework& p);
  // Drops kernel `id` from the tables note_ir and the rework fill (release and forget_kernel).
  void drop_tables(uint64_t id);
  // Drops kernel `id` from every table and cache, its printed IR into refused_kernels_.
  void forget_kernel(uint64_t id);
  // Printed IR of rework kernels the device refused to register: not made again.
  std::unordered_set<std::string> refused_kernels_;
  static Status refused(const codegen::Kernel& k);
  void snapshot_extents(const CaptureLog& log);
  // The background rework (CaptureOptions::background_rework): at most one runs at a time.
  struct BackgroundRework {
    GraphHandle graph;  // as captured: the caller's handle
    CaptureLog log;     // the worker's input (unpacked on its thread)
    std::thread worker;
    std::atomic<bool> done{false};
    std::unique_ptr<PreparedRework> result;  // the worker's, written before `done`
    std::vector<GraphUpdate> updates;        // replays' updates so far, the latest of each
  };
  std::unique_ptr<BackgroundRework> background_;
  // A background rework's graph (the caller's handle) -> the reworked graph installed for it.
  std::unordered_map<uint64_t, GraphHandle> reworked_;
  bool capture_background_ = false;  // the open capture's CaptureOptions::background_rework
  // Waits for the background worker (its result stays pending): before anything that uses
  // the tables it reads.
  void join_rework();
  // Waits for the background rework and installs it.
  void settle_rework();
  // Kernels the running rework compiled (moved into its PreparedRework).
  std::vector<PendingKernel> unregistered_;
  // A launch step's schedule_launch answer and pins, by step index: the rework asks for them
  // twice (zero_outputs, then plan_order), and a step loop has thousands of launches.
  struct StepSchedule {
    ScheduleLaunch launch;
    std::vector<bool> pinned;
  };
  using ScheduleMemo = std::vector<std::optional<StepSchedule>>;
  // Gather recompute (api/graph_recompute.cpp, graph/gather_recompute.h): `captured` with every
  // launch that gathers an earlier launch's element-wise output rewritten to compute it;
  // `launches` gets the launch numbers whose arguments a rewritten launch carries. False when
  // none was rewritten. `memo` gets every launch step's schedule (empty where a step was
  // rewritten: its kernel changed), for plan_order; left empty when recompute is off.
  bool recompute(const std::vector<CapturedStep>& captured, std::vector<CapturedStep>* out,
                 std::vector<size_t>* launches, ScheduleMemo* memo);
  std::optional<CapturedStep> recompute_step(
      std::span<const CapturedStep> steps, size_t consumer,
      std::span<const std::vector<uint64_t>> zeros_before,
      const std::unordered_map<uint64_t, size_t>& first_write, size_t* producer_step);
  // The producer of `consumer` that recompute may copy into it, if any.
  std::optional<size_t> recompute_producer(std::span<const CapturedStep> steps, size_t consumer,
                                           const std::unordered_map<uint64_t, size_t>& first_write);
  std::optional<codegen::GatherLaunch> gather_launch(const CapturedStep& s, bool producer) const;
  // gather_launch's parts (recompute_key uses them too): the launch-uniform values the kernel
  // indexes with, evaluated for `s` (sorted by value id); a producer's evaluated range per
  // task dimension (nullopt where one does not evaluate).
  void gather_uniform(const CapturedStep& s, const codegen::Kernel& k,
                      codegen::UniformWords* out) const;
  std::optional<std::vector<std::pair<int64_t, int64_t>>> gather_ranges(
      const CapturedStep& s, const codegen::Kernel& k) const;
  std::vector<std::vector<uint64_t>> zero_outputs(std::span<const CapturedStep> steps,
                                                  ScheduleMemo* memo) const;
  // What recompute_gathers' answer for consumer `c` and producer `p` depends on, in words:
  // both kernels, which arguments are the same array, each array's extents (as a shape
  // class), the launch-uniform values (which equal which), the producer's ranges and which
  // of its arrays are known zero. Built from the steps without their GatherLaunches (made
  // only when the answer is not known yet). nullopt where gather_launch would refuse either.
  std::optional<std::vector<uint64_t>> recompute_key(const CapturedStep& c, const CapturedStep& p,
                                                     std::span<const uint64_t> zeros) const;
  // A session-wide number per distinct extents vector (an array's, during a rework).
  uint64_t shape_class(uint64_t array) const;
  Result<KernelHandle> recomputed_kernel(const codegen::Kernel& k);
  // A launch's scalar arguments and array extents, for evaluating launch-uniform indices.
  codegen::UniformInputs launch_inputs(const CapturedStep& s) const;
  // Per parameter of a launch, the one first-axis row all its accesses touch
  // (codegen::FusionLaunch::rows).
  std::vector<int64_t> launch_rows(const CapturedStep& s) const;
  // Step loops of small launches in `captured` rolled into resident kernels: false when none
  // is. Else `out` gets the steps with each loop as one launch, and per captured launch
  // `launch_index` its launch in `out` and `rolled` whether it was rolled.
  // Runs of a stencil kernel's launches become launches of blocked kernels
  // (graph/stencil_blocking.h) too, `blocked` counting the captured launches they take.
  bool roll(const std::vector<CapturedStep>& captured, std::vector<CapturedStep>* out,
            std::vector<uint32_t>* launch_index, std::vector<bool>* rolled, size_t* blocked,
            std::vector<StashNeed>* stashes);
  // The blocked runs among the launches no segment of `segments` covers, added to it (in
  // order) with their kernels in `built`; returns the captured launches they take.
  // A blocked run's prologue (filling its stash) goes before the launch of captured launch
  // `first`.
  struct StashPrologue {
    size_t first = 0;
    KernelHandle kernel;
    uint64_t blocked_kernel = 0, placeholder = 0;
  };
  // The launches of `launches` that may block (a kernel and box each), where no built
  // resident loop of `segments` took them.
  std::vector<RollCandidate> blocking_candidates(
      std::span<const CapturedStep* const> launches, std::span<const RollSegment> segments,
      std::span<const std::optional<MergedLaunch>> built) const;
  // The blocked kernel of one run (its stash and prologue recorded), `K` its launches per
  // dispatch; nullopt where the run does not block.
  std::optional<MergedLaunch> build_blocked(const RollSegment& run, const CapturedStep& first,
                                            const RollCandidate& candidate, uint32_t* K,
                                            std::vector<StashNeed>* stashes,
                                            std::vector<StashPrologue>* prologues);
  size_t block_stencils(std::span<const CapturedStep> captured,
                        std::span<const CapturedStep* const> launches,
                        std::vector<RollSegment>* segments,
                        std::vector<std::optional<MergedLaunch>>* built,
                        std::vector<StashNeed>* stashes, std::vector<StashPrologue>* prologues);
  // Puts the stashes' placeholders and the prologues into `out` (splice_rolled's), keeping
  // `launch_index` in step.
  static void add_prologues(std::span<const StashPrologue> prologues,
                            std::vector<CapturedStep>* out, std::vector<uint32_t>* launch_index);
  std::vector<RollCandidate> roll_candidates(std::span<const CapturedStep* const> launches) const;
  // The resident kernel of one segment, compiled and registered; nullopt where it cannot be.
  std::optional<MergedLaunch> build_rolled(const RollSegment& seg,
                                           std::span<const CapturedStep* const> launches,
                                           std::span<const RollCandidate> candidates);
  // The value of a launch's range bound from its arguments (scalar bounds only when
  // `scalars`); nullopt where unknown.
  std::optional<int64_t> bound_value(const abi::RangeBound& b, std::span<const Arg> args,
                                     bool scalars) const;
  // A kernel the rework made, compiled and registered once per printed IR.
  Result<KernelHandle> merged_kernel(const codegen::Kernel& k);
  codegen::FusionLaunch fusion_launch(const CapturedStep& s, bool loops_capped) const;
  // The fused kernels of `runs` into `planned`, and the zero fills they make redundant into
  // `dropped`: false where one cannot be built (the graph then stays as captured).
  bool build_fused(std::span<const codegen::FusionRun> runs,
                   std::span<const codegen::FusionLaunch> launches,
                   std::span<const std::unordered_map<uint64_t, size_t>> zero_fills,
                   std::vector<MergedLaunch>* planned, std::vector<bool>* dropped);
  // Records the plan as a graph; `map` gets each capture-order launch's place in it and
  // `relaxed` whether a barrier was left out. `origins` (per capture-order launch of `w`, or
  // empty): what made each, kept by the launches recorded (a fused run's: what its members
  // share, LaunchOrigin::join).
  Result<GraphHandle> recapture(const ReworkPlan& w, const std::string& name, FusedGraph* map,
                                bool* relaxed, std::span<const runtime::LaunchOrigin> origins = {});
  void describe_launches(const std::vector<CapturedStep>& captured, FusedGraph* map) const;
  void trace_rework(const ReworkPlan& w, const std::string& name) const;
  // `cap`'s steps in scheduled order into `w` (steps, order, what each launch touches and what
  // fusion needs of it); per launch in capture order, the scalars the schedule rests on. A
  // step's entry in `memo` (recompute's), where there is one, is used (moved out) instead of
  // computing it again.
  void plan_order(const std::vector<CapturedStep>& cap, ReworkPlan* w,
                  std::vector<std::vector<bool>>* pinned, ScheduleMemo* memo) const;
  // Keeps `graph` (the graph as captured) in `map` where a reworked graph's schedule rests
  // on scalar parameters (`pinned`), else releases it.
  void keep_for_updates(GraphHandle graph, bool reworked, bool keep_captured,
                        std::vector<std::vector<bool>> pinned, FusedGraph* map);
  static void unroll_numbering(std::span<const uint32_t> roll_index,
                               const std::vector<bool>& rolled, FusedGraph* map,
                               std::vector<std::vector<bool>>* pinned);
  // replay's part for a graph end_capture reworked (or not): updates in captured numbering.
  Status replay_reworked(GraphHandle graph, std::span<const GraphUpdate> updates, LaunchId* first);
  // `updates` into `kept`, one entry per (launch, parameter): the latest value.
  static void keep_latest(std::span<const GraphUpdate> updates, std::vector<GraphUpdate>* kept);
  Status translate(const FusedGraph& f, std::span<const GraphUpdate> updates,
                   std::vector<GraphUpdate>* out) const;
  // What a captured launch reads and writes, rows evaluated (graph/graph_schedule.h); `pinned`
  // gets the scalar parameters those rows depend on.
  ScheduleLaunch schedule_launch(const CapturedStep& s, std::vector<bool>* pinned) const;
  // `generic_on_demand`: as Runtime::register_kernel's.
  Result<KernelHandle> register_ir(const codegen::Kernel& kernel, const runtime::CompiledKernel& ck,
                                   bool generic_on_demand = false);
  // register_ir's tables for kernel `id` (no runtime call).
  void note_ir(const codegen::Kernel& kernel, const runtime::CompiledKernel& ck, uint64_t id);

  codegen::CompileOptions compile_options_;
  codegen::Target target_;
  codegen::AdjointOptions adjoint_options_;  // reverse mode's, from the device (device_target.h)
  std::string device_uuid_;
  // Every kernel this session compiled, by text, target and options: compiling one again
  // (a DSL re-tracing a function, a fused run seen before) skips emission and validation.
  codegen::CompileCache compile_cache_;
  std::unique_ptr<runtime::Runtime> rt_;
  bool fuse_graph_launches_ = true;
  bool schedule_graph_launches_ = true;
  uint32_t resident_max_range_ = 256;
  bool block_stencils_ = true;
  // launch_loop's rolled kernels (registered on the caller's thread), by printed IR.
  std::unordered_map<std::string, KernelHandle> loop_kernels_;
  // What roll_loop decided, by the body's shape (loop_signature): later loops of that shape skip
  // rolling and printing. nullopt: the shape does not qualify (ranges, arrays, refused kernel).
  struct RolledLoop;
  std::unordered_map<std::string, std::shared_ptr<const RolledLoop>> rolled_by_shape_;
  // prepare_loop's rolls and compiles, each on a thread of its own, by shape.
  struct LoopJob;
  std::vector<std::unique_ptr<LoopJob>> loop_jobs_;  // declared below
  void join_loop_jobs();
  uint64_t rolled_loops_ = 0;
  uint64_t reworked_loops_ = 0;
  // rework_loop's plans by loop_key (the body's kernels, arguments and steps, and the count);
  // null: the loop was found to gain nothing (not tried again).
  struct LoopRework {
    ReworkPlan w;
    std::vector<std::shared_ptr<const codegen::Kernel>> ir;  // what w.launches points into
    std::vector<uint64_t> zeros;  // arrays the plan needs zero when the loop starts
    // Per launch of the plan (in its order), the loop iteration it comes from, for its device
    // errors; empty where the plan rolled or blocked launches (its launch numbers are not the
    // loop's then).
    std::vector<int64_t> iteration;
  };
  std::unordered_map<std::string, std::shared_ptr<const LoopRework>> loop_reworks_;
  static std::string loop_key(std::span<const LoopLaunch> body, uint32_t count);
  // launch_loop's checks before anything is launched (errors name the launch and iteration).
  Status check_loop(std::span<const LoopLaunch> body, uint32_t count) const;
  // The arrays `l` adds into (atomic_add), appended to `out` once each.
  void loop_accumulates(const LoopLaunch& l, std::vector<uint64_t>* out) const;
  // Of the arrays a loop's rework took for zero at the loop's start (`assumed`), those its plan
  // rests on: gather recompute's accumulating producers' and fusion's zero fills.
  std::vector<uint64_t> plan_zeros(const PreparedRework& p, std::span<const LoopLaunch> body,
                                   std::span<const uint64_t> assumed) const;
  // Whether every array of `zeros` holds zeros now, as far as the open capture's log shows.
  bool zeros_hold(std::span<const uint64_t> zeros) const;
  // Launches a rework_loop plan's steps through launch() (info->launches counts them).
  Status launch_reworked(const LoopRework& r, LoopInfo* info);
  // loop_member's verdict per kernel handle id: may its launches be rolled (caller's thread).
  mutable std::unordered_map<uint64_t, bool> loop_residable_;
  // The rolled kernel of `body` x `count` and its parameter map, or nullopt where the loop runs
  // its launches one by one (api/session_loop.cpp).
  struct RolledLoop {
    KernelHandle kernel;
    std::vector<std::vector<uint32_t>> param_map;
    size_t params = 0;
  };
  std::optional<RolledLoop> roll_loop(std::span<const LoopLaunch> body, uint32_t count,
                                      PhaseClock& clock);
  // The members of body x count as a resident kernel would take them, its workgroup size and
  // its shape's signature; false where the body does not qualify.
  struct LoopPlan {
    std::vector<codegen::ResidentMember> period;
    std::vector<std::shared_ptr<const codegen::Kernel>> ir;  // what `period` points into
    uint32_t count = 0, local = 0;
    std::string name, signature;
  };
  bool plan_loop(std::span<const LoopLaunch> body, uint32_t count, LoopPlan* plan) const;
  // The rolled launch's arguments: each body launch's first-iteration args at its parameters.
  static void rolled_args(const RolledLoop& rolled, std::span<const LoopLaunch> body,
                          std::vector<Arg>* out);
  // A prepare_loop's roll and compile, on its own thread: pure functions and the thread-safe
  // compile cache only (the members' IR is held by the plan).
  struct LoopJob {
    LoopPlan plan;
    std::thread worker;
    // The worker's, read after join.
    std::optional<codegen::ResidentKernel> rolled;
    std::string key;
    std::optional<Result<std::shared_ptr<const runtime::CompiledKernel>>> compiled;
  };
  // roll_loop's parts: a body launch as a resident member (nullopt: it does not qualify), its
  // kernel's ranges for `args`, and the rolled kernel compiled and registered (or found).
  std::optional<codegen::ResidentMember> loop_member(
      const LoopLaunch& l, uint32_t count, std::shared_ptr<const codegen::Kernel>* ir) const;
  std::optional<std::vector<std::pair<int64_t, int64_t>>> loop_ranges(
      const codegen::Kernel& k, std::span<const Arg> args) const;
  // `key`: k's printed IR ("" prints it); `ck`: its compile (nullopt compiles it).
  std::optional<KernelHandle> loop_kernel(
      const codegen::Kernel& k, std::string key,
      std::optional<Result<std::shared_ptr<const runtime::CompiledKernel>>> ck, PhaseClock& clock);
  uint64_t rolled_launches_ = 0;      // SessionStats::rolled_launches
  uint64_t blocked_launches_ = 0;     // SessionStats::blocked_launches
  uint64_t recomputed_launches_ = 0;  // SessionStats::recomputed_launches
  // Every kernel compiled here and every kernel a rework made, by handle id: IR, access
  // summary, adstacks and what the graph passes derive from them (graph/kernel_catalog.h).
  // Written by register_ir / rework_compile and read by the reworks (a background one's
  // worker too: the session's thread joins it first), never by a capture's launches.
  KernelCatalog catalog_;
  // An array's extents during a graph rework (Session::fuse asks for each launch's arrays in
  // several passes: read from the runtime once per array), nullptr for a freed one. Emptied
  // when a rework starts and ends.
  const std::vector<uint32_t>* extents_of(uint64_t array) const;
  mutable std::unordered_map<uint64_t, std::optional<std::vector<uint32_t>>> rework_extents_;
  // shape_class(): by extents for the session's life (recompute_answers_ keys hold them), by
  // array during a rework (emptied with rework_extents_).
  mutable std::map<std::vector<uint32_t>, uint64_t> shape_classes_;
  mutable std::unordered_map<uint64_t, uint64_t> rework_shape_class_;
  std::unordered_map<std::string, KernelHandle> recomputed_kernels_;  // by printed IR
  // A kernel a rework made, compiled, with a reserved handle (registered at the install:
  // unregistered_), with its IR and access summary where `keep_ir` (so later reworks see it
  // like any kernel of the session), its time added to rework_compile_ms_.
  Result<KernelHandle> rework_compile(const codegen::Kernel& k, bool keep_ir);
  // The same for several kernels, compiled on several threads; results in order.
  std::vector<Result<KernelHandle>> rework_compile_all(std::span<const codegen::Kernel> ks,
                                                       bool keep_ir);
  // Milliseconds the graph reworks spent compiling and registering kernels and the driver
  // making their pipelines (VKAD_GRAPH_TRACE: what of a slow end_capture is the compiler and
  // the driver's, not the analysis).
  double rework_compile_ms_ = 0;
  // recompute_key -> the rewritten kernel and its added arguments (kernel id 0: none).
  struct RecomputeAnswer {
    KernelHandle kernel;
    std::vector<uint32_t> producer_param;
  };
  struct WordsHash {
    size_t operator()(const std::vector<uint64_t>& w) const noexcept;
  };
  std::unordered_map<std::vector<uint64_t>, RecomputeAnswer, WordsHash> recompute_answers_;
  bool recompute_graph_gathers_ = true;
  // launch_access() of every differentiated forward kernel, by handle id.
  std::unordered_map<uint64_t, std::shared_ptr<const codegen::KernelAccess>> access_;
  std::optional<CaptureLog> capture_;  // open capture, as Session saw it
  // Launches (capture-order [first, end) ranges) that launch_loop made of a rolled or reworked
  // step loop: replay updates of them are refused, since the kernel run there is not the one
  // whose parameters the update would number. Of the open capture, then by graph id.
  using LaunchRanges = std::vector<std::pair<uint32_t, uint32_t>>;
  LaunchRanges capture_fixed_;
  std::unordered_map<uint64_t, LaunchRanges> fixed_launches_;
  Result<GraphHandle> end_capture_log();
  Status check_fixed_updates(GraphHandle graph, std::span<const GraphUpdate> updates) const;
  // kernel_access() summed up per parameter and whether it has adstacks, of the kernels a
  // caller can launch (those register_ir made, and the rework's registered kernels that have an
  // access summary: a reworked step loop launches them), by handle id: what a capture judges its
  // barriers on. Apart from catalog_ because a background rework writes that one while a
  // capture may be open.
  struct CaptureAccess {
    // Per ndarray parameter it accesses: the parameter and its kinds of access (kind_bit).
    std::vector<std::pair<uint32_t, uint8_t>> params;
    bool adstack = false;
  };
  std::unordered_map<uint64_t, CaptureAccess> capture_access_;
  // capture_access_[id] from catalog_.access(id) (nothing where that is unknown): at a kernel's
  // registration, on the caller's thread.
  void note_capture_access(uint64_t id, bool adstack);
  // The open capture's barriers so far (Graph scheduling: none between launches that share
  // no array) and the accesses of the launch being judged (reused).
  ArrayBarrierTracker capture_barriers_;
  std::vector<ArrayKinds> capture_accesses_;
  bool capture_needs_barrier(KernelHandle kernel, std::span<const Arg> args);
  std::string capture_name_;
  std::unordered_map<std::string, KernelHandle> fused_kernels_;  // by printed IR
  // differentiate()'s forward IR and clearing adjoints (made on demand), by forward handle id.
  std::unordered_map<uint64_t, std::shared_ptr<const codegen::Kernel>> forward_ir_;
  std::unordered_map<uint64_t, KernelHandle> clearing_;
  std::unordered_map<uint64_t, FusedGraph> fused_graphs_;  // by graph id
};

}  // namespace vkad
