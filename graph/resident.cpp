#include "graph/resident.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>

#include "abi/kernel_abi.h"
#include "adstack/size_expr.h"
#include "graph/launch_fusion.h"
#include "ir/loop_passes.h"
#include "ir/rewriter.h"

namespace vkad::codegen {

namespace {

bool residable_block(const Block& b) {
  for (const Stmt& s : b.stmts) {
    // Adstacks bind the runtime's heaps, sized per launch; a stated trip bound may read
    // scalars the roll steps; a barrier belongs to the rolled kernel alone.
    if (s.op >= Op::kStackAlloc || s.op == Op::kSharedAlloc || s.has_cap) return false;
    for (const Block& c : s.blocks) {
      if (!residable_block(c)) return false;
    }
  }
  return true;
}

}  // namespace

bool residable(const Kernel& k) {
  if (k.tasks.empty()) return false;
  for (const Task& t : k.tasks) {
    // A serial task (DiffTaichi's kernels of top-level statements: [0, 1), no index) is walked
    // below by one invocation over its range in order, as its own launch runs it.
    if (!residable_block(t.body)) return false;
    if (t.serial ? !t.dims.empty() : t.index == kNoValue) return false;
  }
  return true;
}

std::pair<int64_t, int64_t> box_range(std::span<const std::pair<int64_t, int64_t>> box) {
  int64_t points = 1;
  for (const auto& [b, e] : box) {
    // A resident walk covers at most a workgroup's few hundred points: no overflow to mind
    // past the first empty or huge dimension.
    points = e > b && points <= (int64_t{1} << 31) ? points * std::min<int64_t>(e - b, 1 << 30) : 0;
  }
  return {0, points};
}

std::optional<std::vector<std::pair<int64_t, int64_t>>> task_box(const Task& t,
                                                                 const ScalarOf& scalar,
                                                                 const ExtentOf& extent) {
  bool known = true;  // every value the box reads is known
  const adstack::SizeInputs sizes{[&](uint32_t p) -> int64_t {
                                    std::optional<int64_t> v = scalar(p);
                                    known = known && v.has_value();
                                    return v.value_or(0);
                                  },
                                  [&](uint32_t p, uint32_t d) -> int64_t {
                                    std::optional<int64_t> e = extent(p, d);
                                    known = known && e.has_value();
                                    return e.value_or(0);
                                  }};
  std::vector<std::pair<int64_t, int64_t>> box;
  for (const TaskDim& d : t.dims) {
    Result<int64_t> b = adstack::evaluate(d.begin, sizes);
    Result<int64_t> e = adstack::evaluate(d.end, sizes);
    if (!b.ok() || !e.ok() || !known) return std::nullopt;
    box.emplace_back(*b, *e);
  }
  return box;
}

std::optional<LaunchShapes> launch_shapes(const Kernel& k, const ScalarOf& scalar,
                                          const ExtentOf& extent, int64_t max_range) {
  LaunchShapes out;
  bool any_nd = false;
  for (const Task& t : k.tasks) {
    std::vector<std::pair<int64_t, int64_t>> box;
    std::pair<int64_t, int64_t> range;
    if (t.dims.empty()) {
      std::optional<int64_t> b = abi::evaluate(t.begin, scalar, extent);
      std::optional<int64_t> e = abi::evaluate(t.end, scalar, extent);
      if (!b || !e) return std::nullopt;
      range = {*b, *e};
    } else {
      std::optional<std::vector<std::pair<int64_t, int64_t>>> evaluated =
          task_box(t, scalar, extent);
      if (!evaluated) return std::nullopt;
      box = std::move(*evaluated);
      range = box_range(box);
      any_nd = true;
    }
    if (range.second - range.first > max_range) return std::nullopt;
    out.ranges.push_back(range);
    out.boxes.push_back(std::move(box));
  }
  if (!any_nd) out.boxes.clear();
  return out;
}

namespace {

// Whether member `mem`'s ranges and boxes fit kernel `k`'s tasks: per task a range, and an N-d
// task's box (one pair per dimension) whose points are that range.
bool shapes_fit(const Kernel& k, const ResidentMember& mem) {
  if (mem.ranges.size() != k.tasks.size()) return false;
  if (!mem.boxes.empty() && mem.boxes.size() != k.tasks.size()) return false;
  for (size_t t = 0; t < k.tasks.size(); ++t) {
    const size_t dims = k.tasks[t].dims.size();
    const size_t have = mem.boxes.empty() ? 0 : mem.boxes[t].size();
    if (have != dims) return false;
    if (dims != 0 && mem.ranges[t] != box_range(mem.boxes[t])) return false;
  }
  return true;
}

// The rolled kernel's parameters (merged_param) and each member's map into them; an error
// names a member that does not match its kernel or cannot be rolled.
Status merge_params(std::span<const ResidentMember> period, ResidentKernel& out,
                    const std::function<Status(const std::string&)>& fail) {
  std::map<uint64_t, uint32_t> array_param;  // array identity -> rolled parameter
  for (size_t m = 0; m < period.size(); ++m) {
    const ResidentMember& mem = period[m];
    const Kernel& k = *mem.kernel;
    if (!residable(k)) return fail("kernel '" + k.name + "' cannot run in a resident kernel");
    if (mem.arrays.size() != k.params.size() || mem.step.size() != k.params.size() ||
        !shapes_fit(k, mem)) {
      return fail("launch " + std::to_string(m) + " of '" + k.name + "' does not match its kernel");
    }
    std::vector<uint32_t>& pm = out.param_map.emplace_back(k.params.size());
    for (size_t p = 0; p < k.params.size(); ++p) {
      const Param& kp = k.params[p];
      if (mem.step[p] != 0 && (kp.kind != ParamKind::kScalar || kp.dtype != DType::kI32)) {
        return fail("parameter '" + kp.name + "' of '" + k.name +
                    "' steps but is not an i32 scalar");
      }
      pm[p] = merged_param(out.kernel, array_param, kp, mem.arrays[p], m);
    }
  }
  return {};
}

// The grid-stride walk of [range.first, range.second) by one workgroup of `local_size`
// invocations (`index` the invocation): element i = begin + index (+ pass * local_size), for
// each pass in [0, ceil(n / local_size)) (no pass loop when one pass covers the range), runs
// `element(i)` at the insertion point under `if i < end`. An empty range emits nothing.
template <typename Element>
void grid_stride(Rewriter& rw, ValueId index, std::pair<int64_t, int64_t> range,
                 uint32_t local_size, Element&& element) {
  const int64_t begin = range.first, end = range.second;
  const int64_t n = end > begin ? end - begin : 0;
  const int64_t passes = (n + local_size - 1) / local_size;
  auto guarded = [&](ValueId pass) {
    ValueId i = rw.op(Op::kAdd, DType::kI32, {index, rw.i32(begin)});
    if (pass != kNoValue) {
      i = rw.op(Op::kAdd, DType::kI32,
                {i, rw.op(Op::kMul, DType::kI32, {pass, rw.i32(local_size)})});
    }
    rw.if_(rw.op(Op::kLt, DType::kBool, {i, rw.i32(end)}), [&](int side) {
      if (side == 0) element(i);
    });
  };
  if (passes == 1) {
    guarded(kNoValue);
  } else if (passes > 1) {
    const ValueId zero = rw.i32(0);  // before the bound: function arguments are unsequenced
    rw.for_(zero, rw.i32(passes), std::nullopt, guarded);
  }
}

// An N-d task's point `i` of its box (row-major, the last dimension fastest): each dimension's
// index, begin + (i / stride) mod extent, read by the copies in place of the task's index values.
void nd_indices(Rewriter& rw, ValueId i, std::span<const std::pair<int64_t, int64_t>> box,
                const Task& kt, MemberCopier& c) {
  int64_t stride = 1;
  for (size_t d = box.size(); d-- > 0;) {
    const int64_t extent = box[d].second - box[d].first;  // > 0: the walk has points
    ValueId q = stride == 1 ? i : rw.op(Op::kDiv, DType::kI32, {i, rw.i32(stride)});
    // The first dimension needs no wrap: i is below the box's points.
    if (d > 0) q = rw.op(Op::kMod, DType::kI32, {q, rw.i32(extent)});
    const ValueId at =
        box[d].first == 0 ? q : rw.op(Op::kAdd, DType::kI32, {q, rw.i32(box[d].first)});
    c.substitute(kt.dims[d].index, at);
    if (d == 0) c.new_index = at;
    stride *= extent;
  }
}

// Appends one repetition of one member at the insertion point (the repetition loop's body, `r`
// its counter): its stepping scalars' values this repetition, then per task a grid-stride pass
// over its range by the workgroup (`index` the invocation), then a barrier.
void append_member(Rewriter& rw, ValueId r, ValueId index, uint32_t local_size,
                   const ResidentMember& mem, const std::vector<uint32_t>& pm) {
  const Kernel& k = *mem.kernel;
  // This repetition's value of each stepping scalar: first + r * step.
  std::unordered_map<uint32_t, ValueId> stepped;
  for (size_t p = 0; p < k.params.size(); ++p) {
    if (mem.step[p] == 0) continue;
    const ValueId first = rw.arg(DType::kI32, pm[p]);
    const ValueId delta = rw.op(Op::kMul, DType::kI32, {r, rw.i32(mem.step[p])});
    stepped[static_cast<uint32_t>(p)] = rw.op(Op::kAdd, DType::kI32, {first, delta});
  }
  for (size_t ti = 0; ti < k.tasks.size(); ++ti) {
    const Task& kt = k.tasks[ti];
    MemberCopier c(rw.kernel(), kt.index, pm, &stepped);
    if (kt.serial) {
      // Invocation 0 walks the range in order, as the task's own launch does.
      const int64_t b = mem.ranges[ti].first, e = mem.ranges[ti].second;
      if (e > b) {
        rw.if_(rw.op(Op::kEq, DType::kBool, {index, rw.i32(0)}), [&](int side) {
          if (side != 0) return;
          if (e - b == 1) {
            c.new_index = rw.i32(b);
            c.copy_block(kt.body, rw.block());
            return;
          }
          const ValueId lo = rw.i32(b);  // before the bound: function arguments are unsequenced
          rw.for_(lo, rw.i32(e), std::nullopt, [&](ValueId i) {
            c.new_index = i;
            c.copy_block(kt.body, rw.block());
          });
        });
      }
      rw.op(Op::kBarrier, DType::kF32, {});
      continue;
    }
    grid_stride(rw, index, mem.ranges[ti], local_size, [&](ValueId i) {
      if (kt.dims.empty()) {
        c.new_index = i;
      } else {
        nd_indices(rw, i, mem.boxes[ti], kt, c);
      }
      c.copy_block(kt.body, rw.block());
    });
    rw.op(Op::kBarrier, DType::kF32, {});  // what this launch wrote, visible to the next
  }
}

}  // namespace

Result<ResidentKernel> roll_launches(std::span<const ResidentMember> period, uint32_t reps,
                                     uint32_t local_size, const std::string& name) {
  auto fail = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "roll_launches '" + name + "': " + what);
  };
  if (period.empty()) return fail("no launch");
  if (local_size == 0) return fail("local size 0");
  ResidentKernel out;
  Kernel& f = out.kernel;
  f.name = name;
  VKAD_TRY(merge_params(period, out, fail));
  Task t;
  t.name = "resident";
  t.local_size = local_size;
  t.begin = RangeBound::constant(0);
  t.end = RangeBound::constant(local_size);
  t.index = f.fresh();
  Rewriter rw(f);
  // The repetitions: a loop with constant bounds (every invocation runs it alike).
  rw.in(t.body, [&] {
    const ValueId zero = rw.i32(0);
    rw.for_(zero, rw.i32(reps), std::nullopt, [&](ValueId r) {
      for (size_t m = 0; m < period.size(); ++m) {
        append_member(rw, r, t.index, local_size, period[m], out.param_map[m]);
      }
    });
  });
  f.tasks.push_back(std::move(t));
  return out;
}

uint64_t rolled_loop_passes(const ResidentKernel& rk, bool cas_f32, bool cas_f64) {
  if (rk.kernel.tasks.size() != 1) return UINT64_MAX;
  const Task& t = rk.kernel.tasks[0];
  const LoopPassBound b = loop_pass_bound(rk.kernel, t, cas_f32, cas_f64);
  bool constant = true;  // every bound the rolled kernel states is a constant
  const adstack::SizeInputs none{[&](uint32_t) -> int64_t {
                                   constant = false;
                                   return 0;
                                 },
                                 [&](uint32_t, uint32_t) -> int64_t {
                                   constant = false;
                                   return 0;
                                 }};
  Result<int64_t> body = adstack::evaluate(b.per_iteration, none);
  if (!body.ok() || !constant || *body < 0 || !b.unchecked_loops.empty()) return UINT64_MAX;
  // One workgroup over [0, local): one grid-stride iteration, its pass, the pass that ends it.
  return static_cast<uint64_t>(*body) + 1 + 1 + b.idle;
}

}  // namespace vkad::codegen
