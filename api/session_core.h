// What vkad::Session (the front door, api/session.h) and the parts it holds share: the runtime,
// the compile configuration and caches, the kernel catalog, the graph passes' switches and the
// open capture. The parts are the graph compiler (api/graph_compiler.h: the rework of a
// capture), the compiled graphs (api/compiled_graphs.h: installed reworks, their replays and
// background reworks) and the step loops (api/step_loops.h: Session::launch_loop and its plans).
// Not part of vkad.h: a Session's user never sees these.
//
// Contract: one SessionCore per Session, made by Session::create_with_runtime before its parts
// and destroyed after them; externally synchronised like the Session. A background rework's
// worker reads `catalog` and the compile caches while the session's thread leaves them alone
// (CompiledGraphs::join comes first).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/session.h"
#include "autodiff/adjoint_plan.h"
#include "base/status.h"
#include "graph/graph_rework.h"
#include "graph/graph_schedule.h"
#include "graph/kernel_catalog.h"
#include "graph/program.h"
#include "ir/ir.h"
#include "ir/target.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"

namespace vkad {

// Which graph passes the session's pipeline holds (SessionCore::pipeline, made once at
// create): what the capture, the step loops and the install ask of it.
struct GraphSwitches {
  bool fuse = true;
  bool schedule = true;
  uint32_t resident_max_range = 256;  // the roll pass's; 0 without one
};

// Capture-order launch ranges [first, end).
using LaunchRanges = std::vector<std::pair<uint32_t, uint32_t>>;

// Session's part of an open capture. The capture's one record is the runtime's
// (Runtime::Graphs::capture_record, then graph_record, which the rework reads); Session counts the
// steps that went through it, which end_capture compares with the runtime's: a step captured
// through runtime() meanwhile leaves the graph as captured. (At namespace scope: std::optional of a
// nested struct with default member initializers is not default-constructible inside its
// enclosing class for clang.)
struct SessionCapture {
  size_t steps = 0;       // launches and fills
  uint32_t launches = 0;  // the next launch's index in capture order
};

struct SessionCore {
  std::unique_ptr<runtime::Runtime> rt;
  codegen::CompileOptions compile_options;
  codegen::Target target;
  codegen::AdjointOptions adjoint_options;  // reverse mode's, from the device (device_target.h)
  std::string device_uuid;
  // Every kernel this session compiled, by text, target and options: compiling one again
  // (a DSL re-tracing a function, a fused run seen before) skips emission and validation.
  codegen::CompileCache compile_cache;
  // The graph passes every rework runs (SessionOptions::graph_passes edited by the switches and
  // the VKAD_GRAPH_* variables), and what it holds.
  GraphPipeline pipeline;
  GraphSwitches graph;
  // Every kernel compiled here and every kernel a rework made, by handle id: IR, access
  // summary, adstacks and what the graph passes derive from them (graph/kernel_catalog.h).
  // Written by register_ir / GraphCompiler::make (the passes' sink) and read by the reworks (a
  // background one's worker too: the session's thread joins it first), never by a capture's
  // launches.
  KernelCatalog catalog;

  // kernel_access() summed up per parameter and whether it has adstacks, of the kernels a
  // caller can launch (those register_ir made, and the rework's registered kernels that have an
  // access summary: a reworked step loop launches them), by handle id: what a capture judges its
  // barriers on. Apart from `catalog` because a background rework writes that one while a
  // capture may be open.
  struct CaptureAccess {
    // Per ndarray parameter it accesses: the parameter and its kinds of access (kind_bit).
    std::vector<std::pair<uint32_t, uint8_t>> params;
    bool adstack = false;
  };
  std::unordered_map<uint64_t, CaptureAccess> capture_access;

  // Session's part of the open capture (Session::begin_capture .. end_capture; SessionCapture).
  std::optional<SessionCapture> capture;
  // Launches launch_loop made of a rolled or reworked step loop in the open capture: replay
  // updates of them are refused (CompiledGraphs::check_fixed_updates).
  LaunchRanges capture_fixed;
  // The open capture's barriers so far (Graph scheduling: none between launches that share
  // no array) and the accesses of the launch being judged (reused).
  ArrayBarrierTracker capture_barriers;
  std::vector<ArrayKinds> capture_accesses;
  std::string capture_name;
  bool capture_background = false;  // the open capture's CaptureOptions::background_rework

  // Registers `kernel` compiled as `ck` and notes its IR in the catalog and its capture access.
  // `generic_on_demand`: as Runtime::register_kernel's.
  Result<KernelHandle> register_ir(const codegen::Kernel& kernel, const runtime::CompiledKernel& ck,
                                   bool generic_on_demand = false);
  // capture_access[id] from catalog.access(id) (nothing where that is unknown): at a kernel's
  // registration, on the caller's thread.
  void note_capture_access(uint64_t id, bool adstack);
  // Drops kernel `id` from the catalog and capture_access.
  void drop_tables(uint64_t id);
  // Forgets a capture begun through Session whose end came through runtime() (nothing to
  // rework then).
  void drop_stale_capture() {
    if (capture && !rt->graphs().capturing()) capture.reset();
  }
};

}  // namespace vkad
