// The gfx runtime a DSL talks to: registers compiled kernels, owns ndarrays, launches kernels
// asynchronously, and retires per-launch memory without stalling.
//
// Life of a launch:
//   launch(k, args)  validates args against k's parameters (nothing is recorded on error),
//                    writes the launch's args into a slot of the upload ring (host_ring.h; no
//                    Vulkan object per launch), records one dispatch per task into the
//                    current command list; ring chunks that fill up (and large upload staging
//                    buffers) go into ctx_buffers. Past `max_dispatches_per_list` dispatches or
//                    `max_list_age_us` the list is flushed automatically, so no command buffer
//                    grows unbounded.
//   flush()          submits the list -> StreamSemaphore; pushes {semaphore, ctx_buffers} onto
//                    the retirement queue (see retirement_queue.h for the exact policy).
//   download()       flush, wait for that submission, copy out, drain ALL retirements, check
//                    the device-side error flags of every launch since the last check.
//   synchronize()    flush, wait for the last serial, drain all, check error flags.
// Every drain point (download, synchronize, destruction) uses one helper, drain_all().
//
// Ownership: the Runtime owns its device, stream, ndarrays and pipelines. Handles are plain ids;
// using one after free is an error value, never a crash.
//
// Threads: a Runtime is externally synchronised: one thread at a time (as a VkQueue). A call that
// overlaps a call from another thread returns kFailedPrecondition and changes nothing (see
// use_guard.h). Distinct runtimes on distinct threads are independent and need no locking: they
// share only the process-wide VkInstance (rhi/instance.h), which is thread-safe. A semaphore
// returned by flush() may outlive its runtime (it then reports signaled).
#pragma once

#include <array>
#include <atomic>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "abi/handles.h"
#include "abi/kernel_abi.h"
#include "base/chunked_vector.h"
#include "rhi/buffer.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "rhi/stream.h"
#include "runtime/adstack_heaps.h"
#include "runtime/defaults.h"
#include "runtime/device_error_log.h"
#include "runtime/host_ring.h"
#include "runtime/launch_origin.h"
#include "runtime/launch_plan.h"
#include "runtime/ndarray_table.h"
#include "runtime/pipeline_cache.h"
#include "runtime/retirement_queue.h"
#include "runtime/timeline_recorder.h"
#include "runtime/use_guard.h"

namespace vkad::runtime {

// Where adstacks live at a launch (adstack/adstack_layout.h, "Storage tiers";
// docs/architecture.md). kDefault reads the environment variable VKAD_ADSTACK_TIER (`heap`,
// `private` or `auto`; unset or empty: auto), so a test suite can run once per tier.
enum class AdstackTier : uint8_t {
  kDefault,
  // Private arrays when the task's private row (each heap's row rounded up to a power of two)
  // takes at most adstack_private_budget_bytes per thread; the heaps otherwise.
  kAuto,
  kHeap,  // always the heaps
  // Private arrays whenever the row fits kMaxPrivateTierBytes per thread; past that the heaps
  // (correct, counted in RuntimeStats::adstack_private_fallbacks), never an error.
  kPrivate,
};
const char* adstack_tier_name(AdstackTier t);
// Which adstack tasks launch with their launch-constant words specialized (abi/kernel_abi.h,
// "Launch specialization": trip counts, adstack offsets and capacities become constants the
// driver sees, so it can unroll loops and index private arrays statically). Each distinct set
// of values is a pipeline variant, made on the first launch that needs it.
// kDefault reads VKAD_ADSTACK_SPECIALIZE (`off`, `auto` or `all`; unset or empty: auto).
enum class AdstackSpecialize : uint8_t {
  kDefault,
  kOff,  // never: every launch uses the tier's generic pipeline
  // Tasks whose stacks all hold at most adstack_specialize_max_capacity entries in the heap
  // tier, adstack_specialize_max_private_capacity in the private tier. On the H200
  // specialization made the sin-loop adjoint 1.3-1.8x faster at 16 steps (both tiers) and the
  // private tier 5-20% faster at 64, but the heap tier 1.2-1.3x slower at 64 and 256 steps and
  // the private tier 3% slower at 256 (docs/benchmarks-log.md, "Launch specialization").
  kAuto,
  kAll,  // every adstack task, either tier, any capacity
};
const char* adstack_specialize_name(AdstackSpecialize s);
// The private tier's hard limit per thread, also under kPrivate: Function memory is carved
// from the driver's per-thread scratch (NVIDIA: local memory; lavapipe: the invocation's stack).
inline constexpr uint64_t kMaxPrivateTierBytes = 16384;

// Launches per bundle of a replayed graph (Runtime::Graphs::replay): the replay that records a
// graph submits each bundle as soon as it is recorded, so the device starts on the graph's first
// launches while the driver records the rest.
inline constexpr uint32_t kBundleLaunches = 512;

struct RuntimeOptions {
  rhi::DeviceOptions device;
  rhi::SyncMode sync_mode = rhi::SyncMode::kAuto;
  size_t retirement_depth = kDefaultRetirementDepth;
  // vkad's policy is kPerEntryPolling; the others are baselines for benchmarks.
  RetirementPolicy retirement_policy = RetirementPolicy::kPerEntryPolling;
  uint32_t max_dispatches_per_list = 1024;
  double max_list_age_us = 2000;         // auto-flush a list older than this at the next launch
  uint32_t max_groups = 65535;           // cap on workgroups per dispatch (tasks grid-stride)
  size_t pipeline_cache_capacity = 256;  // unreferenced pipelines kept for reuse
  // Spin-then-block waits (download, synchronize, forced retirement waits); see
  // rhi::StreamOptions::spin_ns. -1 = automatic (spin on GPUs, block at once on CPU devices).
  int64_t wait_spin_ns = -1;
  // On a device that caps loop passes per invocation (Capabilities::max_loop_passes: lavapipe),
  // launch refuses a launch whose known loop passes exceed the cap (see launch). false skips the
  // check: only to observe the driver's behaviour, or on a driver known not to cut loops.
  bool enforce_loop_limit = true;
  // Test seam: replaces CompiledKernel::content_hash as the pipeline cache's key, so a test can
  // make every kernel collide and check that a hit is confirmed by content. nullptr in real use.
  uint64_t (*pipeline_hash_for_testing)(const CompiledKernel&) = nullptr;
  AdstackTier adstack_tier = AdstackTier::kDefault;
  // kAuto's limit: private arrays up to this many bytes per thread. On the H200 private arrays
  // (local memory) beat the slot-major heap by 4-17% up to 4 KiB per thread, the largest
  // measured (docs/benchmarks-log.md, "Private tier").
  uint64_t adstack_private_budget_bytes = 4096;
  // Private arrays get at least this many elements (then a power of two). On the H200 a 16-float
  // array indexed by a runtime value ran 2.2x slower than a 32-float one (kept in registers with
  // per-access selects, presumably, instead of local memory; docs/benchmarks-log.md).
  uint32_t adstack_private_min_length = 32;
  AdstackSpecialize adstack_specialize = AdstackSpecialize::kDefault;
  uint32_t adstack_specialize_max_capacity = 32;          // kAuto's limits, entries per stack:
  uint32_t adstack_specialize_max_private_capacity = 64;  // heap tier, private tier
  // Specialized variants per task at most; launches with further value sets use the tier's
  // generic pipeline (counted in RuntimeStats::adstack_specialize_misses). Bounds the pipeline
  // creations a kernel whose trip count changes at every launch can cause.
  uint32_t adstack_specialize_max_variants = 8;
  // A launch whose specialized variant is not made yet runs the generic pipeline while a
  // thread makes the variant (PipelineCache::variant's `background`), so the driver's
  // compile never stalls a launch; later launches take the variant once made. Applies where
  // the generic pipeline exists (kernels registered without generic_on_demand) and to the
  // heap tier; prepare() always makes variants at once. false: made by the launch that first
  // wants it (deterministic counts for tests that check them).
  bool background_specialization = true;
  // A kernel's generic pipelines are made on threads from its registration (a few at a time,
  // PipelineCache::acquire's `background`) and waited for by its first launch or prepare():
  // the kernels a program registers one after another compile side by side in the driver
  // (tens to hundreds of ms each on a cold NVIDIA cache). One the driver refuses there is made
  // again by its first launch, whose error it is should the driver refuse it again (the
  // module passed validation at registration either way).
  // false, or VKAD_BACKGROUND_PIPELINES=0: made by register_kernel.
  bool background_pipelines = true;
  // The on-disk caches' directory (base/cache_file.h: compiled kernels, which api::Session
  // keeps there, and the driver's pipeline cache, which the device loads and saves):
  // nullopt = automatic (VKAD_CACHE=0 turns them off, else VKAD_CACHE_DIR, else
  // $XDG_CACHE_HOME/vkad, else ~/.cache/vkad); "" = off; else that directory.
  std::optional<std::string> cache_dir;
  // Times flush's phases into RuntimeStats::flush_profile (steady_clock reads around each
  // phase). Off: no clock is read, the profile stays zero. For benchmarks
  // (vkad-bench-retirement's breakdown), not for production runs.
  bool profile_flush = false;
  // The ndarray pool's bound (create_ndarray's `pooled`): bytes of freed pooled buffers kept.
  uint64_t ndarray_pool_bytes = 512ull << 20;
  // A capture that runs (Graphs::begin_capture's `run`) records its pieces on the caller's
  // thread until it has cut this many steps, then on recording threads (VKAD_RUN_THREADS_AFTER
  // overrides; 0: threads from the start). On an H200 host every DiffTaichi port's first
  // iteration (up to 2,370 captured launches) ran as fast or faster with none -- wave 2.5 vs
  // 2.9 ms, smoke 9.6-10.2 vs 11.2-11.9 -- the threads' hand-off, their secondary command
  // buffers and the wait for the last pieces' recording costing more than the driver's ~5 us a
  // launch on the caller; a long capture (8,186 launches from a Python loop) gained ~20 ms from
  // them (docs/benchmarks-log.md).
  uint32_t run_threads_after_steps = 2048;
};

// Where the host time of flushes and of opening command lists goes, summed over the runtime's
// life (RuntimeOptions::profile_flush; all zero when off). Microseconds.
struct FlushProfile {
  uint64_t flushes = 0;  // submissions timed
  // Opening a list (the first launch or upload after a flush): the stream recycles finished
  // command buffers and descriptor pools, then vkBeginCommandBuffer.
  double begin_us = 0;
  // vkEndCommandBuffer + vkQueueSubmit with its timeline-semaphore (or fence) signal.
  double submit_us = 0;
  // The retirement queue's push: polling the front entries' semaphores, and forced waits
  // (RetirementCounters::forced_wait_us says how much of it was blocked).
  double poll_us = 0;
  // Retired payloads: their launches' error words read, ring chunks back to the pools, the
  // payload's buffers handed to the deferred deleter.
  double release_us = 0;
  // After the submit: the stream recycles its pools and the device runs its deferred deleter.
  double recycle_us = 0;
};

struct RuntimeStats {
  RetirementCounters retirement;
  rhi::LiveObjects live;
  uint64_t launches = 0;
  // Compute dispatches those launches recorded (one per task; a graph's fused launch counts
  // once, a replay every launch again): what a device pays a dependent-dispatch floor for.
  uint64_t dispatches = 0;
  // Compute-to-compute barriers recorded after those dispatches (between a launch's tasks and
  // after its last where the next launch may depend on it; a replay's again): how many of the
  // dispatches the next one waited behind. A graph's scheduling leaves out the barriers between
  // launches it proved independent, so dispatches - barriers ran beside the one before them.
  uint64_t barriers = 0;
  uint64_t prepares = 0;  // Runtime::prepare calls that succeeded
  uint64_t flushes = 0;   // submissions made by flush (explicit or automatic)
  uint64_t auto_flushes = 0;
  uint64_t device_wide_waits = 0;    // always 0: the runtime never waits for the whole device
  uint64_t ctx_bytes_recording = 0;  // ctx buffer bytes of the list being recorded
  uint64_t pipelines_cached = 0;
  uint64_t pipeline_cache_hits = 0;
  // Pipelines the driver made so far (variants included) and the milliseconds it took.
  uint64_t pipelines_created = 0;
  double pipeline_create_ms = 0;
  uint64_t ndarrays = 0;
  uint64_t memory_block_bytes = 0;  // VkDeviceMemory held (blocks, spares included)
  uint64_t memory_used_bytes = 0;   // ... of which handed out to live buffers
  // The most of each held at once since the runtime was made or reset_memory_peaks.
  uint64_t memory_peak_block_bytes = 0;
  uint64_t memory_peak_used_bytes = 0;
  size_t live_descriptor_sets = 0;
  uint64_t adstack_heap_bytes = 0;    // current f32 + f64 + int adstack heaps
  uint64_t adstack_heap_growths = 0;  // heaps replaced by bigger ones (old ones retired)
  AdstackTier adstack_tier = AdstackTier::kAuto;  // the tier policy in force (never kDefault)
  uint64_t adstack_private_dispatches = 0;        // adstack task dispatches in the private tier
  uint64_t adstack_heap_dispatches = 0;           // ... in the heap tier
  uint64_t adstack_private_fallbacks = 0;         // kPrivate dispatches over kMaxPrivateTierBytes
  uint64_t adstack_private_pipelines = 0;         // cached private-tier pipeline variants
  AdstackSpecialize adstack_specialize = AdstackSpecialize::kAuto;  // in force (never kDefault)
  // Launch specialization's counts. The names are historical: they count every specialized
  // kernel, also the graph rework's, whose extents are launch constants (launch_spec.h).
  uint64_t adstack_specialized_dispatches = 0;  // dispatches with launch constants specialized
  uint64_t adstack_specialize_misses = 0;       // ... wanted, but past the variant cap
  // ... wanted, run generic while the variant was made in the background
  // (RuntimeOptions::background_specialization)
  uint64_t adstack_specialize_pending = 0;
  uint64_t pipelines_pending = 0;              // variants being made in the background now
  uint64_t adstack_specialized_pipelines = 0;  // cached specialized variants (either tier)
  // The host rings (host_ring.h: launch args, small staging and readbacks): chunk buffers held
  // by the rings now (open + pool; those in flight come back at retirement), and created so far.
  uint64_t ring_chunks_held = 0;
  uint64_t ring_chunks_created = 0;
  // Device memory by owner. The user's: live ndarrays. The runtime's own, all of it returned to
  // the driver by release_idle_memory() when idle: the args (upload) ring's and the readback
  // ring's chunks held (open + pool), the adstack heaps (adstack_heap_bytes), empty
  // VkDeviceMemory blocks kept for reuse (spare_block_bytes), and the ndarray pool
  // (ndarray_pool_bytes, below). In flight, until its submission
  // retires: retirement.bytes.
  uint64_t user_bytes = 0;
  uint64_t args_ring_bytes = 0;
  uint64_t readback_ring_bytes = 0;
  uint64_t spare_block_bytes = 0;
  uint64_t ndarray_pool_bytes = 0;   // freed pooled ndarrays' buffers kept for reuse
  uint64_t ndarray_pool_reuses = 0;  // pooled create_ndarray calls served from the pool
  FlushProfile flush_profile;
  uint64_t graphs = 0;  // captured graphs alive
  uint64_t graph_replays = 0;
  uint64_t replayed_launches = 0;  // launches recorded by replays (also counted in `launches`)
  // Replays that executed a pre-recorded bundle (the others recorded every step again: a
  // pipeline without push descriptors), and bundle recordings (one per graph, one more for its
  // timed bundles at its first replay under a timeline; again after an update changed a
  // launch's plan or the adstack heaps grew).
  uint64_t bundle_replays = 0;
  uint64_t graph_recordings = 0;
  // Pieces a running capture (begin_capture's `run`) submitted, and of those the ones recorded
  // on its recording thread (the others: on the caller's, where no thread could be had or a
  // pipeline has no push descriptors).
  uint64_t run_pieces = 0;
  uint64_t run_pieces_recorded_aside = 0;
  // The driver pipeline cache read from disk at creation (rhi::PipelineCacheLoad).
  bool pipeline_cache_loaded = false;
  uint64_t pipeline_cache_bytes_loaded = 0;
};

// One step of a graph: what Runtime::Graphs::instantiate makes a graph of, and what a graph's
// record (Runtime::Graphs::graph_record, capture_record) reads back. A launch of `kernel` with
// `args`, or a fill of `array` with `value`; the factories below make either.
struct GraphStep {
  bool launch = true;  // false: a fill
  KernelHandle kernel;
  // A launch's arguments, borrowed: instantiate reads them during the call; a record's point
  // into the graph (valid while its GraphRecord is).
  std::span<const Arg> args;
  // A launch: no barrier between the launch before it and this one, so the two may run
  // concurrently (Runtime::Graphs::omit_next_barrier's request, with its contract: for a caller
  // that proved they touch nothing in common). Honoured only where the step before is a launch.
  bool omit_barrier = false;
  LaunchOrigin origin;  // a launch: what its device errors name (set_launch_note's)
  NdArrayHandle array;  // a fill's array and value (Runtime::fill's conversion)
  double value = 0;

  static GraphStep kernel_launch(KernelHandle kernel, std::span<const Arg> args,
                                 bool omit_barrier = false, const LaunchOrigin& origin = {}) {
    GraphStep s;
    s.kernel = kernel;
    s.args = args;
    s.omit_barrier = omit_barrier;
    s.origin = origin;
    return s;
  }
  static GraphStep array_fill(NdArrayHandle array, double value) {
    GraphStep s;
    s.launch = false;
    s.array = array;
    s.value = value;
    return s;
  }
};

// The layer of Runtime below kernels and ndarrays: the device, its stream and the command list
// every call records into; flush submits the list with its payload (the buffers it used and the
// launches whose error words and print lines are read back) onto the retirement queue, which
// hands payloads back as their submissions complete (retirement_queue.h); the timeline, the
// launch notes device errors name, and the recording of planned launches. Runtime derives from
// it and nothing else does: its state is Runtime's (protected), so the graphs and the interop
// (nested in Runtime) reach it as before.
class CommandQueue {
 public:
  // Submits what was recorded (if anything) and runs the retirement policy. With nothing
  // recorded it only polls, and returns the semaphore of the last submission.
  Result<rhi::StreamSemaphore> flush();
  // Device errors are reported once, by the download / synchronize that finds them, as a
  // kDeviceError whose message names kernel, task, the error and the launch sequence numbers
  // ("in launch #2", "in launches #2, #5 (3 launches)").
  Status synchronize();
  // The device errors behind the last kDeviceError that download / synchronize returned (empty
  // when none was reported yet), for callers that act on them rather than print them.
  const std::vector<DeviceError>& device_errors() const { return errors_.reported(); }

  // After a device loss every call above and set_retirement_depth return kDeviceLost and
  // change nothing; only destruction remains useful. A handle of another runtime is
  // kInvalidArgument, a freed or never-issued one kNotFound; both name the handle.
  Status set_retirement_depth(size_t depth);
  // Where the lines of kernels' print statements go (abi/print_records.h): one call per line
  // (no newline), on the thread that retires the launch -- the one calling launch, flush,
  // synchronize, a download -- in launch order, each launch's lines in its records' order;
  // a launch whose print area filled adds a line saying how many records it dropped. Unset
  // (the default, or an empty function): written to stdout.
  void set_print_sink(std::function<void(std::string_view line)> sink) {
    print_sink_ = std::move(sink);
  }
  // What the user wrote that makes the launches recorded from now on, for their device errors:
  // `what` (static storage; nullptr: nothing) and its number, reported after the launch's own
  // number, "in launch #12 (the adjoint of tape entry 3)". The tapes set it around their
  // launches. A replayed graph's launches name their graph's launch instead.
  void set_launch_note(const char* what, uint64_t index) {
    note_.what = what;
    note_.index = index;
  }
  // The iteration of a loop the launches recorded from now on belong to (a step loop launched
  // one launch at a time), added to the note: "iteration 4 of the loop at tape entry 2";
  // negative: none.
  void set_launch_iteration(int64_t iteration) {
    note_.iteration = iteration;
    note_.last_iteration = -1;
  }
  // Both at once (a reworked step loop's launches name their iterations, a fused one all of
  // its members').
  LaunchOrigin launch_origin() const { return note_; }
  void set_launch_origin(const LaunchOrigin& origin) { note_ = origin; }

  // A timeline (runtime/timeline.h): from begin_timeline to end_timeline every launch, fill,
  // copy and upload is timed on the device and submissions and waits on the host. begin waits
  // for the device once (the clock calibration); kFailedPrecondition while capturing or when a
  // timeline is already being recorded. `max_events`: events kept, later ones counted as
  // dropped. end_timeline waits for every submission and reads the timestamps; device errors
  // raised meanwhile stay pending for the next download / synchronize. kFailedPrecondition
  // when no timeline was begun.
  // `replay_sample`: a graph's first replay and every replay_sample-th after it are timed
  // launch by launch, the others as one event (at least 1; 1: every replay).
  Status begin_timeline(uint64_t max_events = kTimelineMaxEvents,
                        uint32_t replay_sample = kTimelineReplaySample);
  Result<Timeline> end_timeline();
  bool timeline_on() const { return timeline_ != nullptr; }
  size_t retirement_depth() const { return retirement_.depth(); }

  // The sequence number the next recorded launch will get.
  LaunchId next_launch_id() const { return LaunchId{next_launch_ + 1}; }

  // Read-only: the device's state (capabilities, validation messages, live objects). Calls that
  // change it (mark_lost, live_mut, creating objects) stay inside the runtime, which keeps its
  // invariants.
  const rhi::Device& device() const { return *device_; }
  const rhi::Capabilities& caps() const { return device_->caps(); }

 protected:
  CommandQueue();
  ~CommandQueue();
  CommandQueue(const CommandQueue&) = delete;
  CommandQueue& operator=(const CommandQueue&) = delete;

  struct Kernel {
    CompiledKernel desc;
    uint64_t id = 0;                 // its handle (GraphRecord gives it back)
    uint64_t hash = 0;               // the key of its pipelines in the pipeline cache
    std::vector<bool> private_tier;  // per task: its module declares the private tier
    // desc's layout facts, found once at registration (each is a scan of desc).
    uint32_t args_bytes = 0;   // desc.args_bytes()
    uint32_t array_count = 0;  // desc.array_count()
    bool has_adstacks = false;
  };

  // Where a launch's device error words live: checked when its submission retires.
  struct FlagSite {
    const std::byte* args;                 // the launch's args slot in the upload ring (mapped)
    std::shared_ptr<const Kernel> kernel;  // kept alive even if unregistered meanwhile
    LaunchId launch;
    uint64_t graph = 0;         // a replayed launch's graph (its handle id), else 0
    uint32_t graph_launch = 0;  // and its index in the graph
    LaunchOrigin origin;        // at the launch (a replay's: at its capture)
  };
  // Per-flush payload of the retirement queue.
  struct CtxBuffers {
    std::vector<rhi::Buffer> buffers;  // per-launch buffers: large staging, replaced heaps
    std::vector<FlagSite> flags;
    // Ring chunks closed while this list was recorded (host_ring.h): back to their ring's
    // pool when it retires.
    std::vector<rhi::Buffer> upload_chunks, readback_chunks;
  };
  // A fill as fill() records it and a graph keeps it (graphs.h).
  struct CapturedFill {
    NdArrayHandle array;
    uint64_t pattern = 0;  // an element's bytes (the low 32 bits where !wide)
    bool wide = false;     // an 8-byte pattern with unequal halves: rhi fill64
    double value = 0;      // what fill() was given (GraphRecord reads it back)
  };
  // What planning decides for one launch and recording reads: each task's plan and pipeline,
  // and the launch's counts -- everything a captured launch keeps of its planning but the
  // buffers. Captured launches of one kernel that plan alike share one (Graph::plans), so ==
  // compares every field (defaulted: a field added here is compared too).
  struct CommandPlan {
    LaunchPlan lp;
    std::vector<rhi::ComputePipeline*> pipelines;  // per task
    // Tasks run specialized, past the variant cap, and run generic while their variant is
    // made in the background.
    uint64_t specialized = 0, spec_misses = 0, spec_pending = 0;
    bool operator==(const CommandPlan&) const = default;
  };

  // What the runtime asks of its graphs where a launch, fill, flush or free meets an open capture
  // (Graphs implements it, graphs.h): an interface, so that the runtime's own sources need nothing
  // of graphs.h, which sits above them as a layer over the runtime.
  class CaptureHooks {
   public:
    virtual ~CaptureHooks() = default;
    virtual bool capturing() const = 0;
    // kFailedPrecondition naming the open capture for `what`, a call a capture refuses.
    virtual Status not_while_capturing(const char* what) const = 0;
    virtual bool take_omit_barrier() = 0;  // omit_next_barrier's request, for this launch only
    // A checked and planned launch (planned_, args_scratch_) or a fill into the open capture;
    // `last`: the call's last fill (zero_many's fills are one step for a running capture).
    virtual void captured_launch(const std::shared_ptr<const Kernel>& k, std::span<const Arg> args,
                                 bool omit_barrier) = 0;
    virtual void captured_fill(const CapturedFill& fill, bool last) = 0;
    // free_ndarray's: a running capture's steps so far submitted (they bind buffers).
    virtual Status drain_run() = 0;
    // ~Runtime's two steps: a running capture stopped and the capture dropped; once drained,
    // every graph released (their bundles go back to the stream before it is destroyed).
    virtual void drop_capture() noexcept = 0;
    virtual void drop_all() noexcept = 0;
    // "launch k of graph 'name'" for a flagged replayed launch (the graph may be released).
    virtual std::string graph_launch_where(uint64_t graph, uint32_t index) const = 0;
  };

  Status ensure_list();
  // Records a host -> device copy of all of `a` from `data` (a.bytes bytes) through a staging
  // buffer retired with the list: upload, and fill's patterns that vkCmdFillBuffer cannot repeat.
  Status record_host_copy(NdArray& a, const void* data);
  Status drain_all();
  Status ensure_heaps(const std::array<uint64_t, adstack::kHeapCount>& need);
  void read_error_flags(CtxBuffers& retired);
  // The lines a retired launch's print statements left in its print area, to the print sink.
  void print_lines(const FlagSite& site);
  // The stream's command buffers for the submissions a retirement depth lets be in flight
  // (depth + 2, at most 16).
  Status reserve_submissions(size_t depth);
  // Reads and releases what the retirement queue retired (after every call that can retire).
  void take_retired();
  // Records a planned launch into the current list (heaps already grown to its need; `arrays`:
  // its ndarray arguments' buffers in parameter order; `encoded`: its args, k->args_bytes of
  // them). Only the ring slot can fail.
  Status record_launch(const std::shared_ptr<const Kernel>& k, const CommandPlan& plan,
                       std::span<rhi::Buffer* const> arrays, const std::byte* encoded, LaunchId* id,
                       bool final_barrier = true);
  // Binds and dispatches every task of a planned launch into `list` (the runtime's list, or a
  // graph's bundle), reading its args at `args_offset` of `args_buf`. A barrier follows every
  // task's dispatch; the last one's only with `final_barrier` (a graph step whose next launch
  // was proved independent of it goes without).
  Status record_dispatches(rhi::CommandList& list, const Kernel& k, const CommandPlan& plan,
                           std::span<rhi::Buffer* const> arrays, rhi::Buffer& args_buf,
                           uint64_t args_offset, bool final_barrier = true);
  // record_dispatches with everything it reads given: the heap buffers (kHeapCount of them)
  // and the bindings scratch. Touches no runtime state: a capture run's recording thread calls
  // it.
  static Status dispatch_into(rhi::CommandList& list, const Kernel& k, const CommandPlan& plan,
                              std::span<rhi::Buffer* const> arrays,
                              std::span<rhi::Buffer* const> heaps, rhi::Buffer& args_buf,
                              uint64_t args_offset, bool final_barrier,
                              std::vector<rhi::Buffer*>& bindings);
  // The stats of one launch recorded; `barrier_after`: a compute barrier follows its last
  // task's dispatch (record_launch's final_barrier, a graph step's barrier_after).
  void count_launch(const CommandPlan& plan, bool barrier_after);
  Result<rhi::StreamSemaphore> submit_list();  // flush()'s submission, also while capturing
  Status auto_flush();  // flush when the list is past max_dispatches_per_list or max_list_age_us
  // flush (to_device) or invalidate every held host view (hold_host_view, Interop).
  Status sync_host_views(bool to_device);
  // Records a device event around what `record` records into list_ when the timeline is on;
  // `name` is called only then.
  template <typename Record, typename Name>
  Status timed(const char* category, Name&& name, Record&& record) {
    bool on = false;
    if (timeline_) {
      static const std::string kNoGraph;
      VKAD_ASSIGN_OR_RETURN(on, timeline_->begin_gpu(list_, name(), category, 0, kNoGraph));
    }
    record();
    if (on) timeline_->end_gpu(list_);
    return {};
  }

  RuntimeOptions options_;
  std::unique_ptr<rhi::Device> device_;
  std::unique_ptr<rhi::Stream> stream_;
  rhi::CommandList list_;
  double list_started_us_ = 0;
  CtxBuffers ctx_buffers_;
  uint64_t ctx_bytes_ = 0;
  RetirementQueue<CtxBuffers> retirement_;
  std::vector<CtxBuffers> retired_;  // take_retired's scratch (no allocation per flush)
  // Retired payloads emptied, their vectors' capacity kept: the next flush's ctx_buffers_ come
  // from here, so a flush allocates no vectors in the steady state.
  std::vector<CtxBuffers> spare_ctx_;
  FlushProfile profile_;  // RuntimeOptions::profile_flush
  // begin_timeline .. end_timeline; null otherwise (a launch then tests this pointer only).
  std::unique_ptr<TimelineRecorder> timeline_;
  std::function<void(std::string_view)> print_sink_;  // set_print_sink
  LaunchOrigin note_;                                 // set_launch_note, set_launch_iteration
  const std::string* timeline_graph_ = nullptr;       // the graph being replayed, for its events
  bool timeline_quiet_ = false;  // a replay timed as one event: its launches record no stamps
  // The graph launch record_launch is recording (a replay launch by launch), for its FlagSite.
  uint64_t replay_graph_ = 0;
  uint32_t replay_launch_ = 0;
  LaunchOrigin replay_origin_;  // ... and its CapturedLaunch::origin
  NdArrayTable arrays_;
  rhi::StreamSemaphore last_sem_;
  AdstackHeaps heaps_;  // shared by all adstack launches
  // Launch args and small upload staging / small readbacks (host_ring.h): no buffer per call.
  std::optional<HostRing> upload_ring_, readback_ring_;
  // Found at retirement, reported at the next drain: one entry per (kernel, task, message).
  DeviceErrorLog errors_;     // found at retirement, reported at the next drain
  uint64_t next_launch_ = 0;  // the last LaunchId issued
  RuntimeStats stats_;
  std::vector<rhi::Buffer*> bindings_;  // record_launch's scratch
  UseGuard use_guard_;                  // see use_guard.h: the thread model, enforced
  // hold_host_view's counts (Interop), of arrays in mapped memory that is not host-coherent only.
  std::unordered_map<uint64_t, uint32_t> host_views_;

  // The graphs (Runtime::Graphs, made by Runtime's constructor). ~Runtime empties them before
  // the device goes.
  std::unique_ptr<CaptureHooks> graphs_;
};

class Runtime : public CommandQueue {
 public:
  // Captured launch sequences: capture, instantiate, replay (runtime/graphs.h).
  class Graphs;
  // Sharing an ndarray's memory with another API: DLPack, CUDA interop (runtime/interop.h).
  class Interop;

  // kInvalidArgument for options out of range (max_groups must be 1 to the device's
  // maxComputeWorkGroupCount[0]).
  static Result<std::unique_ptr<Runtime>> create(const RuntimeOptions& options = {});
  // Waits for this runtime's own submissions (never the whole device), drains, frees all.
  // Never throws; after a device loss it releases without waiting.
  ~Runtime();

  // --- kernels ---
  // Creates (or finds, by content hash) the pipelines of `kernel`. Two kernels with the same
  // name but different content coexist. kInvalidArgument when the kernel is malformed: no
  // tasks, bad parameters or range bounds, local_size 0 or past the device, or a task module
  // that fails SPIR-V validation or whose interface (set-0 storage-buffer bindings, push
  // constant size, LocalSize) disagrees with the declared parameters. All checked before any
  // driver call. `generic_on_demand`: the generic pipeline of a task with launch constants
  // (CompiledTask::spec_words) is made at its first launch that cannot be specialized, not
  // here (for kernels whose launches are all specialized: the graph rework's, which would
  // otherwise pay the driver's compile twice).
  // `reserved`: a handle from reserve_kernel_handle() to register the kernel under (0: a new
  // one); kInvalidArgument for a handle this runtime did not reserve or that is in use.
  Result<KernelHandle> register_kernel(const CompiledKernel& kernel, bool generic_on_demand = false,
                                       KernelHandle reserved = {});
  // A kernel handle for a later register_kernel: what another thread (Session's background
  // graph rework) hands out for kernels it compiles while this runtime is in use. The one
  // call that is safe from any thread at any time; the handle names nothing until registered.
  Result<KernelHandle> reserve_kernel_handle();
  // Drops the handle. Its pipelines stay cached while unreferenced (up to the cache
  // capacity); eviction goes through the deferred deleter, never under a queued submission.
  Status unregister_kernel(KernelHandle kernel);

  // --- ndarrays ---
  // kInvalidArgument for an unknown dtype, a rank outside 1..kMaxNdArrayRank, a zero
  // extent, or a size that overflows 64 bits or exceeds the device's storage buffer range.
  // `pooled`: for arrays a program makes anew each iteration (a tape's gradients): when freed,
  // the buffer goes into the runtime's ndarray pool instead of being destroyed, and a later
  // pooled create_ndarray of the same byte size takes it back once its last use has completed,
  // so a loop that makes and frees such arrays creates no Vulkan object in its steady state.
  // The pool is bounded (RuntimeOptions::ndarray_pool_bytes; oldest evicted), counted as the
  // runtime's memory (RuntimeStats::ndarray_pool_bytes) and emptied by release_idle_memory().
  // A pooled array's contents are undefined when made, as any new array's.
  Result<NdArrayHandle> create_ndarray(DType dtype, std::vector<uint32_t> shape,
                                       const std::string& name = "", bool pooled = false);
  // Frees now from the caller's view; the memory is released once every recorded or in-flight
  // launch that uses it has completed (never early, never leaked).
  Status free_ndarray(NdArrayHandle array);
  // Host -> device. Recorded into the current list (ordered before later launches); the host
  // data is copied into a staging buffer before returning. `data` must not be null and
  // `bytes` must equal the array's size (kInvalidArgument otherwise).
  Status upload(NdArrayHandle array, const void* data, uint64_t bytes);
  // Device -> host (a readback: flushes, waits for that submission, drains all retirements,
  // checks device error flags). `out` must not be null and `bytes` must equal the array's
  // size (kInvalidArgument otherwise).
  Status download(NdArrayHandle array, void* out, uint64_t bytes);
  Result<std::vector<uint32_t>> shape(NdArrayHandle array) const;
  // One axis's extent, without copying the shape (per-launch checks; kInvalidArgument for an
  // axis past the array's rank).
  Result<uint32_t> extent(NdArrayHandle array, uint32_t axis) const;
  Result<DType> dtype(NdArrayHandle array) const;
  // How many writes into `array` have been recorded (or captured) so far: launches of
  // kernels that may write it (a parameter the kernel stores or atomically adds into, whether or
  // not this launch does), fills, zeroes, copies into it and uploads. A replayed graph's
  // launches are counted at their capture, not per replay; writes by another API through shared
  // memory (DLPack, CUDA interop) are not seen. What a tape compares to tell that an array
  // its recording read was written since (Tape::backward).
  Result<uint64_t> write_count(NdArrayHandle array) const;
  // The last of those writes in words ("a launch of 'k'", "an upload", "a fill", "a zero", "a
  // copy into it"; "" before any), for messages (write_count itself allocates nothing).
  Result<std::string> last_writer(NdArrayHandle array) const;
  // The name given at creation ("" when none).
  Result<std::string> name(NdArrayHandle array) const;
  // Sets every element to `value` converted to the array's dtype: rounded to f32 / exact in
  // f64; integers take it truncated toward zero (2.9 -> 2, -2.9 -> -2); bool takes 0 or 1.
  // Recorded into the current list like upload (ordered before later launches), never waits. A
  // value whose element pattern repeats every 32 bits (every 4-byte dtype, and 0 of every dtype)
  // is a device fill; an 8-byte pattern that does not is staged from the host.
  // kInvalidArgument ("fill 'x': value 1e+20 does not fit i32") for a value the dtype cannot
  // hold -- the rule launch applies to scalar arguments: a finite value past FLT_MAX into f32
  // (inf and NaN are f32 values), NaN, infinities or a truncated value out of range into an
  // integer, anything but 0 and 1 into bool. Nothing is recorded then.
  Status fill(NdArrayHandle array, double value);
  // Copies `src` into `dst` on the device, ordered with launches (a compute->transfer barrier,
  // vkCmdCopyBuffer, a transfer->compute barrier); nothing waits. kInvalidArgument when the
  // two differ in dtype or shape or are the same array; kNotFound for a dead handle;
  // kFailedPrecondition while a capture is open (a graph has no copy step). Nothing is
  // recorded on an error.
  Status copy(NdArrayHandle src, NdArrayHandle dst);
  // Sets every element of every array in `arrays` to 0, in as few commands as the device allows:
  // one compute->transfer barrier, one vkCmdFillBuffer per array, one transfer->compute barrier
  // (fill records two barriers per array). Every handle is checked first: a dead or foreign one
  // is the error dead_handle gives ("zero_many: ndarray handle 4:7 was freed or never existed",
  // kNotFound / kInvalidArgument) and nothing is recorded. An empty span records nothing; a
  // handle given twice is filled twice. Ordered with launches like fill; never waits.
  Status zero_many(std::span<const NdArrayHandle> arrays);

  // --- execution ---
  // Validates and records one dispatch per task; nothing is recorded on error.
  // kFailedPrecondition on a device that silently leaves loops after a number of passes per
  // invocation (lavapipe: Capabilities::max_loop_passes) when a task's loop passes, as known at
  // launch, exceed it: the grid-stride iterations per invocation times the task's loop_passes
  // (ir/loop_passes.h; loops with data-dependent bounds are not checked). The error names
  // the kernel, the task and the count.
  // `id`, when not null, receives the launch's sequence number (LaunchId) once it is recorded
  // (unchanged on error). Device errors reported later name the launches that hit them, so a
  // caller can discard exactly those launches' results (see device_errors()).
  Status launch(KernelHandle kernel, std::span<const Arg> args, LaunchId* id = nullptr);
  // Makes every pipeline that launch(kernel, args) would use -- the private-tier and
  // specialized variants included, which are otherwise created inside the first launch with
  // their values (tens of ms on NVIDIA) -- without recording, dispatching or allocating heaps.
  // Checks the arguments as launch does and returns its errors (nothing made on error). Call it
  // where a pause is acceptable (loading, before a timed loop) with the arguments the hot loop
  // will pass. Also makes the args and readback rings' first chunks where they have none yet
  // (HostRing::reserve): a first launch or capture then makes no buffer. Counts in
  // RuntimeStats::prepares; not a launch.
  Status prepare(KernelHandle kernel, std::span<const Arg> args);
  // Between these two, prepare() starts the pipelines it would make on threads (at most
  // PipelineCache::max_making() compiling at a time; with background_pipelines off it makes
  // them at once) and returns; end_prepare_batch() waits for them all. A rework's dozens of kernels
  // (a step loop's) then compile side by side in the driver. One the driver refuses there is made
  // by its first launch instead (whose error it is then). No launch may come between the two
  // (kFailedPrecondition).
  void begin_prepare_batch() { batch_prepare_ = true; }
  void end_prepare_batch();
  // The argument checks of launch(kernel, args) alone (handles, count, kinds, dtypes, ranks,
  // scalar ranges): nothing planned, made or recorded. Session::launch_loop checks a loop's
  // launches with it before running any.
  Status check_launch(KernelHandle kernel, std::span<const Arg> args);

  // --- captured launch sequences (graphs.h) ---
  // The runtime's graphs. While a capture is open (Graphs::begin_capture), launch(), fill() and
  // zero_many() are captured instead of recorded (launch's `id` is left unchanged) and flush()
  // submits nothing; upload, download, copy, synchronize, set_retirement_depth, the timeline,
  // ndarray_memory and release_idle_memory return kFailedPrecondition naming the capture.
  Graphs& graphs();
  const Graphs& graphs() const;

  // --- sharing an ndarray's memory with another API (interop.h) ---
  // A view (it holds nothing of its own: copy it freely while the runtime lives).
  Interop interop();

  // Returns the runtime's idle memory to the driver: synchronizes (so every retirement entry is
  // complete and released), then frees the rings' chunks (open and pooled), the adstack heaps
  // (made again at the next launch that needs them), the ndarray pool, what the deferred
  // deleter holds, and the empty VkDeviceMemory blocks kept for reuse. Live ndarrays, kernels
  // and cached pipelines are kept. Afterwards, with every ndarray freed, stats().live.buffers
  // and memory_block_bytes are what they were before the first launch. The next launches make
  // what they need again (a cost of tens of microseconds per buffer), so call it between phases
  // of a program, not per iteration. Errors: those of synchronize(); kFailedPrecondition while
  // capturing.
  Status release_idle_memory();
  // Starts the memory peaks (RuntimeStats::memory_peak_*) again from what is held now, so the
  // next stats() tell the most a phase of a program held. Like stats(), kFailedPrecondition
  // while another thread is inside this runtime.
  Status reset_memory_peaks();
  // A snapshot of the counters. Like every call, kFailedPrecondition while another thread is
  // inside this runtime (the counters are being changed; see use_guard.h).
  Result<RuntimeStats> stats() const;
  // Milliseconds the driver has spent creating this runtime's pipelines (VKAD_GRAPH_TRACE's
  // compile times: a graph's specialized pipelines are made at its re-capture).
  double pipeline_create_ms() const { return pipelines_.create_ms(); }
  // Waits for the specialized variants being made in the background and takes them in, so
  // that the next launches run them (and stats() counts them): for tests and benchmarks.
  void finish_pipelines() { pipelines_.finish_background(); }
  // The resolved RuntimeOptions::cache_dir: "" when the on-disk caches are off.
  const std::string& cache_dir() const { return cache_dir_; }
  // Writes the driver's pipeline cache now (rhi::Device::save_pipeline_cache); the destructor
  // does it too. ok and nothing written when the caches are off or nothing new was compiled.
  Status save_pipeline_cache();

 private:
  // fill()'s checks of a fill of `array` with `value` (a dead handle, a value its dtype cannot
  // hold) and the step a graph keeps of it.
  Result<CapturedFill> fill_step(NdArrayHandle array, double value) const;
  Runtime();
  // The error for a handle that is not live here: foreign (kInvalidArgument) or freed /
  // never issued (kNotFound). `what` is "kernel" or "ndarray".
  Status dead_handle(const std::string& where, const char* what, uint64_t id) const;
  // One more write into `a` (write_count), by `what` (a launch: of kernel handle id `kernel`).
  static void note_write(NdArray& a, NdArray::Writer what, uint64_t kernel = 0);
  Result<uint64_t> issue_id();  // the next handle id of this runtime
  // Also finds each ndarray argument's NdArray (checked_arrays_, by parameter; null for a
  // scalar), which plan_pipelines reads.
  Status check_args(const Kernel& k, std::span<const Arg> args);
  std::vector<NdArray*> checked_arrays_;

  std::string cache_dir_;
  LaunchLimits limits_;       // the device's and options' numbers planning needs (launch_plan.h)
  NdArrayPool ndarray_pool_;  // create_ndarray's `pooled` (ndarray_table.h); create() sizes it
  PipelineCache pipelines_{256, nullptr};  // create() sets it from the options
  std::unordered_map<uint64_t, std::shared_ptr<const Kernel>> kernels_;
  uint64_t runtime_id_ = 0;  // process-wide, the high half of every handle
  // The low half: atomic for reserve_kernel_handle (any thread); issue_id the same counter.
  std::atomic<uint32_t> next_serial_{1};
  std::unordered_set<uint64_t> reserved_kernels_;  // reserved, not yet registered (under mu)
  std::mutex reserved_mu_;
  std::vector<std::byte> args_scratch_;  // launch: the args encoded before the copy to the device
  // What plan_pipelines finds for one launch (kept as a member: its vectors are reused).
  struct PlannedLaunch : CommandPlan {
    std::vector<rhi::Buffer*> arrays;  // the ndarray arguments' buffers, in parameter order
  };
  PlannedLaunch planned_;
  LaunchInputs plan_inputs_;                               // plan_pipelines' scratch
  std::vector<abi::ScalarValue> plan_scalars_;             // plan_pipelines' scratch
  std::vector<std::vector<uint32_t>> plan_adstack_words_;  // plan_pipelines' scratch
  PipelineCache::VariantKey plan_variant_;  // plan_pipelines' scratch (one task's key)
  bool batch_prepare_ = false;              // between begin_ and end_prepare_batch()
  // `args` must have just passed check_args(k, args): its arrays are read from checked_arrays_.
  // `background`: a specialized variant not made yet is made on a thread while this launch
  // runs the generic pipeline (RuntimeOptions::background_specialization); prepare() makes it
  // here.
  Status plan_pipelines(const Kernel& k, std::span<const Arg> args, PlannedLaunch* out,
                        bool background);
  void encode_planned_args(const Kernel& k, const LaunchPlan& lp);  // plan_pipelines' encoding

  static std::unique_ptr<CaptureHooks> make_graphs(Runtime& rt);  // graph.cpp
};

}  // namespace vkad::runtime
