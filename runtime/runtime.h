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

// Launches per bundle of a replayed graph (Runtime::replay): the replay that records a graph
// submits each bundle as soon as it is recorded, so the device starts on the graph's first
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

// One step of a graph: what Runtime::instantiate makes a graph of, and what a graph's record
// (Runtime::graph_record, capture_record) reads back. A launch of `kernel` with `args`, or a fill
// of `array` with `value`; the factories below make either.
struct GraphStep {
  bool launch = true;  // false: a fill
  KernelHandle kernel;
  // A launch's arguments, borrowed: instantiate reads them during the call; a record's point
  // into the graph (valid while its GraphRecord is).
  std::span<const Arg> args;
  // A launch: no barrier between the launch before it and this one, so the two may run
  // concurrently (Runtime::omit_next_barrier's request, with its contract: for a caller that
  // proved they touch nothing in common). Honoured only where the step before is a launch.
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

class Runtime {
  struct Graph;  // a graph's steps, plans and bundles (private: below)

 public:
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
  // will pass. Counts in RuntimeStats::prepares; not a launch.
  Status prepare(KernelHandle kernel, std::span<const Arg> args);
  // The argument checks of launch(kernel, args) alone (handles, count, kinds, dtypes, ranks,
  // scalar ranges): nothing planned, made or recorded. Session::launch_loop checks a loop's
  // launches with it before running any.
  Status check_launch(KernelHandle kernel, std::span<const Arg> args);
  // The sequence number the next recorded launch will get.
  LaunchId next_launch_id() const { return LaunchId{next_launch_ + 1}; }

  // --- captured launch sequences (graphs) ---
  // A graph is a sequence of launches and device fills captured once and replayed with one
  // call: the launches' checks, plans (ranges, workgroups, adstack rows and tiers), pipelines
  // (specialized variants included) and encoded args are kept. Where every pipeline binds with
  // push descriptors (every device vkad knows of), the first replay records the steps once into
  // bundles (secondary command buffers, rhi/command_list.h) of at most kBundleLaunches launches
  // that read every launch's args from a device buffer of the graph's own; it submits the work
  // recorded so far after each bundle (a flush), so the device runs the graph's first pieces
  // while the driver records the rest. Each later replay writes all args into the upload ring
  // and records a copy in per 256 KiB of args, one vkCmdExecuteCommands per bundle and the
  // copies of the error words back -- no validation, planning, allocation, lookup or per-launch
  // command. The bundles are recorded again when an update changed a launch's
  // plan (its range, workgroups or pipeline variant) or the adstack heaps grew. Without push
  // descriptors every step is recorded again at each replay (same results). Arrays are bound by
  // reference (checked alive at every replay; a freed one makes the replay fail naming it, with
  // nothing recorded); the adstack heaps are the runtime's at the replay (grown first if the graph
  // needs more). Device errors of replayed launches are reported as for any launch, with the
  // sequence numbers each replay gave them.
  //
  // begin_capture: from now until end_capture, launch() and fill() (zero) are validated and
  // planned as usual but captured instead of recorded (launch's `id` is left unchanged);
  // flush() submits nothing (so a DSL's step function that flushes can be captured as is);
  // upload, download, synchronize, set_retirement_depth and replay return
  // kFailedPrecondition naming the capture. kFailedPrecondition if a capture is open already.
  // A fill of an 8-byte dtype whose pattern's halves differ (f64 1.0, an i64 seed) is captured
  // as rhi::CommandList::fill64 (the pattern inline in the command buffer, then copies within
  // the array), where fill() outside a capture stages it from the host.
  //
  // `run`: the capture also runs what it captures, as launch() and fill() would have, in
  // order and asynchronously -- the first iteration of a training loop without a replay after
  // its capture (docs/graphs.md, "A capture that runs"). The captured steps are cut into pieces of
  // kBundleLaunches steps (the first three of 64, 128 and 256); threads of the runtime's own record
  // each piece into a bundle (the driver's per-launch recording, ~5 us on NVIDIA, off the caller's
  // thread) and the caller's next captured step submits the pieces recorded so far, so the device
  // runs the first pieces while the capture goes on. Each piece reads its args from a device buffer
  // of its own (copied in from the upload ring at submission, and out to the readback ring for the
  // error words); launches get their LaunchIds, stats and device-error reports when submitted.
  // Freeing an array while running first submits every step captured so far (its buffer stays alive
  // until they complete). end_capture submits the rest and returns once everything is submitted;
  // the graph is then the same as without `run` (its first replay records its own bundles). Should
  // a piece fail (out of memory, device lost), nothing after it runs and end_capture returns that
  // error, the capture dropped. Without push descriptors every piece is recorded on the caller's
  // thread (same results).
  Status begin_capture(const std::string& name = "", bool run = false);
  // The graph (kFailedPrecondition without an open capture; an empty capture is a graph too).
  Result<GraphHandle> end_capture();
  // Records the graph's steps into the current list, in order, as if launched one by one
  // (ordered with every other call; asynchronous; may auto-flush once at the end). `updates`
  // replace scalar arguments of captured launches, for this replay and later ones: each names
  // the launch (0-based, in capture order), the parameter and the new value, checked as a
  // launch checks it; an updated launch is planned again (its ranges may depend on it).
  // `first`, when not null, receives the LaunchId of the graph's first launch (the others
  // follow consecutively). On an error in the checks (a bad update, a freed array) nothing is
  // recorded and no update is kept; running out of memory for the ring or the bundle part-way
  // keeps the updates and may leave the steps before it recorded.
  Status replay(GraphHandle graph, std::span<const GraphUpdate> updates = {},
                LaunchId* first = nullptr);
  // Drops the graph (its pipelines return to the cache's care). kNotFound for a dead handle.
  Status release_graph(GraphHandle graph);
  // Whether a capture is open; the steps (launches and fills) of a graph (kNotFound for a dead
  // handle): what Session checks its count of the steps it captured against (a step captured
  // through runtime() meanwhile leaves its graph unreworked).
  bool capturing() const { return capture_ != nullptr; }
  // During a capture: the next launch captured is recorded without the barrier that otherwise
  // follows the launch captured last, so the two may run concurrently. For a caller that has
  // proved they touch nothing in common (Session's graph scheduling, session.h) -- the
  // adstack heaps included, which every heap-tier launch shares (thread g of each uses the same
  // slots); a fill, or anything but a launch captured next, keeps the barrier, and the next
  // launch() call takes the request even when it refuses the launch.
  // kFailedPrecondition without an open capture.
  Status omit_next_barrier();
  // While a capture runs (begin_capture's `run`): the steps captured since the last piece
  // become a piece now, which the next captured step (or end_capture) submits, instead of
  // waiting for 64-512 more steps -- what one long launch (a rolled step loop,
  // Session::launch_loop) wants, so the device starts it while the caller goes on. Nothing
  // otherwise (kFailedPrecondition while another thread uses the runtime).
  Status cut_capture_run();
  Result<size_t> graph_steps(GraphHandle graph) const;
  // The kernel name of each of a graph's launches, in the numbering replay updates take
  // (kNotFound for a dead handle).
  Result<std::vector<std::string>> graph_launch_kernels(GraphHandle graph) const;
  // How many of a graph's launches a barrier follows (the rest run concurrently with the next
  // launch: omit_next_barrier). kNotFound for a dead handle.
  Result<size_t> graph_barriers(GraphHandle graph) const;
  // A graph made directly from `steps`, in order, without a capture: each launch checked and
  // planned as a launch() between begin_capture(name) and end_capture is (the same errors,
  // plans, pipelines -- specialized variants included, made or begun as such a launch makes
  // them -- and stats), its `omit_barrier` taken as omit_next_barrier() before it, its `origin`
  // as the note it was captured under; each fill as fill() captures it (zero_many's fills are
  // fills of 0). The graph is then a captured one in every respect (replay, its bundles and
  // timed replays, updates, graph_record, release_graph). Nothing is recorded or run.
  //
  // No capture is opened: capturing() and capture_record() do not change, and a capture the
  // caller has open -- one that runs included -- goes on unchanged (its steps, its pending
  // omit_next_barrier request, the launch note): instantiate is allowed then, and makes a graph
  // of `steps` alone. `name` "" is "graph", as begin_capture's.
  //
  // Errors: the first step refused, with the code launch() or fill() gives it and the message
  // "instantiate of graph '<name>', step <i>: " followed by theirs (a dead or foreign handle, a
  // bad argument, a value the array's dtype cannot hold, a launch past the device's loop
  // limit...); nothing is kept then (no graph, no pipeline retained by it; pipelines made for
  // the steps before stay in the cache). kFailedPrecondition while another thread uses the
  // runtime, kDeviceLost after a loss.
  Result<GraphHandle> instantiate(const std::string& name, std::span<const GraphStep> steps);
  // A read-only view of a graph's steps (graph_record) or of the open capture's so far
  // (capture_record), what a layer above reads instead of keeping its own record of a capture
  // (Session's graph rework). Reading is cheap: no copy; step i's arguments point into the
  // graph. Valid until the runtime's next non-const call: a replay with updates changes the
  // arguments (they are read with every update so far applied), release_graph frees them,
  // another captured step may move the open capture's.
  class GraphRecord {
   public:
    size_t size() const;      // steps: launches and fills
    size_t launches() const;  // launch steps, the numbering replay updates take
    // Step i (< size()): its kernel and arguments or its array and value; `omit_barrier` true
    // where no barrier separates it from the launch before it; the origin it was captured
    // (or instantiated) with. A fill's value is the one given to fill().
    GraphStep operator[](size_t i) const;

   private:
    friend class Runtime;
    explicit GraphRecord(const Graph* g) : g_(g) {}
    const Graph* g_ = nullptr;  // null: no steps
  };
  // kNotFound for a dead graph handle.
  Result<GraphRecord> graph_record(GraphHandle graph) const;
  // The open capture's steps so far (none without one).
  GraphRecord capture_record() const { return GraphRecord(capture_.get()); }
  // --- sharing an ndarray's memory with another API (runtime/ndarray_export.cpp) ---
  // What the Python package's DLPack exchange is built on (docs/interop.md, "Sharing arrays
  // with PyTorch, JAX and numpy"). The memory stays the runtime's: a caller that hands it out must
  // keep the array alive (not free it) while anyone uses it, and order the other API's work
  // against this runtime's itself, with the serials and the semaphore below.
  struct NdArrayMemory {
    std::byte* host = nullptr;  // the mapped bytes (host-visible memory), else null
    bool host_coherent = true;  // false: host views need hold_host_view's flushes
    uint64_t block_id = 0;      // the VkDeviceMemory block (rhi::BlockInfo::id)
    uint64_t block_bytes = 0;   // its size
    uint64_t offset = 0;        // the array's first byte in the block
    uint64_t bytes = 0;         // the array's size
    bool exportable = false;    // export_ndarray_fd can hand out the block
    // The serial of the last submission that used the array (rhi::kNoSerial: none): the
    // value the stream's timeline semaphore reaches when that work is done.
    rhi::Serial last_use;
  };
  // Submits what is recorded (so every use of the array so far has a serial), then says where
  // its bytes are. kNotFound / kInvalidArgument for a dead or foreign handle; kFailedPrecondition
  // while capturing (nothing could be submitted).
  Result<NdArrayMemory> ndarray_memory(NdArrayHandle array);
  // Blocks until the array's last use (as of ndarray_memory) completed; then device writes are
  // visible through the mapped pointer (non-coherent memory is invalidated).
  Status wait_ndarray(NdArrayHandle array);
  // While a host view of a mapped array is held (counted), every flush first makes host writes
  // to it visible to the device and synchronize() makes device writes visible to the host:
  // non-coherent memory is flushed / invalidated; nothing is done for coherent memory.
  // release_host_view ignores an unknown handle (it never fails).
  Status hold_host_view(NdArrayHandle array);
  void release_host_view(NdArrayHandle array);
  // A new opaque POSIX fd of the block holding the array (the caller owns it), for
  // cuImportExternalMemory. kUnsupported when the block is not exportable.
  Result<int> export_ndarray_fd(NdArrayHandle array);
  // A new opaque POSIX fd of the stream's timeline semaphore, whose value is the last serial
  // completed (kUnsupported where it is not exportable: Capabilities::export_semaphore_fd).
  Result<int> export_timeline_fd();
  // Called with a block id (NdArrayMemory::block_id) just before that block's memory is freed
  // (see rhi::MemoryAllocator::set_block_freed_hook), on the thread inside the runtime.
  void set_block_freed_hook(std::function<void(uint64_t)> hook);

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
  // Each launch's origin as it was captured, in capture order.
  Result<std::vector<LaunchOrigin>> graph_launch_origins(GraphHandle graph) const;
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
  // A snapshot of the counters. Like every call, kFailedPrecondition while another thread is
  // inside this runtime (the counters are being changed; see use_guard.h).
  Result<RuntimeStats> stats() const;
  // Milliseconds the driver has spent creating this runtime's pipelines (VKAD_GRAPH_TRACE's
  // compile times: a graph's specialized pipelines are made at its re-capture).
  double pipeline_create_ms() const { return pipelines_.create_ms(); }
  // Waits for the specialized variants being made in the background and takes them in, so
  // that the next launches run them (and stats() counts them): for tests and benchmarks.
  void finish_pipelines() { pipelines_.finish_background(); }
  // Read-only: the device's state (capabilities, validation messages, live objects). Calls that
  // change it (mark_lost, live_mut, creating objects) stay inside the runtime, which keeps its
  // invariants.
  const rhi::Device& device() const { return *device_; }
  const rhi::Capabilities& caps() const { return device_->caps(); }
  // The resolved RuntimeOptions::cache_dir: "" when the on-disk caches are off.
  const std::string& cache_dir() const { return cache_dir_; }
  // Writes the driver's pipeline cache now (rhi::Device::save_pipeline_cache); the destructor
  // does it too. ok and nothing written when the caches are off or nothing new was compiled.
  Status save_pipeline_cache();

 private:
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

  Runtime() : retirement_(kDefaultRetirementDepth) {}
  Status ensure_list();
  // Records a host -> device copy of all of `a` from `data` (a.bytes bytes) through a staging
  // buffer retired with the list: upload, and fill's patterns that vkCmdFillBuffer cannot repeat.
  Status record_host_copy(NdArray& a, const void* data);
  // The error for a handle that is not live here: foreign (kInvalidArgument) or freed /
  // never issued (kNotFound). `what` is "kernel" or "ndarray".
  Status dead_handle(const std::string& where, const char* what, uint64_t id) const;
  Result<uint64_t> issue_id();  // the next handle id of this runtime
  // Also finds each ndarray argument's NdArray (checked_arrays_, by parameter; null for a
  // scalar), which plan_pipelines reads.
  Status check_args(const Kernel& k, std::span<const Arg> args);
  std::vector<NdArray*> checked_arrays_;
  Status drain_all();
  Status ensure_heaps(const std::array<uint64_t, adstack::kHeapCount>& need);
  void read_error_flags(CtxBuffers& retired);
  // The lines a retired launch's print statements left in its print area, to the print sink.
  void print_lines(const FlagSite& site);
  // Reads and releases what the retirement queue retired (after every call that can retire).
  void take_retired();

  RuntimeOptions options_;
  std::string cache_dir_;
  LaunchLimits limits_;  // the device's and options' numbers planning needs (launch_plan.h)
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
  // "launch k of graph 'name'" for a flagged replayed launch (the graph may be released by then).
  std::string graph_launch_where(uint64_t graph, uint32_t index) const;
  // Records a device event around what `record` records into list_ when the timeline is on;
  // `name` is called only then.
  template <typename Record, typename Name>
  Status timed(const char* category, Name&& name, Record&& record);
  // Freed pooled ndarrays' buffers, oldest first (create_ndarray's `pooled`), with their bytes.
  struct PooledBuffer {
    rhi::Buffer buffer;
    uint64_t bytes = 0;
  };
  std::deque<PooledBuffer> ndarray_pool_;
  uint64_t ndarray_pool_bytes_ = 0;
  uint64_t ndarray_pool_reuses_ = 0;
  // A pooled buffer of `bytes` whose every use has completed, or an invalid Buffer.
  rhi::Buffer take_pooled(uint64_t bytes);
  void pool_buffer(rhi::Buffer buffer, uint64_t bytes);
  PipelineCache pipelines_{256, nullptr};  // create() sets it from the options
  std::unordered_map<uint64_t, std::shared_ptr<const Kernel>> kernels_;
  NdArrayTable arrays_;
  uint64_t runtime_id_ = 0;  // process-wide, the high half of every handle
  // The low half: atomic for reserve_kernel_handle (any thread); issue_id the same counter.
  std::atomic<uint32_t> next_serial_{1};
  std::unordered_set<uint64_t> reserved_kernels_;  // reserved, not yet registered (under mu)
  std::mutex reserved_mu_;
  rhi::StreamSemaphore last_sem_;
  AdstackHeaps heaps_;  // shared by all adstack launches
  // Launch args and small upload staging / small readbacks (host_ring.h): no buffer per call.
  std::optional<HostRing> upload_ring_, readback_ring_;
  // Found at retirement, reported at the next drain: one entry per (kernel, task, message).
  DeviceErrorLog errors_;     // found at retirement, reported at the next drain
  uint64_t next_launch_ = 0;  // the last LaunchId issued
  RuntimeStats stats_;
  std::vector<std::byte> args_scratch_;  // launch: the args encoded before the copy to the device
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
  // What plan_pipelines finds for one launch (kept as a member: its vectors are reused).
  struct PlannedLaunch : CommandPlan {
    std::vector<rhi::Buffer*> arrays;  // the ndarray arguments' buffers, in parameter order
  };
  PlannedLaunch planned_;
  LaunchInputs plan_inputs_;                               // plan_pipelines' scratch
  std::vector<abi::ScalarValue> plan_scalars_;             // plan_pipelines' scratch
  std::vector<std::vector<uint32_t>> plan_adstack_words_;  // plan_pipelines' scratch
  PipelineCache::VariantKey plan_variant_;  // plan_pipelines' scratch (one task's key)
  // `args` must have just passed check_args(k, args): its arrays are read from checked_arrays_.
  // `background`: a specialized variant not made yet is made on a thread while this launch
  // runs the generic pipeline (RuntimeOptions::background_specialization); prepare() makes it
  // here.
  Status plan_pipelines(const Kernel& k, std::span<const Arg> args, PlannedLaunch* out,
                        bool background);
  void encode_planned_args(const Kernel& k, const LaunchPlan& lp);  // plan_pipelines' encoding
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
  void count_launch(const CommandPlan& plan);  // the stats of one launch recorded
  Result<rhi::StreamSemaphore> submit_list();  // flush()'s submission, also while capturing
  Status auto_flush();  // flush when the list is past max_dispatches_per_list or max_list_age_us
  std::vector<rhi::Buffer*> bindings_;  // record_launch's scratch

  // Graphs (runtime/graph.cpp). A captured launch owns no memory of its own: its arguments,
  // buffers and encoded args are ranges of its graph's pools and its plan is shared, so a capture
  // allocates nothing per launch but the pools' amortised growth (and a plan per change of
  // plan).
  struct CapturedLaunch {
    std::shared_ptr<const Kernel> kernel;
    uint32_t args = 0;    // Graph::args.at(args)[0, kernel's parameters): its arguments
    uint32_t arrays = 0;  // Graph::arrays.at(arrays)[0, kernel->array_count): its buffers
    uint32_t plan = 0;    // Graph::plans index
    // false: the next launch needs no barrier after this one (omit_next_barrier).
    bool barrier_after = true;
    LaunchOrigin origin;  // the note when it was captured
  };
  // A launch an update changes, while a replay checks and plans it (kept only if the whole
  // replay is recorded).
  struct UpdatedLaunch {
    uint32_t index = 0;     // in Graph::launches
    std::vector<Arg> args;  // its arguments, the updates applied
    CommandPlan plan;       // planned with them
    std::vector<std::byte> encoded;
  };
  struct CapturedFill {
    NdArrayHandle array;
    uint64_t pattern = 0;  // an element's bytes (the low 32 bits where !wide)
    bool wide = false;     // an 8-byte pattern with unequal halves: rhi fill64
    double value = 0;      // what fill() was given (GraphRecord reads it back)
  };
  // A graph's recorded bundles (record_bundles).
  struct BundleSet {
    std::vector<rhi::Bundle> bundles;
    uint64_t heaps = 0;    // heaps_.generation() they were recorded with
    bool current = false;  // recorded in full since the plans last changed
    // A timed set's stamps, reset and copied out by every replay, and what they time.
    rhi::QueryPool stamps;
    std::shared_ptr<TimelineRecorder::ReplayLayout> layout;
  };
  struct Graph {
    std::string name;
    std::vector<CapturedLaunch> launches;
    ChunkedVector<Arg> args;  // every launch's arguments, in capture order
    // Every launch's ndarray buffers, resolved again from `args` at every replay (the arrays are
    // bound by reference).
    ChunkedVector<rhi::Buffer*> arrays;
    std::vector<CommandPlan> plans;
    std::vector<uint32_t> plan_users;  // launches per plan: an update copies a shared plan
    // While steps are added: each kernel's last plan, the one its next launch shares if equal.
    std::unordered_map<const Kernel*, uint32_t> last_plan;
    // Steps in order: launch i is {true, i}, fill i is {false, i}.
    std::vector<std::pair<bool, uint32_t>> steps;
    std::vector<CapturedFill> fills;
    std::vector<uint64_t> pipeline_keys;  // cache entries retained while the graph lives
    // The launches' encoded args (updates applied) at args_offset[i], written at capture: a
    // replay recording every step reads them from here. Pre-recorded replay (graph.cpp): the
    // steps recorded once into `bundles`, reading every launch's args from `args_dev` at
    // args_offset[i]; each replay copies `args_blob` into it from the upload ring, and copies it
    // back to the readback ring afterwards for the error words.
    std::vector<uint64_t> args_offset;
    std::vector<std::pair<uint64_t, uint64_t>> pieces;  // [begin, end) copied per ring slot
    std::vector<std::byte> args_blob;
    rhi::Buffer args_dev;
    // The steps in order, kBundleLaunches launches each: `plain` for replays, `timed` (the same
    // commands and a timestamp per boundary) for replays while a timeline is on.
    BundleSet plain, timed;
    bool rerecord = false;  // an update changed a launch's plan (ranges, groups, pipelines)
    // Some plan runs a generic pipeline while its specialized one is being made
    // (CommandPlan::spec_pending): replays look for it (refresh_pending_plans).
    bool pending_plans = false;
  };
  // The last capture's sizes, which the next capture reserves: a training loop captures the
  // same ~10^4 launches again, and growing their vectors by doubling copied megabytes inside
  // the recording (the arguments and buffers are chunked: ChunkedVector).
  struct CaptureSizes {
    size_t launches = 0, steps = 0, blob = 0;
  };
  CaptureSizes capture_sizes_;
  // `time_launches`: with a timeline, whether this replay's launches are timed one by one
  // (TimelineRecorder::time_replay), else the replay is one event. replay_bundle executes the
  // graph's bundles, replay_steps records every step again (a graph that cannot be bundled).
  Status replay_bundle(Graph& g, uint64_t id, bool any_heap, const std::string& where,
                       LaunchId* first, bool time_launches);
  Status replay_steps(Graph& g, uint64_t id, LaunchId* first, bool time_launches);
  // replay_bundle's parts: the args blob copied into g.args_dev (made at the first replay)
  // through upload ring slots; and, after the bundles, back into readback ring slots for the
  // error words, `down` getting each piece's.
  Status upload_graph_args(Graph& g);
  Status read_back_graph_args(Graph& g, std::vector<const std::byte*>* down);
  // A replay's checked updates into the graph: arguments, encoded args and plans (a plan shared
  // with other launches is copied).
  static void apply_updates(Graph& g, std::vector<UpdatedLaunch>& updated);
  // replay()'s steps: the launches updates change (copies), their new plans (`rerecord` when
  // one changes what a bundle bakes in: same_commands), and every array and heap the graph
  // binds, checked alive.
  static Status updated_launches(const Graph& g, std::span<const GraphUpdate> updates,
                                 const std::string& where, std::vector<UpdatedLaunch>* updated);
  static bool same_commands(const CommandPlan& was, const CommandPlan& now);
  // The plan a kernel's launch uses: `slot`, the kernel's latest plan, where equal to `plan`
  // (a step loop's launches share one), else a new entry of g.plans that `slot` then names.
  // `fresh`: the kernel has no plan in `slot` yet. The caller counts the launch's use.
  static uint32_t share_plan(Graph& g, uint32_t& slot, bool fresh, const CommandPlan& plan);
  // At a replay of a graph with pending_plans: launches captured while their shape's
  // specialized pipeline was being made on a thread hold the generic one in their plans, which
  // every replay would run. Plans such launches again with their own arguments (plans stay
  // shared where equal; a changed one records the bundle again), never waiting: a pipeline
  // still being made is looked for again at the next replay.
  void refresh_pending_plans(Graph& g);
  Status plan_updates(std::vector<UpdatedLaunch>& updated, const Graph& g, const std::string& where,
                      bool* rerecord);
  Status bind_graph_arrays(Graph& g, std::span<const UpdatedLaunch> updated,
                           const std::string& where, bool* any_heap);
  // A captured launch's ndarray buffers, as capture or the last bind_graph_arrays found them.
  static std::span<rhi::Buffer* const> graph_arrays(const Graph& g, const CapturedLaunch& c) {
    return {g.arrays.at(c.arrays), c.kernel->array_count};
  }
  std::vector<const std::byte*> replay_down_;  // replay_bundle's scratch

  // A running capture (begin_capture's `run`; runtime/capture_run.cpp). A piece is a run of
  // captured steps with everything its recording reads resolved when it is cut (buffers,
  // plans, heaps, args): the recording thread touches nothing else of the runtime.
  struct RunStep {
    std::shared_ptr<const Kernel> kernel;  // null: a fill
    uint32_t plan = 0;                     // RunPiece::plans
    uint32_t arrays = 0;                   // RunPiece::arrays[arrays, + kernel->array_count)
    uint64_t args_offset = 0;              // in RunPiece::args
    bool barrier_after = true;
    rhi::Buffer* fill = nullptr;  // a fill's buffer, its array, bytes and pattern
    uint64_t fill_array = 0;
    uint64_t fill_bytes = 0;
    uint64_t pattern = 0;
    bool wide = false;    // CapturedFill::wide
    LaunchOrigin origin;  // a launch's CapturedLaunch::origin
  };
  struct RunPiece {
    std::vector<RunStep> steps;
    std::vector<CommandPlan> plans;
    std::vector<rhi::Buffer*> arrays;
    std::array<rhi::Buffer*, adstack::kHeapCount> heaps{};
    // The launches' encoded args: copied at submission into `args`, a device buffer of the
    // piece's (read by every workgroup: host memory would put a PCIe read on each dependent
    // launch), and back out for the error words, as a graph's replay does.
    std::vector<std::byte> args_host;
    rhi::Buffer args;
    uint64_t seq = 0;      // cut order: submitted in it
    bool direct = false;   // recorded into the runtime's list (a pipeline without push descriptors)
    rhi::Bundle bundle;    // the recording's result
    double record_us = 0;  // the recording thread's time on it (VKAD_GRAPH_TRACE)
    Status status;
  };
  struct CaptureRun {
    std::mutex mu;
    std::condition_variable cv;  // a piece queued (todo), recorded (done), or stop
    std::deque<std::unique_ptr<RunPiece>> todo;
    std::map<uint64_t, std::unique_ptr<RunPiece>> done;  // by seq: recorded in any order
    bool stop = false;
    // The caller's thread only:
    std::vector<std::thread> threads;  // none: the caller's thread records every piece
    uint64_t next_seq = 0, next_submit = 0;
    size_t outstanding = 0;         // pieces cut, not submitted yet
    size_t next_step = 0;           // the first captured step not in a piece
    std::vector<rhi::Bundle> keep;  // submitted bundles, released once the thread stopped
    Status error;                   // the first piece that failed: nothing after it runs
    // VKAD_GRAPH_TRACE: where the caller's time went (us), printed by run_finish.
    bool trace = false;
    double cut_us = 0, submit_us = 0, queue_us = 0, wait_us = 0, record_us = 0;
  };
  std::unique_ptr<CaptureRun> run_;
  // Recording thread `index` (side pool `index`).
  static void run_thread(CaptureRun* run, rhi::Stream* stream, int index);
  static Status record_piece(rhi::Stream& stream, RunPiece& piece, int pool);
  // A piece's steps into `list` (a side bundle, or the runtime's list for a direct piece).
  static Status record_run_steps(rhi::CommandList& list, RunPiece& piece,
                                 std::vector<rhi::Buffer*>& bindings,
                                 std::vector<uint64_t>& filled);
  void run_after_step();             // a step was captured: submit, cut
  void run_cut(bool split = false);  // the steps not in a piece yet (split: one per thread)
  void run_cut_range(size_t begin, size_t end);  // steps [begin, end) as one piece
  Status run_heaps(size_t begin, size_t end, uint64_t* lo, uint64_t* hi);  // run_cut's parts
  void run_steps_into(RunPiece& piece, size_t begin, size_t end, uint64_t lo);
  void run_pump(bool wait_all);        // submits recorded pieces (all outstanding: wait_all)
  Status run_drain();                  // cut, then submit everything (before a free)
  Status run_finish();                 // end_capture's: the rest, the threads stopped
  void run_stop() noexcept;            // stops the threads, drops what is not submitted
  void submit_piece(RunPiece& piece);  // executes it into the list (submitted by run_pump)
  Status run_start();                  // begin_capture's: side pools made, threads started
  Status record_bundles(Graph& g, BundleSet& set, bool timed);
  // The barriers around a graph's fills, as zero_many records them: one pair per run of
  // consecutive fills, and a second fill of one array in a run ordered after the first (it may
  // write another value). record_steps and a capture run's pieces record with it.
  class FillBarriers {
   public:
    explicit FillBarriers(std::vector<uint64_t>& scratch) : filled_(scratch) { filled_.clear(); }
    // `wide`: `pattern` is 8 bytes with unequal halves (CommandList::fill64), else 32 bits.
    void fill(rhi::CommandList& list, rhi::Buffer& buffer, uint64_t array, uint64_t pattern,
              bool wide, uint64_t bytes);
    void end(rhi::CommandList& list);  // before a launch, and after the last step

   private:
    std::vector<uint64_t>& filled_;  // the arrays the open run filled
    bool filling_ = false;
  };
  Status record_steps(rhi::CommandList& list, const Graph& g,
                      const std::function<Status(uint32_t)>& launch);
  std::vector<uint64_t> filled_scratch_;  // record_steps' scratch
  // Steps into a graph (runtime/graph_steps.cpp), the open capture's or instantiate's. add_launch
  // takes what check_args and plan_pipelines just made of `args` (planned_, args_scratch_);
  // `omit_barrier`: no barrier after the graph's last step where that is a launch.
  void add_launch(Graph& g, const std::shared_ptr<const Kernel>& k, std::span<const Arg> args,
                  bool omit_barrier, const LaunchOrigin& origin);
  static void add_fill(Graph& g, const CapturedFill& fill);
  // fill()'s checks of a fill of `array` with `value` (a dead handle, a value its dtype cannot
  // hold) and the step a graph keeps of it.
  Result<CapturedFill> fill_step(NdArrayHandle array, double value) const;
  Status instantiate_step(Graph& g, const GraphStep& step);
  // end_capture's and instantiate's last part: `g` kept under handle `id`.
  GraphHandle keep_graph(uint64_t id, std::unique_ptr<Graph> g);
  Status not_while_capturing(const char* what) const;
  std::unique_ptr<Graph> capture_;  // the capture being recorded
  bool omit_next_barrier_ = false;  // omit_next_barrier() before the next captured launch
  std::unordered_map<uint64_t, std::unique_ptr<Graph>> graphs_;
  // hold_host_view's counts, of arrays in mapped memory that is not host-coherent only.
  std::unordered_map<uint64_t, uint32_t> host_views_;
  Status sync_host_views(bool to_device);  // flush (to_device) or invalidate them all
  UseGuard use_guard_;                     // see use_guard.h: the thread model, enforced
};

}  // namespace vkad::runtime
