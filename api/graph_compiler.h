// The graph compiler: a capture's rework planned (docs/graphs.md; the pure steps are
// graph/graph_rework.h, the merging graph/resident.h, graph/launch_fusion.h,
// graph/stencil_blocking.h and graph/gather_recompute.h). Step loops of small launches roll into
// resident kernels, stencil runs block, gathers recompute what they gather, the launches are
// scheduled and element-wise runs fuse; the kernels that makes are compiled (in parallel) under
// handles reserved for them. What it decides is a PreparedRework: CompiledGraphs installs it
// (api/compiled_graphs.h), StepLoops launches it (api/step_loops.h).
//
// Contract: prepare_rework reads the catalog, the compile caches and the extents
// snapshot_extents took, and touches no runtime state but handle reservation: it may run on
// another thread while the session's goes on, as long as nothing else uses those (the session
// joins a background rework before it registers a kernel). The kernels a rework compiled stay
// unregistered until register_rework_kernels, on the session's thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "api/session_core.h"
#include "graph/gather_recompute.h"
#include "graph/graph_rework.h"
#include "graph/graph_schedule.h"
#include "graph/resident.h"

namespace vkad {

class GraphCompiler {
 public:
  explicit GraphCompiler(SessionCore& core) : core_(core) {}
  GraphCompiler(const GraphCompiler&) = delete;
  GraphCompiler& operator=(const GraphCompiler&) = delete;

  // A kernel a rework compiled: registered under its reserved handle at the install.
  struct PendingKernel {
    KernelHandle handle;
    std::shared_ptr<const runtime::CompiledKernel> compiled;
  };
  // A stash a blocked stencil needs: its placeholder id in the plan's arguments, its type and
  // length.
  struct StashNeed {
    uint64_t placeholder = 0;
    DType dtype = DType::kF32;
    uint32_t elements = 0;
  };
  // What a graph rework decided before anything of it reaches the runtime (prepare_rework:
  // on the caller's thread, or on a background one); CompiledGraphs::install applies it.
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

  // The array extents the next prepare_rework reads (each launch's arrays, asked of the runtime
  // once per array, on the session's thread).
  void snapshot_extents(const CaptureLog& log);
  // The rework of `captured` (graph `graph` as captured, called `name`), planned and its kernels
  // compiled. Where it throws (out of memory), the kernels compiled so far are left for
  // take_unregistered.
  std::unique_ptr<PreparedRework> prepare_rework(GraphHandle graph,
                                                 std::vector<CapturedStep> captured,
                                                 const std::string& name);
  std::vector<PendingKernel> take_unregistered() { return std::exchange(unregistered_, {}); }
  // Registers p.kernels; false where one is refused (its handle is then forgotten).
  bool register_rework_kernels(PreparedRework& p);
  // Allocates each stash and puts it in place of its placeholder in `w`'s arguments; the
  // arrays go to `owned` (freed with what uses them).
  Status materialize_stashes(std::span<const StashNeed> needs, ReworkPlan* w,
                             std::vector<NdArrayHandle>* owned);
  // Printed IR of rework kernels the device refused to register: not made again.
  bool refused(const std::string& key) const { return refused_kernels_.count(key) != 0; }
  void refuse(std::string key) { refused_kernels_.insert(std::move(key)); }
  // Milliseconds the graph reworks spent compiling and registering kernels and the driver
  // making their pipelines (VKAD_GRAPH_TRACE: what of a slow end_capture is the compiler and
  // the driver's, not the analysis).
  double* compile_ms() { return &rework_compile_ms_; }

 private:
  // A launch step's schedule_launch answer and pins, by step index: the rework asks for them
  // twice (zero_outputs, then plan_order), and a step loop has thousands of launches.
  struct StepSchedule {
    ScheduleLaunch launch;
    std::vector<bool> pinned;
  };
  using ScheduleMemo = std::vector<std::optional<StepSchedule>>;
  // A blocked run's prologue (filling its stash) goes before the launch of captured launch
  // `first`.
  struct StashPrologue {
    size_t first = 0;
    KernelHandle kernel;
    uint64_t blocked_kernel = 0, placeholder = 0;
  };

  void plan_rework(PreparedRework* p);
  // Drops kernel `id` from every table and cache, its printed IR into refused_kernels_.
  void forget_kernel(uint64_t id);
  static Status refused_status(const codegen::Kernel& k);

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
  // A launch's scalars and its arrays' extents (the snapshot's) as the graph passes read them.
  static codegen::ScalarOf scalars_in(std::span<const Arg> args);
  codegen::ExtentOf extents_in(std::span<const Arg> args) const;
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

  // Step loops of small launches in `captured` rolled into resident kernels: false when none
  // is. Else `out` gets the steps with each loop as one launch, and per captured launch
  // `launch_index` its launch in `out` and `rolled` whether it was rolled.
  // Runs of a stencil kernel's launches become launches of blocked kernels
  // (graph/stencil_blocking.h) too, `blocked` counting the captured launches they take.
  bool roll(const std::vector<CapturedStep>& captured, std::vector<CapturedStep>* out,
            std::vector<uint32_t>* launch_index, std::vector<bool>* rolled, size_t* blocked,
            std::vector<StashNeed>* stashes);
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
  // The blocked runs among the launches no segment of `segments` covers, added to it (in
  // order) with their kernels in `built`; returns the captured launches they take.
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
  // Per parameter of a launch, the one first-axis row all its accesses touch
  // (codegen::FusionLaunch::rows).
  std::vector<int64_t> launch_rows(const CapturedStep& s) const;
  // The fused kernels of `runs` into `planned`, and the zero fills they make redundant into
  // `dropped`: false where one cannot be built (the graph then stays as captured).
  bool build_fused(std::span<const codegen::FusionRun> runs,
                   std::span<const codegen::FusionLaunch> launches,
                   std::span<const std::unordered_map<uint64_t, size_t>> zero_fills,
                   std::vector<MergedLaunch>* planned, std::vector<bool>* dropped);
  void trace_rework(const ReworkPlan& w, const std::string& name) const;
  // `cap`'s steps in scheduled order into `w` (steps, order, what each launch touches and what
  // fusion needs of it); per launch in capture order, the scalars the schedule rests on. A
  // step's entry in `memo` (recompute's), where there is one, is used (moved out) instead of
  // computing it again.
  void plan_order(const std::vector<CapturedStep>& cap, ReworkPlan* w,
                  std::vector<std::vector<bool>>* pinned, ScheduleMemo* memo) const;
  // What a captured launch reads and writes, rows evaluated (graph/graph_schedule.h); `pinned`
  // gets the scalar parameters those rows depend on.
  ScheduleLaunch schedule_launch(const CapturedStep& s, std::vector<bool>* pinned) const;
  // An array's extents during a graph rework (snapshot_extents'), nullptr for a freed one.
  const std::vector<uint32_t>* extents_of(uint64_t array) const;
  // A kernel the rework made, compiled, with a reserved handle (registered at the install:
  // unregistered_), with its IR and access summary where `keep_ir` (so later reworks see it
  // like any kernel of the session), its time added to rework_compile_ms_.
  Result<KernelHandle> rework_compile(const codegen::Kernel& k, bool keep_ir);
  // The same for several kernels, compiled on several threads; results in order.
  std::vector<Result<KernelHandle>> rework_compile_all(std::span<const codegen::Kernel> ks,
                                                       bool keep_ir);

  SessionCore& core_;
  std::unordered_map<std::string, KernelHandle> fused_kernels_;       // by printed IR
  std::unordered_map<std::string, KernelHandle> recomputed_kernels_;  // by printed IR
  std::unordered_set<std::string> refused_kernels_;
  // Kernels the running rework compiled (moved into its PreparedRework).
  std::vector<PendingKernel> unregistered_;
  double rework_compile_ms_ = 0;
  uint64_t next_stash_placeholder_ = uint64_t{1} << 62;
  // An array's extents during a graph rework (the passes ask for each launch's arrays several
  // times: read from the runtime once per array), nullopt for a freed one. Emptied when a
  // rework starts and ends.
  std::unordered_map<uint64_t, std::optional<std::vector<uint32_t>>> rework_extents_;
  // shape_class(): by extents for the session's life (recompute_answers_ keys hold them), by
  // array during a rework (emptied with rework_extents_).
  mutable std::map<std::vector<uint32_t>, uint64_t> shape_classes_;
  mutable std::unordered_map<uint64_t, uint64_t> rework_shape_class_;
  // recompute_key -> the rewritten kernel and its added arguments (kernel id 0: none).
  struct RecomputeAnswer {
    KernelHandle kernel;
    std::vector<uint32_t> producer_param;
  };
  struct WordsHash {
    size_t operator()(const std::vector<uint64_t>& w) const noexcept;
  };
  std::unordered_map<std::vector<uint64_t>, RecomputeAnswer, WordsHash> recompute_answers_;
};

}  // namespace vkad
