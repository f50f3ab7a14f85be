// The graphs a Session captured, as it runs them (api/compiled_graphs.h): each capture's
// rework installed -- the launches made a graph again (Runtime::Graphs::instantiate) rolled,
// reordered, with fewer barriers or fused -- or run on a thread of its own until a replay finds it
// done; replays in the captured numbering. This is an optimisation: whatever keeps a launch from
// being reworked (a kernel vkad did not compile, a kernel the device refuses) leaves it as it was.
#include "api/compiled_graphs.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/phase_clock.h"
#include "graph/graph_rework.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"

namespace vkad {

void CompiledGraphs::note_fixed(GraphHandle graph, LaunchRanges fixed) {
  if (!fixed.empty()) fixed_launches_[graph.id] = std::move(fixed);
}

const std::vector<std::string>* CompiledGraphs::captured_kernels(GraphHandle graph) const {
  GraphHandle g = graph;
  if (auto rw = reworked_.find(graph.id); rw != reworked_.end()) g = rw->second;
  auto it = fused_graphs_.find(g.id);
  return it == fused_graphs_.end() ? nullptr : &it->second.kernel;
}

void CompiledGraphs::forget(uint64_t id) {
  auto f = fused_graphs_.find(id);
  if (f == fused_graphs_.end()) return;
  for (NdArrayHandle a : f->second.owned) (void)core_.rt->free_ndarray(a);
  fused_graphs_.erase(f);
}

void CompiledGraphs::join() {
  if (background_ && background_->worker.joinable()) background_->worker.join();
}

void CompiledGraphs::settle() {
  if (!background_) return;
  join();
  std::unique_ptr<BackgroundRework> bg = std::move(background_);
  spare_record_ = std::move(bg->record);
  if (bg->result == nullptr) return;
  Result<GraphHandle> g = install(*bg->result, /*keep_captured=*/true);
  if (!g.ok() || g->id == bg->graph.id) return;
  reworked_[bg->graph.id] = *g;
  fused_graphs_.at(g->id).carried = std::move(bg->updates);
}

Status CompiledGraphs::check_fixed_updates(GraphHandle graph,
                                           std::span<const GraphUpdate> updates) const {
  if (updates.empty() || fixed_launches_.empty()) return {};  // a plain replay: no lookup
  auto it = fixed_launches_.find(graph.id);
  if (it == fixed_launches_.end()) return {};
  for (const GraphUpdate& u : updates) {
    for (const auto& [first, end] : it->second) {
      if (u.launch < first || u.launch >= end) continue;
      return make_error(ErrorCode::kInvalidArgument,
                        "replay: update of launch " + std::to_string(u.launch) +
                            ", made by a launch_loop that runs as one resident kernel or as its "
                            "reworked launches: its scalars are fixed (replace them through an "
                            "array, or capture the loop's launches one by one)");
    }
  }
  return {};
}

void CompiledGraphs::copy_record(const runtime::Runtime::Graphs::GraphRecord& record,
                                 RecordCopy* copy) {
  RecordCopy& out = *copy;
  out.steps.clear();
  out.args.clear();
  out.offset.clear();
  out.steps.reserve(record.size());
  out.offset.reserve(record.size() + 1);
  out.offset.push_back(0);
  for (size_t i = 0; i < record.size(); ++i) {
    runtime::GraphStep s = record[i];
    if (s.launch) {
      out.args.insert(out.args.end(), s.args.begin(), s.args.end());
    } else {
      out.args.push_back(Arg::ndarray(s.array));
    }
    s.args = {};
    out.steps.push_back(s);
    out.offset.push_back(out.args.size());
  }
}

std::vector<CapturedStep> CompiledGraphs::captured_steps(const RecordCopy& record) {
  std::vector<CapturedStep> out;
  out.reserve(record.steps.size());
  for (size_t i = 0; i < record.steps.size(); ++i) {
    const runtime::GraphStep& s = record.steps[i];
    const auto begin = record.args.begin() + static_cast<ptrdiff_t>(record.offset[i]);
    const auto end = record.args.begin() + static_cast<ptrdiff_t>(record.offset[i + 1]);
    out.push_back({s.launch, s.kernel, {begin, end}, s.launch ? 0.0 : s.value});
  }
  return out;
}

Result<GraphHandle> CompiledGraphs::rework(GraphHandle g, size_t session_steps,
                                           const std::string& name, bool background) {
  // Steps recorded through runtime() while Session captured: the graph is then kept as the
  // runtime captured it (the barriers Session judged at capture did not see them).
  Result<size_t> n_steps = core_.rt->graphs().graph_steps(g);
  if (!n_steps.ok() || *n_steps != session_steps) return g;
  settle();  // one rework at a time: the previous one is installed first
  Result<runtime::Runtime::Graphs::GraphRecord> record = core_.rt->graphs().graph_record(g);
  if (!record.ok()) return g;
  // Into the last rework's vectors: a training loop's record is the same size each time, and
  // fresh pages for it cost the caller more than the copy (lavapipe, diffmpm).
  RecordCopy copy = std::move(spare_record_);
  copy_record(*record, &copy);
  compiler_.snapshot_extents(std::span<const Arg>(copy.args));
  if (background) {
    auto bg = std::make_unique<BackgroundRework>();
    bg->graph = g;
    bg->record = std::move(copy);
    BackgroundRework* b = bg.get();
    // The worker reads the session's kernel tables and caches, which are left alone until
    // join(), and writes only its result slot and `done`.
    auto work = [this, b, name]() {
      try {
        b->result = compiler_.prepare_rework(b->graph, captured_steps(b->record), name);
      } catch (...) {  // out of memory: the graph stays as captured
        b->result = std::make_unique<GraphCompiler::PreparedRework>();
        b->result->graph = b->graph;
        b->result->kernels = compiler_.take_unregistered();
      }
      b->done.store(true, std::memory_order_release);
    };
    try {
      bg->worker = std::thread(work);
      background_ = std::move(bg);
      return g;
    } catch (const std::system_error&) {
      copy = std::move(bg->record);  // no thread to be had: the rework runs here
    }
  }
  std::unique_ptr<GraphCompiler::PreparedRework> p =
      compiler_.prepare_rework(g, captured_steps(copy), name);
  spare_record_ = std::move(copy);
  return install(*p, /*keep_captured=*/false);
}

void CompiledGraphs::keep_latest(std::span<const GraphUpdate> updates,
                                 std::vector<GraphUpdate>* kept) {
  for (const GraphUpdate& u : updates) {
    auto same = [&](const GraphUpdate& a) { return a.launch == u.launch && a.param == u.param; };
    auto at = std::find_if(kept->begin(), kept->end(), same);
    if (at == kept->end()) {
      kept->push_back(u);
    } else {
      *at = u;
    }
  }
}

Status CompiledGraphs::finish_rework(GraphHandle graph) {
  if (!background_ || background_->graph.id != graph.id) return {};
  if (core_.rt->graphs().capturing()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "finish_rework: a capture is open; end it first (the rework records the "
                      "reworked graph)");
  }
  settle();
  return {};
}

Status CompiledGraphs::replay(GraphHandle graph, std::span<const GraphUpdate> updates,
                              LaunchId* first) {
  VKAD_TRY(check_fixed_updates(graph, updates));
  if (background_ && background_->graph.id == graph.id) {
    if (background_->done.load(std::memory_order_acquire) && !core_.rt->graphs().capturing()) {
      settle();
    } else {
      // The launches as captured until the rework is done; the updates carry over to it.
      VKAD_TRY(core_.rt->graphs().replay(graph, updates, first));
      keep_latest(updates, &background_->updates);
      return {};
    }
  }
  if (auto rw = reworked_.find(graph.id); rw != reworked_.end()) graph = rw->second;
  auto it = fused_graphs_.find(graph.id);
  std::vector<GraphUpdate> carried;  // a background rework's updates from before its install
  if (it != fused_graphs_.end() && !it->second.carried.empty()) {
    carried = it->second.carried;
    carried.insert(carried.end(), updates.begin(), updates.end());
    updates = carried;
  }
  Status st = replay_reworked(graph, updates, first);
  if (st.ok() && it != fused_graphs_.end()) it->second.carried.clear();
  return st;
}

Status CompiledGraphs::replay_reworked(GraphHandle graph, std::span<const GraphUpdate> updates,
                                       LaunchId* first) {
  auto it = fused_graphs_.find(graph.id);
  if (it == fused_graphs_.end() || updates.empty()) {
    if (it != fused_graphs_.end() && it->second.on_original) {
      return core_.rt->graphs().replay(it->second.original, updates, first);
    }
    return core_.rt->graphs().replay(graph, updates, first);
  }
  FusedGraph& f = it->second;
  if (f.original.id != 0) {
    bool pinned = f.on_original;
    for (const GraphUpdate& u : updates) {
      pinned = pinned || (u.launch < f.pinned.size() && u.param < f.pinned[u.launch].size() &&
                          f.pinned[u.launch][u.param]);
    }
    if (pinned) {
      // The schedule's premise may not hold for the new values: the launches as captured,
      // with every update so far, from now on.
      std::vector<GraphUpdate> all = f.on_original ? std::vector<GraphUpdate>{} : f.applied;
      all.insert(all.end(), updates.begin(), updates.end());
      VKAD_TRY(core_.rt->graphs().replay(f.original, all, first));
      f.on_original = true;
      f.applied.clear();
      return {};
    }
  }
  std::vector<GraphUpdate> mapped;
  VKAD_TRY(translate(f, updates, &mapped));
  Status st = core_.rt->graphs().replay(graph, mapped, first);
  if (st.ok()) {
    // The latest value per launch and parameter: what the graph as captured would need.
    if (f.original.id != 0) keep_latest(updates, &f.applied);
    return st;
  }
  // The runtime checks the values (dtype, range) in the fused graph's numbering: say which
  // captured launch and parameter each fused one stands for.
  std::string map;
  for (size_t i = 0; i < updates.size(); ++i) {
    map += (map.empty() ? "" : "; ") + std::string("captured launch ") +
           std::to_string(updates[i].launch) + " parameter " + std::to_string(updates[i].param) +
           " is launch " + std::to_string(mapped[i].launch) + " parameter " +
           std::to_string(mapped[i].param) + " of the fused graph";
  }
  return make_error(st.code(),
                    st.message() + " (launches scheduled and fused at end_capture: " + map + ")");
}

Status CompiledGraphs::release(GraphHandle graph) {
  if (background_ && background_->graph.id == graph.id) {
    // Its rework is dropped; the kernels it compiled are registered (the caches name them).
    join();
    if (background_->result != nullptr)
      (void)compiler_.register_rework_kernels(*background_->result);
    spare_record_ = std::move(background_->record);
    background_.reset();
  }
  VKAD_TRY(core_.rt->graphs().release_graph(graph));
  if (auto rw = reworked_.find(graph.id); rw != reworked_.end()) {
    // The reworked graph installed for it: its graph as captured is the one just released.
    (void)core_.rt->graphs().release_graph(rw->second);
    forget(rw->second.id);
    reworked_.erase(rw);
  }
  auto it = fused_graphs_.find(graph.id);
  if (it != fused_graphs_.end() && it->second.original.id != 0) {
    (void)core_.rt->graphs().release_graph(it->second.original);
  }
  forget(graph.id);
  fixed_launches_.erase(graph.id);
  return {};
}

namespace {

// VKAD_GRAPH_DUMP (docs/graphs.md, "Diagnostics"): the graph as recorded, a line per dispatch or
// fill, '|' before those a barrier precedes, a fused run's members joined by '+'.
class RecordedDump {
 public:
  void fill(uint64_t array) {
    if (to_) text_ += "| fill a" + std::to_string(array) + "\n";
  }
  void member(const codegen::Kernel* k, size_t m) {
    if (to_) members_ += (m ? "+" : "") + (k ? k->name : std::string("?"));
  }
  void launch(bool barrier) {
    if (to_) text_ += (barrier ? "| " : "  ") + members_ + "\n";
    members_.clear();
  }
  void write(const std::string& name) const {
    if (to_) append_graph_dump("=== " + name + " as recorded ('|': after a barrier)\n" + text_);
  }

 private:
  const bool to_ = std::getenv("VKAD_GRAPH_DUMP") != nullptr;
  std::string text_, members_;
};

}  // namespace

Result<GraphHandle> CompiledGraphs::instantiate_plan(
    const ReworkPlan& w, const std::string& name, FusedGraph* map, bool* relaxed,
    std::span<const runtime::LaunchOrigin> origins) {
  // The steps, each launch's arguments at `first` in `args` (their spans are set once every
  // step is in: `args` moves as it grows).
  std::vector<runtime::GraphStep> steps;
  std::vector<Arg> args;
  std::vector<size_t> first;
  runtime::LaunchOrigin origin;  // of the launch being assembled
  map->launch.resize(w.launches.size());
  map->param.resize(w.launches.size());
  uint32_t made = 0;
  // What ran since the last barrier (a fill records its own): a launch that conflicts with
  // none of it goes without one.
  BarrierTracker pending;
  bool first_in_stretch = true;
  ScheduleLaunch unit;  // the accesses of the launch being assembled (a run's union)
  size_t barriers = 0;  // dependent launches: what a replay waits for (VKAD_GRAPH_TRACE)
  RecordedDump dump;
  // Fills are kept only where the plan keeps them (w.dropped: made redundant by a fused run's
  // zeroing); a dropped one still ends the stretch, as it did when it was captured.
  auto fill = [&](size_t i, bool kept) {
    pending.clear();
    first_in_stretch = true;
    if (kept) {
      dump.fill(w.steps[i].args[0].array.id);
      steps.push_back(runtime::GraphStep::array_fill(w.steps[i].args[0].array, w.steps[i].value));
      first.push_back(args.size());
    }
    return Status{};
  };
  auto member = [&](size_t launch, size_t r, size_t m) {
    const ScheduleLaunch& sl = w.sched[launch];
    unit.known = unit.known && sl.known;
    unit.accesses.insert(unit.accesses.end(), sl.accesses.begin(), sl.accesses.end());
    const uint32_t orig = w.order[launch];
    dump.member(w.launches[launch].kernel, m);
    map->launch[orig] = made;
    if (w.runs[r].count > 1) map->param[orig] = w.planned[r].param_map[m];
    const runtime::LaunchOrigin mine =
        orig < origins.size() ? origins[orig] : runtime::LaunchOrigin{};
    origin = m == 0 ? mine : runtime::LaunchOrigin::join(origin, mine);
  };
  auto emit = [&](KernelHandle k, std::span<const Arg> a) {
    const bool barrier = pending.next(unit);
    barriers += barrier || first_in_stretch || !core_.graph.schedule;
    unit = ScheduleLaunch{};
    const bool omit = core_.graph.schedule && !first_in_stretch && !barrier;
    dump.launch(!omit);
    *relaxed = *relaxed || omit;
    first_in_stretch = false;
    ++made;
    steps.push_back(runtime::GraphStep::kernel_launch(k, {}, omit, origin));
    first.push_back(args.size());
    args.insert(args.end(), a.begin(), a.end());
    return Status{};
  };
  VKAD_TRY(walk_plan(w, fill, member, emit));
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].launch) continue;
    const size_t end = i + 1 < steps.size() ? first[i + 1] : args.size();
    steps[i].args = std::span<const Arg>(args.data() + first[i], end - first[i]);
  }
  dump.write(name);
  Result<GraphHandle> fused = core_.rt->graphs().instantiate(name, steps);
  if (!fused.ok()) return fused.status();
  if (std::getenv("VKAD_GRAPH_TRACE") != nullptr) {
    std::fprintf(stderr, "vkad graph '%s': %u launches, %zu after a barrier\n", name.c_str(), made,
                 barriers);
  }
  return fused;
}

void CompiledGraphs::describe_launches(const std::vector<CapturedStep>& captured,
                                       FusedGraph* map) const {
  for (const CapturedStep& s : captured) {
    if (!s.launch) continue;
    map->scalars.push_back(scalar_params(s.args));
    const std::shared_ptr<const codegen::Kernel>& k = core_.catalog.fusible_ir(s.kernel.id);
    map->kernel.push_back(k ? k->name : std::string());
  }
}

void CompiledGraphs::unroll_numbering(std::span<const uint32_t> roll_index,
                                      const std::vector<bool>& rolled, FusedGraph* map,
                                      std::vector<std::vector<bool>>* pinned) {
  // Back to the captured launches' numbering: a rolled launch is part of its resident launch,
  // whose scalars are its first repetition's; an update of any of a rolled launch's scalars
  // needs the graph as captured (pinned).
  std::vector<uint32_t> launch(roll_index.size());
  std::vector<std::vector<uint32_t>> param(roll_index.size());
  std::vector<std::vector<bool>> pin(roll_index.size());
  for (size_t o = 0; o < roll_index.size(); ++o) {
    const uint32_t l = roll_index[o];
    launch[o] = map->launch[l];
    if (rolled[o]) {
      pin[o] = map->scalars[o];
    } else {
      param[o] = map->param[l];
      pin[o] = (*pinned)[l];
    }
  }
  map->launch = std::move(launch);
  map->param = std::move(param);
  *pinned = std::move(pin);
}

void CompiledGraphs::keep_for_updates(GraphHandle graph, bool reworked, bool keep_captured,
                                      std::vector<std::vector<bool>> pinned, FusedGraph* map) {
  // Where the schedule rests on rows that scalar arguments decide, the graph as captured stays
  // for an update of one of them (CompiledGraphs::replay).
  bool any_pinned = false;
  for (const std::vector<bool>& p : pinned) {
    for (bool b : p) any_pinned = any_pinned || b;
  }
  if (keep_captured || (reworked && any_pinned)) {
    if (!reworked) {
      for (std::vector<bool>& p : pinned) p.assign(p.size(), false);
    }
    map->pinned = std::move(pinned);
    map->original = graph;
  } else {
    (void)core_.rt->graphs().release_graph(graph);
  }
}

Result<GraphHandle> CompiledGraphs::install(GraphCompiler::PreparedRework& p, bool keep_captured) {
  if (!compiler_.register_rework_kernels(p) || !p.rework) return p.graph;
  PhaseClock clock("vkad graph rework", compiler_.compile_ms());
  FusedGraph map;
  if (!compiler_.materialize_stashes(p.stashes, &p.w, &map.owned).ok()) {
    for (NdArrayHandle a : map.owned) (void)core_.rt->free_ndarray(a);
    return p.graph;  // out of memory for a stash: the launches as captured
  }
  // The rework's kernels get their specialized pipelines where their first launch is planned:
  // in instantiate.
  const double created = core_.rt->pipeline_create_ms();
  // What made each captured launch, where the plan's launches are the captured ones in another
  // order (rolling and blocking make launches of several).
  std::vector<runtime::LaunchOrigin> origins;
  if (!p.any_rolled && p.blocked == 0) {
    Result<std::vector<runtime::LaunchOrigin>> o = core_.rt->graphs().graph_launch_origins(p.graph);
    if (o.ok() && o->size() == p.w.order.size()) origins = std::move(*o);
  } else if (p.renumbered_only) {
    // In the plan's numbering: a fill launch rename made has none, a launch prune left out
    // none of its own.
    Result<std::vector<runtime::LaunchOrigin>> o = core_.rt->graphs().graph_launch_origins(p.graph);
    if (o.ok() && o->size() == p.roll_index.size()) {
      origins.assign(p.w.order.size(), runtime::LaunchOrigin{});
      for (size_t c = 0; c < o->size(); ++c) {
        if (!p.rolled[c] && p.roll_index[c] < origins.size()) origins[p.roll_index[c]] = (*o)[c];
      }
    }
  }
  Result<GraphHandle> fused = instantiate_plan(p.w, p.name, &map, &p.relaxed, origins);
  *compiler_.compile_ms() += core_.rt->pipeline_create_ms() - created;
  clock.mark("instantiate");
  if (!fused.ok()) {
    for (NdArrayHandle a : map.owned) (void)core_.rt->free_ndarray(a);
    return p.graph;  // the launches as captured
  }
  map.name = p.name;
  describe_launches(p.captured, &map);
  if (p.any_rolled) unroll_numbering(p.roll_index, p.rolled, &map, &p.pinned);
  keep_for_updates(p.graph,
                   p.reordered || p.relaxed || p.any_rolled || p.any_recomputed || p.rows_used,
                   keep_captured, std::move(p.pinned), &map);
  rolled_launches_ += static_cast<uint64_t>(std::count(p.rolled.begin(), p.rolled.end(), true)) -
                      p.blocked - p.dropped;
  blocked_launches_ += p.blocked;
  recomputed_launches_ += p.recompute_pins.size() / 2;  // a (consumer, producer) pair each
  fused_graphs_.emplace(fused->id, std::move(map));
  return *fused;
}

std::vector<bool> CompiledGraphs::scalar_params(std::span<const Arg> args) {
  std::vector<bool> out(args.size());
  for (size_t p = 0; p < args.size(); ++p) out[p] = args[p].kind == abi::ParamKind::kScalar;
  return out;
}

Status CompiledGraphs::translate(const FusedGraph& f, std::span<const GraphUpdate> updates,
                                 std::vector<GraphUpdate>* out) const {
  // The runtime's messages (runtime/graph.cpp), in the captured launches' numbering.
  const std::string where = "replay of graph '" + f.name + "'";
  for (const GraphUpdate& u : updates) {
    if (u.launch >= f.launch.size()) {
      return make_error(ErrorCode::kInvalidArgument,
                        where + ": update of launch " + std::to_string(u.launch) +
                            "; the graph has " + std::to_string(f.launch.size()) + " launches");
    }
    const std::vector<bool>& scalars = f.scalars[u.launch];
    if (u.param >= scalars.size() || !scalars[u.param]) {
      const std::string& k = f.kernel[u.launch];
      return make_error(ErrorCode::kInvalidArgument,
                        where + ", launch " + std::to_string(u.launch) +
                            (k.empty() ? "" : " ('" + k + "')") + ": parameter " +
                            std::to_string(u.param) + " is not a scalar parameter of the kernel");
    }
    const std::vector<uint32_t>& pm = f.param[u.launch];
    out->push_back({f.launch[u.launch], pm.empty() ? u.param : pm[u.param], u.value});
  }
  return {};
}

}  // namespace vkad
