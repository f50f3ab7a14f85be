#include "graph/resident.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>

#include "abi/kernel_abi.h"
#include "adstack/size_expr.h"
#include "graph/launch_fusion.h"
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
    if (t.serial || t.index == kNoValue || !residable_block(t.body)) {
      return false;
    }
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

std::vector<int64_t> array_shape(const Kernel& k, uint32_t p, const ExtentOf& extent) {
  if (p >= k.params.size() || k.params[p].kind != ParamKind::kNdArray) return {};
  std::vector<int64_t> shape;
  for (uint32_t d = 0; d < k.params[p].rank; ++d) {
    const std::optional<int64_t> e = extent(p, d);
    if (!e) return {};
    shape.push_back(*e);
  }
  return shape;
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

// ---- windows (the file comment of resident.h)

// A member value as (an integer scalar parameter, or -1) + a constant, where it is one.
struct Affine {
  int64_t param = -1;
  int64_t c = 0;
};

// The member kernel's statements by result, to read its access indices as Affine values.
class MemberValues {
 public:
  explicit MemberValues(const Kernel& k) {
    for (const Task& t : k.tasks) index(t.body);
  }
  std::optional<Affine> affine(ValueId v, int depth = 0) const {
    const Stmt* s = def(v);
    if (s == nullptr || depth > 16 || s->type != DType::kI32) return std::nullopt;
    switch (s->op) {
      case Op::kConst: return Affine{-1, s->iimm};
      case Op::kArg: return Affine{static_cast<int64_t>(s->param), 0};
      case Op::kAdd:
      case Op::kSub: {
        std::optional<Affine> a = affine(s->args[0], depth + 1);
        std::optional<Affine> b = affine(s->args[1], depth + 1);
        if (!a || !b || (b->param >= 0 && (s->op == Op::kSub || a->param >= 0))) return std::nullopt;
        return Affine{std::max(a->param, b->param), s->op == Op::kAdd ? a->c + b->c : a->c - b->c};
      }
      default: return std::nullopt;
    }
  }
  // Whether `v` is an i32 value (a task's index has no statement: i32).
  bool i32(ValueId v) const {
    const Stmt* s = def(v);
    return s == nullptr || s->type == DType::kI32;
  }

 private:
  const Stmt* def(ValueId v) const {
    auto it = defs_.find(v);
    return it == defs_.end() ? nullptr : it->second;
  }
  void index(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) defs_[s.result] = &s;
      for (const Block& c : s.blocks) index(c);
    }
  }
  std::unordered_map<ValueId, const Stmt*> defs_;
};

// What the period does with one rolled array parameter.
struct ArrayUse {
  bool known = true;  // every member bound it with known extents and i32 indices
  bool atomic = false, load = false;
  bool sliding = true;  // every access's row: a scalar stepping by `step` plus a constant
  int64_t step = 0;
  bool have_ref = false;
  uint32_t ref = 0;        // the rolled scalar rows are counted from
  int64_t ref_first = 0;   // its first repetition's value
  int64_t lo = INT64_MAX;  // rows at repetition r: arg(ref) + r * step + [lo, hi]
  int64_t hi = INT64_MIN;
  std::vector<int64_t> shape;
};

// One array held in workgroup shared memory.
struct Window {
  uint32_t param = 0;
  DType type = DType::kF32;
  std::vector<int64_t> shape;
  bool sliding = false;
  int64_t step = 0, lo = 0, hi = 0;  // sliding (ArrayUse's)
  uint32_t ref = 0;
  int64_t slots = 0;      // rows held: hi - lo + 2 sliding, shape[0] whole
  int64_t row_elems = 1;  // elements per row
  ValueId shared = kNoValue;
  int64_t elements() const { return slots * row_elems; }
};

void note_access(const Stmt& s, const ResidentMember& mem, const std::vector<uint32_t>& pm,
                 const MemberValues& vals, ArrayUse& u) {
  const std::vector<int64_t>* shape =
      s.param < mem.shapes.size() && !mem.shapes[s.param].empty() ? &mem.shapes[s.param] : nullptr;
  const size_t rank = s.op == Op::kLoad ? s.args.size() : s.args.size() - 1;
  if (shape == nullptr || shape->size() != rank || (!u.shape.empty() && u.shape != *shape)) {
    u.known = false;
    return;
  }
  u.shape = *shape;
  for (size_t d = 0; d < rank; ++d) u.known = u.known && vals.i32(s.args[d]);
  if (s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax) u.atomic = true;
  if (s.op == Op::kLoad) u.load = true;
  const std::optional<Affine> row = rank > 0 ? vals.affine(s.args[0]) : std::nullopt;
  const int64_t step = row && row->param >= 0 && !mem.first.empty()
                           ? mem.step[static_cast<size_t>(row->param)]
                           : 0;
  if (!row || (step != 1 && step != -1) || (u.step != 0 && u.step != step)) {
    u.sliding = false;
    return;
  }
  const size_t q = static_cast<size_t>(row->param);
  u.step = step;
  if (!u.have_ref) {
    u.have_ref = true;
    u.ref = pm[q];
    u.ref_first = mem.first[q];
  }
  const int64_t k = mem.first[q] + row->c - u.ref_first;
  u.lo = std::min(u.lo, k);
  u.hi = std::max(u.hi, k);
}

void note_block(const Block& b, const ResidentMember& mem, const std::vector<uint32_t>& pm,
                const MemberValues& vals, std::map<uint32_t, ArrayUse>& uses) {
  for (const Stmt& s : b.stmts) {
    if (accesses_array(s.op)) note_access(s, mem, pm, vals, uses[pm[s.param]]);
    for (const Block& c : s.blocks) note_block(c, mem, pm, vals, uses);
  }
}

// The windows of the period's arrays that fit `shared_bytes`, smallest first.
std::vector<Window> plan_windows(std::span<const ResidentMember> period,
                                 const ResidentKernel& rk, uint32_t local_size,
                                 uint32_t shared_bytes) {
  std::map<uint32_t, ArrayUse> uses;
  for (size_t m = 0; m < period.size(); ++m) {
    const MemberValues vals(*period[m].kernel);
    for (const Task& t : period[m].kernel->tasks) {
      note_block(t.body, period[m], rk.param_map[m], vals, uses);
    }
  }
  constexpr int64_t kBig = int64_t{1} << 30;
  std::vector<Window> out;
  for (const auto& [param, u] : uses) {
    const DType type = rk.kernel.params[param].dtype;
    const bool number = type == DType::kF32 || type == DType::kF64 || type == DType::kI32 ||
                        type == DType::kU32;
    if (!u.known || u.atomic || !u.load || !number || u.shape.empty()) continue;
    Window w;
    w.param = param;
    w.type = type;
    w.shape = u.shape;
    for (size_t d = 1; d < u.shape.size(); ++d) w.row_elems *= std::clamp<int64_t>(u.shape[d], 0, kBig);
    const int64_t rows = u.shape[0];
    if (w.row_elems <= 0 || w.row_elems > kBig || rows <= 0) continue;
    // Sliding where it holds fewer rows than the array and a repetition's new row takes one
    // pass of the workgroup; otherwise whole where the array is small (its load before the
    // first repetition: at most 16 passes).
    const int64_t slots = u.sliding && u.have_ref ? u.hi - u.lo + 2 : 0;
    if (slots > 1 && slots <= 16 && slots < rows && w.row_elems <= local_size) {
      w.sliding = true;
      w.step = u.step;
      w.lo = u.lo;
      w.hi = u.hi;
      w.ref = u.ref;
      w.slots = slots;
    } else if (rows <= 16 * int64_t{local_size} / w.row_elems) {
      w.slots = rows;
    } else {
      continue;
    }
    out.push_back(std::move(w));
  }
  auto bytes = [](const Window& w) { return w.elements() * abi::dtype_bytes(w.type); };
  std::stable_sort(out.begin(), out.end(),
                   [&](const Window& a, const Window& b) { return bytes(a) < bytes(b); });
  int64_t left = shared_bytes;
  std::vector<Window> fit;
  for (Window& w : out) {
    if (bytes(w) > left) break;
    left -= bytes(w);
    fit.push_back(std::move(w));
  }
  return fit;
}

// Emits the window code of a resident kernel: the shared arrays, the loads before the first
// repetition, each repetition's load of the row the next one adds, and the accesses.
class WindowEmitter {
 public:
  WindowEmitter(Rewriter& rw, std::vector<Window>& windows, ValueId index, uint32_t local_size)
      : rw_(rw), windows_(windows), index_(index), local_(local_size) {}

  // At the top of the task: the shared arrays, the rows the first repetition touches, a barrier.
  void prologue() {
    for (Window& w : windows_) {
      Stmt s = rw_.make(Op::kSharedAlloc, w.type);
      s.iimm = w.elements();
      w.shared = rw_.insert(std::move(s));
    }
    for (const Window& w : windows_) {
      const int64_t rows = w.sliding ? w.slots - 1 : w.slots;
      grid_stride(rw_, index_, {0, rows * w.row_elems}, local_, [&](ValueId e) {
        const ValueId n = rw_.i32(w.row_elems);
        const ValueId row = rw_.op(Op::kFloorDiv, DType::kI32, {e, n});
        const ValueId x = rw_.op(Op::kMod, DType::kI32, {e, n});
        load_row(w, w.sliding ? add(add(rw_.arg(DType::kI32, w.ref), rw_.i32(w.lo)), row) : row,
                 x);
      });
    }
    rw_.op(Op::kBarrier, DType::kF32, {});
  }

  // At the top of repetition r: the row repetition r + 1 adds to each sliding window.
  void next_rows(ValueId r) {
    for (const Window& w : windows_) {
      if (!w.sliding) continue;
      const ValueId ahead = rw_.op(Op::kMul, DType::kI32, {add(r, rw_.i32(1)), rw_.i32(w.step)});
      const ValueId row =
          add(add(rw_.arg(DType::kI32, w.ref), ahead), rw_.i32(w.step > 0 ? w.hi : w.lo));
      grid_stride(rw_, index_, {0, w.row_elems}, local_, [&](ValueId x) { load_row(w, row, x); });
    }
  }

  // `b`'s loads of windowed arrays read the window; its stores also write it.
  void rewrite(Block& b) {
    TreeChildren<Stmt> old = std::move(b.stmts);
    b.stmts.clear();
    for (Stmt& s : old) {
      for (Block& c : s.blocks) rewrite(c);
      const Window* w = nullptr;
      if (s.op == Op::kLoad || s.op == Op::kStore) {
        for (const Window& x : windows_) w = x.param == s.param ? &x : w;
      }
      if (w == nullptr) {
        b.stmts.push_back(std::move(s));
        continue;
      }
      const uint32_t loc = rw_.location();
      rw_.set_location(s.loc);
      Block made;
      rw_.in(made, [&] { s.op == Op::kLoad ? load(*w, std::move(s)) : store(*w, std::move(s)); });
      rw_.set_location(loc);
      for (Stmt& m : made.stmts) b.stmts.push_back(std::move(m));
    }
  }

 private:
  ValueId add(ValueId a, ValueId b) { return rw_.op(Op::kAdd, DType::kI32, {a, b}); }

  // The element of the window that holds [idx...] (when in bounds).
  ValueId at(const Window& w, std::span<const ValueId> idx) {
    ValueId e = w.sliding ? rw_.op(Op::kMod, DType::kI32, {idx[0], rw_.i32(w.slots)}) : idx[0];
    for (size_t d = 1; d < w.shape.size(); ++d) {
      e = add(rw_.op(Op::kMul, DType::kI32, {e, rw_.i32(w.shape[d])}), idx[d]);
    }
    return e;
  }
  ValueId in_bounds(const Window& w, std::span<const ValueId> idx) {
    ValueId ok = kNoValue;
    for (size_t d = 0; d < w.shape.size(); ++d) {
      const ValueId lo = rw_.op(Op::kGe, DType::kBool, {idx[d], rw_.i32(0)});
      const ValueId hi = rw_.op(Op::kLt, DType::kBool, {idx[d], rw_.i32(w.shape[d])});
      const ValueId both = rw_.op(Op::kAnd, DType::kBool, {lo, hi});
      ok = ok == kNoValue ? both : rw_.op(Op::kAnd, DType::kBool, {ok, both});
    }
    return ok;
  }
  // Row `row` element `x` of the array into its slot, where the row is inside the array.
  void load_row(const Window& w, ValueId row, ValueId x) {
    const ValueId inside = rw_.op(
        Op::kAnd, DType::kBool,
        {rw_.op(Op::kGe, DType::kBool, {row, rw_.i32(0)}),
         rw_.op(Op::kLt, DType::kBool, {row, rw_.i32(w.shape[0])})});
    rw_.if_(inside, [&](int side) {
      if (side != 0) return;
      std::vector<ValueId> idx = {row};
      int64_t stride = w.row_elems;
      for (size_t d = 1; d < w.shape.size(); ++d) {
        stride /= w.shape[d];
        ValueId i = stride == 1 ? x : rw_.op(Op::kFloorDiv, DType::kI32, {x, rw_.i32(stride)});
        if (d > 1) i = rw_.op(Op::kMod, DType::kI32, {i, rw_.i32(w.shape[d])});
        idx.push_back(i);
      }
      const ValueId v = rw_.access(Op::kLoad, w.type, w.param, idx);
      rw_.op(Op::kStoreShared, DType::kF32, {w.shared, at(w, idx), v});
    });
  }
  // A load: the window's element in bounds; out of bounds the load as it was (its error).
  void load(const Window& w, Stmt s) {
    const std::vector<ValueId> idx(s.args.begin(), s.args.end());
    const ValueId ok = in_bounds(w, idx);
    const ValueId e = at(w, idx);
    const ValueId local = rw_.op(Op::kAlloca, s.type, {});
    const ValueId result = s.result;
    rw_.if_(ok, [&](int side) {
      if (side == 0) {
        rw_.store_local(local, rw_.op(Op::kLoadShared, s.type, {w.shared, e}));
      } else {
        rw_.store_local(local, rw_.emit(s));
      }
    });
    Stmt value = rw_.make(Op::kLoadLocal, s.type, {local});
    value.result = result;
    rw_.insert(std::move(value));
  }
  // A store: to the array as it was, and to the window in bounds.
  void store(const Window& w, Stmt s) {
    const std::vector<ValueId> idx(s.args.begin(), s.args.end() - 1);
    const ValueId v = s.args.back();
    rw_.insert(std::move(s));
    const ValueId ok = in_bounds(w, idx);
    rw_.if_(ok, [&](int side) {
      if (side == 0) rw_.op(Op::kStoreShared, DType::kF32, {w.shared, at(w, idx), v});
    });
  }

  Rewriter& rw_;
  std::vector<Window>& windows_;
  ValueId index_;
  uint32_t local_;
};

}  // namespace

Result<ResidentKernel> roll_launches(std::span<const ResidentMember> period, uint32_t reps,
                                     uint32_t local_size, const std::string& name,
                                     uint32_t shared_bytes) {
  auto fail = [&](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "roll_launches '" + name + "': " + what);
  };
  if (period.empty()) return fail("no launch");
  if (local_size == 0) return fail("local size 0");
  ResidentKernel out;
  Kernel& f = out.kernel;
  f.name = name;
  VKAD_TRY(merge_params(period, out, fail));
  std::vector<Window> windows;
  if (shared_bytes > 0) windows = plan_windows(period, out, local_size, shared_bytes);
  Task t;
  t.name = "resident";
  t.local_size = local_size;
  t.begin = RangeBound::constant(0);
  t.end = RangeBound::constant(local_size);
  t.index = f.fresh();
  Rewriter rw(f);
  WindowEmitter win(rw, windows, t.index, local_size);
  // The repetitions: a loop with constant bounds (every invocation runs it alike).
  rw.in(t.body, [&] {
    if (!windows.empty()) win.prologue();
    const ValueId zero = rw.i32(0);
    ValueId rep = kNoValue;
    rw.for_(zero, rw.i32(reps), std::nullopt, [&](ValueId r) {
      rep = r;
      for (size_t m = 0; m < period.size(); ++m) {
        append_member(rw, r, t.index, local_size, period[m], out.param_map[m]);
      }
    });
    if (windows.empty()) return;
    Block& body = t.body.stmts.back().blocks[0];
    win.rewrite(body);
    Block ahead;  // each repetition first loads what the next one adds
    rw.in(ahead, [&] { win.next_rows(rep); });
    body.stmts.insert(body.stmts.begin(), std::make_move_iterator(ahead.stmts.begin()),
                      std::make_move_iterator(ahead.stmts.end()));
  });
  out.windows = static_cast<uint32_t>(windows.size());
  f.tasks.push_back(std::move(t));
  return out;
}

void trace_windows(const ResidentKernel& rk) {
  if (std::getenv("VKAD_GRAPH_TRACE") == nullptr || rk.kernel.tasks.empty()) return;
  std::string arrays;
  for (const Stmt& s : rk.kernel.tasks[0].body.stmts) {
    if (s.op == Op::kSharedAlloc) arrays += (arrays.empty() ? "" : ", ") + std::to_string(s.iimm);
  }
  std::fprintf(stderr, "vkad graph: '%s': %u arrays in shared windows (elements: %s)\n",
               rk.kernel.name.c_str(), rk.windows, arrays.empty() ? "none" : arrays.c_str());
}

}  // namespace vkad::codegen
