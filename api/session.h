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

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "abi/handles.h"
#include "autodiff/in_place.h"
#include "base/status.h"
#include "ir/ir.h"
#include "ir/launch_access.h"
#include "ir/target.h"
#include "runtime/defaults.h"
#include "runtime/timeline.h"
#include "spirv/compiler.h"

namespace vkad {
namespace runtime {
class Runtime;
struct RuntimeOptions;
}  // namespace runtime
namespace codegen {
struct KernelAccess;
struct CountedAdjoint;
}  // namespace codegen
// The parts a Session holds (api/session_core.h, api/graph_compiler.h, api/compiled_graphs.h,
// api/step_loops.h): not part of the front door.
struct SessionCore;
class GraphCompiler;
class CompiledGraphs;
class StepLoops;

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
  // The graph passes end_capture runs (docs/graphs.md, "Graph passes"), as a pipeline's text:
  // "" is the default, "rename, roll, block, recompute, prune, slice, hoist, schedule, fuse";
  // "none" runs none. The switches above edit it (a switch turned off removes its pass;
  // resident_max_range other than 256 sets roll{max-range=N}), and so do the VKAD_GRAPH_*
  // variables, after them; VKAD_GRAPH_PASSES=<text> replaces it for every session.
  // Session::create refuses a text that does not parse (kInvalidArgument naming the pass).
  std::string graph_passes;
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
  // Compute barriers recorded after those dispatches (RuntimeStats::barriers): the dispatches
  // the next one waited behind, a device's dependent-dispatch latency each; a graph's schedule
  // leaves out the ones between launches it proved independent.
  uint64_t barriers = 0;
  uint64_t flushes = 0;
  uint64_t forced_waits = 0;  // times a flush waited for the oldest submission
  double forced_wait_ms = 0;  // host time those waits took (the device pacing the host)
  uint64_t ndarrays = 0;
  uint64_t kernels_cached = 0;      // pipelines held (kernels registered or kept for reuse)
  uint64_t memory_block_bytes = 0;  // device memory held
  uint64_t memory_used_bytes = 0;   // ... of which in live buffers
  // The most of each held at once since the session was made or reset_memory_peaks(): what a
  // program needs of the device (nvidia-smi shows the blocks, with the driver's own beside).
  uint64_t memory_peak_block_bytes = 0;
  uint64_t memory_peak_used_bytes = 0;
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
  // Launches run inside blocked stencil dispatches (docs/graphs.md, "Blocked stencils"): those
  // graphs captured so far, and those of step loops launched as a rework_loop plan.
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
  // Loops whose trip counts no bound gives (a while loop without max_trip, a for loop whose
  // bounds depend on array contents): the adjoint's stacks are sized by counting their trips on
  // the device (codegen::make_adjoint_counted) at each launch of the adjoint, which launch()
  // does (Session::counted_loops); 0 for most kernels.
  uint32_t counted = 0;
  // Forward parameters the kernel updates in place (x[I] = f(x[I]): autodiff/in_place.h), which
  // make_adjoint refuses: the adjoint is that of the kernel reading a copy of each taken before
  // the launch, and only a Tape, which keeps those copies, launches it (Session::in_place).
  // Empty for most kernels.
  std::vector<uint32_t> in_place;
  // The adjoint's argument list: the forward's arguments, then `grads` (one ndarray per entry
  // of `gradients`, in order). kInvalidArgument if the counts disagree. (With `in_place` the
  // adjoint also takes the copies, which a Tape binds: launch() refuses this list then.)
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
  // (Runtime::Graphs::begin_capture's `run`): a thread records the captured steps in pieces and the
  // device runs them while the capture goes on. A training loop's first iteration is then its
  // capture alone -- no replay after it. end_capture returns once every step is submitted.
  bool run = false;
};

// The front door's calls come in three classes by concern: Session (devices, kernels, launches,
// diagnostics) derives from SessionArrays (ndarrays) and SessionGraphs (captures, replays,
// step loops), so a user calls them all on one Session. Only Session derives from them: their
// definitions reach the session's parts through it (self()).
class Session;

// What a facet's definitions reach the session through: the Session it is part of and the
// session's core. Defined (for the two facets) in api/session.cpp.
template <typename Facet>
class SessionFacet {
 protected:
  SessionFacet() = default;
  ~SessionFacet() = default;
  Session& self();
  const Session& self() const;
  SessionCore& core() const;  // the session's (api/session_core.h)
};

// Session's calls on ndarrays: make, free, fill, copy, move data to and from the host, ask
// their shape and dtype.
class SessionArrays : public SessionFacet<SessionArrays> {
 public:
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
  // launches; nothing waits (runtime::Runtime::copy). Inside a capture (begin_capture) it is
  // a launch of a copy kernel this session makes per dtype and rank ('vkad_copy_f32_2'): it
  // takes a launch index in the graph (GraphUpdate) and is scheduled and fused like any launch.
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

 protected:
  SessionArrays() = default;
  ~SessionArrays() = default;
};

// Session's calls on launch sequences: captured graphs (begin_capture .. replay) and step loops
// (launch_loop and what prepares one).
class SessionGraphs : public SessionFacet<SessionGraphs> {
 public:
  // A step loop (docs/graphs.md, "Step loops"): `count` iterations of `body`, iteration r launching
  // each of body's launches in order with its stepping scalars advanced by r x step -- the
  // results of those launches one by one. Where every launch of the body may run in a resident
  // kernel (the rules of "Resident step loops": parallel 1-d tasks whose ranges do not step and
  // are at most SessionOptions::resident_max_range, at most 31 distinct arrays -- 94 where the
  // device's pipelines bind more storage buffers than its push descriptors --, count >= 4) the
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
  // Captured launch sequences (runtime::Runtime::Graphs::begin_capture, runtime/graphs.h):
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
  // array commute. A launch of a kernel this session did not compile keeps every launch in
  // place around it (a fill of an array it does not take may move past it). Results are those of
  // the launches in capture order (atomic adds may sum in another order); the graph's launches are
  // numbered (LaunchIds, device errors) in the order they run. Where the schedule relied on rows
  // that a scalar parameter decides, an update of that parameter makes this and every later replay
  // run the launches as captured (the graph keeps that form too), so an update never breaks the
  // schedule's premise. The graph as captured already goes without the barriers the capture can
  // tell are not needed: while capturing, a launch that conflicts on no whole array with the
  // launches captured since the last barrier (or fill) is recorded without one before it (judged
  // per array, never per row, so no update can break it). That graph is what a background rework's
  // first replays and a capture that runs (CaptureOptions::run) execute, and what end_capture keeps
  // where the rework changes nothing.
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
  // The launches the open capture (begun here) holds so far: the GraphUpdate index the next
  // one takes. 0 without one. For front doors that mirror a capture's launches.
  uint32_t captured_launches() const;
  // The graph passes every end_capture runs, as pipeline text (SessionOptions::graph_passes with
  // the switches' and VKAD_GRAPH_* variables' edits; docs/graphs.md, "Graph passes").
  std::string graph_passes() const;

 protected:
  SessionGraphs() = default;
  ~SessionGraphs() = default;
};

class Session : public SessionArrays, public SessionGraphs {
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
  const codegen::Target& target() const;
  const std::string& device_name() const;
  // The device's UUID as vkad::devices() lists it ("xxxxxxxx-xxxx-..."): which physical device
  // this session runs on, comparable with CUDA's UUIDs (api/devices.h).
  const std::string& device_uuid() const;

  // --- kernels ---
  // Verifies, compiles for target() and registers. Errors name the statement (bad IR), or say
  // what the device lacks (kUnsupported).
  Result<KernelHandle> compile(const codegen::Kernel& kernel);
  // The same from the IR text form (ir/text.h); parse errors name line and column.
  Result<KernelHandle> compile(std::string_view ir_text);
  // Builds the adjoint (codegen::make_adjoint), compiles and registers both kernels. kInvalid-
  // Argument when no parameter is marked grad. An array updated in place that make_adjoint
  // refuses is differentiated through a copy from before the launch where split_in_place
  // qualifies it (Differentiated::in_place; only a Tape launches that adjoint). A loop with no trip
  // bound (a while loop without max_trip, a for loop whose bounds depend on array contents) that
  // make_adjoint refuses is counted instead (codegen::make_adjoint_counted; d.counted says how
  // many): launch() of d.adjoint with the adjoint's arguments (the forward's, then the gradients)
  // first runs the trip-counting kernel on the arrays as they are and waits for its counts (a
  // blocking point, like a readback), then launches the adjoint with stacks exactly as deep as it
  // needs. Such a launch cannot be captured in a graph (kFailedPrecondition, naming the kernel and
  // max_trip); a loop with max_trip is launched as any other.
  Result<Differentiated> differentiate(const codegen::Kernel& forward);
  Result<Differentiated> differentiate(std::string_view ir_text);
  // The adjoint of d.forward in which a store's adjoint also clears the seed it read
  // (codegen::make_clearing_adjoint): same parameters as d.adjoint (none for an in-place
  // update's: it fails with make_adjoint's refusal, and a checkpointed tape refuses those
  // launches first). Built and compiled on the
  // first call per forward, then kept. What a checkpointed Tape (api/tape.h) launches.
  // kInvalidArgument when d.forward is not a live differentiate() result of this session.
  Result<KernelHandle> clearing_adjoint(const Differentiated& d);
  // What the forward kernel of a differentiate() reads and writes of each ndarray, with the
  // launch-uniform rows (ir/launch_access.h): computed once by differentiate, shared with
  // the tapes that record it (api/tape_hazards.h). Null for any other handle, and once released.
  std::shared_ptr<const codegen::KernelAccess> launch_access(KernelHandle forward) const;
  // The forward parameters whose values an adjoint or clearing adjoint of this session uses
  // (codegen::used_loads of its IR: loads feeding nothing, the forward's replay of values its
  // derivatives do not need, are left out), by the adjoint's handle; null for any other handle,
  // and once released. A checkpointed tape writes in place what no adjoint reads (api/tape.h).
  const std::vector<uint32_t>* adjoint_reads(KernelHandle adjoint) const;
  // The parameters a differentiate() forward stores to whole (codegen::whole_stores: each
  // invocation at the top of its task, no other access), by the forward's handle; null for any
  // other handle, and once released. A checkpointed tape starts a new version of such an
  // array without copying the old one where the launch's extents cover it (api/tape.h).
  const std::vector<codegen::WholeStore>* whole_stores(KernelHandle forward) const;
  // The arrays the adjoint `adjoint` differentiates as updated in place (Differentiated::
  // in_place): each forward parameter and the adjoint parameter that takes its copy from before
  // the launch (the copies follow the forward's arguments in this order, then the gradients;
  // a copy's gradient is its array's); null for any other handle. launch() of such an adjoint
  // with the forward's arguments and the gradients alone is refused (kInvalidArgument).
  const std::vector<codegen::InPlaceParam>* in_place(KernelHandle adjoint) const;
  // differentiate() of `dst[...] = src[...]` over every element of two arrays of `dtype` (f32 or
  // f64) and `rank`: what a Tape records a copy as (Tape::copy). Made on the first call per
  // dtype and rank, then kept while the session lives (the pointer stays valid).
  // kInvalidArgument for another dtype.
  Result<const Differentiated*> differentiated_copy(DType dtype, uint32_t rank);
  // For such an adjoint, the forward's launch_access as a tape's hazard check takes it: the
  // arrays' reads left out (the adjoint reads the copies) and their stores counted as
  // accumulations (its adjoint clears the seeds they read); null for any other handle.
  std::shared_ptr<const codegen::KernelAccess> in_place_access(KernelHandle adjoint) const;
  // How many loops the adjoint (or clearing adjoint) `adjoint` counts on the device at its
  // launches (Differentiated::counted); 0 for any other handle.
  uint32_t counted_loops(KernelHandle adjoint) const;
  // Drops a kernel (both of a Differentiated are dropped separately). A graph captured with it
  // keeps working (the runtime keeps what a captured launch needs).
  Status release(KernelHandle kernel);

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
  // Submits what was recorded; never waits for the device.
  Status flush();
  // Waits for everything this session submitted; reports device errors (kDeviceError).
  Status synchronize();
  // Synchronizes, then returns the runtime's idle memory (rings, adstack heaps, spare memory
  // blocks) to the driver; the user's ndarrays, kernels and graphs are kept
  // (Runtime::release_idle_memory). For between phases of a program: the next launches make
  // what they need again.
  Status release_idle_memory();
  // Starts stats()' memory peaks again from what is held now (to measure one phase).
  Status reset_memory_peaks();
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
  runtime::Runtime& runtime();

 private:
  template <typename Facet>
  friend class SessionFacet;
  friend class SessionArrays;
  friend class SessionGraphs;
  Session();
  // A counted adjoint (differentiate): the trip-counting kernel launch() runs first, how many
  // loops it counts, how many of the arguments are the forward's and how many launch() takes
  // (the adjoint's parameters without its trips_ scalars), and the forward's name.
  struct CountedLaunch {
    KernelHandle counter;
    uint32_t counted = 0, forward_params = 0, args = 0;
    std::string name;
  };
  // make_adjoint's (clear_seeds: make_clearing_adjoint's) adjoint of `forward`, or, where that
  // refuses a loop for want of a trip bound, the counted one; otherwise make_adjoint's error.
  Result<codegen::CountedAdjoint> adjoint_of(const codegen::Kernel& forward,
                                             bool clear_seeds) const;
  // Registers `ca.counter` for the adjoint `adjoint` (counted_ then holds it); drop_counter
  // unregisters the one of adjoint handle id `adjoint`, where there is one.
  void drop_counter(uint64_t adjoint);
  Status register_counter(KernelHandle adjoint, const codegen::Kernel& forward,
                          const codegen::CountedAdjoint& ca, uint32_t args);
  Status launch_counted(KernelHandle adjoint, const CountedLaunch& c, std::span<const Arg> args,
                        LaunchId* id);
  // Graph scheduling's part at capture: whether `kernel`'s launch with `args` needs a barrier
  // after what the open capture ran since its last one.
  bool capture_needs_barrier(KernelHandle kernel, std::span<const Arg> args);

  // The runtime, compile configuration and caches, kernel catalog and open capture
  // (api/session_core.h), and the parts that share them: the graph compiler (a capture's
  // rework), the compiled graphs (installed reworks, replays) and the step loops. Declared in
  // the order they are made; destroyed the other way round (the core last).
  std::unique_ptr<SessionCore> core_;
  std::unique_ptr<GraphCompiler> compiler_;
  std::unique_ptr<CompiledGraphs> graphs_;
  std::unique_ptr<StepLoops> loops_;
  // differentiate()'s forward IR, clearing adjoints (made on demand) and access summaries, by
  // forward handle id.
  std::unordered_map<uint64_t, std::shared_ptr<const codegen::Kernel>> forward_ir_;
  std::unordered_map<uint64_t, KernelHandle> clearing_;
  // copy()'s kernels inside a capture, by dtype << 32 | rank.
  std::unordered_map<uint64_t, KernelHandle> copy_kernels_;
  std::unordered_map<uint64_t, std::shared_ptr<const codegen::KernelAccess>> access_;
  // adjoint_reads: differentiate()'s adjoints and clearing adjoints, by their own handle ids.
  std::unordered_map<uint64_t, std::vector<uint32_t>> adjoint_reads_;
  // whole_stores: differentiate()'s forwards, by handle id.
  std::unordered_map<uint64_t, std::vector<codegen::WholeStore>> whole_stores_;
  // Counted adjoints and clearing adjoints (differentiate), by their own handle ids.
  std::unordered_map<uint64_t, CountedLaunch> counted_;
  // Adjoints of in-place updates (differentiate), by their own handle ids: the split's arrays,
  // the forward's parameter and gradient counts, the forward's name.
  struct InPlaceAdjoint {
    std::vector<codegen::InPlaceParam> arrays;
    uint32_t forward_params = 0, grads = 0;
    std::string name;
    std::shared_ptr<const codegen::KernelAccess> access;  // in_place_access
  };
  std::unordered_map<uint64_t, InPlaceAdjoint> in_place_;
  // differentiated_copy's, by dtype << 32 | rank (a node's address stays put).
  std::unordered_map<uint64_t, Differentiated> copy_differentiated_;
};

}  // namespace vkad
