// The graphs a Session captured, as it runs them: each capture's rework (api/graph_compiler.h)
// installed -- its kernels registered, its stashes allocated, the reworked graph made in place
// of the one captured (Runtime::Graphs::instantiate) -- or run in the background until a replay
// finds it done; replays in the captured launches' numbering, translated to the reworked graph's or
// falling back to the graph as captured where an update breaks what the schedule rested on; release
// of both.
//
// Contract: Session's thread only. join() before anything that registers a kernel or writes the
// catalog (a background rework reads them); settle() installs a finished or running background
// rework (waiting for it).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "api/graph_compiler.h"
#include "api/session_core.h"
#include "runtime/graphs.h"

namespace vkad {

class CompiledGraphs {
 public:
  CompiledGraphs(SessionCore& core, GraphCompiler& compiler) : core_(core), compiler_(compiler) {}
  CompiledGraphs(const CompiledGraphs&) = delete;
  CompiledGraphs& operator=(const CompiledGraphs&) = delete;
  ~CompiledGraphs() { join(); }

  // Graph `g` just captured, `session_steps` of its steps through Session: its rework planned
  // from the runtime's record of it (Runtime::Graphs::graph_record) and installed, or started on a
  // thread (`background`); returns the graph to hand the caller. A graph with steps captured
  // through runtime() (more steps than `session_steps`) is kept as captured.
  Result<GraphHandle> rework(GraphHandle g, size_t session_steps, const std::string& name,
                             bool background);
  // Launch ranges of `graph` that launch_loop made (CompiledGraphs::check_fixed_updates).
  void note_fixed(GraphHandle graph, LaunchRanges fixed);
  Status replay(GraphHandle graph, std::span<const GraphUpdate> updates, LaunchId* first);
  Status finish_rework(GraphHandle graph);
  Status release(GraphHandle graph);
  // The captured launches' kernel names of `graph` where it was reworked (its own launches are
  // fused and reordered), else nullptr.
  const std::vector<std::string>* captured_kernels(GraphHandle graph) const;
  // Waits for the background worker (its result stays pending).
  void join();
  // Waits for the background rework and installs it.
  void settle();
  // Whether a background rework is pending (not yet installed).
  bool background_pending() const { return background_ != nullptr; }
  // Installs `p` (a PreparedRework of GraphCompiler::prepare_rework): returns the graph to
  // replay (`p.graph` where nothing was reworked). `keep_captured`: the graph as captured stays
  // (a background rework's: the caller holds it).
  Result<GraphHandle> install(GraphCompiler::PreparedRework& p, bool keep_captured);

  // SessionStats' counters.
  uint64_t rolled_launches() const { return rolled_launches_; }
  uint64_t blocked_launches() const { return blocked_launches_; }
  uint64_t recomputed_launches() const { return recomputed_launches_; }

 private:
  // Per original captured launch of a reworked graph: its launch in the fused graph and
  // parameter map.
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
  // A graph's steps copied flat from the runtime's record, in a few vectors whatever their number
  // (the copy is made at end_capture, on the caller's thread; the per-step vectors of
  // CapturedStep are made from it by the rework, on its own): each launch's arguments and each
  // fill's array (as Arg::ndarray) one after another in `args`, step i's from offset[i] to
  // offset[i + 1].
  struct RecordCopy {
    std::vector<runtime::GraphStep> steps;  // `args` spans left empty: `offset` says where
    std::vector<Arg> args;
    std::vector<size_t> offset;
  };
  RecordCopy spare_record_;  // the last rework's input, emptied: the next copy's vectors
  // The background rework (CaptureOptions::background_rework): at most one runs at a time.
  struct BackgroundRework {
    GraphHandle graph;  // as captured: the caller's handle
    RecordCopy record;  // the worker's input
    std::thread worker;
    std::atomic<bool> done{false};
    std::unique_ptr<GraphCompiler::PreparedRework> result;  // the worker's, written before `done`
    std::vector<GraphUpdate> updates;  // replays' updates so far, the latest of each
  };

  static std::vector<bool> scalar_params(std::span<const Arg> args);
  // A graph's steps as the rework reads them, copied from the runtime's record (copy_record):
  // the rework may run on a thread of its own while replays update the graph's arguments.
  // `copy`'s vectors are cleared and refilled (their capacity kept).
  static void copy_record(const runtime::Runtime::Graphs::GraphRecord& record, RecordCopy* copy);
  static std::vector<CapturedStep> captured_steps(const RecordCopy& record);
  // Makes the plan a graph (Runtime::Graphs::instantiate); `map` gets each capture-order launch's
  // place in it and `relaxed` whether a barrier was left out. `origins` (per capture-order launch
  // of `w`, or empty): what made each, kept by the launches made (a fused run's: what its members
  // share, LaunchOrigin::join).
  Result<GraphHandle> instantiate_plan(const ReworkPlan& w, const std::string& name,
                                       FusedGraph* map, bool* relaxed,
                                       std::span<const runtime::LaunchOrigin> origins = {});
  void describe_launches(const std::vector<CapturedStep>& captured, FusedGraph* map) const;
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
  Status check_fixed_updates(GraphHandle graph, std::span<const GraphUpdate> updates) const;
  // Frees a reworked graph's map and the stashes it owns.
  void forget(uint64_t id);

  SessionCore& core_;
  GraphCompiler& compiler_;
  std::unordered_map<uint64_t, FusedGraph> fused_graphs_;  // by graph id
  std::unique_ptr<BackgroundRework> background_;
  // A background rework's graph (the caller's handle) -> the reworked graph installed for it.
  std::unordered_map<uint64_t, GraphHandle> reworked_;
  // Launches (capture-order ranges) that launch_loop made of a rolled or reworked step loop,
  // by graph id: replay updates of them are refused, since the kernel run there is not the one
  // whose parameters the update would number.
  std::unordered_map<uint64_t, LaunchRanges> fixed_launches_;
  uint64_t rolled_launches_ = 0;      // SessionStats::rolled_launches
  uint64_t blocked_launches_ = 0;     // SessionStats::blocked_launches
  uint64_t recomputed_launches_ = 0;  // SessionStats::recomputed_launches
};

}  // namespace vkad
