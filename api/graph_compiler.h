// The graph compiler: a capture's rework planned by the session's pipeline of graph passes
// (graph/program.h, graph/graph_passes.h; docs/graphs.md) -- step loops of small launches roll
// into resident kernels, stencil runs block, gathers recompute what they gather, the launches
// are scheduled and element-wise runs fuse -- and the kernels the passes make compiled (in
// parallel) under handles reserved for them: the passes' KernelSink. What it decides is a
// PreparedRework: CompiledGraphs installs it (api/compiled_graphs.h), StepLoops launches it
// (api/step_loops.h).
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
#include "graph/graph_rework.h"
#include "graph/program.h"

namespace vkad {

// Appends `text` to the file VKAD_GRAPH_DUMP names (nothing where it is unset or cannot be
// opened): the plans and recorded graphs of docs/graphs.md, "Diagnostics".
void append_graph_dump(const std::string& text);

class GraphCompiler final : public KernelSink {
 public:
  explicit GraphCompiler(SessionCore& core) : core_(core) {}
  GraphCompiler(const GraphCompiler&) = delete;
  GraphCompiler& operator=(const GraphCompiler&) = delete;

  // A kernel a rework compiled: registered under its reserved handle at the install.
  struct PendingKernel {
    KernelHandle handle;
    std::shared_ptr<const runtime::CompiledKernel> compiled;
  };
  using StashNeed = vkad::StashNeed;
  // What a graph rework decided before anything of it reaches the runtime (prepare_rework:
  // on the caller's thread, or on a background one); CompiledGraphs::install applies it.
  struct PreparedRework {
    GraphHandle graph;  // as captured
    std::string name;
    std::vector<CapturedStep> captured;
    bool rework = false;  // false: the graph stays as captured
    ReworkPlan w;
    std::vector<uint32_t> roll_index;  // Program::launch_index
    std::vector<bool> rolled;          // Program::merged
    size_t blocked = 0;                // captured launches in blocked stencil dispatches
    size_t dropped = 0;                // captured launches left out (dead; graph/rename_pass.cpp)
    bool renumbered_only = false;      // rename / prune changed the numbering, nothing merged
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

  // The array extents the next prepare_rework reads (each step's arrays, asked of the runtime
  // once per array, on the session's thread).
  void snapshot_extents(std::span<const CapturedStep> steps);
  void snapshot_extents(std::span<const Arg> args);  // every ndarray among `args`
  // The rework of `captured` (graph `graph` as captured, called `name`): the session's pipeline
  // run over it, its kernels compiled. Where it throws (out of memory), the kernels compiled so
  // far are left for take_unregistered.
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

  // KernelSink: each kernel compiled once per printed IR (and keep_ir), with a reserved handle
  // (registered at the install: unregistered_), several on several threads; with its IR and
  // access summary in the catalog where `keep_ir`, else its access summary only.
  std::vector<Result<KernelHandle>> make(std::span<const codegen::Kernel> kernels,
                                         bool keep_ir) override;
  using KernelSink::make;

 private:
  // Drops kernel `id` from every table and cache, its printed IR into refused_kernels_.
  void forget_kernel(uint64_t id);
  void trace_rework(const ReworkPlan& w, const std::string& name) const;
  void dump_rework(const ReworkPlan& w, const std::string& name) const;
  // An array's extents during a graph rework (snapshot_extents'), nullptr for a freed one.
  const std::vector<uint32_t>* extents_of(uint64_t array) const;
  // The kernels, compiled on several threads, with reserved handles; results in order.
  std::vector<Result<KernelHandle>> compile_all(std::span<const codegen::Kernel> ks, bool keep_ir);

  SessionCore& core_;
  // The kernels the passes made, by keep_ir and printed IR.
  std::unordered_map<std::string, KernelHandle> made_[2];
  std::unordered_set<std::string> refused_kernels_;
  // Kernels the running rework compiled (moved into its PreparedRework).
  std::vector<PendingKernel> unregistered_;
  double rework_compile_ms_ = 0;
  // An array's extents during a graph rework (the passes ask for each launch's arrays several
  // times: read from the runtime once per array), nullopt for a freed one. Emptied when a
  // rework starts and ends.
  std::unordered_map<uint64_t, std::optional<std::vector<uint32_t>>> rework_extents_;
  std::unordered_map<uint64_t, DType> rework_dtypes_;  // with rework_extents_
  void add_extents(std::span<const Arg> args);         // snapshot_extents' arrays not asked yet
};

}  // namespace vkad
