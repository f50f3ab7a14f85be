// The launch-sequence pass contract (graph/program.h): what a pass may ask of a launch, the
// pipeline and its registry, the plan every pipeline ends with, and a plan's text.
#include "graph/program.h"

#include <algorithm>
#include <cstdio>
#include <unordered_map>

namespace vkad {

namespace {

// The pseudo-array id of the runtime's adstack heaps in a launch's schedule (no ndarray has it).
constexpr uint64_t kAdstackHeaps = ScheduleAccess::kAdstackHeaps;

// Launches that could fuse share this nonzero key (range or N-d box, and workgroup size); 0 for
// none.
uint64_t fusion_shape(const codegen::FusionLaunch& l) {
  if (l.kernel == &PassContext::not_fusible()) return 0;
  const uint64_t size = l.kernel->tasks[0].local_size;
  uint64_t h = static_cast<uint64_t>(l.begin) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(l.end) * 0xC2B2AE3D27D4EB4Full ^ size;
  for (const auto& [b, e] : l.dims) {
    h = (h ^ static_cast<uint64_t>(b)) * 0x100000001B3ull;
    h = (h ^ static_cast<uint64_t>(e)) * 0x100000001B3ull;
  }
  return std::hash<uint64_t>{}(h) | 1;
}

bool identity(std::span<const uint32_t> order) {
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != i) return false;
  }
  return true;
}

}  // namespace

Program Program::of(std::vector<CapturedStep> captured) {
  Program p;
  p.steps = std::move(captured);
  for (const CapturedStep& s : p.steps) {
    if (!s.launch) continue;
    p.launch_index.push_back(static_cast<uint32_t>(p.launch_index.size()));
  }
  p.merged.assign(p.launch_index.size(), false);
  return p;
}

// ---------------------------------------------------------------- what a pass asks of a launch

const codegen::Kernel& PassContext::not_fusible() {
  static const codegen::Kernel k;  // no task: fusible() is false
  return k;
}

codegen::ScalarOf PassContext::scalars_in(std::span<const Arg> args) {
  return [args](uint32_t p) -> std::optional<int64_t> {
    if (p >= args.size()) return std::nullopt;
    return args[p].i;
  };
}

codegen::ExtentOf PassContext::extents_in(std::span<const Arg> args) const {
  return [this, args](uint32_t p, uint32_t d) -> std::optional<int64_t> {
    if (p >= args.size() || args[p].kind != abi::ParamKind::kNdArray) return std::nullopt;
    const std::vector<uint32_t>* shape = extents(args[p].array.id);
    if (shape == nullptr || d >= shape->size()) return std::nullopt;
    return (*shape)[d];
  };
}

codegen::UniformInputs PassContext::launch_inputs(const CapturedStep& s) const {
  return codegen::UniformInputs{
      [&s](uint32_t p) -> int64_t { return p < s.args.size() ? s.args[p].i : 0; },
      [this, &s](uint32_t p, uint32_t d) -> std::optional<uint32_t> {
        if (p >= s.args.size() || s.args[p].kind != abi::ParamKind::kNdArray) return std::nullopt;
        const std::vector<uint32_t>* shape = extents(s.args[p].array.id);
        if (shape == nullptr || d >= shape->size()) return std::nullopt;
        return (*shape)[d];
      }};
}

std::optional<int64_t> PassContext::bound_value(const abi::RangeBound& b, std::span<const Arg> args,
                                                bool scalars) const {
  const codegen::ScalarOf none = [](uint32_t) -> std::optional<int64_t> { return std::nullopt; };
  return abi::evaluate(b, scalars ? scalars_in(args) : none, extents_in(args));
}

std::optional<std::vector<std::pair<int64_t, int64_t>>> PassContext::task_ranges(
    const CapturedStep& s, const codegen::Kernel& k) const {
  const codegen::Task& t = k.tasks[0];
  if (!t.dims.empty()) return codegen::task_box(t, scalars_in(s.args), extents_in(s.args));
  std::optional<int64_t> b = bound_value(t.begin, s.args, true);
  std::optional<int64_t> e = bound_value(t.end, s.args, true);
  if (!b || !e) return std::nullopt;
  return std::vector<std::pair<int64_t, int64_t>>{{*b, *e}};
}

ScheduleLaunch PassContext::schedule_launch(const CapturedStep& s,
                                            std::vector<bool>* pinned) const {
  ScheduleLaunch out;
  pinned->assign(s.args.size(), false);
  const std::shared_ptr<const codegen::KernelAccess>& access = catalog.access(s.kernel.id);
  if (!access) {
    out.known = false;
    return out;
  }
  const codegen::KernelAccess& k = *access;
  // Adstack kernels may run from the runtime's one set of heaps, where thread g of every such
  // launch uses the same slots: one pseudo-array they all overwrite keeps them apart (from
  // the kernel, not the plan: an update may move a launch from the private tier to the heap).
  if (catalog.adstack(s.kernel.id)) {
    out.accesses.push_back(
        {kAdstackHeaps, codegen::ArrayAccess::Kind::kOverwrite, ScheduleAccess::kAnyRow});
  }
  // Without bounds checks an index past its extent reaches another row: rows tell nothing.
  const bool rows = target.bounds_checks;
  const codegen::UniformInputs inputs = launch_inputs(s);
  for (const codegen::ParamAccess& p : k.params) {
    if (p.param >= s.args.size() || s.args[p.param].kind != abi::ParamKind::kNdArray) {
      out.known = false;  // not a launch Session::launch let through
      return out;
    }
    for (const codegen::ArrayAccess& a : p.accesses) {
      ScheduleAccess sa{s.args[p.param].array.id, a.kind, ScheduleAccess::kAnyRow};
      if (rows && !a.rows.empty() && a.rows[0] != codegen::ArrayAccess::kNotUniform) {
        const codegen::UniformExpr& e = k.exprs[a.rows[0]];
        std::optional<uint32_t> v = codegen::evaluate(e, inputs);
        if (v) sa.row = *v;
        for (const codegen::UniformExpr::Node& n : e.nodes) {
          if (n.op == codegen::Op::kArg && n.param < pinned->size()) (*pinned)[n.param] = true;
        }
      }
      out.accesses.push_back(sa);
    }
  }
  return out;
}

codegen::FusionLaunch PassContext::fusion_launch(const CapturedStep& s) const {
  codegen::FusionLaunch l;
  l.kernel = &not_fusible();
  const std::shared_ptr<const codegen::Kernel>& ir = catalog.fusible_ir(s.kernel.id);
  if (!ir || ir->params.size() != s.args.size()) return l;
  const codegen::Kernel& k = *ir;
  l.arrays.assign(s.args.size(), 0);
  for (size_t p = 0; p < s.args.size(); ++p) {
    if (s.args[p].kind == abi::ParamKind::kNdArray) l.arrays[p] = s.args[p].array.id;
  }
  if (k.tasks.empty()) return l;
  // Where the device caps loop passes per invocation (lavapipe), a fused kernel's passes are its
  // members' sum: an update that raises a member's trip count could then be refused where the
  // launches alone were not, so kernels with loops are left alone there. Asked once per kernel:
  // a step loop launches the same few kernels thousands of times.
  if (loops_capped() && catalog.first_task_loops(s.kernel.id)) return l;
  // The range: constants and extents only (fusible() refuses scalar bounds).
  std::optional<int64_t> b = bound_value(k.tasks[0].begin, s.args, false);
  std::optional<int64_t> e = bound_value(k.tasks[0].end, s.args, false);
  if (!b || !e) return l;
  l.begin = *b;
  l.end = *e;
  if (!k.tasks[0].dims.empty()) {  // the box (fusible() refuses one that reads a scalar)
    std::optional<std::vector<std::pair<int64_t, int64_t>>> box = task_ranges(s, k);
    if (!box) return l;
    l.dims = std::move(*box);
  }
  l.kernel = &k;
  l.rows = launch_rows(s);
  return l;
}

std::vector<int64_t> PassContext::launch_rows(const CapturedStep& s) const {
  // Without bounds checks an index past its extent reaches another row: rows tell nothing.
  const std::shared_ptr<const codegen::KernelAccess>& acc = catalog.access(s.kernel.id);
  if (!target.bounds_checks || !acc) return {};
  const codegen::KernelAccess& k = *acc;
  const codegen::UniformInputs in = launch_inputs(s);
  std::vector<int64_t> rows(s.args.size(), codegen::FusionLaunch::kAnyRow);
  for (const codegen::ParamAccess& p : k.params) {
    std::optional<uint32_t> row;
    bool one = p.param < rows.size();
    for (const codegen::ArrayAccess& a : p.accesses) {
      if (!one) break;
      std::optional<uint32_t> v;
      if (!a.rows.empty() && a.rows[0] != codegen::ArrayAccess::kNotUniform) {
        v = codegen::evaluate(k.exprs[a.rows[0]], in);
      }
      one = v && (!row || *row == *v);
      row = v;
    }
    if (one && row) rows[p.param] = *row;
  }
  return rows;
}

// ---------------------------------------------------------------- the plan

void plan_order(Program& p, const PassContext& ctx, bool reorder) {
  // What each launch touches, and what fusion needs of it, in step order; a step's entry in
  // p.memo (recompute's), where there is one, is used (moved out) instead of asking again.
  const std::vector<CapturedStep>& cap = p.steps;
  ReworkPlan& w = p.w;
  std::vector<ScheduleLaunch> sched;
  std::vector<codegen::FusionLaunch> fusion;
  std::vector<const CapturedStep*> cap_launches;
  for (size_t i = 0; i < cap.size(); ++i) {
    if (!cap[i].launch) continue;
    cap_launches.push_back(&cap[i]);
    std::optional<StepSchedule>* known = i < p.memo.size() ? &p.memo[i] : nullptr;
    if (known != nullptr && known->has_value()) {
      sched.push_back(std::move((*known)->launch));
      p.pinned.push_back(std::move((*known)->pinned));
    } else {
      sched.push_back(ctx.schedule_launch(cap[i], &p.pinned.emplace_back()));
    }
    fusion.push_back(ctx.fusion_launch(cap[i]));
    sched.back().shape = fusion_shape(fusion.back());
  }
  // Scheduling first (graph/graph_schedule.h): `w.order[i]` is the launch that runs i-th;
  // fusion then merges runs of that order.
  w.order = scheduled_order(cap, sched, reorder);
  size_t li = 0;
  for (const CapturedStep& s : cap) w.steps.push_back(s.launch ? *cap_launches[w.order[li++]] : s);
  for (uint32_t o : w.order) {
    w.sched.push_back(sched[o]);
    w.launches.push_back(fusion[o]);
  }
  for (size_t l : p.recompute_pins) p.pinned[l].assign(p.pinned[l].size(), true);
  for (size_t l : p.prune_pins) p.pinned[l].assign(p.pinned[l].size(), true);
  p.reordered = !identity(w.order);
  p.planned = true;
}

// ---------------------------------------------------------------- pipelines

GraphPass* GraphPipeline::find(const std::string& name) const {
  for (const std::unique_ptr<GraphPass>& p : passes_) {
    if (p->name() == name) return p.get();
  }
  return nullptr;
}

std::vector<std::string> GraphPipeline::names() const {
  std::vector<std::string> out;
  for (const std::unique_ptr<GraphPass>& p : passes_) out.push_back(p->name());
  return out;
}

std::string GraphPipeline::text() const {
  std::string out;
  for (const std::unique_ptr<GraphPass>& p : passes_) out += (out.empty() ? "" : ", ") + p->text();
  return out;
}

bool GraphPipeline::run(Program& p, PassContext& ctx,
                        const std::function<void(const std::string&)>& after) const {
  for (const std::unique_ptr<GraphPass>& pass : passes_) {
    if (!pass->run(p, ctx)) return false;
    if (after) after(pass->name());
  }
  if (!p.planned) plan_order(p, ctx, /*reorder=*/false);
  if (p.w.runs.empty()) {  // no fuse pass: every launch a run of its own
    p.w.runs = fusion_runs(p.w.steps, p.w.launches, /*fuse=*/false, 0, 0, &p.rows_used);
  }
  p.w.planned.resize(p.w.runs.size());
  p.w.dropped.resize(p.w.steps.size(), false);
  p.relaxed = !p.fused && p.scheduled && any_barrier_relaxed(p.w.steps, p.w.sched);
  return true;
}

void GraphPipeline::forget(uint64_t kernel_id) const {
  for (const std::unique_ptr<GraphPass>& p : passes_) p->forget(kernel_id);
}

void GraphPassRegistry::add(const std::string& name, std::string summary, Factory factory) {
  passes_[name] = {std::move(summary), std::move(factory)};
}

std::vector<std::pair<std::string, std::string>> GraphPassRegistry::list() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, e] : passes_) out.emplace_back(name, e.summary);
  return out;
}

Result<GraphPipeline> GraphPassRegistry::parse(const std::string& text) const {
  auto bad = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "graph pipeline '" + text + "': " + what);
  };
  GraphPipeline out;
  // "" is the empty pipeline (no pass: graphs are replayed as captured).
  if (text.find_first_not_of(" \t") == std::string::npos) return out;
  VKAD_ASSIGN_OR_RETURN(auto specs, codegen::split_pipeline(text));
  const GraphPass* last = nullptr;
  for (auto& [name, options] : specs) {
    auto it = passes_.find(name);
    if (it == passes_.end()) {
      std::string known;
      for (const auto& [n, e] : passes_) known += (known.empty() ? "" : ", ") + n;
      return bad("unknown pass '" + name + "' (known: " + known + ")");
    }
    if (out.has(name)) return bad("pass '" + name + "' appears twice");
    Result<std::unique_ptr<GraphPass>> pass = it->second.factory(options);
    if (!pass.ok()) return bad(pass.status().message());
    if (last != nullptr && (*pass)->stage() < last->stage()) {
      return bad("'" + name + "' must come before '" + last->name() +
                 "' (merging passes first, then recompute, schedule, fuse)");
    }
    out.add(std::move(*pass));
    last = out.find(name);
  }
  return out;
}

// ---------------------------------------------------------------- a plan in text

std::string print_plan(const ReworkPlan& w,
                       const std::function<std::string(uint64_t kernel)>& kernel_name,
                       const std::function<std::string(uint64_t array)>& array_name) {
  std::string out;
  auto arg_text = [&](const Arg& a) -> std::string {
    if (a.kind == abi::ParamKind::kNdArray) return array_name(a.array.id);
    char buf[40];
    if (a.dtype == runtime::DType::kF32 || a.dtype == runtime::DType::kF64) {
      std::snprintf(buf, sizeof buf, "%.9g", a.f);
    } else {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(a.i));
    }
    return buf;
  };
  auto fill = [&](size_t i, bool kept) -> Status {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", w.steps[i].value);
    out += std::string(kept ? "" : "dropped ") + "fill " + array_name(w.steps[i].args[0].array.id) +
           " " + buf + "\n";
    return {};
  };
  auto member = [](size_t, size_t, size_t) {};
  auto launch = [&](KernelHandle k, std::span<const Arg> args) -> Status {
    out += "launch " + kernel_name(k.id) + "(";
    for (size_t i = 0; i < args.size(); ++i) out += (i ? ", " : "") + arg_text(args[i]);
    out += ")\n";
    return {};
  };
  (void)walk_plan(w, fill, member, launch);
  return out;
}

}  // namespace vkad
