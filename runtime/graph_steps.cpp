// How a graph's steps come to be and are read back (graphs.h):
// a captured launch or fill (launch() and fill() while a capture is open) and a step of
// Runtime::Graphs::instantiate go into a Graph through the same two functions, so a graph made from
// a list is the graph its capture would have made; GraphRecord reads the steps back for a layer
// above that reworks a graph (Session), which thus keeps no record of its own.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "runtime/graphs.h"

namespace vkad::runtime {

void Runtime::Graphs::add_launch(Graph& g, const std::shared_ptr<const Kernel>& k,
                                 std::span<const Arg> args, bool omit_barrier,
                                 const LaunchOrigin& origin) {
  CapturedLaunch c;
  c.kernel = k;
  c.origin = origin;
  c.args = g.args.append(args);
  c.arrays = g.arrays.append(rt_.planned_.arrays);
  // What a replay needs of the plan, shared with the kernel's previous launch when equal (as it
  // is for a step loop's launches).
  auto [last, first_use] = g.last_plan.try_emplace(k.get(), 0);
  if (first_use &&
      std::find(g.pipeline_keys.begin(), g.pipeline_keys.end(), k->hash) == g.pipeline_keys.end()) {
    rt_.pipelines_.retain(k->hash);
    g.pipeline_keys.push_back(k->hash);
  }
  c.plan = share_plan(g, last->second, first_use, rt_.planned_);
  ++g.plan_users[c.plan];
  // The encoded args into the graph's blob, at an offset a storage binding may start at, in
  // pieces of at most a ring chunk (a launch's args never straddle two pieces).
  const uint64_t align =
      std::max<uint64_t>(rt_.device_->caps().min_storage_buffer_offset_alignment, 16);
  const uint64_t bytes = rt_.args_scratch_.size();
  const uint64_t at = (g.args_blob.size() + align - 1) / align * align;
  if (g.pieces.empty() || at + bytes - g.pieces.back().first > rt_.upload_ring_->chunk_bytes()) {
    if (!g.pieces.empty()) g.pieces.back().second = at;
    g.pieces.push_back({at, at});
  }
  g.args_offset.push_back(at);
  g.args_blob.resize(at + bytes);  // the padding before `at` is zero
  std::memcpy(g.args_blob.data() + at, rt_.args_scratch_.data(), bytes);
  g.pieces.back().second = at + bytes;
  if (omit_barrier && !g.steps.empty() && g.steps.back().first) {
    g.launches.back().barrier_after = false;
  }
  g.steps.push_back({true, static_cast<uint32_t>(g.launches.size())});
  g.launches.push_back(std::move(c));
}

void Runtime::Graphs::add_fill(Graph& g, const CapturedFill& fill) {
  g.steps.push_back({false, static_cast<uint32_t>(g.fills.size())});
  g.fills.push_back(fill);
}

// A launch step goes through what launch() does while capturing -- the kernel looked up, the
// arguments checked, the launch planned (its pipelines found or made) -- and a fill through
// fill()'s checks, with the same errors.
Status Runtime::Graphs::instantiate_step(Graph& g, const GraphStep& step) {
  if (!step.launch) {
    VKAD_ASSIGN_OR_RETURN(const CapturedFill f, rt_.fill_step(step.array, step.value));
    add_fill(g, f);
    return {};
  }
  auto kit = rt_.kernels_.find(step.kernel.id);
  if (kit == rt_.kernels_.end()) return rt_.dead_handle("launch", "kernel", step.kernel.id);
  const std::shared_ptr<const Kernel>& k = kit->second;
  VKAD_TRY(rt_.check_args(*k, step.args));
  VKAD_TRY(
      rt_.plan_pipelines(*k, step.args, &rt_.planned_, rt_.options_.background_specialization));
  add_launch(g, k, step.args, step.omit_barrier, step.origin);
  return {};
}

Result<GraphHandle> Runtime::Graphs::instantiate(const std::string& name,
                                                 std::span<const GraphStep> steps) {
  VKAD_EXCLUSIVE_USE("instantiate");
  VKAD_TRY(rt_.device_->status());
  auto g = std::make_unique<Graph>();
  g->name = name.empty() ? "graph" : name;
  const size_t launches = static_cast<size_t>(
      std::count_if(steps.begin(), steps.end(), [](const GraphStep& s) { return s.launch; }));
  g->launches.reserve(launches);
  g->args_offset.reserve(launches);
  g->steps.reserve(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    Status st = instantiate_step(*g, steps[i]);
    if (st.ok()) continue;
    for (uint64_t key : g->pipeline_keys) rt_.pipelines_.release(key);
    return make_error(st.code(), "instantiate of graph '" + g->name + "', step " +
                                     std::to_string(i) + ": " + st.message());
  }
  Result<uint64_t> id = rt_.issue_id();
  if (!id.ok()) {
    for (uint64_t key : g->pipeline_keys) rt_.pipelines_.release(key);
    return id.status();
  }
  return keep_graph(*id, std::move(g));
}

Result<Runtime::Graphs::GraphRecord> Runtime::Graphs::graph_record(GraphHandle graph) const {
  auto it = graphs_.find(graph.id);
  if (it == graphs_.end()) return rt_.dead_handle("graph_record", "graph", graph.id);
  return GraphRecord(it->second.get());
}

size_t Runtime::Graphs::GraphRecord::size() const { return g_ ? g_->steps.size() : 0; }

size_t Runtime::Graphs::GraphRecord::launches() const { return g_ ? g_->launches.size() : 0; }

GraphStep Runtime::Graphs::GraphRecord::operator[](size_t i) const {
  const auto [is_launch, j] = g_->steps[i];
  if (!is_launch) {
    const CapturedFill& f = g_->fills[j];
    return GraphStep::array_fill(f.array, f.value);
  }
  const CapturedLaunch& c = g_->launches[j];
  // No barrier before it: the launch before it, the step before, goes without one.
  const bool omitted = i > 0 && g_->steps[i - 1].first && !g_->launches[j - 1].barrier_after;
  return GraphStep::kernel_launch(KernelHandle{c.kernel->id},
                                  {g_->args.at(c.args), c.kernel->desc.params.size()}, omitted,
                                  c.origin);
}

}  // namespace vkad::runtime
