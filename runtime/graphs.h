// A Runtime's captured launch sequences (graphs): capture, instantiate, replay, and the capture
// that runs what it captures (runtime/graph.cpp, graph_steps.cpp, capture_run.cpp). An object the
// runtime holds (Runtime::graphs()); it shares the runtime's thread model (runtime.h, "Threads":
// one thread at a time, the same guard) and lives exactly as long as its runtime.
//
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
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/runtime.h"

namespace vkad::runtime {

class Runtime::Graphs : public Runtime::CaptureHooks {
  struct Graph;  // a graph's steps, plans and bundles (private: below)

 public:
  explicit Graphs(Runtime& rt);
  ~Graphs() override;  // stops a running capture's threads
  Graphs(const Graphs&) = delete;
  Graphs& operator=(const Graphs&) = delete;

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
  // kBundleLaunches steps (the first five of 16, 32, 64, 128 and 256); the caller's next captured
  // step records and submits them, so the device runs the first pieces while the capture goes on.
  // From RuntimeOptions::run_threads_after_steps captured steps on, threads of the runtime's own
  // record each piece into a bundle (the driver's per-launch recording, ~5 us on NVIDIA, off the
  // caller's thread) and the caller submits the pieces recorded so far. Each piece reads its args
  // from a device buffer of its own (copied in from the upload ring at submission, and out to the
  // readback ring for the error words); launches get their LaunchIds, stats and device-error
  // reports when submitted. Freeing an array while running first submits every step captured so far
  // (its buffer stays alive until they complete). end_capture submits the rest and returns once
  // everything is submitted; the graph is then the same as without `run` (its first replay records
  // its own bundles). Should a piece fail (out of memory, device lost), nothing after it runs and
  // end_capture returns that error, the capture dropped. Without push descriptors every piece is
  // recorded on the caller's thread (same results).
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
  // Whether a capture is open.
  bool capturing() const override { return capture_ != nullptr; }
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
  // The steps (launches and fills) of a graph (kNotFound for a dead handle): what Session checks
  // its count of the steps it captured against (a step captured through runtime() meanwhile
  // leaves its graph unreworked).
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
    friend class Graphs;
    explicit GraphRecord(const Graph* g) : g_(g) {}
    const Graph* g_ = nullptr;  // null: no steps
  };
  // kNotFound for a dead graph handle.
  Result<GraphRecord> graph_record(GraphHandle graph) const;
  // The open capture's steps so far (none without one).
  GraphRecord capture_record() const { return GraphRecord(capture_.get()); }
  // Each launch's origin as it was captured, in capture order.
  Result<std::vector<LaunchOrigin>> graph_launch_origins(GraphHandle graph) const;

 private:
  friend class Runtime;
  class Run;  // a capture that runs (runtime/capture_run.h)
  Runtime& rt_;
  UseGuard& use_guard_;  // the runtime's (VKAD_EXCLUSIVE_USE)
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

  // A running capture (begin_capture's `run`; runtime/capture_run.h), while one is open.
  std::unique_ptr<Run> run_;
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
  Status instantiate_step(Graph& g, const GraphStep& step);
  // end_capture's and instantiate's last part: `g` kept under handle `id`.
  GraphHandle keep_graph(uint64_t id, std::unique_ptr<Graph> g);
  std::unique_ptr<Graph> capture_;  // the capture being recorded
  bool omit_next_barrier_ = false;  // omit_next_barrier() before the next captured launch
  std::unordered_map<uint64_t, std::unique_ptr<Graph>> graphs_;
  // Runtime::CaptureHooks (runtime.h says what each is for).
  Status not_while_capturing(const char* what) const override;
  bool take_omit_barrier() override { return std::exchange(omit_next_barrier_, false); }
  void captured_launch(const std::shared_ptr<const Kernel>& k, std::span<const Arg> args,
                       bool omit_barrier) override;
  void captured_fill(const CapturedFill& fill, bool last) override;
  Status drain_run() override;
  void drop_capture() noexcept override;
  void drop_all() noexcept override;
  std::string graph_launch_where(uint64_t graph, uint32_t index) const override;
};

}  // namespace vkad::runtime
