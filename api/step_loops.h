// Session's step loops (Session::launch_loop, docs/graphs.md "Step loops"): a loop's body
// launched `count` times, as one resident kernel (graph/resident.h) where it may be rolled, as
// the launches of a plan rework_loop made (the graph compiler's rework of the loop) where one
// was made, else launch by launch, each naming its iteration in its device errors.
//
// Contract: Session's thread only; prepare_loop's rolls and compiles run on threads of their own
// (pure functions and the thread-safe compile cache), joined before this is destroyed.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/compiled_graphs.h"
#include "api/graph_compiler.h"
#include "api/session.h"
#include "api/session_core.h"
#include "graph/resident.h"

namespace vkad {

class StepLoops {
 public:
  // Launches go through `session` (a capture's log takes them and judges their barriers).
  StepLoops(Session& session, SessionCore& core, GraphCompiler& compiler, CompiledGraphs& graphs)
      : session_(session), core_(core), compiler_(compiler), graphs_(graphs) {}
  StepLoops(const StepLoops&) = delete;
  StepLoops& operator=(const StepLoops&) = delete;
  ~StepLoops() { join_jobs(); }

  // Session's calls of the same names (api/session.h).
  Status launch_loop(std::span<const LoopLaunch> body, uint32_t count, LoopInfo* info);
  void prepare_loop(std::span<const LoopLaunch> body, uint32_t count);
  void ready_loop(std::span<const LoopLaunch> body, uint32_t count);
  bool loop_rolls(std::span<const LoopLaunch> body, uint32_t count);
  void rework_loop(std::span<const LoopLaunch> body, uint32_t count);
  void join_jobs();

  uint64_t rolled_loops() const { return rolled_loops_; }      // SessionStats::rolled_loops
  uint64_t reworked_loops() const { return reworked_loops_; }  // SessionStats::reworked_loops
  // The loops' launches run inside blocked stencil dispatches (part of blocked_launches).
  uint64_t blocked_launches() const { return blocked_launches_; }

 private:
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
    size_t blocked = 0;  // the loop's launches run inside blocked stencil dispatches
  };
  // The rolled kernel of `body` x `count` and its parameter map, or nullopt where the loop runs
  // its launches one by one.
  struct RolledLoop {
    KernelHandle kernel;
    std::vector<std::vector<uint32_t>> param_map;
    size_t params = 0;
  };
  // The members of body x count as a resident kernel would take them, its workgroup size and
  // its shape's signature; false where the body does not qualify.
  struct LoopPlan {
    std::vector<codegen::ResidentMember> period;
    std::vector<std::shared_ptr<const codegen::Kernel>> ir;  // what `period` points into
    uint32_t count = 0, local = 0;
    std::string name, signature;
  };
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

  static std::string loop_key(std::span<const LoopLaunch> body, uint32_t count);
  // launch_loop's checks before anything is launched (errors name the launch and iteration).
  Status check_loop(std::span<const LoopLaunch> body, uint32_t count) const;
  // The arrays `l` adds into (atomic_add), appended to `out` once each.
  void loop_accumulates(const LoopLaunch& l, std::vector<uint64_t>* out) const;
  // Of the arrays a loop's rework took for zero at the loop's start (`assumed`), those its plan
  // rests on: gather recompute's accumulating producers' and fusion's zero fills.
  std::vector<uint64_t> plan_zeros(const GraphCompiler::PreparedRework& p,
                                   std::span<const LoopLaunch> body,
                                   std::span<const uint64_t> assumed) const;
  // Whether every array of `zeros` holds zeros now, as far as the open capture's log shows.
  bool zeros_hold(std::span<const uint64_t> zeros) const;
  // Launches a rework_loop plan's steps through Session::launch (info->launches counts them).
  Status launch_reworked(const LoopRework& r, LoopInfo* info);
  std::optional<RolledLoop> roll_loop(std::span<const LoopLaunch> body, uint32_t count,
                                      PhaseClock& clock);
  bool plan_loop(std::span<const LoopLaunch> body, uint32_t count, LoopPlan* plan) const;
  // Whether the made kernel's loop passes fit the device's cap (codegen::rolled_loop_passes):
  // thread-safe (reads the runtime's caps and the session's options only).
  bool within_loop_cap(const codegen::ResidentKernel& rk) const;
  // The rolled launch's arguments: each body launch's first-iteration args at its parameters.
  static void rolled_args(const RolledLoop& rolled, std::span<const LoopLaunch> body,
                          std::vector<Arg>* out);
  // roll_loop's parts: a body launch as a resident member (nullopt: it does not qualify), its
  // kernel's ranges for `args`, and the rolled kernel compiled and registered (or found).
  std::optional<codegen::ResidentMember> loop_member(
      const LoopLaunch& l, uint32_t count, std::shared_ptr<const codegen::Kernel>* ir) const;
  // A launch's ranges and N-d boxes as a resident walk takes them, the runtime's extents.
  std::optional<codegen::LaunchShapes> loop_ranges(const codegen::Kernel& k,
                                                   std::span<const Arg> args) const;
  // `key`: k's printed IR ("" prints it); `ck`: its compile (nullopt compiles it).
  std::optional<KernelHandle> loop_kernel(
      const codegen::Kernel& k, std::string key,
      std::optional<Result<std::shared_ptr<const runtime::CompiledKernel>>> ck, PhaseClock& clock);

  Session& session_;
  SessionCore& core_;
  GraphCompiler& compiler_;
  CompiledGraphs& graphs_;
  // launch_loop's rolled kernels (registered on the caller's thread), by printed IR.
  std::unordered_map<std::string, KernelHandle> loop_kernels_;
  // What roll_loop decided, by the body's shape (loop_signature): later loops of that shape skip
  // rolling and printing. null: the shape does not qualify (ranges, arrays, refused kernel).
  std::unordered_map<std::string, std::shared_ptr<const RolledLoop>> rolled_by_shape_;
  // prepare_loop's rolls and compiles, each on a thread of its own, by shape.
  std::vector<std::unique_ptr<LoopJob>> loop_jobs_;
  std::unordered_map<std::string, std::shared_ptr<const LoopRework>> loop_reworks_;
  std::deque<std::string> loop_rework_order_;  // loop_reworks_' keys, oldest first
  // loop_member's verdict per kernel handle id: may its launches be rolled (caller's thread).
  mutable std::unordered_map<uint64_t, bool> loop_residable_;
  // Stashes of step-loop plans: graphs may record their launches, so they live as long as the
  // session.
  std::vector<NdArrayHandle> loop_stashes_;
  uint64_t rolled_loops_ = 0;
  uint64_t reworked_loops_ = 0;
  uint64_t blocked_launches_ = 0;
};

}  // namespace vkad
