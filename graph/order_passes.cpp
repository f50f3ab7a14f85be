// The passes over the plan (graph/graph_passes.h): schedule (the launches in scheduled order;
// the install then drops the barriers no shared array needs) and fuse (runs of element-wise
// launches of one range into one kernel each, and the zero fills those make redundant).
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/graph_passes.h"
#include "graph/stencil_blocking.h"
#include "ir/text.h"

namespace vkad {

namespace {

// At most this many distinct arrays per fused kernel: with its args buffer that stays within
// the 32 bindings every push-descriptor implementation takes (maxPushDescriptors >= 32).
constexpr uint32_t kMaxFusedArrays = 24;
constexpr uint32_t kMaxFusedLaunches = 32;

class SchedulePass final : public GraphPass {
 public:
  std::string name() const override { return "schedule"; }
  Stage stage() const override { return Stage::kSchedule; }
  bool run(Program& p, PassContext& ctx) override {
    plan_order(p, ctx, /*reorder=*/true);
    p.scheduled = true;
    return true;
  }
};

// Within each stretch between fills of a scheduled plan, a launch of the shape of the one
// before it, found among the next kPullWindow launches, that fuses with it and with neither of
// its own neighbours and conflicts with none of the launches it passes, is moved up next to it: the
// schedule orders a level's launches by shape, so a chain's next step may sit behind the other
// launches of its level (a controller that many steps write, diffmpm's compute_actuation, between
// g2p(f) and p2g(f + 1)), where fusion, which merges runs of consecutive launches, would not see
// it. Results are the launches' in capture order: only launches that conflict with nothing they
// pass move. True where one moved.
constexpr size_t kPullWindow = 64;

// Whether launches `a` then `b` (shapes `sa`, `sb`: graph_schedule.h) fuse into one run
// (launch_fusion.h). Asked of thousands of pairs of a few kernels in a budgeted forward, so
// answers are kept by what decides them: the two kernels, which of their parameters share an
// array and whether those accesses' rows are equal.
class FusePairs {
 public:
  bool operator()(const codegen::FusionLaunch& a, uint64_t sa, const codegen::FusionLaunch& b,
                  uint64_t sb) {
    if (sa == 0 || sa != sb) return false;  // another range, box or workgroup: never
    // The kernels and ranges (the shape is a hash of the ranges: equal ones are compared).
    key_.assign({reinterpret_cast<uintptr_t>(a.kernel), reinterpret_cast<uintptr_t>(b.kernel),
                 static_cast<uintptr_t>(a.begin), static_cast<uintptr_t>(a.end),
                 static_cast<uintptr_t>(b.begin), static_cast<uintptr_t>(b.end)});
    for (const codegen::FusionLaunch* l : {&a, &b}) {
      for (const auto& [lo, hi] : l->dims) {
        key_.push_back(static_cast<uintptr_t>(lo));
        key_.push_back(static_cast<uintptr_t>(hi));
      }
      key_.push_back(UINTPTR_MAX);
    }
    const codegen::FusionLaunch* l[] = {&a, &b};
    for (int x = 0; x < 2; ++x) {
      for (size_t p = 0; p < l[x]->arrays.size(); ++p) {
        if (l[x]->arrays[p] == 0) continue;
        for (int y = x; y < 2; ++y) {
          for (size_t q = y == x ? p + 1 : 0; q < l[y]->arrays.size(); ++q) {
            if (l[y]->arrays[q] != l[x]->arrays[p]) continue;
            // Rows: both known, equal or not; else which of them is unknown (a parameter a
            // kernel never accesses has none, and fusion notes no row for it).
            const int64_t any = codegen::FusionLaunch::kAnyRow;
            const int64_t rp = p < l[x]->rows.size() ? l[x]->rows[p] : any;
            const int64_t rq = q < l[y]->rows.size() ? l[y]->rows[q] : any;
            const uintptr_t rows = (rp == any ? 2 : 0) + (rq == any ? 4 : 0) +
                                   (rp != any && rq != any && rp == rq ? 1 : 0);
            key_.insert(key_.end(),
                        {static_cast<uintptr_t>(x), p, static_cast<uintptr_t>(y), q, rows});
          }
        }
      }
    }
    auto it = memo_.find(key_);
    if (it != memo_.end()) return it->second;
    const codegen::FusionLaunch pair[] = {a, b};
    const bool fuses = codegen::fusion_groups(pair, kMaxFusedArrays, kMaxFusedLaunches).size() == 1;
    memo_.emplace(key_, fuses);
    return fuses;
  }

 private:
  struct Hash {
    size_t operator()(const std::vector<uintptr_t>& v) const {
      size_t h = 0;
      for (uintptr_t x : v) h = (h ^ std::hash<uintptr_t>{}(x)) * 0x100000001B3ull;
      return h;
    }
  };
  std::vector<uintptr_t> key_;
  std::unordered_map<std::vector<uintptr_t>, bool, Hash> memo_;
};

bool pull_successors(ReworkPlan& w) {
  FusePairs fuse_pair;
  std::vector<size_t> step_of;  // per launch in run order: its step
  for (size_t i = 0; i < w.steps.size(); ++i) {
    if (w.steps[i].launch) step_of.push_back(i);
  }
  bool moved = false;
  auto move = [&](size_t from, size_t to) {  // launch `from` to position `to` < from
    auto rot = [&](auto& v) {
      std::rotate(v.begin() + static_cast<std::ptrdiff_t>(to),
                  v.begin() + static_cast<std::ptrdiff_t>(from),
                  v.begin() + static_cast<std::ptrdiff_t>(from + 1));
    };
    rot(w.order);
    rot(w.sched);
    rot(w.launches);
    CapturedStep s = std::move(w.steps[step_of[from]]);
    for (size_t k = from; k > to; --k) w.steps[step_of[k]] = std::move(w.steps[step_of[k - 1]]);
    w.steps[step_of[to]] = std::move(s);
    moved = true;
  };
  for_each_stretch(w.steps, [&](size_t first, size_t count) {
    const size_t end = first + count;
    for (size_t i = first; i + 2 < end; ++i) {
      const uint64_t shape = w.sched[i].shape;
      if (shape == 0 || w.sched[i + 1].shape == shape) continue;
      size_t j = i + 2;
      while (j < end && j < i + 1 + kPullWindow && w.sched[j].shape != shape) ++j;
      if (j >= end || j >= i + 1 + kPullWindow) continue;
      auto fuse = [&](size_t x, size_t y) {
        return fuse_pair(w.launches[x], w.sched[x].shape, w.launches[y], w.sched[y].shape);
      };
      // (j - 1, the launch before j, has another shape: j is the first of i's after i + 1.)
      if (!fuse(i, j)) continue;
      // The launch with the launches after it that it fuses with (a step with the sliced
      // copies of its rings): moved as one, so fusion keeps them together.
      size_t k = j + 1;
      while (k < end && k < j + kMaxFusedLaunches && fuse(k - 1, k)) ++k;
      bool free = true;
      for (size_t m = j; m < k && free; ++m) {
        for (size_t x = i + 1; x < j && free; ++x)
          free = !launches_conflict(w.sched[x], w.sched[m]);
      }
      if (!free) continue;
      for (size_t m = j; m < k; ++m) move(m, i + 1 + (m - j));
    }
  });
  return moved;
}

class FusePass final : public GraphPass {
 public:
  // `side`: how many ranges one run may hold side by side (launch_fusion.h).
  explicit FusePass(uint32_t side) : side_(side) {}
  std::string name() const override { return "fuse"; }
  Stage stage() const override { return Stage::kFuse; }

  bool run(Program& p, PassContext& ctx) override {
    if (!p.planned) plan_order(p, ctx, /*reorder=*/false);
    ReworkPlan& w = p.w;
    if (p.scheduled && pull_successors(w)) {
      p.reordered = true;
    }
    w.runs = fusion_runs(w.steps, w.launches, /*fuse=*/true, kMaxFusedArrays, kMaxFusedLaunches,
                         &p.rows_used, side_);
    p.fused = std::any_of(w.runs.begin(), w.runs.end(),
                          [](const codegen::FusionRun& r) { return r.count > 1; });
    if (!p.fused) return true;
    const ShapeOf shape_of = [&](uint64_t id) -> std::optional<std::vector<uint32_t>> {
      const std::vector<uint32_t>* s = ctx.extents(id);
      if (s == nullptr) return std::nullopt;
      return *s;
    };
    const auto zero_fills = zero_fills_before_runs(w.steps, w.launches, w.runs, shape_of);
    w.dropped.assign(w.steps.size(), false);
    return build(w.runs, w.launches, zero_fills, &w.planned, &w.dropped, ctx);
  }

 private:
  uint32_t side_;
  // The fused kernels of `runs` into `planned`, and the zero fills they make redundant into
  // `dropped`: false where one cannot be built (the graph then stays as captured).
  static bool build(std::span<const codegen::FusionRun> runs,
                    std::span<const codegen::FusionLaunch> launches,
                    std::span<const std::unordered_map<uint64_t, size_t>> zero_fills,
                    std::vector<MergedLaunch>* planned, std::vector<bool>* dropped,
                    PassContext& ctx) {
    // A step loop repeats the same runs with other arrays and scalars: a fused kernel is built
    // once per signature (graph_rework.h) and reused; the sink makes the distinct ones side by
    // side.
    struct Built {
      MergedLaunch launch;
      std::vector<uint32_t> overwritten;  // arrays by first-use number
      size_t fresh = 0;                   // its index in `fresh`
    };
    std::unordered_map<std::string, Built> built;
    std::vector<codegen::Kernel> fresh;
    std::unordered_map<std::string, size_t> fresh_of;  // by printed IR
    std::vector<const std::string*> sig_of(runs.size(), nullptr);
    std::vector<std::vector<uint64_t>> ids_of(runs.size());  // each run's arrays by first use
    for (size_t r = 0; r < runs.size(); ++r) {
      if (runs[r].count < 2) continue;
      std::span<const codegen::FusionLaunch> members =
          launches.subspan(runs[r].first, runs[r].count);
      const std::string sig = fusion_signature(members, zero_fills[r], &ids_of[r]);
      auto b = built.find(sig);
      if (b == built.end()) {
        std::vector<uint64_t> zeros;
        for (const auto& entry : zero_fills[r]) zeros.push_back(entry.first);
        const std::string name =
            "fused_" + members[0].kernel->name + "_x" + std::to_string(runs[r].count);
        Result<codegen::FusedKernel> f = codegen::fuse_launches(members, name, zeros);
        if (!f.ok()) return false;
        Built nb{{KernelHandle{}, std::move(f->param_map), f->kernel.params.size()}, {}};
        const std::vector<uint64_t>& ids = ids_of[r];
        for (uint64_t id : f->overwritten) {
          nb.overwritten.push_back(
              static_cast<uint32_t>(std::find(ids.begin(), ids.end(), id) - ids.begin()));
        }
        auto [at, added] = fresh_of.try_emplace(codegen::print(f->kernel), fresh.size());
        if (added) fresh.push_back(std::move(f->kernel));
        nb.fresh = at->second;
        b = built.emplace(sig, std::move(nb)).first;
      }
      sig_of[r] = &b->first;
    }
    std::vector<Result<KernelHandle>> handles = ctx.sink.make(fresh, /*keep_ir=*/false);
    for (const Result<KernelHandle>& h : handles) {
      if (!h.ok()) return false;
    }
    for (auto& [sig, b] : built) b.launch.kernel = *handles[b.fresh];
    planned->assign(runs.size(), MergedLaunch{});
    for (size_t r = 0; r < runs.size(); ++r) {
      if (sig_of[r] == nullptr) continue;
      const Built& b = built.at(*sig_of[r]);
      // A zero fill whose array the run then overwrites whole is left out of the graph.
      const codegen::FusionLaunch& first = launches[runs[r].first];
      for (uint32_t n : b.overwritten) {
        const std::vector<uint32_t>* shape = ctx.extents(ids_of[r][n]);
        if (shape != nullptr && shape->size() == 1 && first.begin == 0 &&
            first.end == static_cast<int64_t>((*shape)[0])) {
          (*dropped)[zero_fills[r].at(ids_of[r][n])] = true;
        }
      }
      (*planned)[r] = b.launch;
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<GraphPass> make_schedule_pass() { return std::make_unique<SchedulePass>(); }
std::unique_ptr<GraphPass> make_fuse_pass(uint32_t side) {
  return std::make_unique<FusePass>(side);
}

const GraphPassRegistry& GraphPassRegistry::standard() {
  static const GraphPassRegistry registry = [] {
    GraphPassRegistry r;
    r.add("rename", "arrays filled whole again and again get a ring of buffers",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("rename", o, {}));
            return make_rename_pass();
          });
    r.add("roll", "step loops of small launches into resident kernels {max-range=256}",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("roll", o, {"max-range"}));
            VKAD_ASSIGN_OR_RETURN(uint32_t n, codegen::uint_option("roll", o, "max-range", 256));
            return make_roll_pass(n);
          });
    r.add("block", "stencil runs into blocked kernels {shared=16384, min-tiles=1}",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("block", o, {"shared", "min-tiles"}));
            VKAD_ASSIGN_OR_RETURN(
                uint32_t shared,
                codegen::uint_option("block", o, "shared", codegen::kStencilSharedBytes));
            VKAD_ASSIGN_OR_RETURN(uint32_t tiles, codegen::uint_option("block", o, "min-tiles", 1));
            // What a device may have: 1 KiB to 1 MiB (Vulkan guarantees 16 KiB).
            return make_block_pass(std::clamp<uint32_t>(shared, 1024, 1u << 20), tiles);
          });
    r.add("recompute", "gathers compute the element-wise output they gather",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("recompute", o, {}));
            return make_recompute_pass();
          });
    r.add("prune", "launches whose writes are overwritten before any read are left out",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("prune", o, {}));
            return make_prune_pass();
          });
    r.add("slice", "copies before a 1-d launch copy over its task, for fusion",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("slice", o, {}));
            return make_slice_pass();
          });
    r.add("hoist", "fill steps move up to the fills before them, nothing between touching them",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("hoist", o, {}));
            return make_hoist_pass();
          });
    r.add("schedule", "launches reordered by level, barriers only where an array is shared",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("schedule", o, {}));
            return make_schedule_pass();
          });
    r.add("fuse", "runs of element-wise launches of one range into one kernel {side=1}",
          [](const codegen::PassOptions& o) -> Result<std::unique_ptr<GraphPass>> {
            VKAD_TRY(codegen::only_options("fuse", o, {"side"}));
            // Side by side (launch_fusion.h) is off by default: on the H200 it took the
            // budgeted diffmpm from 6,857 to 4,125 dispatches and not its time (33.5 ms either
            // way: the launches it merges ran between the same barriers already), while its
            // more numerous kernels cost the first iteration ~3.5 s of driver compiles.
            VKAD_ASSIGN_OR_RETURN(uint32_t side, codegen::uint_option("fuse", o, "side", 1));
            return make_fuse_pass(side);  // fusion_groups clamps it to [1, kMaxRunBoxes]
          });
    return r;
  }();
  return registry;
}

}  // namespace vkad
