// Session's calls on launch sequences: captures, replays, step loops (api/session.h,
// SessionGraphs).
#include <string>
#include <unordered_map>
#include <utility>

#include "api/compiled_graphs.h"
#include "api/session.h"
#include "api/session_core.h"
#include "api/step_loops.h"
#include "runtime/graphs.h"
#include "runtime/runtime.h"

namespace vkad {

uint32_t SessionGraphs::captured_launches() const {
  return core().capture && core().rt->graphs().capturing() ? core().capture->launches : 0;
}

Status SessionGraphs::begin_capture(const std::string& name, CaptureOptions options) {
  VKAD_TRY(core().rt->graphs().begin_capture(name, options.run));
  core().capture.emplace();
  core().capture_fixed.clear();
  core().capture_barriers.clear();
  core().capture_name = name;
  core().capture_background = options.background_rework;
  return {};
}

Result<GraphHandle> SessionGraphs::end_capture() {
  LaunchRanges fixed = std::exchange(core().capture_fixed, {});
  Result<GraphHandle> g = core().rt->graphs().end_capture();
  if (!g.ok()) return g;
  if (!core().capture) return g;  // the capture was begun through runtime(): nothing to rework
  const size_t steps = core().capture->steps;
  core().capture.reset();
  if (!core().pipeline.empty()) {  // no pass: the graph stays as captured
    g = self().graphs_->rework(*g, steps, core().capture_name, core().capture_background);
  }
  if (g.ok()) self().graphs_->note_fixed(*g, std::move(fixed));
  return g;
}

Status SessionGraphs::finish_rework(GraphHandle graph) {
  return self().graphs_->finish_rework(graph);
}

Status SessionGraphs::replay(GraphHandle graph, std::span<const GraphUpdate> updates,
                             LaunchId* first) {
  return self().graphs_->replay(graph, updates, first);
}

Status SessionGraphs::release_graph(GraphHandle graph) { return self().graphs_->release(graph); }

Status SessionGraphs::launch_loop(std::span<const LoopLaunch> body, uint32_t count,
                                  LoopInfo* info) {
  return self().loops_->launch_loop(body, count, info);
}

void SessionGraphs::prepare_loop(std::span<const LoopLaunch> body, uint32_t count) {
  self().loops_->prepare_loop(body, count);
}

void SessionGraphs::ready_loop(std::span<const LoopLaunch> body, uint32_t count) {
  self().loops_->ready_loop(body, count);
}

bool SessionGraphs::loop_rolls(std::span<const LoopLaunch> body, uint32_t count) {
  return self().loops_->loop_rolls(body, count);
}

void SessionGraphs::rework_loop(std::span<const LoopLaunch> body, uint32_t count) {
  self().loops_->rework_loop(body, count);
}

Result<std::vector<std::string>> SessionGraphs::graph_launch_names(GraphHandle graph) const {
  VKAD_ASSIGN_OR_RETURN(std::vector<std::string> names,
                        core().rt->graphs().graph_launch_kernels(graph));
  // A reworked graph's own launches are fused and reordered: updates (and so names) keep the
  // captured numbering, which its FusedGraph records.
  if (const std::vector<std::string>* captured = self().graphs_->captured_kernels(graph)) {
    names = *captured;
  }
  std::unordered_map<std::string, uint32_t> seen;
  for (std::string& n : names) {
    const uint32_t k = seen[n]++;
    if (k > 0) n += "#" + std::to_string(k);
  }
  return names;
}

Result<uint32_t> SessionGraphs::graph_launch(GraphHandle graph, std::string_view name) const {
  VKAD_ASSIGN_OR_RETURN(const std::vector<std::string> names, graph_launch_names(graph));
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<uint32_t>(i);
  }
  std::string some;
  for (size_t i = 0; i < names.size() && i < 8; ++i) some += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 8) some += ", ...";
  return make_error(ErrorCode::kNotFound,
                    "graph_launch: the graph has no launch named '" + std::string(name) +
                        "' (its " + std::to_string(names.size()) + " launches: " + some + ")");
}

std::string SessionGraphs::graph_passes() const { return core().pipeline.text(); }

}  // namespace vkad
