// The graph compiler (api/graph_compiler.h): a capture's rework planned (session.h: "Resident step
// loops", "Graph scheduling", "Launch fusion"; the pure steps are graph/graph_rework.h, the merging
// itself graph/resident.h and graph/launch_fusion.h). The runtime captured the launches one by one,
// which checked them; when some can roll into a resident loop, be reordered, lose a barrier or
// merge, the same steps are captured again that way and the first graph is dropped (or kept,
// where scalar updates may need it). This is an optimisation: whatever keeps a launch from
// being reworked (a kernel vkad did not compile, a kernel the device refuses) leaves it as it
// was.
#include "api/graph_compiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "api/phase_clock.h"
#include "graph/graph_rework.h"
#include "graph/launch_fusion.h"
#include "graph/resident.h"
#include "graph/stencil_blocking.h"
#include "ir/text.h"
#include "runtime/runtime.h"

namespace vkad {

namespace {

// At most this many distinct arrays per fused kernel: with its args buffer that stays within
// the 32 bindings every push-descriptor implementation takes (maxPushDescriptors >= 32).
constexpr uint32_t kMaxFusedArrays = 24;
// The pseudo-array id of the runtime's adstack heaps in a launch's schedule (no ndarray has it).
constexpr uint64_t kAdstackHeaps = ScheduleAccess::kAdstackHeaps;
constexpr uint32_t kMaxFusedLaunches = 32;
// Resident step loops: a workgroup of at most this many invocations (RollLimits has the rest).
constexpr uint32_t kMaxResidentLocal = 256;

const codegen::Kernel& not_fusible() {
  static const codegen::Kernel k;  // no task: fusible() is false
  return k;
}

// Launches that could fuse share this nonzero key (range or N-d box, and workgroup size); 0 for
// none.
uint64_t fusion_shape(const codegen::FusionLaunch& l) {
  if (l.kernel == &not_fusible()) return 0;
  const uint64_t size = l.kernel->tasks[0].local_size;
  uint64_t h = static_cast<uint64_t>(l.begin) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(l.end) * 0xC2B2AE3D27D4EB4Full ^ size;
  for (const auto& [b, e] : l.dims) {
    h = (h ^ static_cast<uint64_t>(b)) * 0x100000001B3ull;
    h = (h ^ static_cast<uint64_t>(e)) * 0x100000001B3ull;
  }
  return std::hash<uint64_t>{}(h) | 1;
}

// Whether `order` is the identity permutation (nothing was reordered).
bool identity(std::span<const uint32_t> order) {
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != i) return false;
  }
  return true;
}

std::vector<const CapturedStep*> launches_of(std::span<const CapturedStep> steps) {
  std::vector<const CapturedStep*> out;
  for (const CapturedStep& s : steps) {
    if (s.launch) out.push_back(&s);
  }
  return out;
}

}  // namespace

codegen::ScalarOf GraphCompiler::scalars_in(std::span<const Arg> args) {
  return [args](uint32_t p) -> std::optional<int64_t> {
    if (p >= args.size()) return std::nullopt;
    return args[p].i;
  };
}

codegen::ExtentOf GraphCompiler::extents_in(std::span<const Arg> args) const {
  return [this, args](uint32_t p, uint32_t d) -> std::optional<int64_t> {
    if (p >= args.size() || args[p].kind != abi::ParamKind::kNdArray) return std::nullopt;
    const std::vector<uint32_t>* shape = extents_of(args[p].array.id);
    if (shape == nullptr || d >= shape->size()) return std::nullopt;
    return (*shape)[d];
  };
}

std::optional<int64_t> GraphCompiler::bound_value(const abi::RangeBound& b,
                                                  std::span<const Arg> args, bool scalars) const {
  const codegen::ScalarOf none = [](uint32_t) -> std::optional<int64_t> { return std::nullopt; };
  return abi::evaluate(b, scalars ? scalars_in(args) : none, extents_in(args));
}

const std::vector<uint32_t>* GraphCompiler::extents_of(uint64_t array) const {
  // snapshot_extents' answer: the rework may run on another thread than the runtime's user.
  auto it = rework_extents_.find(array);
  return it != rework_extents_.end() && it->second ? &*it->second : nullptr;
}

void GraphCompiler::snapshot_extents(const CaptureLog& log) {
  rework_extents_.clear();
  rework_shape_class_.clear();
  for (const CaptureLog::Step& s : log.steps) {
    const Arg* args = log.args.at(s.first);
    for (uint32_t i = 0; i < s.count; ++i) {
      const Arg& a = args[i];
      if (a.kind != abi::ParamKind::kNdArray) continue;
      auto [it, fresh] = rework_extents_.try_emplace(a.array.id);
      if (!fresh) continue;
      Result<std::vector<uint32_t>> shape = core_.rt->shape(a.array);
      if (shape.ok()) it->second = std::move(*shape);
    }
  }
}

Result<KernelHandle> GraphCompiler::merged_kernel(const codegen::Kernel& k) {
  const std::string key = codegen::print(k);
  auto it = fused_kernels_.find(key);
  if (it != fused_kernels_.end()) return it->second;
  if (refused_kernels_.count(key)) return refused_status(k);
  VKAD_ASSIGN_OR_RETURN(KernelHandle h, rework_compile(k, /*keep_ir=*/false));
  fused_kernels_.emplace(key, h);
  return h;
}

Result<KernelHandle> GraphCompiler::rework_compile(const codegen::Kernel& k, bool keep_ir) {
  return std::move(rework_compile_all(std::span<const codegen::Kernel>(&k, 1), keep_ir)[0]);
}

std::vector<Result<KernelHandle>> GraphCompiler::rework_compile_all(
    std::span<const codegen::Kernel> ks, bool keep_ir) {
  const auto t0 = std::chrono::steady_clock::now();
  // A rework kernel is launched only by graphs, each launch with the shapes of its capture:
  // its extents become pipeline constants (launch_spec.h), and its generic pipeline is made
  // only if a launch ever needs it.
  codegen::CompileOptions options = core_.compile_options;
  options.specialize_shapes = true;
  // Compiled side by side (CompileCache is thread-safe): a step loop's rework makes a dozen or
  // more kernels, each emitted and validated on its own (diffmpm with cold caches: 140 ms one
  // by one on the development machine).
  using Compiled = Result<std::shared_ptr<const runtime::CompiledKernel>>;
  std::vector<std::optional<Compiled>> compiled(ks.size());
  std::atomic<size_t> next{0};
  // Nothing may leave a helper thread (std::terminate): a compile that throws leaves its slot
  // empty, read below as a failed compile.
  auto work = [&]() noexcept {
    for (size_t i = next++; i < ks.size(); i = next++) {
      try {
        compiled[i] = core_.compile_cache.compile(ks[i], core_.target, options);
      } catch (...) {
        compiled[i].reset();
      }
    }
  };
  const size_t want =
      std::min<size_t>(ks.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> helpers;
  helpers.reserve(want);  // emplace_back below then allocates only the threads themselves
  try {
    while (helpers.size() + 1 < want) helpers.emplace_back(work);
  } catch (...) {
    // Fewer threads than asked for: this one and those made share the rest.
  }
  work();
  for (std::thread& t : helpers) t.join();
  std::vector<Result<KernelHandle>> out;
  for (size_t i = 0; i < ks.size(); ++i) {
    if (!compiled[i]) {
      compiled[i] = Compiled(make_error(ErrorCode::kOutOfHostMemory,
                                        "compiling '" + ks[i].name + "' threw (out of memory?)"));
    }
    Compiled& ck = *compiled[i];
    Result<KernelHandle> h = ck.ok() ? core_.rt->reserve_kernel_handle() : ck.status();
    if (h.ok()) {
      if (keep_ir) {
        core_.catalog.add(h->id, ks[i], (*ck)->has_adstacks());
      } else {
        // No IR (later reworks do not fuse or recompute it again), but its access summary:
        // a capture that launches it directly (a reworked step loop, GraphCompiler::rework_loop)
        // judges its barriers and a rework of that capture schedules it, instead of fencing.
        core_.catalog.add_access(h->id, ks[i], (*ck)->has_adstacks());
      }
      unregistered_.push_back({*h, std::move(*ck)});
    }
    out.push_back(std::move(h));
  }
  rework_compile_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::vector<RollCandidate> GraphCompiler::roll_candidates(
    std::span<const CapturedStep* const> launches) const {
  // Where the device cuts long loops (lavapipe) the rolled kernel's passes add up: kernels
  // with loops of their own stay out there.
  const bool loops_capped = core_.rt->caps().max_loop_passes != 0;
  std::unordered_map<uint64_t, bool> residable;  // by kernel handle id
  std::vector<RollCandidate> out(launches.size());
  for (size_t l = 0; l < launches.size(); ++l) {
    const CapturedStep& s = *launches[l];
    const std::shared_ptr<const codegen::Kernel>& ir = core_.catalog.fusible_ir(s.kernel.id);
    if (!ir || ir->params.size() != s.args.size()) continue;
    const codegen::Kernel& k = *ir;
    auto [r, fresh] = residable.try_emplace(s.kernel.id, false);
    if (fresh) r->second = codegen::residable(k) && !(loops_capped && any_task_loops(k));
    if (!r->second) continue;
    std::optional<codegen::LaunchShapes> shapes =
        codegen::launch_shapes(k, scalars_in(s.args), extents_in(s.args),
                               static_cast<int64_t>(core_.graph.resident_max_range));
    if (shapes) out[l] = {&k, std::move(shapes->ranges), std::move(shapes->boxes)};
  }
  return out;
}

std::optional<MergedLaunch> GraphCompiler::build_rolled(
    const RollSegment& seg, std::span<const CapturedStep* const> launches,
    std::span<const RollCandidate> candidates) {
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
      std::min<uint32_t>(kMaxResidentLocal, core_.target.max_local_size), (widest + 31) / 32 * 32));
  // Where the device cuts loops past a number of passes per invocation (lavapipe), past the
  // cap the launches stay as they are rather than have the whole graph's rework refused at
  // its re-capture.
  const uint32_t cap = core_.rt->caps().max_loop_passes;
  if (cap != 0 && resident_loop_passes(period, seg.reps, local) > cap) return std::nullopt;
  const std::string name = "resident_" + period[0].kernel->name + "_x" +
                           std::to_string(seg.period) + "_r" + std::to_string(seg.reps);
  Result<codegen::ResidentKernel> rk =
      codegen::roll_launches(period, static_cast<uint32_t>(seg.reps), local, name);
  if (!rk.ok()) return std::nullopt;  // these launches stay as they are
  Result<KernelHandle> h = merged_kernel(rk->kernel);
  if (!h.ok()) return std::nullopt;
  return MergedLaunch{*h, std::move(rk->param_map), rk->kernel.params.size()};
}

bool GraphCompiler::roll(const std::vector<CapturedStep>& captured, std::vector<CapturedStep>* out,
                         std::vector<uint32_t>* launch_index, std::vector<bool>* rolled,
                         size_t* blocked, std::vector<StashNeed>* stashes) {
  *blocked = 0;
  std::vector<StashPrologue> prologues;
  if (core_.graph.resident_max_range == 0 && !core_.graph.block) return false;
  const std::vector<const CapturedStep*> launches = launches_of(captured);
  std::vector<RollSegment> segments;
  std::vector<std::optional<MergedLaunch>> built;
  if (core_.graph.resident_max_range != 0) {
    const std::vector<RollCandidate> candidates = roll_candidates(launches);
    segments = find_roll_segments(captured, launches, candidates, RollLimits{});
    for (const RollSegment& seg : segments)
      built.push_back(build_rolled(seg, launches, candidates));
  }
  if (core_.graph.block)
    *blocked = block_stencils(captured, launches, &segments, &built, stashes, &prologues);
  if (segments.empty()) return false;
  splice_rolled(captured, segments, built, out, launch_index, rolled);
  add_prologues(prologues, out, launch_index);
  return std::find(rolled->begin(), rolled->end(), true) != rolled->end();
}

void GraphCompiler::add_prologues(std::span<const StashPrologue> prologues,
                                  std::vector<CapturedStep>* out,
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
    if (it != placeholder.end()) s.args.back() = Arg::ndarray(NdArrayHandle{it->second});
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

Status GraphCompiler::materialize_stashes(std::span<const StashNeed> needs, ReworkPlan* w,
                                          std::vector<NdArrayHandle>* owned) {
  for (const StashNeed& n : needs) {
    VKAD_ASSIGN_OR_RETURN(NdArrayHandle a,
                          core_.rt->create_ndarray(n.dtype, {n.elements}, "stencil stash"));
    owned->push_back(a);
    for (CapturedStep& s : w->steps) {
      for (Arg& x : s.args) {
        if (x.kind == abi::ParamKind::kNdArray && x.array.id == n.placeholder) x.array = a;
      }
    }
  }
  return {};
}

std::vector<RollCandidate> GraphCompiler::blocking_candidates(
    std::span<const CapturedStep* const> launches, std::span<const RollSegment> segments,
    std::span<const std::optional<MergedLaunch>> built) const {
  std::vector<bool> covered(launches.size(), false);  // by a resident loop
  for (size_t g = 0; g < segments.size(); ++g) {
    if (!built[g]) continue;
    for (size_t i = 0; i < segments[g].period * segments[g].reps; ++i)
      covered[segments[g].first + i] = true;
  }
  const bool loops_capped = core_.rt->caps().max_loop_passes != 0;
  std::vector<RollCandidate> candidates(launches.size());
  for (size_t l = 0; l < launches.size(); ++l) {
    if (covered[l]) continue;
    codegen::FusionLaunch f = fusion_launch(*launches[l], loops_capped);
    if (f.kernel == &not_fusible()) continue;
    std::vector<std::pair<int64_t, int64_t>> box = f.dims;
    if (box.empty()) box.emplace_back(f.begin, f.end);
    candidates[l] = {f.kernel, std::move(box)};
  }
  return candidates;
}

std::optional<MergedLaunch> GraphCompiler::build_blocked(
    const RollSegment& run, const CapturedStep& first, const RollCandidate& candidate, uint32_t* K,
    std::vector<StashNeed>* stashes, std::vector<StashPrologue>* prologues) {
  codegen::StencilLaunch sl;
  sl.kernel = candidate.kernel;
  sl.box = candidate.ranges;
  sl.step = run.steps[0];
  for (const Arg& a : first.args) {
    const bool array = a.kind == abi::ParamKind::kNdArray;
    sl.arrays.push_back(array ? a.array.id : 0);
    sl.first.push_back(!array && a.dtype == DType::kI32 ? a.i : 0);
    const std::vector<uint32_t>* ext = array ? extents_of(a.array.id) : nullptr;
    sl.shapes.emplace_back();
    if (ext) sl.shapes.back().assign(ext->begin(), ext->end());
  }
  // Vulkan guarantees 16 KiB of shared memory; VKAD_GRAPH_BLOCK_SHARED=<bytes> lets a
  // benchmark try what its device has (an H200: 48 KiB) without rebuilding.
  uint32_t shared = codegen::kStencilSharedBytes;
  if (const char* env = std::getenv("VKAD_GRAPH_BLOCK_SHARED"))
    shared = static_cast<uint32_t>(
        std::clamp<unsigned long long>(std::strtoull(env, nullptr, 10), 1024, 1u << 20));
  // No floor on a box's tiles by default: the launches it replaces run as many workgroups as the
  // box has tiles (256 cells each), so a small box leaves the same compute units idle either
  // way, and blocking still saves K - 1 dependent dispatches per K steps (H200, 32^2 to 128^2
  // grids: 1.6-2.1x faster blocked; docs/graphs.md). VKAD_GRAPH_BLOCK_MIN_TILES=<n> sets one
  // (what a suspected case is checked against).
  sl.min_tiles = 1;
  if (const char* env = std::getenv("VKAD_GRAPH_BLOCK_MIN_TILES"))
    sl.min_tiles = static_cast<int64_t>(
        std::min<unsigned long long>(std::strtoull(env, nullptr, 10), 1u << 30));
  sl.max_group = std::min<int64_t>(core_.target.max_local_size, 1024);
  *K = codegen::stencil_steps(sl, shared);
  if (*K == 0 || run.reps < *K) return std::nullopt;
  Result<codegen::BlockedStencil> k =
      codegen::block_stencil(sl, *K, "blocked_" + sl.kernel->name + "_x" + std::to_string(*K));
  if (!k.ok() || k->stash_elements > UINT32_MAX) return std::nullopt;
  Result<KernelHandle> h = merged_kernel(k->kernel);
  if (!h.ok()) return std::nullopt;
  if (k->prologue) {
    Result<KernelHandle> ph = merged_kernel(*k->prologue);
    if (!ph.ok()) return std::nullopt;
    const uint64_t placeholder = next_stash_placeholder_++;
    stashes->push_back({placeholder, k->stash_type, static_cast<uint32_t>(k->stash_elements)});
    prologues->push_back({run.first, *ph, h->id, placeholder});
  }
  // The launch's parameters are the kernel's (the stash, where there is one, last).
  std::vector<uint32_t> identity(first.args.size());
  for (uint32_t p = 0; p < identity.size(); ++p) identity[p] = p;
  return MergedLaunch{*h, {identity}, k->kernel.params.size()};
}

size_t GraphCompiler::block_stencils(std::span<const CapturedStep> captured,
                                     std::span<const CapturedStep* const> launches,
                                     std::vector<RollSegment>* segments,
                                     std::vector<std::optional<MergedLaunch>>* built,
                                     std::vector<StashNeed>* stashes,
                                     std::vector<StashPrologue>* prologues) {
  const std::vector<RollCandidate> candidates = blocking_candidates(launches, *segments, *built);
  RollLimits limits;
  limits.max_period = 1;
  limits.min_reps = 2;
  const std::vector<RollSegment> runs = find_roll_segments(captured, launches, candidates, limits);
  size_t taken = 0;
  std::vector<std::pair<RollSegment, std::optional<MergedLaunch>>> all;
  for (size_t g = 0; g < segments->size(); ++g)
    all.emplace_back(std::move((*segments)[g]), std::move((*built)[g]));
  for (const RollSegment& run : runs) {
    uint32_t K = 0;
    std::optional<MergedLaunch> m =
        build_blocked(run, *launches[run.first], candidates[run.first], &K, stashes, prologues);
    if (!m) continue;
    // Whole blocks of K launches; the rest stay as they are.
    for (size_t b = 0; b + K <= run.reps; b += K) {
      all.emplace_back(RollSegment{run.first + b, 1, K, run.steps}, *m);
      taken += K;
    }
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first.first < b.first.first; });
  segments->clear();
  built->clear();
  for (auto& [seg, m] : all) {
    segments->push_back(std::move(seg));
    built->push_back(std::move(m));
  }
  return taken;
}

ScheduleLaunch GraphCompiler::schedule_launch(const CapturedStep& s,
                                              std::vector<bool>* pinned) const {
  ScheduleLaunch out;
  pinned->assign(s.args.size(), false);
  const std::shared_ptr<const codegen::KernelAccess>& access = core_.catalog.access(s.kernel.id);
  if (!access) {
    out.known = false;
    return out;
  }
  const codegen::KernelAccess& k = *access;
  // Adstack kernels may run from the runtime's one set of heaps, where thread g of every such
  // launch uses the same slots: one pseudo-array they all overwrite keeps them apart (from
  // the kernel, not the plan: an update may move a launch from the private tier to the heap).
  if (core_.catalog.adstack(s.kernel.id)) {
    out.accesses.push_back(
        {kAdstackHeaps, codegen::ArrayAccess::Kind::kOverwrite, ScheduleAccess::kAnyRow});
  }
  // Without bounds checks an index past its extent reaches another row: rows tell nothing.
  const bool rows = core_.compile_options.bounds_checks;
  const codegen::UniformInputs inputs = launch_inputs(s);
  for (const codegen::ParamAccess& p : k.params) {
    if (p.param >= s.args.size() || s.args[p.param].kind != abi::ParamKind::kNdArray) {
      out.known = false;  // not a launch GraphCompiler::launch let through
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

codegen::FusionLaunch GraphCompiler::fusion_launch(const CapturedStep& s, bool loops_capped) const {
  codegen::FusionLaunch l;
  l.kernel = &not_fusible();
  const std::shared_ptr<const codegen::Kernel>& ir = core_.catalog.fusible_ir(s.kernel.id);
  if (!ir || ir->params.size() != s.args.size()) return l;
  const codegen::Kernel& k = *ir;
  l.arrays.assign(s.args.size(), 0);
  for (size_t p = 0; p < s.args.size(); ++p) {
    if (s.args[p].kind == abi::ParamKind::kNdArray) l.arrays[p] = s.args[p].array.id;
  }
  if (k.tasks.empty()) return l;
  if (loops_capped) {
    // Once per kernel: a step loop launches the same few kernels thousands of times.
    if (core_.catalog.first_task_loops(s.kernel.id)) return l;
  }
  // The range: constants and extents only (fusible() refuses scalar bounds).
  std::optional<int64_t> b = bound_value(k.tasks[0].begin, s.args, false);
  std::optional<int64_t> e = bound_value(k.tasks[0].end, s.args, false);
  if (!b || !e) return l;
  l.begin = *b;
  l.end = *e;
  if (!k.tasks[0].dims.empty()) {  // the box (fusible() refuses one that reads a scalar)
    std::optional<std::vector<std::pair<int64_t, int64_t>>> box = gather_ranges(s, k);
    if (!box) return l;
    l.dims = std::move(*box);
  }
  l.kernel = &k;
  l.rows = launch_rows(s);
  return l;
}

std::vector<int64_t> GraphCompiler::launch_rows(const CapturedStep& s) const {
  // Without bounds checks an index past its extent reaches another row: rows tell nothing.
  const std::shared_ptr<const codegen::KernelAccess>& acc = core_.catalog.access(s.kernel.id);
  if (!core_.compile_options.bounds_checks || !acc) return {};
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

bool GraphCompiler::build_fused(std::span<const codegen::FusionRun> runs,
                                std::span<const codegen::FusionLaunch> launches,
                                std::span<const std::unordered_map<uint64_t, size_t>> zero_fills,
                                std::vector<MergedLaunch>* planned, std::vector<bool>* dropped) {
  // A step loop repeats the same runs with other arrays and scalars: a fused kernel is built
  // once per signature (graph_rework.h) and reused; the ones no earlier rework compiled are
  // compiled together, side by side.
  struct Built {
    MergedLaunch launch;
    std::vector<uint32_t> overwritten;  // arrays by first-use number
    size_t fresh = SIZE_MAX;            // its index in `fresh` until compiled
  };
  std::unordered_map<std::string, Built> built;
  std::vector<codegen::Kernel> fresh;
  std::vector<std::string> fresh_keys;  // their printed IR
  std::unordered_map<std::string, size_t> fresh_of;
  std::vector<const std::string*> sig_of(runs.size(), nullptr);
  std::vector<std::vector<uint64_t>> ids_of(runs.size());  // each run's arrays by first use
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].count < 2) continue;
    std::span<const codegen::FusionLaunch> members = launches.subspan(runs[r].first, runs[r].count);
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
      std::string key = codegen::print(f->kernel);
      if (refused_kernels_.count(key)) return false;
      if (auto known = fused_kernels_.find(key); known != fused_kernels_.end()) {
        nb.launch.kernel = known->second;
      } else {
        auto [at, added] = fresh_of.try_emplace(key, fresh.size());
        if (added) {
          fresh.push_back(std::move(f->kernel));
          fresh_keys.push_back(std::move(key));
        }
        nb.fresh = at->second;
      }
      b = built.emplace(sig, std::move(nb)).first;
    }
    sig_of[r] = &b->first;
  }
  std::vector<Result<KernelHandle>> handles = rework_compile_all(fresh, /*keep_ir=*/false);
  bool all = true;  // every one compiled is cached (and registered), whichever failed
  for (size_t i = 0; i < handles.size(); ++i) {
    if (handles[i].ok()) fused_kernels_.emplace(fresh_keys[i], *handles[i]);
    all = all && handles[i].ok();
  }
  if (!all) return false;
  for (auto& [sig, b] : built) {
    if (b.fresh != SIZE_MAX) b.launch.kernel = *handles[b.fresh];
  }
  planned->assign(runs.size(), MergedLaunch{});
  for (size_t r = 0; r < runs.size(); ++r) {
    if (sig_of[r] == nullptr) continue;
    const Built& b = built.at(*sig_of[r]);
    // A zero fill whose array the run then overwrites whole is left out of the graph.
    const codegen::FusionLaunch& first = launches[runs[r].first];
    for (uint32_t n : b.overwritten) {
      const std::vector<uint32_t>* shape = extents_of(ids_of[r][n]);
      if (shape != nullptr && shape->size() == 1 && first.begin == 0 &&
          first.end == static_cast<int64_t>((*shape)[0])) {
        (*dropped)[zero_fills[r].at(ids_of[r][n])] = true;
      }
    }
    (*planned)[r] = b.launch;
  }
  return true;
}

void GraphCompiler::trace_rework(const ReworkPlan& w, const std::string& name) const {
  // One line per launch the reworked graph runs (a fused run: its members joined by '+'), in
  // run order, with the number of launches a resident loop stands for: what a user checks
  // when a replay issues more launches than expected (VKAD_GRAPH_TRACE).
  std::vector<const CapturedStep*> launches;
  for (const CapturedStep& s : w.steps) {
    if (s.launch) launches.push_back(&s);
  }
  std::fprintf(stderr, "vkad graph '%s': %zu launches in %zu runs\n", name.c_str(), launches.size(),
               w.runs.size());
  for (const codegen::FusionRun& r : w.runs) {
    std::string line;
    for (size_t m = 0; m < r.count; ++m) {
      const std::shared_ptr<const codegen::Kernel>& k =
          core_.catalog.fusible_ir(launches[r.first + m]->kernel.id);
      line += (m ? "+" : "") + (k ? k->name : std::string("?"));
    }
    std::fprintf(stderr, "  %s\n", line.c_str());
  }
}

void GraphCompiler::plan_order(const std::vector<CapturedStep>& cap, ReworkPlan* w,
                               std::vector<std::vector<bool>>* pinned, ScheduleMemo* memo) const {
  // What each launch touches, and what fusion needs of it, in capture order. Where the device
  // caps loop passes per invocation (lavapipe), a fused kernel's passes are its members' sum:
  // an update that raises a member's trip count could then be refused where the launches
  // alone were not, so kernels with loops are left alone there.
  const bool loops_capped = core_.rt->caps().max_loop_passes != 0;
  std::vector<ScheduleLaunch> sched;
  std::vector<codegen::FusionLaunch> fusion;
  const std::vector<const CapturedStep*> cap_launches = launches_of(cap);
  for (size_t i = 0; i < cap.size(); ++i) {
    if (!cap[i].launch) continue;
    std::optional<StepSchedule>* known = i < memo->size() ? &(*memo)[i] : nullptr;
    if (known != nullptr && known->has_value()) {
      sched.push_back(std::move((*known)->launch));
      pinned->push_back(std::move((*known)->pinned));
    } else {
      sched.push_back(schedule_launch(cap[i], &pinned->emplace_back()));
    }
    fusion.push_back(fusion_launch(cap[i], loops_capped));
    sched.back().shape = fusion_shape(fusion.back());
  }
  // Scheduling first (graph/graph_schedule.h): `w.order[i]` is the launch that runs i-th;
  // fusion then merges runs of that order.
  w->order = scheduled_order(cap, sched, core_.graph.schedule);
  size_t li = 0;
  for (const CapturedStep& s : cap)
    w->steps.push_back(s.launch ? *cap_launches[w->order[li++]] : s);
  for (uint32_t o : w->order) {
    w->sched.push_back(sched[o]);
    w->launches.push_back(fusion[o]);
  }
}

std::unique_ptr<GraphCompiler::PreparedRework> GraphCompiler::prepare_rework(
    GraphHandle graph, std::vector<CapturedStep> captured, const std::string& name) {
  auto p = std::make_unique<PreparedRework>();
  p->graph = graph;
  p->name = name.empty() ? "graph" : name;
  p->captured = std::move(captured);
  // Extents (and shape classes by array) of this rework only: an array freed later must not be
  // found here. shape_classes_ by extents stay: recompute_answers_ keys hold them.
  struct Forget {
    GraphCompiler* s;
    ~Forget() {
      s->rework_extents_.clear();
      s->rework_shape_class_.clear();
    }
  } forget{this};
  plan_rework(p.get());
  // Registered at the install, or where the rework is dropped: the caches name them. (Where
  // plan_rework throws they stay in unregistered_ for the caller.)
  p->kernels = std::move(unregistered_);
  unregistered_.clear();
  return p;
}

void GraphCompiler::plan_rework(PreparedRework* p) {
  PhaseClock clock("vkad graph rework", &rework_compile_ms_);
  const std::vector<CapturedStep>& captured = p->captured;
  // Step loops of small launches first (graph/resident.h): each becomes one launch of a
  // resident kernel, which scheduling and fusion below then see as a fence.
  std::vector<CapturedStep> rolled_steps;
  p->any_rolled =
      roll(captured, &rolled_steps, &p->roll_index, &p->rolled, &p->blocked, &p->stashes);
  const std::vector<CapturedStep>& rolled_cap = p->any_rolled ? rolled_steps : captured;
  clock.mark("roll");
  // Gathers of an earlier launch's element-wise output compute it themselves (above the
  // scheduling, which then need not order them after that launch).
  std::vector<CapturedStep> recomputed_steps;
  ScheduleMemo memo;  // by step of rolled_cap (and of recomputed_steps: the same indices)
  p->any_recomputed = recompute(rolled_cap, &recomputed_steps, &p->recompute_pins, &memo);
  const std::vector<CapturedStep>& cap = p->any_recomputed ? recomputed_steps : rolled_cap;
  clock.mark("recompute");
  ReworkPlan& w = p->w;
  plan_order(cap, &w, &p->pinned, &memo);
  for (size_t l : p->recompute_pins) p->pinned[l].assign(p->pinned[l].size(), true);
  clock.mark("schedule");
  w.runs = fusion_runs(w.steps, w.launches, core_.graph.fuse, kMaxFusedArrays, kMaxFusedLaunches,
                       &p->rows_used);
  clock.mark("fusion runs");
  bool any_fused = false;
  for (const codegen::FusionRun& r : w.runs) any_fused = any_fused || r.count > 1;
  if (std::getenv("VKAD_GRAPH_TRACE") != nullptr) trace_rework(w, p->name);
  p->reordered = !identity(w.order);
  p->relaxed = !any_fused && core_.graph.schedule && any_barrier_relaxed(w.steps, w.sched);
  if (!any_fused && !p->reordered && !p->relaxed && !p->any_rolled) return;

  const ShapeOf shape_of = [&](uint64_t id) -> std::optional<std::vector<uint32_t>> {
    const std::vector<uint32_t>* s = extents_of(id);
    if (s == nullptr) return std::nullopt;
    return *s;
  };
  const auto zero_fills = zero_fills_before_runs(w.steps, w.launches, w.runs, shape_of);
  w.dropped.assign(w.steps.size(), false);
  if (!build_fused(w.runs, w.launches, zero_fills, &w.planned, &w.dropped)) return;
  clock.mark("fused kernels");
  std::unordered_set<uint64_t> kept;  // fusion_launch's kernels: the steps' fusible IR
  for (const CapturedStep& s : w.steps) {
    if (!s.launch || !kept.insert(s.kernel.id).second) continue;
    const std::shared_ptr<const codegen::Kernel>& ir = core_.catalog.fusible_ir(s.kernel.id);
    if (ir) p->ir.push_back(ir);
  }
  p->rework = true;
}

bool GraphCompiler::register_rework_kernels(PreparedRework& p) {
  bool all = true;
  for (PendingKernel& k : p.kernels) {
    Result<KernelHandle> h =
        core_.rt->register_kernel(*k.compiled, /*generic_on_demand=*/true, k.handle);
    if (!h.ok()) {
      // This rework keeps the graph as captured; later reworks leave that kernel's piece out
      // (a rolled segment or recomputed gather stays as launched; a fused run's graph stays as
      // captured, as when its kernel fails to compile).
      forget_kernel(k.handle.id);
      all = false;
      continue;
    }
    core_.note_capture_access(h->id, k.compiled->has_adstacks());
  }
  p.kernels.clear();
  return all;
}

void GraphCompiler::forget_kernel(uint64_t id) {
  auto remember = [&](auto& by_text) {
    for (auto it = by_text.begin(); it != by_text.end();) {
      if (it->second.id != id) {
        ++it;
        continue;
      }
      refused_kernels_.insert(it->first);
      it = by_text.erase(it);
    }
  };
  remember(fused_kernels_);
  remember(recomputed_kernels_);
  core_.drop_tables(id);
  for (auto& [key, answer] : recompute_answers_) {
    if (answer.kernel.id == id) answer = RecomputeAnswer{};  // no kernel: stays as launched
  }
}

Status GraphCompiler::refused_status(const codegen::Kernel& k) {
  return make_error(ErrorCode::kInvalidArgument,
                    "graph rework: the device refused kernel '" + k.name + "' before");
}

}  // namespace vkad
