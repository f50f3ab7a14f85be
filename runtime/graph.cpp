// Captured launch sequences (graphs.h): capture keeps what a
// launch checked and planned; replay re-resolves the arrays and re-plans only the launches
// whose scalars were updated. Where every pipeline binds with push descriptors the steps are
// recorded once into bundles (secondary command buffers of kBundleLaunches launches, each
// submitted as it is recorded) that read their args from a buffer of the graph's own: a replay
// then records two copies (the args in, the error words back) and one vkCmdExecuteCommands per
// bundle. The bundles are recorded again only when an update changed a launch's plan or the
// adstack heaps were replaced. Otherwise every step is recorded again through the same path as
// launch().
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <unordered_map>

#include "runtime/capture_run.h"
#include "runtime/graphs.h"

namespace vkad::runtime {

Status Runtime::Graphs::not_while_capturing(const char* what) const {
  if (!capture_) return {};
  return make_error(ErrorCode::kFailedPrecondition,
                    std::string(what) + ": graph '" + capture_->name +
                        "' is being captured; only launches and fills are captured (end_capture "
                        "first)");
}

Status Runtime::Graphs::begin_capture(const std::string& name, bool run) {
  VKAD_EXCLUSIVE_USE("begin_capture");
  VKAD_TRY(rt_.device_->status());
  if (capture_) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "begin_capture: graph '" + capture_->name + "' is being captured already");
  }
  auto g = std::make_unique<Graph>();
  g->name = name.empty() ? "graph" : name;
  const CaptureSizes& was = capture_sizes_;
  g->launches.reserve(was.launches);
  g->steps.reserve(was.steps);
  g->args_offset.reserve(was.launches);
  g->args_blob.reserve(was.blob);
  if (run) {
    VKAD_ASSIGN_OR_RETURN(run_, Run::start(rt_, *this));
  }
  capture_ = std::move(g);
  omit_next_barrier_ = false;
  return {};
}

Runtime::Graphs::Graphs(Runtime& rt) : rt_(rt), use_guard_(rt.use_guard_) {}

std::unique_ptr<Runtime::CaptureHooks> Runtime::make_graphs(Runtime& rt) {
  return std::make_unique<Graphs>(rt);
}

Runtime::Graphs& Runtime::graphs() { return static_cast<Graphs&>(*graphs_); }

const Runtime::Graphs& Runtime::graphs() const { return static_cast<const Graphs&>(*graphs_); }

Runtime::Graphs::~Graphs() { drop_all(); }

void Runtime::Graphs::drop_capture() noexcept {
  run_.reset();  // the recording threads stopped first
  capture_.reset();
}

void Runtime::Graphs::drop_all() noexcept {
  drop_capture();
  graphs_.clear();
}

Status Runtime::Graphs::cut_capture_run() {
  VKAD_EXCLUSIVE_USE("cut_capture_run");
  if (run_ && capture_) run_->cut();
  return {};
}

void Runtime::Graphs::captured_launch(const std::shared_ptr<const Kernel>& k,
                                      std::span<const Arg> args, bool omit_barrier) {
  add_launch(*capture_, k, args, omit_barrier, rt_.note_);
  if (run_) run_->after_step();
}

void Runtime::Graphs::captured_fill(const CapturedFill& fill, bool last) {
  add_fill(*capture_, fill);
  if (run_ && last) run_->after_step();
}

Status Runtime::Graphs::drain_run() { return run_ ? run_->drain() : Status{}; }

uint32_t Runtime::Graphs::share_plan(Graph& g, uint32_t& slot, bool fresh,
                                     const CommandPlan& plan) {
  if (fresh || !(g.plans[slot] == plan)) {
    slot = static_cast<uint32_t>(g.plans.size());
    g.plans.push_back(plan);
    g.plan_users.push_back(0);
  }
  return slot;
}

Status Runtime::Graphs::omit_next_barrier() {
  if (!capture_) {
    return make_error(ErrorCode::kFailedPrecondition, "omit_next_barrier: no capture is open");
  }
  omit_next_barrier_ = true;
  return {};
}

Result<GraphHandle> Runtime::Graphs::end_capture() {
  VKAD_EXCLUSIVE_USE("end_capture");
  if (!capture_)
    return make_error(ErrorCode::kFailedPrecondition, "end_capture: no capture is open");
  if (run_) {
    Status ran = run_->finish();
    run_.reset();
    if (!ran.ok()) {
      const std::string name = capture_->name;
      capture_.reset();
      return make_error(ran.code(), "end_capture of graph '" + name +
                                        "', running its steps as captured: " + ran.message());
    }
  }
  VKAD_ASSIGN_OR_RETURN(uint64_t id, rt_.issue_id());
  capture_sizes_ = {capture_->launches.size(), capture_->steps.size(), capture_->args_blob.size()};
  return keep_graph(id, std::move(capture_));
}

GraphHandle Runtime::Graphs::keep_graph(uint64_t id, std::unique_ptr<Graph> g) {
  g->pending_plans = std::any_of(g->plans.begin(), g->plans.end(),
                                 [](const CommandPlan& p) { return p.spec_pending > 0; });
  g->last_plan = {};  // add_launch's only
  graphs_.emplace(id, std::move(g));
  rt_.stats_.graphs = graphs_.size();
  return GraphHandle{id};
}

void Runtime::Graphs::refresh_pending_plans(Graph& g) {
  std::unordered_map<const Kernel*, uint32_t> last;  // a kernel's latest refreshed plan
  bool still = false;
  for (CapturedLaunch& c : g.launches) {
    if (g.plans[c.plan].spec_pending == 0) continue;
    const std::span<const Arg> args(g.args.at(c.args), c.kernel->desc.params.size());
    // Never waits: a pipeline still being made leaves the plan as it is, for the next replay.
    if (!rt_.check_args(*c.kernel, args).ok() ||
        !rt_.plan_pipelines(*c.kernel, args, &rt_.planned_, /*background=*/true).ok()) {
      still = true;
      continue;
    }
    const CommandPlan& fresh = rt_.planned_;
    still = still || fresh.spec_pending > 0;
    if (fresh == g.plans[c.plan]) continue;
    auto [it, first] = last.try_emplace(c.kernel.get(), 0);
    --g.plan_users[c.plan];
    c.plan = share_plan(g, it->second, first, fresh);
    ++g.plan_users[c.plan];
    g.rerecord = true;
  }
  g.pending_plans = still;
}

Result<size_t> Runtime::Graphs::graph_steps(GraphHandle graph) const {
  auto it = graphs_.find(graph.id);
  if (it == graphs_.end()) return rt_.dead_handle("graph_steps", "graph", graph.id);
  return it->second->steps.size();
}

Result<std::vector<std::string>> Runtime::Graphs::graph_launch_kernels(GraphHandle graph) const {
  auto it = graphs_.find(graph.id);
  if (it == graphs_.end()) return rt_.dead_handle("graph_launch_kernels", "graph", graph.id);
  std::vector<std::string> names;
  names.reserve(it->second->launches.size());
  for (const CapturedLaunch& c : it->second->launches) names.push_back(c.kernel->desc.name);
  return names;
}

Result<std::vector<LaunchOrigin>> Runtime::Graphs::graph_launch_origins(GraphHandle graph) const {
  auto it = graphs_.find(graph.id);
  if (it == graphs_.end()) return rt_.dead_handle("graph_launch_origins", "graph", graph.id);
  std::vector<LaunchOrigin> out;
  out.reserve(it->second->launches.size());
  for (const CapturedLaunch& c : it->second->launches) out.push_back(c.origin);
  return out;
}

Result<size_t> Runtime::Graphs::graph_barriers(GraphHandle graph) const {
  auto it = graphs_.find(graph.id);
  if (it == graphs_.end()) return rt_.dead_handle("graph_barriers", "graph", graph.id);
  size_t n = 0;
  for (const CapturedLaunch& c : it->second->launches) n += c.barrier_after;
  return n;
}

Status Runtime::Graphs::release_graph(GraphHandle graph) {
  VKAD_EXCLUSIVE_USE("release_graph");
  auto it = graphs_.find(graph.id);
  if (it == graphs_.end()) return rt_.dead_handle("release_graph", "graph", graph.id);
  for (uint64_t key : it->second->pipeline_keys) rt_.pipelines_.release(key);
  graphs_.erase(it);
  rt_.stats_.graphs = graphs_.size();
  return {};
}

// The graph's steps in capture order into `list`: fills directly, launch i through
// `launch(i)`. Consecutive fills share one barrier pair (as zero_many records them); a second
// fill of an array in one run is ordered after the first (it may write another value).
Status Runtime::Graphs::record_steps(rhi::CommandList& list, const Graph& g,
                                     const std::function<Status(uint32_t)>& launch) {
  FillBarriers fills(filled_scratch_);
  for (const auto& [is_launch, i] : g.steps) {
    if (!is_launch) {
      NdArray& a = rt_.arrays_.at(g.fills[i].array.id);
      fills.fill(list, a.buffer, g.fills[i].array.id, g.fills[i].pattern, g.fills[i].wide, a.bytes);
      continue;
    }
    fills.end(list);
    VKAD_TRY(launch(i));
  }
  fills.end(list);
  return {};
}

void Runtime::Graphs::FillBarriers::fill(rhi::CommandList& list, rhi::Buffer& buffer,
                                         uint64_t array, uint64_t pattern, bool wide,
                                         uint64_t bytes) {
  if (!filling_) {
    list.barrier(rhi::Barrier::kComputeToTransfer);
    filled_.clear();
  } else if (std::find(filled_.begin(), filled_.end(), array) != filled_.end()) {
    list.barrier(rhi::Barrier::kTransferToTransfer);
    filled_.clear();
  }
  filled_.push_back(array);
  filling_ = true;
  if (wide) {
    list.fill64(buffer, pattern, bytes);
  } else {
    list.fill(buffer, static_cast<uint32_t>(pattern), 0, bytes);
  }
}

void Runtime::Graphs::FillBarriers::end(rhi::CommandList& list) {
  if (filling_) list.barrier(rhi::Barrier::kTransferToCompute);
  filling_ = false;
}

// The launches `updates` change, as copies of the graph's with the new scalar values (one
// copy per launch however many updates it gets); an error names an update that does not fit.
Status Runtime::Graphs::updated_launches(const Graph& g, std::span<const GraphUpdate> updates,
                                         const std::string& where,
                                         std::vector<UpdatedLaunch>* updated) {
  for (const GraphUpdate& u : updates) {
    if (u.launch >= g.launches.size()) {
      return make_error(ErrorCode::kInvalidArgument,
                        where + ": update of launch " + std::to_string(u.launch) +
                            "; the graph has " + std::to_string(g.launches.size()) + " launches");
    }
    const CapturedLaunch& c = g.launches[u.launch];
    const CompiledKernel& d = c.kernel->desc;
    auto at = std::find_if(updated->begin(), updated->end(),
                           [&](const UpdatedLaunch& p) { return p.index == u.launch; });
    if (at == updated->end()) {
      const Arg* args = g.args.at(c.args);
      updated->push_back({u.launch, {args, args + d.params.size()}, {}, {}});
      at = updated->end() - 1;
    }
    if (u.param >= at->args.size() || d.params[u.param].kind != ParamKind::kScalar) {
      return make_error(ErrorCode::kInvalidArgument,
                        where + ", launch " + std::to_string(u.launch) + " ('" + d.name +
                            "'): parameter " + std::to_string(u.param) +
                            " is not a scalar parameter of the kernel");
    }
    at->args[u.param] = u.value;
  }
  return {};
}

// Whether a launch planned `was` records the same commands planned `now`: the bundle bakes
// ranges, workgroup counts and pipelines in; only the args are read at run time.
bool Runtime::Graphs::same_commands(const CommandPlan& was, const CommandPlan& now) {
  bool same = was.pipelines == now.pipelines && was.lp.any_heap_task == now.lp.any_heap_task &&
              was.lp.tasks.size() == now.lp.tasks.size();
  for (size_t t = 0; same && t < was.lp.tasks.size(); ++t) {
    const TaskPlan& a = was.lp.tasks[t];
    const TaskPlan& b = now.lp.tasks[t];
    same = a.begin == b.begin && a.end == b.end && a.groups == b.groups;
  }
  return same;
}

Status Runtime::Graphs::plan_updates(std::vector<UpdatedLaunch>& updated, const Graph& g,
                                     const std::string& where, bool* rerecord) {
  for (UpdatedLaunch& u : updated) {
    const CapturedLaunch& c = g.launches[u.index];
    VKAD_TRY_CTX(rt_.check_args(*c.kernel, u.args), where + ", launch " + std::to_string(u.index));
    VKAD_TRY_CTX(rt_.plan_pipelines(*c.kernel, u.args, &rt_.planned_,
                                    rt_.options_.background_specialization),
                 where + ", launch " + std::to_string(u.index));
    if (!same_commands(g.plans[c.plan], rt_.planned_)) *rerecord = true;
    u.plan = rt_.planned_;
    u.encoded.assign(rt_.args_scratch_.begin(), rt_.args_scratch_.end());
  }
  return {};
}

// Every launch's arrays looked up again (into g.arrays; updates change scalars only), and the
// heaps the launches need (an updated launch's as planned with its updates).
Status Runtime::Graphs::bind_graph_arrays(Graph& g, std::span<const UpdatedLaunch> updated,
                                          const std::string& where, bool* any_heap) {
  std::array<uint64_t, adstack::kHeapCount> heap_need{};
  for (uint32_t i = 0; i < g.launches.size(); ++i) {
    const CapturedLaunch& c = g.launches[i];
    const CompiledKernel& d = c.kernel->desc;
    rhi::Buffer** buffers = g.arrays.at(c.arrays);
    for (size_t p = 0; p < d.params.size(); ++p) {
      const Arg& arg = g.args.at(c.args)[p];
      if (arg.kind != ParamKind::kNdArray) continue;
      auto a = rt_.arrays_.find(arg.array.id);
      if (a == rt_.arrays_.end()) {
        return rt_.dead_handle(where + ", launch " + std::to_string(i) + " ('" + d.name +
                                   "'), argument " + std::to_string(p) + " ('" + d.params[p].name +
                                   "')",
                               "ndarray", arg.array.id);
      }
      *buffers++ = &a->second.buffer;
    }
    const CommandPlan* plan = &g.plans[c.plan];
    for (const UpdatedLaunch& u : updated) {
      if (u.index == i) plan = &u.plan;
    }
    if (!plan->lp.any_heap_task) continue;
    *any_heap = true;
    for (size_t h = 0; h < heap_need.size(); ++h) {
      heap_need[h] = std::max(heap_need[h], plan->lp.heap_need[h]);
    }
  }
  for (const CapturedFill& f : g.fills) {
    if (rt_.arrays_.find(f.array.id) == rt_.arrays_.end()) {
      return rt_.dead_handle(where + ", fill", "ndarray", f.array.id);
    }
  }
  if (*any_heap) VKAD_TRY(rt_.ensure_heaps(heap_need));
  return {};
}

namespace {
// A replay recorded launch by launch while a timeline is on is submitted in pieces of this many
// dispatches (see replay): small enough that the device starts early, large enough that the
// submissions (~10-30 us each on an H200) stay a small share.
constexpr uint32_t kTimelinePieceDispatches = 128;
}  // namespace

Status Runtime::Graphs::replay(GraphHandle graph, std::span<const GraphUpdate> updates,
                               LaunchId* first) {
  VKAD_EXCLUSIVE_USE("replay");
  VKAD_TRY(rt_.device_->status());
  VKAD_TRY(not_while_capturing("replay"));
  auto it = graphs_.find(graph.id);
  if (it == graphs_.end()) return rt_.dead_handle("replay", "graph", graph.id);
  Graph& g = *it->second;
  const std::string where = "replay of graph '" + g.name + "'";
  // 1. Updates: checked and planned on copies, kept only if the whole replay is recorded.
  std::vector<UpdatedLaunch> updated;
  bool rerecord = false;  // an update changed a plan: kept with the updates, below
  VKAD_TRY(updated_launches(g, updates, where, &updated));
  VKAD_TRY(plan_updates(updated, g, where, &rerecord));
  // 2. Every array still alive (bound by reference); the heaps the graph needs.
  bool any_heap = false;
  VKAD_TRY(bind_graph_arrays(g, updated, where, &any_heap));
  if (rerecord) g.rerecord = true;
  apply_updates(g, updated);
  if (g.pending_plans) refresh_pending_plans(g);
  bool bundled = rt_.device_->caps().push_descriptor;
  for (const CommandPlan& plan : g.plans) {
    for (const rhi::ComputePipeline* p : plan.pipelines) {
      bundled = bundled && p->push_descriptors();
    }
  }
  // With a timeline on: this replay's launches timed one by one, or the replay as one event.
  const bool time_launches =
      !rt_.timeline_ || rt_.timeline_->time_replay(graph.id, g.launches.size());
  if (bundled) return replay_bundle(g, graph.id, any_heap, where, first, time_launches);
  return replay_steps(g, graph.id, first, time_launches);
}

void Runtime::Graphs::apply_updates(Graph& g, std::vector<UpdatedLaunch>& updated) {
  for (UpdatedLaunch& u : updated) {
    CapturedLaunch& c = g.launches[u.index];
    std::copy(u.args.begin(), u.args.end(), g.args.at(c.args));
    std::memcpy(g.args_blob.data() + g.args_offset[u.index], u.encoded.data(), u.encoded.size());
    if (g.plans[c.plan] == u.plan) continue;
    if (g.plan_users[c.plan] == 1) {
      g.plans[c.plan] = std::move(u.plan);
      continue;
    }
    --g.plan_users[c.plan];  // shared: the launch gets a plan of its own
    c.plan = static_cast<uint32_t>(g.plans.size());
    g.plans.push_back(std::move(u.plan));
    g.plan_users.push_back(1);
  }
}

// A graph that cannot be bundled: every step recorded again, in capture order.
Status Runtime::Graphs::replay_steps(Graph& g, uint64_t id, LaunchId* first, bool time_launches) {
  VKAD_TRY(rt_.ensure_list());
  const LaunchId first_id{rt_.next_launch_ + 1};
  const double replay_begin = rt_.timeline_ ? TimelineRecorder::now_us() : 0;
  rt_.timeline_graph_ = &g.name;
  bool span = false;  // the replay as one device event
  if (rt_.timeline_ && !time_launches) {
    VKAD_ASSIGN_OR_RETURN(
        span, rt_.timeline_->begin_gpu(rt_.list_, "replay '" + g.name + "'", "replay", 0, g.name));
    rt_.timeline_quiet_ = true;
  }
  Status recorded = record_steps(rt_.list_, g, [&](uint32_t i) -> Status {
    const CapturedLaunch& c = g.launches[i];
    rt_.replay_graph_ = id;
    rt_.replay_launch_ = i;
    rt_.replay_origin_ = c.origin;
    VKAD_TRY(rt_.record_launch(c.kernel, g.plans[c.plan], graph_arrays(g, c),
                               g.args_blob.data() + g.args_offset[i], nullptr, c.barrier_after));
    // With a timeline on, the launches are submitted in small pieces (after a launch: no fill
    // batch is open), so the device runs the first while the host records the rest, as a
    // bundled replay's pieces do; without it the whole graph waits for its last launch. (Only
    // graphs that cannot be bundled come here.)
    if (rt_.timeline_ && !rt_.timeline_quiet_ &&
        rt_.list_.dispatch_count() >= kTimelinePieceDispatches && i + 1 < g.launches.size()) {
      VKAD_TRY(rt_.flush().status());
      VKAD_TRY(rt_.ensure_list());
    }
    return {};
  });
  rt_.timeline_graph_ = nullptr;
  rt_.timeline_quiet_ = false;
  if (span && rt_.list_.recording()) rt_.timeline_->end_gpu(rt_.list_);
  rt_.replay_graph_ = 0;
  if (rt_.timeline_) {
    rt_.timeline_->host("replay '" + g.name + "'", "replay", replay_begin,
                        TimelineRecorder::now_us(), g.name);
  }
  VKAD_TRY(recorded);
  ++rt_.stats_.graph_replays;
  rt_.stats_.replayed_launches += g.launches.size();
  if (first && !g.launches.empty()) *first = first_id;
  return rt_.auto_flush();
}

// The steps into fresh bundles, with the same commands record_launch and the fill path above
// record, each launch reading its args from g.args_dev (made by the caller, kept with the
// graph). A bundle holds at most kBundleLaunches launches and is executed in rt_.list_ as soon as
// it is recorded; every one but the last is then submitted, so the device runs a piece of the graph
// while the driver takes the next (a DiffTaichi iteration's 5,149 launches took the NVIDIA driver
// 20-27 ms to record, about as long as the device takes to run them). The old bundles go back to
// their stream, freed after their last execution: in-flight replays keep running. Should recording
// fail, the pieces submitted have run and the next replay records again.
Status Runtime::Graphs::record_bundles(Graph& g, BundleSet& set, bool timed) {
  const auto t0 = std::chrono::steady_clock::now();
  set.current = false;  // until every piece is recorded
  set.bundles.clear();
  // A timed set: a stamp before the first launch and after every fill batch, and one after
  // every launch (the next launch's begin). Launches and fills bound the count.
  TimelineRecorder::ReplayLayout* layout = nullptr;
  std::vector<bool> fill_before;  // a fill batch between launch i - 1 and launch i
  if (timed) {
    set.layout = std::make_shared<TimelineRecorder::ReplayLayout>();
    layout = set.layout.get();
    layout->graph = g.name;
    layout->kernels.reserve(g.launches.size());
    for (const CapturedLaunch& c : g.launches) layout->kernels.push_back(c.kernel->desc.name);
    layout->launch_stamps.resize(g.launches.size());
    fill_before.assign(g.launches.size(), false);
    bool fill = false;
    for (const auto& [is_launch, i] : g.steps) {
      if (!is_launch) {
        fill = true;
      } else {
        fill_before[i] = fill;
        fill = false;
      }
    }
    const auto bound = static_cast<uint32_t>(g.launches.size() + g.fills.size() + 1);
    VKAD_ASSIGN_OR_RETURN(set.stamps,
                          rt_.device_->create_query_pool(bound, "graph '" + g.name + "' stamps"));
    rt_.list_.reset_queries(set.stamps, 0, bound);
  }
  VKAD_ASSIGN_OR_RETURN(rhi::CommandList rec, rt_.stream_->begin_bundle());
  size_t in_piece = 0;
  auto close = [&](bool more) -> Status {
    VKAD_ASSIGN_OR_RETURN(rhi::Bundle b, rt_.stream_->end_bundle(rec));
    set.bundles.push_back(std::move(b));
    rt_.list_.execute(set.bundles.back());
    if (!more) return {};
    VKAD_TRY(rt_.flush().status());
    VKAD_TRY(rt_.ensure_list());
    VKAD_ASSIGN_OR_RETURN(rec, rt_.stream_->begin_bundle());
    return {};
  };
  uint32_t stamp = 0;  // the next stamp's query
  VKAD_TRY(record_steps(rec, g, [&](uint32_t i) {
    const CapturedLaunch& c = g.launches[i];
    if (layout) {
      // The previous launch's end stamp is this one's begin, unless fills ran between them.
      if (i == 0 || fill_before[i]) rec.write_timestamp(set.stamps, stamp++);
      layout->launch_stamps[i].first = stamp - 1;
    }
    VKAD_TRY(rt_.record_dispatches(rec, *c.kernel, g.plans[c.plan], graph_arrays(g, c), g.args_dev,
                                   g.args_offset[i], c.barrier_after));
    if (layout) {
      rec.write_timestamp(set.stamps, stamp);
      layout->launch_stamps[i].second = stamp++;
    }
    // Cut after a launch only (record_steps is then between fills) and never after the last.
    if (++in_piece < kBundleLaunches || i + 1 == g.launches.size()) return Status{};
    in_piece = 0;
    return close(true);
  }));
  VKAD_TRY(close(false));
  if (layout) layout->stamp_count = stamp;
  if (std::getenv("VKAD_GRAPH_TRACE") != nullptr) {
    // What a first replay costs beyond the steady ones: the driver taking every step once.
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    size_t barriers = 0;
    for (const CapturedLaunch& c : g.launches) barriers += c.barrier_after;
    std::fprintf(stderr,
                 "vkad graph '%s': %zu launches (%zu followed by a barrier) recorded in %zu "
                 "%sbundles in %.2f ms\n",
                 g.name.c_str(), g.launches.size(), barriers, set.bundles.size(),
                 timed ? "timed " : "", ms);
  }
  set.heaps = rt_.heaps_.generation();
  set.current = true;
  ++rt_.stats_.graph_recordings;
  return {};
}

Status Runtime::Graphs::replay_bundle(Graph& g, uint64_t id, bool any_heap,
                                      const std::string& where, LaunchId* first,
                                      bool time_launches) {
  // While a timeline is on, the timed bundles run (the same commands and their stamps), or the
  // plain ones between two stamps of the whole replay.
  const bool timed = rt_.timeline_ && rt_.timeline_->gpu_times() && time_launches;
  const double replay_begin = rt_.timeline_ ? TimelineRecorder::now_us() : 0;
  if (g.rerecord) {  // plans changed since either set was recorded
    g.plain.current = g.timed.current = false;
    g.rerecord = false;
  }
  BundleSet& set = timed ? g.timed : g.plain;
  // A graph with no heap task binds its args buffer where the heaps would go: heap growth
  // leaves its bundles valid.
  const bool record = !set.current || (any_heap && set.heaps != rt_.heaps_.generation());
  VKAD_TRY(upload_graph_args(g));
  bool span = false;
  if (rt_.timeline_ && !time_launches) {
    VKAD_ASSIGN_OR_RETURN(
        span, rt_.timeline_->begin_gpu(rt_.list_, "replay '" + g.name + "'", "replay", 0, g.name));
  }
  if (record) {
    Status recorded = record_bundles(g, set, timed);
    // Also after a failure (its stamps are read at the end), where the list still records.
    if (span && rt_.list_.recording()) rt_.timeline_->end_gpu(rt_.list_);
    VKAD_TRY_CTX(recorded, where);
  } else {
    if (timed) rt_.list_.reset_queries(set.stamps, 0, set.layout->stamp_count);
    for (rhi::Bundle& b : set.bundles) rt_.list_.execute(b);
    if (span) rt_.timeline_->end_gpu(rt_.list_);
  }
  // Under the Khronos validation layer a secondary command buffer that writes queries must not
  // be in two submissions at once: the layer's queue thread, retiring the first, read-locks the
  // same command buffer it holds write-locked (KhronosGroup/Vulkan-ValidationLayers#7874, fixed
  // in 1.3.283; Debian 12 ships 1.3.239) and the process aborts ("Resource deadlock avoided").
  // There each timed replay records its timed bundles afresh, so each is executed once.
  if (timed && rt_.device_->validation_enabled()) set.current = false;
  std::vector<const std::byte*>& down = replay_down_;  // where each piece's error words land
  VKAD_TRY(read_back_graph_args(g, &down));
  const LaunchId first_id{rt_.next_launch_ + 1};
  if (timed)
    VKAD_TRY(rt_.timeline_->replay_stamps(rt_.list_, set.stamps, set.layout, first_id.value));
  size_t piece = 0;
  for (size_t i = 0; i < g.launches.size(); ++i) {
    while (g.args_offset[i] >= g.pieces[piece].second) ++piece;
    const std::byte* at = down[piece] + (g.args_offset[i] - g.pieces[piece].first);
    rt_.ctx_buffers_.flags.push_back({at, g.launches[i].kernel, LaunchId{++rt_.next_launch_}, id,
                                      static_cast<uint32_t>(i), g.launches[i].origin});
    rt_.count_launch(g.plans[g.launches[i].plan], g.launches[i].barrier_after);
  }
  rt_.ctx_bytes_ += 2 * g.args_blob.size();  // the upload and the readback slots
  ++rt_.stats_.graph_replays;
  ++rt_.stats_.bundle_replays;
  rt_.stats_.replayed_launches += g.launches.size();
  if (first && !g.launches.empty()) *first = first_id;
  if (rt_.timeline_) {
    rt_.timeline_->host("replay '" + g.name + "'", "replay", replay_begin,
                        TimelineRecorder::now_us(), g.name);
  }
  return rt_.auto_flush();
}

Status Runtime::Graphs::upload_graph_args(Graph& g) {
  if (!g.args_dev.valid()) {
    VKAD_ASSIGN_OR_RETURN(g.args_dev,
                          rt_.device_->create_buffer({std::max<uint64_t>(g.args_blob.size(), 16),
                                                      rhi::MemoryUsage::kDeviceLocal,
                                                      "graph '" + g.name + "' args"}));
  }
  VKAD_TRY(rt_.ensure_list());
  // Ring slots of at most a chunk each (no buffer per replay), copied into the graph's args
  // buffer after every earlier use of it (a previous replay's dispatches) is done. Each slot's
  // copy is recorded as soon as it is allocated: a slot's `buffer` is the ring's open chunk,
  // which the next allocation may close and replace.
  rt_.list_.barrier(rhi::Barrier::kComputeToTransfer);
  for (const auto& [begin, end] : g.pieces) {
    VKAD_ASSIGN_OR_RETURN(
        HostRing::Slot up,
        rt_.upload_ring_->allocate(*rt_.device_, end - begin, &rt_.ctx_buffers_.upload_chunks));
    std::memcpy(up.data, g.args_blob.data() + begin, end - begin);
    rt_.list_.copy(*up.buffer, g.args_dev, end - begin, up.offset, begin);
  }
  rt_.list_.barrier(rhi::Barrier::kTransferToCompute);
  return {};
}

Status Runtime::Graphs::read_back_graph_args(Graph& g, std::vector<const std::byte*>* down) {
  // The launches wrote their error words into the graph's args buffer: read when this list
  // retires like every launch's. Running out of host memory here returns the error with the
  // replay recorded but its error words unread.
  down->clear();
  rt_.list_.barrier(rhi::Barrier::kComputeToTransfer);
  for (const auto& [begin, end] : g.pieces) {
    VKAD_ASSIGN_OR_RETURN(
        HostRing::Slot slot,
        rt_.readback_ring_->allocate(*rt_.device_, end - begin, &rt_.ctx_buffers_.readback_chunks));
    rt_.list_.copy(g.args_dev, *slot.buffer, end - begin, begin, slot.offset);
    down->push_back(slot.data);
  }
  rt_.list_.barrier(rhi::Barrier::kTransferToCompute);
  return {};
}

std::string Runtime::Graphs::graph_launch_where(uint64_t graph, uint32_t index) const {
  auto it = graphs_.find(graph);
  const std::string name = it == graphs_.end() ? "#" + std::to_string(graph) + " (released since)"
                                               : "'" + it->second->name + "'";
  return "launch " + std::to_string(index) + " of graph " + name;
}

}  // namespace vkad::runtime
