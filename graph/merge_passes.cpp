// The passes that merge launches (graph/graph_passes.h): roll (resident step loops) and block
// (blocked stencils). Each finds runs of launches, makes their kernel through the sink, and
// splices one launch of it in their place; the Program's launch_index / merged follow every
// captured launch to the launch it runs in. What keeps a run from merging (a kernel that cannot
// be built or that the device refuses) leaves it as it was.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include "graph/graph_passes.h"
#include "graph/stencil_blocking.h"

namespace vkad {

namespace {

// Resident step loops: a workgroup of at most this many invocations (RollLimits has the rest).
constexpr uint32_t kMaxResidentLocal = 256;

std::vector<const CapturedStep*> launches_of(std::span<const CapturedStep> steps) {
  std::vector<const CapturedStep*> out;
  for (const CapturedStep& s : steps) {
    if (s.launch) out.push_back(&s);
  }
  return out;
}

// A blocked run's prologue (filling its stash) goes before the launch of launch `first` (in
// the numbering of the steps the pass found the run in).
struct StashPrologue {
  size_t first = 0;
  KernelHandle kernel;
  uint64_t blocked_kernel = 0, placeholder = 0;
};

// Puts the stashes' placeholders and the prologues into `out` (splice_rolled's), keeping
// `launch_index` in step.
void add_prologues(std::span<const StashPrologue> prologues, std::vector<CapturedStep>* out,
                   std::vector<uint32_t>* launch_index) {
  if (prologues.empty()) return;
  std::unordered_map<uint64_t, uint64_t> placeholder;  // by blocked kernel
  for (const StashPrologue& p : prologues) placeholder[p.blocked_kernel] = p.placeholder;
  std::vector<size_t> step_of;  // per launch of `out`: its step
  for (size_t i = 0; i < out->size(); ++i) {
    CapturedStep& s = (*out)[i];
    if (!s.launch) continue;
    step_of.push_back(i);
    auto it = placeholder.find(s.kernel.id);
    if (it != placeholder.end()) s.args.back() = Arg::ndarray(runtime::NdArrayHandle{it->second});
  }
  // Last first: an insertion moves only what follows it.
  std::vector<StashPrologue> order(prologues.begin(), prologues.end());
  std::sort(order.begin(), order.end(),
            [](const StashPrologue& a, const StashPrologue& b) { return a.first > b.first; });
  for (const StashPrologue& p : order) {
    const uint32_t at = (*launch_index)[p.first];
    CapturedStep pro = (*out)[step_of[at]];  // the run's first dispatch's arguments
    pro.kernel = p.kernel;
    out->insert(out->begin() + static_cast<std::ptrdiff_t>(step_of[at]), std::move(pro));
    for (uint32_t& l : *launch_index) l += l >= at ? 1 : 0;
  }
}

// `p`'s steps with each segment that has a kernel as one launch of it (and the prologues), every
// captured launch followed to its new place.
void merge(Program& p, std::span<const RollSegment> segments,
           std::span<const std::optional<MergedLaunch>> built,
           std::span<const StashPrologue> prologues) {
  std::vector<CapturedStep> out;
  std::vector<uint32_t> index;
  std::vector<bool> was;
  splice_rolled(p.steps, segments, built, &out, &index, &was);
  add_prologues(prologues, &out, &index);
  if (std::find(was.begin(), was.end(), true) == was.end()) return;
  for (size_t c = 0; c < p.launch_index.size(); ++c) {
    const uint32_t mid = p.launch_index[c];
    p.launch_index[c] = index[mid];
    p.merged[c] = p.merged[c] || was[mid];
  }
  p.steps = std::move(out);
  p.any_merged = true;
}

class RollPass final : public GraphPass {
 public:
  explicit RollPass(uint32_t max_range) : max_range_(max_range) {}
  std::string name() const override { return "roll"; }
  std::string text() const override {
    return max_range_ == 256 ? name() : name() + "{max-range=" + std::to_string(max_range_) + "}";
  }
  Stage stage() const override { return Stage::kMerge; }
  uint32_t max_range() const { return max_range_; }

  bool run(Program& p, PassContext& ctx) override {
    if (max_range_ == 0) return true;
    const std::vector<const CapturedStep*> launches = launches_of(p.steps);
    const std::vector<RollCandidate> candidates = roll_candidates(launches, ctx);
    const std::vector<RollSegment> segments = find_roll_segments(
        p.steps, launches, candidates, roll_limits(ctx.target.max_storage_buffers));
    if (segments.empty()) return true;
    std::vector<std::optional<MergedLaunch>> built;
    for (const RollSegment& seg : segments) built.push_back(build(seg, launches, candidates, ctx));
    merge(p, segments, built, {});
    return true;
  }

 private:
  std::vector<RollCandidate> roll_candidates(std::span<const CapturedStep* const> launches,
                                             const PassContext& ctx) const {
    // Where the device cuts long loops (lavapipe) the rolled kernel's passes add up: kernels
    // with loops of their own stay out there.
    std::unordered_map<uint64_t, bool> residable;  // by kernel handle id
    std::vector<RollCandidate> out(launches.size());
    for (size_t l = 0; l < launches.size(); ++l) {
      const CapturedStep& s = *launches[l];
      const std::shared_ptr<const codegen::Kernel>& ir = ctx.catalog.rollable_ir(s.kernel.id);
      if (!ir || ir->params.size() != s.args.size()) continue;
      const codegen::Kernel& k = *ir;
      auto [r, fresh] = residable.try_emplace(s.kernel.id, false);
      if (fresh) r->second = codegen::residable(k) && !(ctx.loops_capped() && any_task_loops(k));
      if (!r->second) continue;
      std::optional<codegen::LaunchShapes> shapes =
          codegen::launch_shapes(k, PassContext::scalars_in(s.args), ctx.extents_in(s.args),
                                 static_cast<int64_t>(max_range_));
      if (shapes) out[l] = {&k, std::move(shapes->ranges), std::move(shapes->boxes)};
    }
    return out;
  }

  // The resident kernel of one segment; nullopt where it cannot be made.
  std::optional<MergedLaunch> build(const RollSegment& seg,
                                    std::span<const CapturedStep* const> launches,
                                    std::span<const RollCandidate> candidates,
                                    PassContext& ctx) const {
    std::vector<codegen::ResidentMember> period;
    int64_t widest = 1;
    for (size_t j = 0; j < seg.period; ++j) {
      codegen::ResidentMember m;
      m.kernel = candidates[seg.first + j].kernel;
      m.step = seg.steps[j];
      m.ranges = candidates[seg.first + j].ranges;
      m.boxes = candidates[seg.first + j].boxes;
      for (const Arg& a : launches[seg.first + j]->args)
        m.arrays.push_back(a.kind == abi::ParamKind::kNdArray ? a.array.id : 0);
      for (const auto& [b, e] : m.ranges) widest = std::max(widest, e - b);
      period.push_back(std::move(m));
    }
    // One invocation per element of the widest launch, in whole subgroups, up to the cap.
    const uint32_t local = static_cast<uint32_t>(std::min<int64_t>(
        std::min<uint32_t>(kMaxResidentLocal, ctx.target.max_local_size), (widest + 31) / 32 * 32));
    // Where the device cuts loops past a number of passes per invocation (lavapipe), past the
    // cap the launches stay as they are rather than have the whole graph's rework refused at
    // its instantiate.
    const uint32_t cap = ctx.target.max_loop_passes;
    if (cap != 0 && resident_loop_passes(period, seg.reps, local) > cap) return std::nullopt;
    const std::string name = "resident_" + period[0].kernel->name + "_x" +
                             std::to_string(seg.period) + "_r" + std::to_string(seg.reps);
    Result<codegen::ResidentKernel> rk =
        codegen::roll_launches(period, static_cast<uint32_t>(seg.reps), local, name);
    if (!rk.ok()) return std::nullopt;  // these launches stay as they are
    if (cap != 0 && codegen::rolled_loop_passes(*rk, ctx.target.cas_float_atomics_f32,
                                                ctx.target.cas_float_atomics_f64) > cap) {
      return std::nullopt;  // the estimate missed what the kernel counts (its float atomics)
    }
    Result<KernelHandle> h = ctx.sink.make(rk->kernel, /*keep_ir=*/false);
    if (!h.ok()) return std::nullopt;
    return MergedLaunch{*h, std::move(rk->param_map), rk->kernel.params.size()};
  }

  uint32_t max_range_;
};

class BlockPass final : public GraphPass {
 public:
  BlockPass(uint32_t shared, uint32_t min_tiles) : shared_(shared), min_tiles_(min_tiles) {}
  std::string name() const override { return "block"; }
  std::string text() const override {
    std::string opts;
    if (shared_ != codegen::kStencilSharedBytes) opts += "shared=" + std::to_string(shared_);
    if (min_tiles_ != 1)
      opts += (opts.empty() ? "" : ", ") + ("min-tiles=" + std::to_string(min_tiles_));
    return opts.empty() ? name() : name() + "{" + opts + "}";
  }
  Stage stage() const override { return Stage::kMerge; }

  bool run(Program& p, PassContext& ctx) override {
    const std::vector<const CapturedStep*> launches = launches_of(p.steps);
    std::vector<RollCandidate> candidates(launches.size());
    for (size_t l = 0; l < launches.size(); ++l) {
      codegen::FusionLaunch f = ctx.fusion_launch(*launches[l]);
      if (f.kernel == &PassContext::not_fusible()) continue;
      std::vector<std::pair<int64_t, int64_t>> box = f.dims;
      if (box.empty()) box.emplace_back(f.begin, f.end);
      candidates[l] = {f.kernel, std::move(box)};
    }
    RollLimits limits;
    limits.max_period = 1;
    limits.min_reps = 2;
    const std::vector<RollSegment> runs = find_roll_segments(p.steps, launches, candidates, limits);
    std::vector<RollSegment> segments;
    std::vector<std::optional<MergedLaunch>> built;
    std::vector<StashPrologue> prologues;
    size_t taken = 0;
    for (const RollSegment& run : runs) {
      uint32_t K = 0;
      std::optional<MergedLaunch> m =
          build(run, *launches[run.first], candidates[run.first], &K, &p.stashes, &prologues, ctx);
      if (!m) continue;
      // Whole blocks of K launches; the rest stay as they are.
      for (size_t b = 0; b + K <= run.reps; b += K) {
        segments.push_back(RollSegment{run.first + b, 1, K, run.steps});
        built.push_back(*m);
        taken += K;
      }
    }
    if (segments.empty()) return true;
    merge(p, segments, built, prologues);
    p.blocked += taken;
    return true;
  }

 private:
  // The blocked kernel of one run (its stash and prologue recorded), `K` its launches per
  // dispatch; nullopt where the run does not block.
  std::optional<MergedLaunch> build(const RollSegment& run, const CapturedStep& first,
                                    const RollCandidate& candidate, uint32_t* K,
                                    std::vector<StashNeed>* stashes,
                                    std::vector<StashPrologue>* prologues, PassContext& ctx) {
    codegen::StencilLaunch sl;
    sl.kernel = candidate.kernel;
    sl.box = candidate.ranges;
    sl.step = run.steps[0];
    for (const Arg& a : first.args) {
      const bool array = a.kind == abi::ParamKind::kNdArray;
      sl.arrays.push_back(array ? a.array.id : 0);
      sl.first.push_back(!array && a.dtype == runtime::DType::kI32 ? a.i : 0);
      const std::vector<uint32_t>* ext = array ? ctx.extents(a.array.id) : nullptr;
      sl.shapes.emplace_back();
      if (ext) sl.shapes.back().assign(ext->begin(), ext->end());
    }
    sl.min_tiles = min_tiles_;
    sl.max_group = std::min<int64_t>(ctx.target.max_local_size, 1024);
    std::string why;
    *K = codegen::stencil_steps(sl, shared_, &why);
    if (*K == 0 && std::getenv("VKAD_GRAPH_TRACE") != nullptr) {
      // What a user asks when a stencil run stays one dispatch per launch (docs/graphs.md,
      // "Diagnostics").
      std::fprintf(stderr, "vkad graph: %zu launches of '%s' not blocked: %s\n", run.reps,
                   sl.kernel->name.c_str(), why.c_str());
    }
    if (*K == 0 || run.reps < *K) return std::nullopt;
    Result<codegen::BlockedStencil> k =
        codegen::block_stencil(sl, *K, "blocked_" + sl.kernel->name + "_x" + std::to_string(*K));
    if (!k.ok() || k->stash_elements > UINT32_MAX) return std::nullopt;
    Result<KernelHandle> h = ctx.sink.make(k->kernel, /*keep_ir=*/false);
    if (!h.ok()) return std::nullopt;
    if (k->prologue) {
      Result<KernelHandle> ph = ctx.sink.make(*k->prologue, /*keep_ir=*/false);
      if (!ph.ok()) return std::nullopt;
      const uint64_t placeholder = next_placeholder_++;
      stashes->push_back({placeholder, k->stash_type, static_cast<uint32_t>(k->stash_elements)});
      prologues->push_back({run.first, *ph, h->id, placeholder});
    }
    // The launch's parameters are the kernel's (the stash, where there is one, last).
    std::vector<uint32_t> identity(first.args.size());
    for (uint32_t q = 0; q < identity.size(); ++q) identity[q] = q;
    return MergedLaunch{*h, {identity}, k->kernel.params.size()};
  }

  uint32_t shared_;     // bytes of shared memory a blocked kernel may use
  uint32_t min_tiles_;  // a box of fewer tiles stays as launched
  // Stash placeholders are array ids no ndarray has, unique for the session's life.
  uint64_t next_placeholder_ = uint64_t{1} << 62;
};

}  // namespace

std::unique_ptr<GraphPass> make_roll_pass(uint32_t max_range) {
  return std::make_unique<RollPass>(max_range);
}

std::unique_ptr<GraphPass> make_block_pass(uint32_t shared_bytes, uint32_t min_tiles) {
  return std::make_unique<BlockPass>(shared_bytes, min_tiles);
}

uint32_t roll_max_range(const GraphPipeline& pipeline) {
  const auto* roll = dynamic_cast<const RollPass*>(pipeline.find("roll"));
  return roll != nullptr ? roll->max_range() : 0;
}

}  // namespace vkad
