// The hoist pass (graph/graph_passes.h): a fill step moves up to the fills before it where no
// step between touches its array.
//
// Why: a fill step is a barrier pair in the recorded graph and the end of a stretch that the
// schedule and fusion treat on its own. A budgeted tape's deepest level fills each step's grid
// version (arrays rename gave no twins) just before that step's scatter: two fills a step cut
// the recomputed forward between g2p(t) and p2g(t + 1), four dependent dispatches a step where
// one would do. Nothing touches a version between the segment's first fills and its own step,
// so moved up next to them, the fills run as one group (consecutive fills share a barrier pair:
// runtime/graph.cpp) and the steps after them as one stretch.
//
// Correct by construction: a fill moves only past launches none of whose array arguments is the
// filled array (a launch touches only its arguments), so every launch sees what it saw. It
// never moves past another fill step (it joins the nearest group before it), so it adds no
// boundary to a stretch that had none. Array identities are fixed for a graph's life (updates
// change scalars only), so no update can make a move wrong.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "graph/graph_passes.h"

namespace vkad {

namespace {

class HoistPass final : public GraphPass {
 public:
  std::string name() const override { return "hoist"; }
  Stage stage() const override { return Stage::kRewrite; }

  bool run(Program& p, PassContext& ctx) override {
    // As rename: a step loop's plan keeps its fills where its zeros are planned around them.
    if (!ctx.knows_dtypes()) return true;
    std::vector<size_t> order;  // step indices in their new order
    order.reserve(p.steps.size());
    // Per array: the stamp of the last step that touched it; stamps grow with each step
    // appended, a fill joining a group takes the group's.
    std::unordered_map<uint64_t, uint64_t> touched;
    uint64_t stamp = 0, group = 0;  // group: the stamp of the last fill group (0: none yet)
    size_t group_end = 0;           // in `order`: one past the group's last fill
    bool moved = false;
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const CapturedStep& s = p.steps[i];
      if (s.launch) {
        order.push_back(i);
        ++stamp;
        for (const Arg& a : s.args) {
          if (a.kind == abi::ParamKind::kNdArray) touched[a.array.id] = stamp;
        }
        continue;
      }
      const uint64_t id = s.args[0].array.id;
      auto t = touched.find(id);
      if (group != 0 && (t == touched.end() || t->second < group)) {
        moved = moved || group_end != order.size();
        order.insert(order.begin() + static_cast<std::ptrdiff_t>(group_end), i);
        ++group_end;
        touched[id] = group;
        continue;
      }
      order.push_back(i);
      group = ++stamp;
      group_end = order.size();
      touched[id] = group;
    }
    if (!moved) return true;
    std::vector<CapturedStep> steps;
    steps.reserve(order.size());
    ScheduleMemo memo;
    for (size_t i : order) {
      steps.push_back(std::move(p.steps[i]));
      if (!p.memo.empty()) memo.push_back(i < p.memo.size() ? std::move(p.memo[i]) : std::nullopt);
    }
    p.steps = std::move(steps);
    if (!p.memo.empty()) p.memo = std::move(memo);
    p.hoisted = true;
    return true;
  }
};

}  // namespace

std::unique_ptr<GraphPass> make_hoist_pass() { return std::make_unique<HoistPass>(); }

}  // namespace vkad
