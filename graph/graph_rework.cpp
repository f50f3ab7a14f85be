// The pure steps of the graph rework (graph_rework.h).
#include "graph/graph_rework.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>

namespace vkad {

namespace {

// Launch b is launch a one repetition later: same kernel, arrays, ranges and boxes; i32 scalars
// step by `step` (set from this pair when `learn`), the other scalars equal.
bool repeats(const CapturedStep& x, const CapturedStep& y, const RollCandidate& a,
             const RollCandidate& b, std::vector<int64_t>& step, bool learn) {
  if (!b.kernel || x.kernel.id != y.kernel.id || a.ranges != b.ranges || a.boxes != b.boxes) {
    return false;
  }
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
}

// The longest run of repetitions of the period of `p` launches from launch i (within `end`):
// 0 repetitions where not even two follow.
RollSegment repetitions(std::span<const CapturedStep* const> launches,
                        std::span<const RollCandidate> candidates, size_t i, size_t p, size_t end) {
  auto follows = [&](size_t a, size_t b, std::vector<int64_t>& step, bool learn) {
    return repeats(*launches[a], *launches[b], candidates[a], candidates[b], step, learn);
  };
  RollSegment seg{i, p, 0, std::vector<std::vector<int64_t>>(p)};
  for (size_t j = 0; j < p; ++j) {
    if (!follows(i + j, i + p + j, seg.steps[j], true)) return seg;
  }
  seg.reps = 2;
  while (i + (seg.reps + 1) * p <= end) {
    for (size_t j = 0; j < p; ++j) {
      if (!follows(i + (seg.reps - 1) * p + j, i + seg.reps * p + j, seg.steps[j], false))
        return seg;
    }
    ++seg.reps;
  }
  return seg;
}

size_t distinct_arrays(std::span<const CapturedStep* const> launches, size_t first, size_t n) {
  std::unordered_set<uint64_t> arrays;
  for (size_t j = first; j < first + n; ++j) {
    for (const Arg& a : launches[j]->args) {
      if (a.kind == abi::ParamKind::kNdArray) arrays.insert(a.array.id);
    }
  }
  return arrays.size();
}

}  // namespace

std::vector<RollSegment> find_roll_segments(std::span<const CapturedStep> captured,
                                            std::span<const CapturedStep* const> launches,
                                            std::span<const RollCandidate> candidates,
                                            const RollLimits& limits) {
  std::vector<RollSegment> segments;
  for_each_stretch(captured, [&](size_t first, size_t count) {
    const size_t end = first + count;
    for (size_t i = first; i < end;) {
      RollSegment best{i, 0, 0, {}};
      for (size_t p = 1; p <= limits.max_period && i + 2 * p <= end; ++p) {
        if (!candidates[i + p - 1].kernel) break;  // a longer period would hold it too
        RollSegment seg = repetitions(launches, candidates, i, p, end);
        if (seg.reps >= limits.min_reps && seg.reps * p > best.reps * best.period &&
            distinct_arrays(launches, i, p) <= limits.max_arrays) {
          best = std::move(seg);
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
  return segments;
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

bool any_task_loops(const codegen::Kernel& k) {
  for (const codegen::Task& t : k.tasks) {
    if (has_loops(t.body)) return true;
  }
  return false;
}

RollLimits roll_limits(uint32_t max_storage_buffers) {
  constexpr size_t kPush = 31, kMost = 94;
  RollLimits limits;
  // Two bindings spare: the args buffer, and one for what a kernel may bind besides.
  limits.max_arrays =
      max_storage_buffers <= kPush + 2 ? kPush : std::min<size_t>(kMost, max_storage_buffers - 2);
  return limits;
}

uint64_t resident_loop_passes(std::span<const codegen::ResidentMember> members, size_t reps,
                              uint32_t local) {
  // Per repetition one pass, plus each member's grid-stride loop where it needs one (a serial
  // task's walk: one pass per element, all on invocation 0); and the repetition loop's exit.
  uint64_t per_rep = 1;
  for (const codegen::ResidentMember& m : members) {
    for (size_t t = 0; t < m.ranges.size(); ++t) {
      const auto [b, e] = m.ranges[t];
      const auto n = static_cast<uint64_t>(std::max<int64_t>(e - b, 0));
      const bool serial = m.kernel && t < m.kernel->tasks.size() && m.kernel->tasks[t].serial;
      const uint64_t passes = serial ? n : (n + local - 1) / local;
      per_rep += passes > 1 ? passes + 1 : 0;
    }
  }
  return reps * per_rep + 1;
}

void splice_rolled(std::span<const CapturedStep> captured, std::span<const RollSegment> segments,
                   std::span<const std::optional<MergedLaunch>> rolled,
                   std::vector<CapturedStep>* out, std::vector<uint32_t>* launch_index,
                   std::vector<bool>* was_rolled) {
  size_t launches = 0;
  for (const CapturedStep& s : captured) launches += s.launch ? 1 : 0;
  out->clear();
  launch_index->assign(launches, 0);
  was_rolled->assign(launches, false);
  size_t li = 0, g = 0, made = 0;
  for (const CapturedStep& s : captured) {
    if (!s.launch) {
      out->push_back(s);
      continue;
    }
    while (g < segments.size() && segments[g].first + segments[g].period * segments[g].reps <= li)
      ++g;
    if (g >= segments.size() || li < segments[g].first || !rolled[g]) {
      (*launch_index)[li++] = static_cast<uint32_t>(made++);
      out->push_back(s);
      continue;
    }
    const RollSegment& seg = segments[g];
    const MergedLaunch& r = *rolled[g];
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
    (*was_rolled)[li++] = true;
  }
}

std::vector<uint32_t> scheduled_order(std::span<const CapturedStep> steps,
                                      std::span<const ScheduleLaunch> launches, bool schedule) {
  std::vector<uint32_t> order(launches.size());
  for_each_stretch(steps, [&](size_t first, size_t count) {
    std::span<const ScheduleLaunch> part = launches.subspan(first, count);
    std::vector<uint32_t> local(count);
    if (schedule) {
      local = schedule_order(schedule_levels(part), part);
    } else {
      for (uint32_t j = 0; j < count; ++j) local[j] = j;
    }
    for (size_t j = 0; j < count; ++j) order[first + j] = static_cast<uint32_t>(first + local[j]);
  });
  return order;
}

std::vector<codegen::FusionRun> fusion_runs(std::span<const CapturedStep> steps,
                                            std::span<const codegen::FusionLaunch> launches,
                                            bool fuse, uint32_t max_arrays, uint32_t max_launches,
                                            bool* rows_used, uint32_t max_ranges) {
  std::vector<codegen::FusionRun> runs;
  if (!fuse) {
    for (size_t i = 0; i < launches.size(); ++i) runs.push_back({i, 1});
    return runs;
  }
  for_each_stretch(steps, [&](size_t first, size_t count) {
    for (codegen::FusionRun r : codegen::fusion_groups(launches.subspan(first, count), max_arrays,
                                                       max_launches, rows_used, max_ranges)) {
      r.first += first;
      runs.push_back(r);
    }
  });
  return runs;
}

bool any_barrier_relaxed(std::span<const CapturedStep> steps,
                         std::span<const ScheduleLaunch> launches) {
  bool relaxed = false;
  // Fills bound the stretches: they keep their own barriers.
  for_each_stretch(steps, [&](size_t first, size_t count) {
    const std::vector<bool> b = schedule_barriers(launches.subspan(first, count));
    for (size_t j = 1; j < b.size(); ++j) relaxed = relaxed || !b[j];
  });
  return relaxed;
}

namespace {

// Whether fill step `f` leaves array `id` all zero bits over the range of `first` (a fill of
// -0.0 does not) in a way a fused kernel may replace its loads by 0.
bool zero_for_run(const CapturedStep& f, uint64_t id, const codegen::FusionLaunch& first,
                  const ShapeOf& shape_of) {
  if (f.launch || f.value != 0.0 || std::signbit(f.value) || !first.dims.empty()) return false;
  std::optional<std::vector<uint32_t>> shape = shape_of(id);
  return shape && shape->size() == 1 && first.begin >= 0 &&
         first.end <= static_cast<int64_t>((*shape)[0]);
}

}  // namespace

std::vector<std::unordered_map<uint64_t, size_t>> zero_fills_before_runs(
    std::span<const CapturedStep> steps, std::span<const codegen::FusionLaunch> launches,
    std::span<const codegen::FusionRun> runs, const ShapeOf& shape_of) {
  std::vector<std::unordered_map<uint64_t, size_t>> zero_fills(runs.size());
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
          if (it != last_touch.end() &&
              zero_for_run(steps[it->second], id, launches[launch], shape_of))
            zero_fills[r].emplace(id, it->second);
        }
      }
    }
    for (const Arg& a : s.args) {
      if (a.kind == abi::ParamKind::kNdArray) last_touch[a.array.id] = i;
    }
    ++launch;
  }
  return zero_fills;
}

std::string fusion_signature(std::span<const codegen::FusionLaunch> members,
                             const std::unordered_map<uint64_t, size_t>& zero_fills,
                             std::vector<uint64_t>* ids) {
  std::string sig;
  for (const codegen::FusionLaunch& m : members) {
    sig += std::to_string(reinterpret_cast<uintptr_t>(m.kernel)) + ":";
    for (uint64_t id : m.arrays) {
      if (id == 0) {
        sig += "s,";
        continue;
      }
      auto at = std::find(ids->begin(), ids->end(), id);
      if (at == ids->end()) at = ids->insert(ids->end(), id);
      sig += std::to_string(at - ids->begin()) + ",";
    }
    sig += ";";
  }
  std::vector<size_t> zero_numbers;
  for (const auto& entry : zero_fills) {
    zero_numbers.push_back(std::find(ids->begin(), ids->end(), entry.first) - ids->begin());
  }
  std::sort(zero_numbers.begin(), zero_numbers.end());
  for (size_t z : zero_numbers) sig += "z" + std::to_string(z);
  const bool one_box = std::all_of(members.begin(), members.end(),
                                   [&](const auto& m) { return codegen::same_box(m, members[0]); });
  if (!one_box) {
    for (const codegen::FusionLaunch& m : members) {
      sig += "r" + std::to_string(m.begin) + ":" + std::to_string(m.end);
      for (const auto& [lo, hi] : m.dims)
        sig += "d" + std::to_string(lo) + ":" + std::to_string(hi);
    }
  }
  return sig;
}

}  // namespace vkad
