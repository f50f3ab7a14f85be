// The contract for passes over launch sequences, as ir/pass.h is for kernels: a `Program` (the
// steps of a captured graph or step loop, one flat record, with what the passes so far decided)
// goes through a `GraphPipeline` of `GraphPass`es, each mapping the Program to the Program it
// stands for, given a `PassContext` (the catalog of kernels, a `KernelSink` that compiles the
// kernels a pass makes, the arrays' extents and what the device allows). The passes
// (graph_passes.h): roll (step loops of small launches into resident kernels), block (stencil
// runs into blocked kernels), recompute (gathers compute what they gather), schedule (reorder,
// drop barriers), fuse (element-wise runs into one kernel). A GraphPassRegistry maps names to
// factories, so a pipeline is text: "roll{max-range=256}, block, recompute, schedule, fuse"
// (ir/pass.h's syntax); the session's switches and VKAD_GRAPH_* variables are edits of that text
// (docs/graphs.md, "Graph passes"). tests/programs/*.vkprog are programs in text
// (graph/program_text.h) run through a pipeline, checked like tests/kernels/*.vkir.
//
// Stages: a pass that merges launches (roll, block) sees the captured numbering and must run
// first, then those that rewrite a launch in place (recompute), then schedule, then fuse; a
// pipeline written in another order is refused at parse. After the last pass the pipeline plans
// what was not planned (the order, one run per launch) -- the plan the install records.
//
// Nothing here compiles, registers or records: the sink compiles (api/graph_compiler.h gives
// the session's; the tests' only names kernels), the install records.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "abi/handles.h"
#include "base/status.h"
#include "graph/graph_rework.h"
#include "graph/graph_schedule.h"
#include "graph/kernel_catalog.h"
#include "graph/launch_fusion.h"
#include "graph/resident.h"
#include "ir/ir.h"
#include "ir/launch_access.h"
#include "ir/pass.h"

namespace vkad {

// Where the passes get the kernels they make.
class KernelSink {
 public:
  virtual ~KernelSink() = default;
  // Each kernel given a handle (compiled once per printed IR: one made before is its handle
  // again), results in order. With its IR in the catalog where `keep_ir` (later passes and
  // reworks may rewrite it), else only its access summary. An error where it cannot be made,
  // or the device refused that IR before.
  virtual std::vector<Result<KernelHandle>> make(std::span<const codegen::Kernel> kernels,
                                                 bool keep_ir) = 0;
  Result<KernelHandle> make(const codegen::Kernel& kernel, bool keep_ir) {
    return std::move(make(std::span<const codegen::Kernel>(&kernel, 1), keep_ir)[0]);
  }
};

// What the passes need of the device and of the compile options.
struct ProgramTarget {
  uint32_t max_loop_passes = 0;  // loop passes per invocation the device allows (0: no cap)
  uint32_t max_local_size = 1024;
  bool bounds_checks = true;         // without them an index past its extent reaches another row
  uint32_t max_storage_buffers = 0;  // one pipeline may bind (0: not known; roll_limits)
  // Float atomic adds of that width become compare-and-swap loops (passes on lavapipe).
  bool cas_float_atomics_f32 = false, cas_float_atomics_f64 = false;
};

// An array a pass needs made at the install: a blocked stencil's stash, or a renamed array's
// twin (graph/rename_pass.cpp). Its placeholder id stands in the steps' arguments until then;
// its type, and its extents (`shape`; a stash's are {elements}).
struct StashNeed {
  uint64_t placeholder = 0;
  runtime::DType dtype = runtime::DType::kF32;
  uint32_t elements = 0;
  std::vector<uint32_t> shape;  // empty: {elements}
};

// What a launch step reads and writes (schedule_launch) and the scalar parameters its rows rest
// on, by step: recompute asks for it and the plan asks again.
struct StepSchedule {
  ScheduleLaunch launch;
  std::vector<bool> pinned;
};
using ScheduleMemo = std::vector<std::optional<StepSchedule>>;

// A launch sequence and what the passes decided of it.
struct Program {
  // The steps as they run after the passes so far (launches and fills).
  std::vector<CapturedStep> steps;
  // Per launch as captured: its launch in `steps` after the merging passes, and whether it runs
  // inside another kernel there (rolled or blocked: its scalars are its run's first).
  std::vector<uint32_t> launch_index;
  std::vector<bool> merged;
  bool any_merged = false;
  size_t blocked = 0;              // captured launches in blocked stencil dispatches
  std::vector<StashNeed> stashes;  // the blocked stencils' stashes, the renamed arrays' twins
  size_t renamed = 0;              // arrays whose lifetimes rename gave twins
  // The kernels of the fill launches rename made (dst, value): later passes read such a launch
  // as the fill it replaced (recompute's known zeros).
  std::vector<uint64_t> fill_kernels;
  size_t dropped = 0;    // captured launches prune left out (dead: overwritten unread)
  size_t sliced = 0;     // copy launches the slice pass gave their consumer's task
  bool hoisted = false;  // fill steps the hoist pass moved up to the fills before them
  // Launches added or left out (rename, prune) without merging any: the captured launches'
  // numbering goes through launch_index.
  bool renumbered = false;
  std::vector<size_t> recompute_pins;  // (consumer, producer) launch numbers after merging
  std::vector<size_t> prune_pins;      // launches whose rows a dropped launch relies on
  bool any_recomputed = false;
  ScheduleMemo memo;       // by step: schedule_launch's answers recompute computed
  bool scheduled = false;  // the schedule pass ran (the install may then drop barriers)
  // The plan: order, per launch what it touches and what fusion needs of it, the runs.
  ReworkPlan w;
  bool planned = false;
  bool fused = false;                     // a run of several launches was built
  std::vector<std::vector<bool>> pinned;  // per launch (captured numbering after merging)
  bool reordered = false, relaxed = false, rows_used = false;

  // A program of `captured` steps: nothing decided yet.
  static Program of(std::vector<CapturedStep> captured);
  // Whether anything the install records differs from the steps as captured.
  bool changed() const {
    return fused || reordered || relaxed || any_merged || renumbered || hoisted;
  }
};

// What a pass may ask of the kernels, the device and the arrays.
class PassContext {
 public:
  using Extents = std::function<const std::vector<uint32_t>*(uint64_t array)>;
  using DTypes = std::function<std::optional<runtime::DType>(uint64_t array)>;
  // `dtypes` null: arrays' types unknown (the rename pass then renames nothing).
  PassContext(KernelCatalog& catalog, KernelSink& sink, ProgramTarget target, Extents extents,
              DTypes dtypes = nullptr)
      : catalog(catalog),
        sink(sink),
        target(target),
        extents_(std::move(extents)),
        dtypes_(std::move(dtypes)) {}

  KernelCatalog& catalog;
  KernelSink& sink;
  const ProgramTarget target;

  // An array's extents; null for one that is unknown (freed).
  const std::vector<uint32_t>* extents(uint64_t array) const {
    auto a = aliases_.find(array);
    return extents_(a == aliases_.end() ? array : a->second);
  }
  // An array's dtype; nullopt where unknown.
  std::optional<runtime::DType> dtype(uint64_t array) const {
    auto a = aliases_.find(array);
    return dtypes_ ? dtypes_(a == aliases_.end() ? array : a->second) : std::nullopt;
  }
  // Whether the arrays' types are known: a graph's rework (a step loop's plan does not rename).
  bool knows_dtypes() const { return dtypes_ != nullptr; }
  // A placeholder a pass put in the steps (a renamed array's twin) has `array`'s extents and
  // dtype for the passes after it.
  void alias(uint64_t placeholder, uint64_t array) { aliases_[placeholder] = array; }
  bool loops_capped() const { return target.max_loop_passes != 0; }
  // A launch's scalars and its arrays' extents as the passes read them.
  static codegen::ScalarOf scalars_in(std::span<const Arg> args);
  codegen::ExtentOf extents_in(std::span<const Arg> args) const;
  codegen::UniformInputs launch_inputs(const CapturedStep& s) const;
  // The value of a launch's range bound (scalar bounds only when `scalars`).
  std::optional<int64_t> bound_value(const abi::RangeBound& b, std::span<const Arg> args,
                                     bool scalars) const;
  // A launch's evaluated range per task dimension (nullopt where one does not evaluate).
  std::optional<std::vector<std::pair<int64_t, int64_t>>> task_ranges(
      const CapturedStep& s, const codegen::Kernel& k) const;
  // What a launch reads and writes, rows evaluated (graph/graph_schedule.h); `pinned` gets the
  // scalar parameters those rows depend on.
  ScheduleLaunch schedule_launch(const CapturedStep& s, std::vector<bool>* pinned) const;
  // What fusion (and blocking) needs of a launch; kernel == not_fusible() where it cannot.
  codegen::FusionLaunch fusion_launch(const CapturedStep& s) const;
  static const codegen::Kernel& not_fusible();

 private:
  std::vector<int64_t> launch_rows(const CapturedStep& s) const;
  Extents extents_;
  DTypes dtypes_;
  std::unordered_map<uint64_t, uint64_t> aliases_;
};

// A pass over a Program.
class GraphPass {
 public:
  enum class Stage { kMerge, kRewrite, kSchedule, kFuse };
  virtual ~GraphPass() = default;
  virtual std::string name() const = 0;
  // Its text in a pipeline (with the options that differ from the defaults).
  virtual std::string text() const { return name(); }
  virtual Stage stage() const = 0;
  // Maps `p` to the program it stands for. False: the program must stay as captured (a kernel
  // the rework needs could not be made).
  virtual bool run(Program& p, PassContext& ctx) = 0;
  // The device refused kernel `id` a pass made: answers naming it are forgotten.
  virtual void forget(uint64_t /*id*/) {}
};

class GraphPipeline {
 public:
  GraphPipeline() = default;
  GraphPipeline(GraphPipeline&&) = default;
  GraphPipeline& operator=(GraphPipeline&&) = default;

  void add(std::unique_ptr<GraphPass> pass) { passes_.push_back(std::move(pass)); }
  bool has(const std::string& name) const { return find(name) != nullptr; }
  bool empty() const { return passes_.empty(); }
  GraphPass* find(const std::string& name) const;
  std::vector<std::string> names() const;
  // The pipeline as text (parse_graph_pipeline of it gives the same pipeline).
  std::string text() const;

  // Runs the passes in order, then plans what no pass planned (the order as captured, one run
  // per launch). `after(name)` is called after each pass (a phase clock). False where a pass
  // says the program stays as captured.
  bool run(Program& p, PassContext& ctx,
           const std::function<void(const std::string&)>& after = nullptr) const;
  void forget(uint64_t kernel_id) const;

 private:
  std::vector<std::unique_ptr<GraphPass>> passes_;
};

class GraphPassRegistry {
 public:
  using Factory = std::function<Result<std::unique_ptr<GraphPass>>(const codegen::PassOptions&)>;
  void add(const std::string& name, std::string summary, Factory factory);
  std::vector<std::pair<std::string, std::string>> list() const;
  // The pipeline written in `text` (ir/pass.h's syntax). kInvalidArgument naming what is wrong:
  // an unknown pass (listing the known ones), a pass twice, passes out of stage order, an
  // option the pass refuses.
  Result<GraphPipeline> parse(const std::string& text) const;
  // rename, roll, block, recompute, prune, slice, hoist, schedule, fuse (graph_passes.h).
  static const GraphPassRegistry& standard();

 private:
  struct Entry {
    std::string summary;
    Factory factory;
  };
  std::map<std::string, Entry> passes_;
};

// The session's default pipeline.
inline constexpr const char* kDefaultGraphPipeline =
    "rename, roll, block, recompute, prune, slice, hoist, schedule, fuse";

// Plans `p` (steps in scheduled order when `reorder`, else as they are): w.steps, w.order,
// w.sched, w.launches, pinned. The schedule pass calls it with reorder; the pipeline without.
void plan_order(Program& p, const PassContext& ctx, bool reorder);

// A plan in text, one step a line as it runs: `launch <kernel>(<args>)`, `fill <array> <value>`
// (a fill a fused run made redundant: `dropped fill ...`); a fused run is one launch of its
// kernel with its members' arguments at their parameters. Arrays by `name(id)` (ids without a
// name as `a<id>`), kernels by `name(id)`, scalars as numbers.
std::string print_plan(const ReworkPlan& w,
                       const std::function<std::string(uint64_t kernel)>& kernel_name,
                       const std::function<std::string(uint64_t array)>& array_name);

}  // namespace vkad
