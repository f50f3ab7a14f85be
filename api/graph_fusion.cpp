// Session's launch fusion at end_capture (session.h, "Launch fusion"; the merging itself is
// codegen/launch_fusion.h). The runtime captured the launches one by one, which checked them;
// when runs of them can merge, the same steps are captured again with each run as one launch
// of its fused kernel, and the first graph is dropped. Fusion is an optimisation: whatever
// keeps a run from being fused (a kernel vkad did not compile, a fused kernel the device
// refuses) leaves those launches as they were.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "api/session.h"
#include "codegen/launch_fusion.h"
#include "codegen/resident.h"
#include "codegen/text.h"
#include "runtime/runtime.h"

namespace vkad {

namespace {

// At most this many distinct arrays per fused kernel: with its args buffer that stays within
// the 32 bindings every push-descriptor implementation takes (maxPushDescriptors >= 32).
constexpr uint32_t kMaxFusedArrays = 24;
// The pseudo-array id of the runtime's adstack heaps in a launch's schedule (no ndarray has it).
constexpr uint64_t kAdstackHeaps = UINT64_MAX;
constexpr uint32_t kMaxFusedLaunches = 32;
// Resident step loops (codegen/resident.h): a period of at most this many launches, repeated
// at least kMinResidentReps times, over at most kMaxResidentArrays arrays (the args buffer
// makes 31 of the 32 push descriptors every implementation takes), in a workgroup of at most
// kMaxResidentLocal invocations.
constexpr size_t kMaxResidentPeriod = 12;
constexpr size_t kMinResidentReps = 4;
constexpr size_t kMaxResidentArrays = 31;
constexpr uint32_t kMaxResidentLocal = 256;

const codegen::Kernel& not_fusible() {
  static const codegen::Kernel k;  // no task: fusible() is false
  return k;
}

// Calls fn(first, count) for each stretch of consecutive launches between fills (and the
// ends), launches numbered from 0 in step order; empty stretches included.
template <typename Step, typename Fn>
void for_each_stretch(const std::vector<Step>& steps, Fn fn) {
  size_t launch = 0, first = 0;
  for (size_t i = 0; i <= steps.size(); ++i) {
    if (i < steps.size() && steps[i].launch) {
      ++launch;
      continue;
    }
    fn(first, launch - first);
    first = launch;
  }
}

// Launches that could fuse share this nonzero key (range and workgroup size); 0 for none.
uint64_t fusion_shape(const codegen::FusionLaunch& l) {
  if (l.kernel == &not_fusible()) return 0;
  const uint64_t size = l.kernel->tasks[0].local_size;
  return std::hash<uint64_t>{}(static_cast<uint64_t>(l.begin) * 0x9E3779B97F4A7C15ull ^
                               static_cast<uint64_t>(l.end) * 0xC2B2AE3D27D4EB4Full ^ size) |
         1;
}

bool has_loops(const codegen::Block& b) {
  for (const codegen::Stmt& s : b.stmts) {
    if (s.op == codegen::Op::kFor || s.op == codegen::Op::kWhile) return true;
    for (const codegen::Block& c : s.blocks) {
      if (has_loops(c)) return true;
    }
  }
  return false;
}

}  // namespace

bool Session::roll(const std::vector<CapturedStep>& captured, std::vector<CapturedStep>* out,
                   std::vector<uint32_t>* launch_index, std::vector<bool>* rolled) {
  if (resident_max_range_ == 0) return false;
  const bool loops_capped = rt_->caps().max_loop_passes != 0;
  // What rolling needs of each captured launch; kernel == nullptr: it cannot be rolled.
  struct Info {
    const codegen::Kernel* kernel = nullptr;
    std::vector<std::pair<int64_t, int64_t>> ranges;
  };
  auto eval_bound = [&](const abi::RangeBound& b, const std::vector<Arg>& args, int64_t* v) {
    switch (b.kind) {
      case abi::RangeBound::Kind::kConstant: *v = b.value; return true;
      case abi::RangeBound::Kind::kScalarParam:
        if (b.param >= args.size()) return false;
        *v = args[b.param].i;
        return true;
      case abi::RangeBound::Kind::kArrayDim: {
        if (b.param >= args.size() || args[b.param].kind != abi::ParamKind::kNdArray) return false;
        Result<std::vector<uint32_t>> shape = rt_->shape(args[b.param].array);
        if (!shape.ok() || b.dim >= shape->size()) return false;
        *v = (*shape)[b.dim];
        return true;
      }
    }
    return false;
  };
  std::vector<const CapturedStep*> launches;
  std::vector<Info> info;
  std::unordered_map<uint64_t, bool> residable;  // by kernel handle id
  for (const CapturedStep& s : captured) {
    if (!s.launch) continue;
    launches.push_back(&s);
    Info& in = info.emplace_back();
    auto it = ir_.find(s.kernel.id);
    if (it == ir_.end() || it->second->params.size() != s.args.size()) continue;
    const codegen::Kernel& k = *it->second;
    auto [r, fresh] = residable.try_emplace(s.kernel.id, false);
    // Where the device cuts long loops (lavapipe) the rolled kernel's passes add up: kernels
    // with loops of their own stay out there.
    if (fresh) {
      bool loops = false;
      for (const codegen::Task& t : k.tasks) loops = loops || has_loops(t.body);
      r->second = codegen::residable(k) && !(loops_capped && loops);
    }
    if (!r->second) continue;
    bool small = true;
    for (const codegen::Task& t : k.tasks) {
      int64_t b = 0, e = 0;
      if (!eval_bound(t.begin, s.args, &b) || !eval_bound(t.end, s.args, &e) ||
          e - b > static_cast<int64_t>(resident_max_range_)) {
        small = false;
        break;
      }
      in.ranges.emplace_back(b, e);
    }
    if (small) in.kernel = &k;
  }
  // Launch a (of one repetition) and launch b (the same place one repetition later): same
  // kernel, arrays and ranges; i32 scalars step by `step` (set from the first pair when
  // `learn`), the other scalars equal.
  auto follows = [&](size_t a, size_t b, std::vector<int64_t>& step, bool learn) {
    const CapturedStep& x = *launches[a];
    const CapturedStep& y = *launches[b];
    if (!info[b].kernel || x.kernel.id != y.kernel.id || info[a].ranges != info[b].ranges)
      return false;
    if (learn) step.assign(x.args.size(), 0);
    for (size_t p = 0; p < x.args.size(); ++p) {
      const Arg& u = x.args[p];
      const Arg& v = y.args[p];
      if (u.kind != v.kind) return false;
      if (u.kind == abi::ParamKind::kNdArray) {
        if (u.array.id != v.array.id) return false;
        continue;
      }
      if (u.dtype != v.dtype) return false;
      if (u.dtype == DType::kI32) {
        if (learn) step[p] = v.i - u.i;
        if (v.i - u.i != step[p]) return false;
      } else if (u.i != v.i || !(u.f == v.f || (std::isnan(u.f) && std::isnan(v.f)))) {
        return false;
      }
    }
    return true;
  };
  struct Segment {
    size_t first, period, reps;
    std::vector<std::vector<int64_t>> steps;
  };
  std::vector<Segment> segments;
  for_each_stretch(captured, [&](size_t first, size_t count) {
    const size_t end = first + count;
    for (size_t i = first; i < end;) {
      Segment best{i, 0, 0, {}};
      for (size_t p = 1; p <= kMaxResidentPeriod && i + 2 * p <= end; ++p) {
        if (!info[i + p - 1].kernel) break;  // a longer period would hold it too
        std::vector<std::vector<int64_t>> steps(p);
        bool ok = true;
        for (size_t j = 0; j < p && ok; ++j) ok = follows(i + j, i + p + j, steps[j], true);
        if (!ok) continue;
        size_t reps = 2;
        while (i + (reps + 1) * p <= end) {
          bool next = true;
          for (size_t j = 0; j < p && next; ++j) {
            next = follows(i + (reps - 1) * p + j, i + reps * p + j, steps[j], false);
          }
          if (!next) break;
          ++reps;
        }
        std::unordered_set<uint64_t> arrays;
        for (size_t j = 0; j < p; ++j) {
          for (const Arg& a : launches[i + j]->args) {
            if (a.kind == abi::ParamKind::kNdArray) arrays.insert(a.array.id);
          }
        }
        if (reps >= kMinResidentReps && arrays.size() <= kMaxResidentArrays &&
            reps * p > best.reps * best.period) {
          best = {i, p, reps, std::move(steps)};
        }
      }
      if (best.period == 0) {
        ++i;
        continue;
      }
      i += best.period * best.reps;
      segments.push_back(std::move(best));
    }
  });
  if (segments.empty()) return false;

  // The rolled kernels (compiled once per printed IR), then the steps with each segment as
  // one launch of its kernel.
  struct Rolled {
    KernelHandle kernel;
    std::vector<std::vector<uint32_t>> param_map;
    size_t params = 0;
  };
  std::vector<std::optional<Rolled>> built(segments.size());
  for (size_t g = 0; g < segments.size(); ++g) {
    const Segment& seg = segments[g];
    std::vector<codegen::ResidentMember> period;
    int64_t widest = 1;
    for (size_t j = 0; j < seg.period; ++j) {
      const CapturedStep& s = *launches[seg.first + j];
      codegen::ResidentMember m;
      m.kernel = info[seg.first + j].kernel;
      m.step = seg.steps[j];
      m.ranges = info[seg.first + j].ranges;
      for (const Arg& a : s.args)
        m.arrays.push_back(a.kind == abi::ParamKind::kNdArray ? a.array.id : 0);
      for (const auto& [b, e] : m.ranges) widest = std::max(widest, e - b);
      period.push_back(std::move(m));
    }
    // One invocation per element of the widest launch, in whole subgroups, up to the cap.
    const uint32_t local = static_cast<uint32_t>(std::min<int64_t>(
        std::min<uint32_t>(kMaxResidentLocal, target_.max_local_size), (widest + 31) / 32 * 32));
    const std::string name = "resident_" + period[0].kernel->name + "_x" +
                             std::to_string(seg.period) + "_r" + std::to_string(seg.reps);
    Result<codegen::ResidentKernel> rk =
        codegen::roll_launches(period, static_cast<uint32_t>(seg.reps), local, name);
    if (!rk.ok()) continue;  // these launches stay as they are
    const std::string key = codegen::print(rk->kernel);
    auto it = fused_kernels_.find(key);
    if (it == fused_kernels_.end()) {
      Result<std::shared_ptr<const runtime::CompiledKernel>> ck =
          compile_cache_.compile(rk->kernel, target_, compile_options_);
      if (!ck.ok()) continue;
      Result<KernelHandle> h = rt_->register_kernel(**ck);
      if (!h.ok()) continue;
      it = fused_kernels_.emplace(key, *h).first;
    }
    built[g] = Rolled{it->second, std::move(rk->param_map), rk->kernel.params.size()};
  }
  out->clear();
  launch_index->assign(launches.size(), 0);
  rolled->assign(launches.size(), false);
  size_t li = 0, g = 0, made = 0;
  bool any = false;
  for (const CapturedStep& s : captured) {
    if (!s.launch) {
      out->push_back(s);
      continue;
    }
    while (g < segments.size() && segments[g].first + segments[g].period * segments[g].reps <= li)
      ++g;
    const bool inside = g < segments.size() && li >= segments[g].first && built[g];
    if (!inside) {
      (*launch_index)[li++] = static_cast<uint32_t>(made++);
      out->push_back(s);
      continue;
    }
    const Segment& seg = segments[g];
    const Rolled& r = *built[g];
    const size_t j = li - seg.first;
    if (j == 0) {
      CapturedStep step;
      step.kernel = r.kernel;
      step.args.assign(r.params, Arg{});
      out->push_back(std::move(step));
      ++made;
    }
    if (j < seg.period) {  // the first repetition's arguments
      const std::vector<uint32_t>& pm = r.param_map[j];
      for (size_t p = 0; p < s.args.size(); ++p) out->back().args[pm[p]] = s.args[p];
    }
    (*launch_index)[li] = static_cast<uint32_t>(made - 1);
    (*rolled)[li++] = true;
    any = true;
  }
  return any;
}

ScheduleLaunch Session::schedule_launch(const CapturedStep& s, std::vector<bool>* pinned) const {
  ScheduleLaunch out;
  pinned->assign(s.args.size(), false);
  auto it = kernel_access_.find(s.kernel.id);
  if (it == kernel_access_.end()) {
    out.known = false;
    return out;
  }
  const codegen::KernelAccess& k = *it->second;
  // Adstack kernels may run from the runtime's one set of heaps, where thread g of every such
  // launch uses the same slots: one pseudo-array they all overwrite keeps them apart (from
  // the kernel, not the plan: an update may move a launch from the private tier to the heap).
  if (adstack_kernels_.count(s.kernel.id)) {
    out.accesses.push_back(
        {kAdstackHeaps, codegen::ArrayAccess::Kind::kOverwrite, ScheduleAccess::kAnyRow});
  }
  // Without bounds checks an index past its extent reaches another row: rows tell nothing.
  const bool rows = compile_options_.bounds_checks;
  const codegen::UniformInputs inputs{
      [&](uint32_t p) -> int64_t { return p < s.args.size() ? s.args[p].i : 0; },
      [&](uint32_t p, uint32_t d) -> std::optional<uint32_t> {
        if (p >= s.args.size() || s.args[p].kind != abi::ParamKind::kNdArray) return std::nullopt;
        Result<std::vector<uint32_t>> shape = rt_->shape(s.args[p].array);
        if (!shape.ok() || d >= shape->size()) return std::nullopt;
        return (*shape)[d];
      }};
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

namespace {

// Whether `order` is the identity permutation (nothing was reordered).
bool identity(std::span<const uint32_t> order) {
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != i) return false;
  }
  return true;
}

}  // namespace

Result<GraphHandle> Session::fuse(GraphHandle graph, const std::vector<CapturedStep>& captured) {
  // Steps recorded through runtime() while Session cap are not in `cap`: the graph
  // is then kept as the runtime cap it.
  Result<size_t> n_steps = rt_->graph_steps(graph);
  if (!n_steps.ok() || *n_steps != captured.size()) return graph;
  // Step loops of small launches first (codegen/resident.h): each becomes one launch of a
  // resident kernel, which scheduling and fusion below then see as a fence.
  std::vector<CapturedStep> rolled_steps;
  std::vector<uint32_t> roll_index;
  std::vector<bool> rolled;
  const bool any_rolled = roll(captured, &rolled_steps, &roll_index, &rolled);
  const std::vector<CapturedStep>& cap = any_rolled ? rolled_steps : captured;
  // Scheduling first: within each stretch between fills the launches by level
  // (api/graph_schedule.h); `order[i]` is the cap launch that runs i-th. Fusion then
  // merges runs of the scheduled order.
  std::vector<ScheduleLaunch> sched;
  std::vector<std::vector<bool>> pinned;
  for (const CapturedStep& s : cap) {
    if (!s.launch) continue;
    pinned.emplace_back();
    sched.push_back(schedule_launch(s, &pinned.back()));
  }
  // Where the device caps loop passes per invocation (lavapipe), a fused kernel's passes are
  // its members' sum: an update that raises a member's trip count could then be refused where
  // the launches alone were not. Kernels with loops are left alone there.
  const bool loops_capped = rt_->caps().max_loop_passes != 0;
  // What fusion needs of every cap launch, in capture order.
  std::vector<codegen::FusionLaunch> captured_launches;
  for (const CapturedStep& s : cap) {
    if (!s.launch) continue;
    codegen::FusionLaunch l;
    l.kernel = &not_fusible();
    auto it = ir_.find(s.kernel.id);
    if (it != ir_.end() && it->second->params.size() == s.args.size()) {
      const codegen::Kernel& k = *it->second;
      l.arrays.assign(s.args.size(), 0);
      for (size_t p = 0; p < s.args.size(); ++p) {
        if (s.args[p].kind == abi::ParamKind::kNdArray) l.arrays[p] = s.args[p].array.id;
      }
      // The range: constants and extents only (fusible() refuses scalar bounds).
      auto bound = [&](const abi::RangeBound& b, int64_t* out) {
        if (b.kind == abi::RangeBound::Kind::kConstant) {
          *out = b.value;
          return true;
        }
        if (b.kind != abi::RangeBound::Kind::kArrayDim || b.param >= s.args.size()) return false;
        Result<std::vector<uint32_t>> shape = rt_->shape(s.args[b.param].array);
        if (!shape.ok() || b.dim >= shape->size()) return false;
        *out = (*shape)[b.dim];
        return true;
      };
      if (!k.tasks.empty() && !(loops_capped && has_loops(k.tasks[0].body)) &&
          bound(k.tasks[0].begin, &l.begin) && bound(k.tasks[0].end, &l.end)) {
        l.kernel = &k;
      }
    }
    captured_launches.push_back(std::move(l));
  }
  // Launches that could fuse share a shape: scheduling keeps a chain's steps of one shape
  // adjacent where it can.
  for (size_t i = 0; i < sched.size(); ++i) sched[i].shape = fusion_shape(captured_launches[i]);
  std::vector<uint32_t> order(sched.size());
  std::vector<CapturedStep> steps;
  {
    for_each_stretch(cap, [&](size_t first, size_t count) {
      std::span<const ScheduleLaunch> part(sched.data() + first, count);
      std::vector<uint32_t> local(count);
      if (schedule_graph_launches_) {
        local = schedule_order(schedule_levels(part), part);
      } else {
        for (uint32_t j = 0; j < count; ++j) local[j] = j;
      }
      for (size_t j = 0; j < count; ++j) order[first + j] = static_cast<uint32_t>(first + local[j]);
    });
    size_t li = 0;
    std::vector<const CapturedStep*> launch_steps;
    for (const CapturedStep& s : cap) {
      if (s.launch) launch_steps.push_back(&s);
    }
    for (const CapturedStep& s : cap) {
      steps.push_back(s.launch ? *launch_steps[order[li++]] : s);
    }
  }
  std::vector<ScheduleLaunch> sched_ordered(sched.size());
  std::vector<codegen::FusionLaunch> launches(sched.size());  // in the scheduled order
  for (size_t i = 0; i < order.size(); ++i) {
    sched_ordered[i] = sched[order[i]];
    launches[i] = captured_launches[order[i]];
  }
  std::vector<codegen::FusionRun> runs;
  for_each_stretch(steps, [&](size_t first, size_t count) {
    std::span<const codegen::FusionLaunch> part(launches.data() + first, count);
    for (codegen::FusionRun r : codegen::fusion_groups(part, kMaxFusedArrays, kMaxFusedLaunches)) {
      r.first += first;
      runs.push_back(r);
    }
  });
  if (!fuse_graph_launches_) {  // scheduling alone: every launch a run of its own
    runs.clear();
    for (size_t i = 0; i < launches.size(); ++i) runs.push_back({i, 1});
  }
  bool any = false;
  for (const codegen::FusionRun& r : runs) any = any || r.count > 1;
  const bool reordered = !identity(order);
  bool relaxed = false;  // some barrier is left out
  if (!any && schedule_graph_launches_) {
    // Fills bound the stretches: they keep their own barriers.
    for_each_stretch(steps, [&](size_t first, size_t count) {
      const std::vector<bool> b =
          schedule_barriers(std::span<const ScheduleLaunch>(sched_ordered.data() + first, count));
      for (size_t j = 1; j < b.size(); ++j) relaxed = relaxed || !b[j];
    });
  }
  if (!any && !reordered && !relaxed && !any_rolled) return graph;

  // The fused kernels (compiled once per distinct run), then the steps cap again.
  struct Planned {
    KernelHandle kernel;
    std::vector<std::vector<uint32_t>> param_map;
    size_t params = 0;
  };
  std::vector<Planned> planned(runs.size());
  // Per run, the arrays a fill with 0 was the last step to touch before it (step index by
  // array id): the fused kernel reads them as zeros, and a fill whose array the run then
  // overwrites whole is left out of the graph.
  std::vector<std::unordered_map<uint64_t, size_t>> zero_fills(runs.size());
  {
    std::unordered_map<uint64_t, size_t> last_touch;  // array id -> step index
    size_t launch = 0, r = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const CapturedStep& s = steps[i];
      if (!s.launch) {
        last_touch[s.args[0].array.id] = i;
        continue;
      }
      while (r + 1 < runs.size() && runs[r].first + runs[r].count <= launch) ++r;
      if (launch == runs[r].first && runs[r].count > 1) {
        for (size_t m = 0; m < runs[r].count; ++m) {
          for (uint64_t id : launches[launch + m].arrays) {
            auto it = id ? last_touch.find(id) : last_touch.end();
            if (it == last_touch.end()) continue;
            const CapturedStep& f = steps[it->second];
            // All bits zero (a fill of -0.0 is not), and an extent that covers the run's
            // range: a load the fused kernel replaces by 0 must be one that was in bounds,
            // since the constant carries no bounds check.
            if (f.launch || f.value != 0.0 || std::signbit(f.value)) continue;
            Result<std::vector<uint32_t>> shape = rt_->shape(NdArrayHandle{id});
            if (!shape.ok() || shape->size() != 1 || launches[launch].begin < 0 ||
                launches[launch].end > static_cast<int64_t>((*shape)[0])) {
              continue;
            }
            zero_fills[r].emplace(id, it->second);
          }
        }
      }
      for (const Arg& a : s.args) {
        if (a.kind == abi::ParamKind::kNdArray) last_touch[a.array.id] = i;
      }
      ++launch;
    }
  }
  std::vector<bool> dropped(steps.size(), false);
  // A step loop repeats the same runs with other arrays and scalars: the fused kernel of a run
  // depends only on its members' kernels, which of their parameters share an array and which
  // arrays are known zero, so it is built once per such signature (numbering arrays by first
  // use in the run) and reused.
  struct Built {
    KernelHandle kernel;
    std::vector<std::vector<uint32_t>> param_map;
    size_t params = 0;
    std::vector<uint32_t> overwritten;  // arrays by first-use number
  };
  std::unordered_map<std::string, Built> built;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].count < 2) continue;
    std::span<const codegen::FusionLaunch> members(launches.data() + runs[r].first, runs[r].count);
    std::vector<uint64_t> ids;  // the run's arrays by first use
    std::string sig;
    for (const codegen::FusionLaunch& m : members) {
      sig += std::to_string(reinterpret_cast<uintptr_t>(m.kernel)) + ":";
      for (uint64_t id : m.arrays) {
        if (id == 0) {
          sig += "s,";
          continue;
        }
        auto at = std::find(ids.begin(), ids.end(), id);
        if (at == ids.end()) at = ids.insert(ids.end(), id);
        sig += std::to_string(at - ids.begin()) + ",";
      }
      sig += ";";
    }
    std::vector<uint64_t> zeros;
    std::vector<size_t> zero_numbers;
    for (const auto& [id, step] : zero_fills[r]) {
      zeros.push_back(id);
      zero_numbers.push_back(std::find(ids.begin(), ids.end(), id) - ids.begin());
    }
    std::sort(zero_numbers.begin(), zero_numbers.end());
    for (size_t z : zero_numbers) sig += "z" + std::to_string(z);
    auto b = built.find(sig);
    if (b == built.end()) {
      const std::string name =
          "fused_" + members[0].kernel->name + "_x" + std::to_string(runs[r].count);
      Result<codegen::FusedKernel> f = codegen::fuse_launches(members, name, zeros);
      if (!f.ok()) return graph;
      const std::string key = codegen::print(f->kernel);
      auto it = fused_kernels_.find(key);
      if (it == fused_kernels_.end()) {
        Result<std::shared_ptr<const runtime::CompiledKernel>> ck =
            compile_cache_.compile(f->kernel, target_, compile_options_);
        if (!ck.ok()) return graph;
        Result<KernelHandle> h = rt_->register_kernel(**ck);
        if (!h.ok()) return graph;
        it = fused_kernels_.emplace(key, *h).first;
      }
      Built nb{it->second, std::move(f->param_map), f->kernel.params.size(), {}};
      for (uint64_t id : f->overwritten) {
        nb.overwritten.push_back(
            static_cast<uint32_t>(std::find(ids.begin(), ids.end(), id) - ids.begin()));
      }
      b = built.emplace(sig, std::move(nb)).first;
    }
    for (uint32_t n : b->second.overwritten) {
      const uint64_t id = ids[n];
      Result<std::vector<uint32_t>> shape = rt_->shape(NdArrayHandle{id});
      if (shape.ok() && shape->size() == 1 && members[0].begin == 0 &&
          members[0].end == static_cast<int64_t>((*shape)[0])) {
        dropped[zero_fills[r].at(id)] = true;
      }
    }
    planned[r] = {b->second.kernel, b->second.param_map, b->second.params};
  }
  std::vector<size_t> run_of(launches.size());
  for (size_t r = 0; r < runs.size(); ++r) {
    for (size_t m = 0; m < runs[r].count; ++m) run_of[runs[r].first + m] = r;
  }
  const std::string name = capture_name_;
  if (!rt_->begin_capture(name).ok()) return graph;  // the launches as cap
  FusedGraph map;
  map.launch.resize(launches.size());
  map.param.resize(launches.size());
  Status st;
  size_t launch = 0;
  uint32_t fused_launches = 0;
  std::vector<Arg> args;
  // What ran since the last barrier (a fill records its own): a launch that conflicts with
  // none of it goes without one.
  BarrierTracker pending;
  bool first_in_stretch = true;
  ScheduleLaunch unit;  // the accesses of the launch being assembled (a run's union)
  auto emit = [&](KernelHandle k, std::span<const Arg> a) {
    const bool barrier = pending.next(unit);
    unit = ScheduleLaunch{};
    if (schedule_graph_launches_ && !first_in_stretch && !barrier) {
      relaxed = true;
      VKAD_TRY(rt_->omit_next_barrier());
    }
    first_in_stretch = false;
    return rt_->launch(k, a);
  };
  for (size_t i = 0; i < steps.size() && st.ok(); ++i) {
    const CapturedStep& s = steps[i];
    if (!s.launch) {
      if (!dropped[i]) st = rt_->fill(s.args[0].array, s.value);
      pending.clear();
      first_in_stretch = true;
      continue;
    }
    const size_t r = run_of[launch];
    const size_t member = launch - runs[r].first;
    const uint32_t orig = order[launch];
    const ScheduleLaunch& sl = sched_ordered[launch];
    unit.known = unit.known && sl.known;
    unit.accesses.insert(unit.accesses.end(), sl.accesses.begin(), sl.accesses.end());
    ++launch;
    if (runs[r].count < 2) {
      map.launch[orig] = fused_launches++;  // param stays empty: identity
      st = emit(s.kernel, s.args);
      continue;
    }
    if (member == 0) args.assign(planned[r].params, Arg{});
    const std::vector<uint32_t>& pm = planned[r].param_map[member];
    for (size_t p = 0; p < s.args.size(); ++p) args[pm[p]] = s.args[p];
    map.launch[orig] = fused_launches;
    map.param[orig] = pm;
    if (member + 1 == runs[r].count) {
      st = emit(planned[r].kernel, args);
      ++fused_launches;
    }
  }
  Result<GraphHandle> fused = rt_->end_capture();
  if (!st.ok() || !fused.ok()) {
    if (fused.ok()) (void)rt_->release_graph(*fused);
    return graph;  // the launches as cap
  }
  map.name = name.empty() ? "graph" : name;
  for (const CapturedStep& s : captured) {
    if (!s.launch) continue;
    map.scalars.push_back(scalar_params(s.args));
    auto k = ir_.find(s.kernel.id);
    map.kernel.push_back(k == ir_.end() ? std::string() : k->second->name);
  }
  if (any_rolled) {
    // Back to the captured launches' numbering: a rolled launch is part of its resident
    // launch, whose scalars are its first repetition's; an update of any of a rolled launch's
    // scalars needs the graph as captured (pinned).
    std::vector<uint32_t> launch(roll_index.size());
    std::vector<std::vector<uint32_t>> param(roll_index.size());
    std::vector<std::vector<bool>> pin(roll_index.size());
    for (size_t o = 0; o < roll_index.size(); ++o) {
      const uint32_t l = roll_index[o];
      launch[o] = map.launch[l];
      if (rolled[o]) {
        pin[o] = map.scalars[o];
      } else {
        param[o] = map.param[l];
        pin[o] = pinned[l];
      }
    }
    map.launch = std::move(launch);
    map.param = std::move(param);
    pinned = std::move(pin);
  }
  // Where the schedule rests on rows that scalar arguments decide, the graph as captured stays
  // for an update of one of them (Session::replay).
  bool any_pinned = false;
  for (const std::vector<bool>& p : pinned) {
    for (bool b : p) any_pinned = any_pinned || b;
  }
  if ((reordered || relaxed || any_rolled) && any_pinned) {
    map.pinned = std::move(pinned);
    map.original = graph;
  } else {
    (void)rt_->release_graph(graph);
  }
  if (any_rolled)
    rolled_launches_ += static_cast<uint64_t>(std::count(rolled.begin(), rolled.end(), true));
  fused_graphs_.emplace(fused->id, std::move(map));
  return *fused;
}

std::vector<bool> Session::scalar_params(std::span<const Arg> args) {
  std::vector<bool> out(args.size());
  for (size_t p = 0; p < args.size(); ++p) out[p] = args[p].kind == abi::ParamKind::kScalar;
  return out;
}

Status Session::translate(const FusedGraph& f, std::span<const GraphUpdate> updates,
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
