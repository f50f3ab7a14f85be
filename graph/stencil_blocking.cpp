#include "graph/stencil_blocking.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ir/launch_access.h"
#include "ir/rewriter.h"
#include "ir/verifier.h"

namespace vkad::codegen {

namespace {

using Box = std::vector<std::pair<int64_t, int64_t>>;

bool is_array_op(Op op) {
  return op == Op::kLoad || op == Op::kStore || op == Op::kAtomicAdd || op == Op::kAtomicMax;
}

// Where an i32 index value lies relative to task dimension `dim`'s index i: value - i in
// [lo, hi] for every i of the box, the value itself in [amin, amax]; `periodic`: value - i is
// in [lo, hi] modulo the dimension's extent n (a wrap-around neighbour, select(i - 1 < 0, n - 1,
// i - 1)), the box starting at 0. dim -1: a value no index moves, [lo, hi] its value.
struct Offset {
  bool ok = false;
  int dim = -1;
  int64_t lo = 0, hi = 0;
  int64_t amin = 0, amax = 0;
  bool periodic = false;
};

// The widest offset an index may have and still count as a neighbour.
constexpr int64_t kMaxOffset = 8;

// A row index: scalar parameter `param` plus `c` (param -1: the constant c).
struct Row {
  bool ok = false;
  int param = -1;
  int64_t c = 0;
  bool operator==(const Row& o) const { return param == o.param && c == o.c; }
};

// The task's values as the analyses need them: definitions, and the index per dimension.
class Values {
 public:
  Values(const Task& t, const Box& box, const std::vector<std::vector<int64_t>>* shapes = nullptr)
      : box_(box), shapes_(shapes) {
    idx_ = task_indices(t);
    collect(t.body);
  }
  const std::vector<ValueId>& indices() const { return idx_; }

  // The offset of `v` (see Offset), found by evaluating v's definitions at every index of
  // the one dimension it depends on: exact for any mix of clamps, selects and wraps.
  Offset offset(ValueId v) {
    auto it = memo_.find(v);
    if (it != memo_.end()) return it->second;
    Offset o = compute(v);
    memo_[v] = o;
    return o;
  }

  // The row `v` is, as a stepping scalar + c: a scalar that does not step in the run (known
  // through `launch`) counts with its first value, so smoke's row k + 10 t, with t fixed
  // through the run's pressure iterations, is k + a constant. Without a launch every scalar is
  // symbolic. Not a row: products of scalars, two stepping scalars, a stepping one scaled.
  Row row(ValueId v) const {
    std::optional<Linear> f = linear(v, 0);
    if (!f || (f->coeff != 0 && f->coeff != 1)) return {};
    return {true, f->coeff == 0 ? -1 : f->param, f->c};
  }
  // Copies v's launch-uniform definition (constants, scalar arguments, extents and integer
  // arithmetic on them) to the insertion point: the row a launch's arguments give, computed
  // in the kernel rather than baked in (so runs that differ only in a fixed scalar share one
  // kernel). kNoValue where v reads anything else.
  ValueId copy_to(Rewriter& rw, ValueId v, std::unordered_map<ValueId, ValueId>& done) const {
    if (auto it = done.find(v); it != done.end()) return it->second;
    const Stmt* s = def(v);
    if (!s || !s->blocks.empty()) return kNoValue;
    const OpFamily fam = op_info(s->op).family;
    const bool leaf = s->op == Op::kConst || s->op == Op::kArg || s->op == Op::kShape;
    if (!leaf && fam != OpFamily::kBinary && fam != OpFamily::kCompare &&
        fam != OpFamily::kSelect && fam != OpFamily::kCast && fam != OpFamily::kUnary)
      return kNoValue;
    Stmt c = *s;
    for (ValueId& a : c.args) {
      a = copy_to(rw, a, done);
      if (a == kNoValue) return kNoValue;
    }
    c.result = rw.kernel().fresh();
    return done[v] = rw.insert(std::move(c));
  }
  // Whether v - i is `off` (modulo `wrap` where it is not 0) for every index i in [from, to) of
  // dimension `dim` (v depends on no other): a gathered add's target seen from the candidates
  // that exist there.
  bool always_at(ValueId v, int dim, int64_t from, int64_t to, int64_t off, int64_t wrap = 0) {
    const std::vector<int64_t>* diffs = differences(v, dim);
    if (diffs == nullptr) return false;
    const int64_t b = box_[static_cast<size_t>(dim)].first;
    for (int64_t i = from; i < to; ++i) {
      const int64_t d = (*diffs)[static_cast<size_t>(i - b)] - off;
      if (wrap != 0 ? d % wrap != 0 : d != 0) return false;
    }
    return true;
  }
  // v - i at every index i of dimension `dim`'s extent in the box, evaluated once per value
  // (a gather form asks it for each candidate of each add); nullptr where v cannot be evaluated.
  const std::vector<int64_t>* differences(ValueId v, int dim) {
    const uint64_t key = (uint64_t{v} << 2) | static_cast<uint64_t>(dim);
    auto [it, fresh] = diffs_.try_emplace(key);
    if (fresh) {
      const auto [b, e] = box_[static_cast<size_t>(dim)];
      std::vector<int64_t> d;
      d.reserve(static_cast<size_t>(std::max<int64_t>(e - b, 0)));
      for (int64_t i = b; i < e; ++i) {
        std::optional<int64_t> f = eval(v, dim, i);
        if (!f) break;
        d.push_back(*f - i);
      }
      if (static_cast<int64_t>(d.size()) == e - b) it->second = std::move(d);
    }
    return it->second ? &*it->second : nullptr;
  }
  // Where a launch is known (its scalars' steps and first values) rows use them.
  void set_launch(const std::vector<int64_t>* step, const std::vector<int64_t>* first) {
    step_ = step;
    first_ = first;
  }

 private:
  const Stmt* def(ValueId v) const {
    auto it = defs_.find(v);
    return it == defs_.end() ? nullptr : it->second;
  }
  void collect(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) defs_[s.result] = &s;
      for (const Block& c : s.blocks) collect(c);
    }
  }
  // The dimensions v depends on (a bit each), -1 where it reads anything but constants,
  // extents, indices and integer arithmetic on them.
  int depends(ValueId v, int depth = 0) {
    for (size_t k = 0; k < idx_.size(); ++k) {
      if (v == idx_[k]) return 1 << k;
    }
    const Stmt* s = def(v);
    if (!s || depth > 64) return -1;
    switch (s->op) {
      case Op::kConst: return s->type == DType::kI32 || s->type == DType::kBool ? 0 : -1;
      case Op::kShape:
        return shapes_ && s->param < shapes_->size() && s->dim < (*shapes_)[s->param].size() ? 0
                                                                                             : -1;
      default: break;
    }
    // Integer arithmetic, comparisons and selects (a float operand fails the type check).
    const OpFamily fam = op_info(s->op).family;
    if (fam != OpFamily::kBinary && fam != OpFamily::kCompare && fam != OpFamily::kSelect &&
        s->op != Op::kNot)
      return -1;
    if (s->type != DType::kI32 && s->type != DType::kBool) return -1;
    int m = 0;
    for (ValueId a : s->args) {
      const int d = depends(a, depth + 1);
      if (d < 0) return -1;
      m |= d;
    }
    return m;
  }
  // v's value with dimension `dim`'s index at i (v depends on no other).
  std::optional<int64_t> eval(ValueId v, int dim, int64_t i) {
    if (dim >= 0 && v == idx_[dim]) return i;
    const Stmt* s = def(v);
    if (!s) return std::nullopt;
    if (s->op == Op::kConst) return s->iimm;
    if (s->op == Op::kShape) return (*shapes_)[s->param][s->dim];
    std::array<int64_t, 3> x{};
    for (size_t a = 0; a < s->args.size() && a < 3; ++a) {
      std::optional<int64_t> y = eval(s->args[a], dim, i);
      if (!y) return std::nullopt;
      x[a] = *y;
    }
    return apply(s->op, x[0], x[1], x[2]);
  }
  // An integer op of the kinds depends() admits, on int64 (i32 values do not overflow it).
  static std::optional<int64_t> apply(Op op, int64_t a, int64_t b, int64_t c) {
    switch (op_info(op).family) {
      case OpFamily::kCompare: return compare(op, a, b);
      case OpFamily::kSelect: return a ? b : c;
      case OpFamily::kUnary: return !a;  // not
      default: return binary(op, a, b);
    }
  }
  static std::optional<int64_t> compare(Op op, int64_t a, int64_t b) {
    return compare_values(compare_op(op), a, b) ? 1 : 0;
  }
  static std::optional<int64_t> binary(Op op, int64_t a, int64_t b) {
    switch (op) {
      case Op::kAdd: return a + b;
      case Op::kSub: return a - b;
      case Op::kMul: return a * b;
      case Op::kMin: return std::min(a, b);
      case Op::kMax: return std::max(a, b);
      case Op::kAnd: return a && b;
      case Op::kOr: return a || b;
      // div truncates, mod and floordiv round toward -inf (ir.h); by zero: 0, mod the dividend
      case Op::kDiv: return b == 0 ? 0 : a / b;
      case Op::kFloorDiv:
        if (b == 0) return 0;
        return a / b - ((a % b != 0) && ((a % b < 0) != (b < 0)));
      case Op::kMod: {
        if (b == 0) return a;
        const int64_t r = a % b;
        return r != 0 && ((r < 0) != (b < 0)) ? r + b : r;
      }
      default: return std::nullopt;
    }
  }
  Offset compute(ValueId v) {
    const Stmt* s = def(v);
    const bool is_index = std::find(idx_.begin(), idx_.end(), v) != idx_.end();
    if (!is_index && (!s || s->type != DType::kI32)) return {};
    const int dep = depends(v);
    if (dep < 0) return {};
    if (dep == 0) {
      std::optional<int64_t> c = eval(v, -1, 0);
      if (!c) return {};
      return {true, -1, *c, *c, *c, *c, false};
    }
    if ((dep & (dep - 1)) != 0) return {};  // two dimensions
    int k = 0;
    while (!(dep & (1 << k))) ++k;
    const auto [b, e] = box_[k];
    Offset o{true, k, INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, false};
    const std::vector<int64_t>* diffs = differences(v, k);
    if (diffs == nullptr) return {};
    const std::vector<int64_t>& d = *diffs;
    for (size_t x = 0; x < d.size(); ++x) {
      const int64_t f = d[x] + b + static_cast<int64_t>(x);
      o.amin = std::min(o.amin, f);
      o.amax = std::max(o.amax, f);
    }
    for (int64_t x : d) {
      o.lo = std::min(o.lo, x);
      o.hi = std::max(o.hi, x);
    }
    if (o.hi - o.lo <= 2 * kMaxOffset && o.lo >= -kMaxOffset && o.hi <= kMaxOffset) return o;
    // A wrap-around: the offset modulo the extent, folded into (-n / 2, n / 2] -- unambiguous
    // for a neighbour within kMaxOffset once n > 2 kMaxOffset. Its values must stay inside the
    // box (select(i < 1, n - 1, i - 1)): an index past the extent is an out-of-bounds access the
    // launch reports, which a wrapped neighbour would silently read instead.
    const int64_t n = e - b;
    if (b != 0 || n <= 2 * kMaxOffset || o.amin < 0 || o.amax >= n) return {};
    o.lo = INT64_MAX;
    o.hi = INT64_MIN;
    for (int64_t x : d) {
      int64_t w = ((x % n) + n) % n;
      if (w > n / 2) w -= n;
      o.lo = std::min(o.lo, w);
      o.hi = std::max(o.hi, w);
    }
    if (o.lo < -kMaxOffset || o.hi > kMaxOffset) return {};
    o.periodic = true;
    return o;
  }

  // coeff * scalar `param` + c
  struct Linear {
    int param = -1;
    int64_t coeff = 0, c = 0;
  };
  std::optional<Linear> linear(ValueId v, int depth) const {
    const Stmt* s = def(v);
    if (!s || s->type != DType::kI32 || depth > 32) return std::nullopt;
    if (s->op == Op::kConst) return Linear{-1, 0, s->iimm};
    if (s->op == Op::kArg) {
      const bool fixed = step_ && first_ && s->param < step_->size() && (*step_)[s->param] == 0;
      if (fixed) return Linear{-1, 0, (*first_)[s->param]};
      return Linear{static_cast<int>(s->param), 1, 0};
    }
    if (s->op != Op::kAdd && s->op != Op::kSub && s->op != Op::kMul) return std::nullopt;
    std::optional<Linear> x = linear(s->args[0], depth + 1), y = linear(s->args[1], depth + 1);
    if (!x || !y) return std::nullopt;
    if (s->op == Op::kMul) {
      if (x->coeff != 0 && y->coeff != 0) return std::nullopt;
      if (x->coeff != 0) std::swap(x, y);
      return Linear{y->param, y->coeff * x->c, y->c * x->c};  // x is the constant
    }
    const int64_t sign = s->op == Op::kSub ? -1 : 1;
    if (x->coeff != 0 && y->coeff != 0 && x->param != y->param) return std::nullopt;
    const int param = x->coeff != 0 ? x->param : y->param;
    return Linear{param, x->coeff + sign * y->coeff, x->c + sign * y->c};
  }

  const Box& box_;
  const std::vector<std::vector<int64_t>>* shapes_;
  const std::vector<int64_t>* step_ = nullptr;
  const std::vector<int64_t>* first_ = nullptr;
  std::vector<ValueId> idx_;
  std::unordered_map<ValueId, const Stmt*> defs_;
  std::unordered_map<ValueId, Offset> memo_;
  std::unordered_map<uint64_t, std::optional<std::vector<int64_t>>> diffs_;  // differences()
};

// One access of an array indexed [row, cell] or [cell].
struct Access {
  const Stmt* s = nullptr;
  bool has_row = false;
  Row row;
  std::array<Offset, kMaxTaskDims> cell{};
  bool own_cell = true;  // offset exactly 0 on every axis
  int depth = 0;         // nesting of branches and loops around it
};

// The access's row and cells for a task of `dims` dimensions; nullopt where it is not of the
// form (see the header).
std::optional<Access> classify(Values& vals, const Stmt& s, uint32_t rank, size_t dims) {
  const size_t n_idx = is_array_op(s.op) && s.op != Op::kLoad ? s.args.size() - 1 : s.args.size();
  if (n_idx != rank || (rank != dims && rank != dims + 1)) return std::nullopt;
  Access a;
  a.s = &s;
  a.has_row = rank == dims + 1;
  if (a.has_row) {
    a.row = vals.row(s.args[0]);
    if (!a.row.ok) return std::nullopt;
  }
  for (size_t k = 0; k < dims; ++k) {
    Offset o = vals.offset(s.args[(a.has_row ? 1 : 0) + k]);
    if (!o.ok || o.dim != static_cast<int>(k)) return std::nullopt;
    a.cell[k] = o;
    a.own_cell = a.own_cell && o.lo == 0 && o.hi == 0;
  }
  return a;
}

// Calls f(stmt, depth) for every statement of b (depth: enclosing blocks).
void walk(const Block& b, int depth, const std::function<void(const Stmt&, int)>& f) {
  for (const Stmt& s : b.stmts) {
    f(s, depth);
    for (const Block& c : s.blocks) walk(c, depth + 1, f);
  }
}

bool unsupported(const Kernel& k, std::string* why) {
  bool bad = false;
  walk(k.tasks[0].body, 0, [&](const Stmt& s, int) {
    // (a print or an assert would run again for every halo cell)
    if (s.op >= Op::kStackAlloc || s.op == Op::kSharedAlloc || s.op == Op::kAtomicMax ||
        s.op == Op::kPrint || s.op == Op::kAssert) {
      bad = true;
      if (why) *why = "statement `" + std::string(op_info(s.op).name) + "` cannot be blocked";
    }
  });
  return bad;
}

bool one_task(const Kernel& k, const Box& box, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (k.tasks.size() != 1) return no("not one task");
  const Task& t = k.tasks[0];
  if (t.serial) return no("a serial task");
  const size_t dims = t.dims.empty() ? 1 : t.dims.size();
  if (t.index == kNoValue || dims > kMaxTaskDims || box.size() != dims) return no("no box");
  for (const auto& [b, e] : box) {
    if (e <= b || b < 0) return no("an empty box");
  }
  return !unsupported(k, why);
}

// ---- The gather form ----

// Copies statements of a kernel into another, values renumbered; hooks may replace array
// statements. Definitions precede uses, so one pass suffices.
class Copier {
 public:
  explicit Copier(Rewriter& rw) : rw_(rw) {}
  std::unordered_map<ValueId, ValueId> map;
  // Replaces an array statement: return true when handled (else it is copied).
  std::function<bool(const Stmt&)> on_array;

  ValueId v(ValueId x) const {
    auto it = map.find(x);
    return it == map.end() ? kNoValue : it->second;
  }
  void block(const Block& b) {
    for (const Stmt& s : b.stmts) stmt(s);
  }
  void stmt(const Stmt& src) {
    if (is_array_op(src.op) && on_array && on_array(src)) return;
    Stmt s = src;
    s.args.clear();
    for (Block& b : s.blocks) b.stmts.clear();
    if (src.result != kNoValue) s.result = map[src.result] = rw_.kernel().fresh();
    if (src.blocks.empty()) {
      for (ValueId a : src.args) s.args.push_back(v(a));
      rw_.insert(std::move(s));
      return;
    }
    // Control statements: blocks first (a while's test value is defined in its block 0).
    const size_t at = rw_.block().stmts.size();
    rw_.insert(std::move(s));
    Stmt& placed = rw_.block().stmts[at];
    for (size_t b = 0; b < src.blocks.size(); ++b)
      rw_.in(placed.blocks[b], [&] { block(src.blocks[b]); });
    for (ValueId a : src.args) placed.args.push_back(v(a));
  }

 private:
  Rewriter& rw_;
};

ValueId all(Rewriter& rw, const std::vector<ValueId>& conds) {
  ValueId c = conds.empty() ? kNoValue : conds[0];
  for (size_t i = 1; i < conds.size(); ++i) c = rw.op(Op::kAnd, DType::kBool, {c, conds[i]});
  if (c == kNoValue) {
    Stmt t = rw.make_int(DType::kBool, 1);
    c = rw.insert(std::move(t));
  }
  return c;
}

// The value of row `r` at the insertion point (scalar parameter + c, or c).
ValueId row_value(Rewriter& rw, const Kernel& k, const Row& r, ValueId param_value = kNoValue) {
  if (r.param < 0) return rw.i32(r.c);
  ValueId p =
      param_value != kNoValue ? param_value : rw.arg(DType::kI32, static_cast<uint32_t>(r.param));
  (void)k;
  return r.c == 0 ? p : rw.op(Op::kAdd, DType::kI32, {p, rw.i32(r.c)});
}

// Statements whose only effect is their result (values, loads) or a local nothing loads.
bool effect_free(const Stmt& s, const std::unordered_set<ValueId>& loaded_locals) {
  if (!s.blocks.empty()) return false;
  if (is_pure_value(s.op)) return true;
  if (s.op == Op::kStoreLocal) return !loaded_locals.count(s.args[0]);
  return s.op == Op::kLoad || s.op == Op::kAlloca || s.op == Op::kLoadLocal ||
         s.op == Op::kLoadShared;
}

// Drops what no effect depends on: reverse mode's adjoint recomputes the forward's values,
// which a gather's candidates need only in part, and a load the emitter bounds-checks is not
// dead to the SPIR-V optimizer (its check may raise the error flag), so it is dropped here.
void drop_dead(Kernel& k) {
  for (bool changed = true; changed;) {
    changed = false;
    std::unordered_set<ValueId> used, loaded_locals;
    for (const Task& t : k.tasks) {
      walk(t.body, 0, [&](const Stmt& s, int) {
        if (s.op == Op::kStoreLocal) {
          used.insert(s.args[1]);  // the local itself counts only where it is loaded
        } else {
          for (ValueId a : s.args) used.insert(a);
        }
        if (s.op == Op::kLoadLocal) loaded_locals.insert(s.args[0]);
      });
    }
    std::function<void(Block&)> prune = [&](Block& b) {
      const size_t before = b.stmts.size();
      std::erase_if(b.stmts, [&](const Stmt& s) {
        if (!effect_free(s, loaded_locals)) return false;
        return s.op == Op::kStoreLocal || s.result == kNoValue || !used.count(s.result);
      });
      changed = changed || b.stmts.size() != before;
      for (Stmt& s : b.stmts) {
        for (Block& c : s.blocks) prune(c);
      }
    };
    for (Task& t : k.tasks) prune(t.body);
  }
}

// A fresh task like t (its indices new values of f).
Task fresh_task(Kernel& f, const Task& t) {
  Task n;
  n.name = t.name;
  n.serial = t.serial;
  n.begin = t.begin;
  n.end = t.end;
  n.local_size = t.local_size;
  n.dims = t.dims;
  for (TaskDim& d : n.dims) d.index = f.fresh();
  n.index = n.dims.empty() ? f.fresh() : n.dims[0].index;
  return n;
}

}  // namespace

namespace {

// What gather_form rewrites: the arrays read and added into, their adds, and the candidate
// threads j + [clo, chi] (modulo the extent along `wrap`) that may add into j's cell.
struct GatherAdds {
  std::vector<bool> gathered;  // per parameter
  std::vector<Access> adds;
  std::array<int64_t, kMaxTaskDims> clo{}, chi{};
  std::array<bool, kMaxTaskDims> wrap{};
};

// The arrays both read and added into atomically (none: empty `gathered` flags all false).
Status gathered_arrays(const Kernel& k, GatherAdds* g,
                       const std::function<Status(std::string)>& fail) {
  std::vector<bool> read(k.params.size()), added(k.params.size()), stored(k.params.size());
  walk(k.tasks[0].body, 0, [&](const Stmt& s, int) {
    if (s.op == Op::kLoad) read[s.param] = true;
    if (s.op == Op::kAtomicAdd) added[s.param] = true;
    if (s.op == Op::kStore) stored[s.param] = true;
  });
  g->gathered.assign(k.params.size(), false);
  for (size_t p = 0; p < k.params.size(); ++p) {
    g->gathered[p] = read[p] && added[p];
    if (g->gathered[p] && stored[p])
      return fail("'" + k.params[p].name + "' is stored and added into");
  }
  return {};
}

// The adds into gathered arrays: bounded offsets inside the box, at rows no load of the array
// reads.
Status gather_adds(const Kernel& k, const Box& box, Values& vals, GatherAdds* g,
                   const std::function<Status(std::string)>& fail) {
  const size_t dims = box.size();
  Status bad;
  walk(k.tasks[0].body, 0, [&](const Stmt& s, int depth) {
    if (!bad.ok() || s.op != Op::kAtomicAdd || !g->gathered[s.param]) return;
    std::optional<Access> a = classify(vals, s, k.params[s.param].rank, dims);
    if (!a) {
      bad = fail("an atomic add into '" + k.params[s.param].name + "' at no bounded offset");
      return;
    }
    for (size_t d = 0; d < dims; ++d) {
      const Offset& o = a->cell[d];
      if (o.amin < box[d].first || o.amax >= box[d].second) {
        bad = fail("an atomic add into '" + k.params[s.param].name + "' may land outside the box");
        return;
      }
      g->clo[d] = std::min(g->clo[d], -o.hi);
      g->chi[d] = std::max(g->chi[d], -o.lo);
      g->wrap[d] = g->wrap[d] || o.periodic;
    }
    a->depth = depth;
    g->adds.push_back(*a);
  });
  VKAD_TRY(bad);
  walk(k.tasks[0].body, 0, [&](const Stmt& s, int) {
    if (!bad.ok() || s.op != Op::kLoad || !g->gathered[s.param]) return;
    std::optional<Access> l = classify(vals, s, k.params[s.param].rank, dims);
    if (!l || !l->has_row) {
      bad = fail("'" + k.params[s.param].name + "' is read where it is added into");
      return;
    }
    for (const Access& a : g->adds) {
      if (a.s->param == s.param && (!a.has_row || a.row == l->row || a.row.param != l->row.param))
        bad = fail("'" + k.params[s.param].name + "' is read at a row it is added into");
    }
  });
  VKAD_TRY(bad);
  int64_t candidates = 1;
  for (size_t d = 0; d < dims; ++d) candidates *= g->chi[d] - g->clo[d] + 1;
  if (candidates > 27) return fail("more than 27 threads add into one cell");
  return {};
}

// Whether thread j + o's add `a` may land on j: -o within a's offsets on every axis.
bool reaches(const Access& a, const std::array<int64_t, kMaxTaskDims>& o, size_t dims) {
  for (size_t d = 0; d < dims; ++d) {
    if (-o[d] < a.cell[d].lo || -o[d] > a.cell[d].hi) return false;
  }
  return true;
}

// Whether thread j + o's add `a` lands on j wherever both are in the box: its target is i - o
// on every axis at every i = j + o the box holds (a clamp min(i + 1, n - 1) seen from
// o = -1, where i stops at n - 2; along a wrapping axis every i, modulo the extent). Its compare
// with j is then true and left out.
bool always_lands(Values& vals, const Box& box, const GatherAdds& g, const Access& a,
                  const std::array<int64_t, kMaxTaskDims>& o, size_t dims) {
  const size_t lead = a.s->args.size() - 1 - dims;
  for (size_t d = 0; d < dims; ++d) {
    const ValueId v = a.s->args[lead + d];
    if (g.wrap[d]) {  // i = (j + o) mod n for every j: each i of the box (which starts at 0)
      const int64_t n = box[d].second;
      if (!vals.always_at(v, static_cast<int>(d), 0, n, -o[d], n)) return false;
      continue;
    }
    const int64_t from = std::max(box[d].first, box[d].first + o[d]);
    const int64_t to = std::min(box[d].second, box[d].second + o[d]);
    if (!vals.always_at(v, static_cast<int>(d), from, to, -o[d])) return false;
  }
  return true;
}

// One candidate thread i = j + o's body at the insertion point: its adds into gathered arrays
// that land on j into their sums (`acc`), its other writes only where o = 0 (j's own body).
void gather_candidate(Rewriter& rw, Values& vals, const Kernel& k, const Box& box,
                      const GatherAdds& g, const std::vector<ValueId>& old_index,
                      const std::vector<ValueId>& j, const std::array<int64_t, kMaxTaskDims>& o,
                      const std::unordered_map<const Stmt*, ValueId>& acc) {
  const size_t dims = box.size();
  bool self = true;
  std::vector<ValueId> i(dims), inside;
  for (size_t e = 0; e < dims; ++e) {
    self = self && o[e] == 0;
    i[e] = o[e] == 0 ? j[e] : rw.op(Op::kAdd, DType::kI32, {j[e], rw.i32(o[e])});
    if (o[e] != 0 && g.wrap[e]) {  // (the box starts at 0: Offset::periodic)
      i[e] = rw.op(Op::kMod, DType::kI32, {i[e], rw.i32(box[e].second)});
      continue;
    }
    if (o[e] < 0) inside.push_back(rw.op(Op::kGe, DType::kBool, {i[e], rw.i32(box[e].first)}));
    if (o[e] > 0) inside.push_back(rw.op(Op::kLt, DType::kBool, {i[e], rw.i32(box[e].second)}));
    // The body runs only where i is inside the box, so i clamped to the box is i there; said
    // clamped, its accesses stay inside the box at every j, which a blocked kernel reads from
    // shared memory with no test of its own (Blocker::access).
    if (o[e] < 0) i[e] = rw.op(Op::kMax, DType::kI32, {i[e], rw.i32(box[e].first)});
    if (o[e] > 0) i[e] = rw.op(Op::kMin, DType::kI32, {i[e], rw.i32(box[e].second - 1)});
  }
  Copier c(rw);
  for (size_t e = 0; e < dims; ++e) c.map[old_index[e]] = i[e];
  std::unordered_map<const Stmt*, const Access*> add_of;
  for (const Access& a : g.adds) add_of[a.s] = &a;
  c.on_array = [&](const Stmt& s) {
    if (s.op == Op::kLoad) return false;
    if (s.op != Op::kAtomicAdd || !g.gathered[s.param]) return !self;  // j's own body only
    // An add whose offsets never reach j from this candidate is left out (and what only it
    // needed is then dead: the candidates of a 5-point stencil compute one term each).
    const Access& a = *add_of.at(&s);
    if (!reaches(a, o, dims)) return true;
    // Thread i's add lands on j: into this statement's sum.
    const ValueId val = c.v(s.args.back());
    const ValueId sum = acc.at(&s);
    const DType ty = k.params[s.param].dtype;
    auto add = [&] { rw.store_local(sum, rw.op(Op::kAdd, ty, {rw.load_local(sum, ty), val})); };
    if (always_lands(vals, box, g, a, o, dims)) {
      add();
      return true;
    }
    const size_t lead = s.args.size() - 1 - dims;
    std::vector<ValueId> eq;
    for (size_t e = 0; e < dims; ++e)
      eq.push_back(rw.op(Op::kEq, DType::kBool, {c.v(s.args[lead + e]), j[e]}));
    rw.if_(all(rw, eq), [&](int side) {
      if (side == 0) add();
    });
    return true;
  };
  if (inside.empty()) {
    c.block(k.tasks[0].body);
    return;
  }
  rw.if_(all(rw, inside), [&](int side) {
    if (side == 0) c.block(k.tasks[0].body);
  });
}

}  // namespace

Result<Kernel> gather_form(const Kernel& k, const Box& box,
                           const std::vector<std::vector<int64_t>>& shapes,
                           const std::vector<int64_t>* step, const std::vector<int64_t>* first) {
  const std::function<Status(std::string)> fail = [&](const std::string& w) {
    return make_error(ErrorCode::kInvalidArgument, "gather_form '" + k.name + "': " + w);
  };
  std::string why;
  if (!one_task(k, box, &why)) return fail(why);
  const Task& t = k.tasks[0];
  const size_t dims = box.size();
  GatherAdds g;
  VKAD_TRY(gathered_arrays(k, &g, fail));
  if (std::find(g.gathered.begin(), g.gathered.end(), true) == g.gathered.end()) return k;
  Values vals(t, box, &shapes);
  vals.set_launch(step, first);
  VKAD_TRY(gather_adds(k, box, vals, &g, fail));

  Kernel f;
  f.name = k.name + "_gather";
  f.params = k.params;
  f.next_id = k.next_id;
  Task nt = fresh_task(f, t);
  const std::vector<ValueId> j = task_indices(nt);
  Rewriter rw(f);
  std::unordered_map<const Stmt*, ValueId> acc;
  rw.in(nt.body, [&] {
    for (const Access& a : g.adds) acc[a.s] = rw.op(Op::kAlloca, k.params[a.s->param].dtype, {});
    std::array<int64_t, kMaxTaskDims> o{};
    std::function<void(size_t)> each = [&](size_t d) {
      if (d < dims) {
        for (o[d] = g.clo[d]; o[d] <= g.chi[d]; ++o[d]) each(d + 1);
        return;
      }
      bool any = false;  // (a candidate no add reaches from only costs)
      for (const Access& a : g.adds) any = any || reaches(a, o, dims);
      if (any || o == std::array<int64_t, kMaxTaskDims>{}) {
        gather_candidate(rw, vals, k, box, g, vals.indices(), j, o, acc);
      }
    };
    each(0);
    // Each sum into its own element (no other thread touches it: rows differ from the loads').
    std::unordered_map<ValueId, ValueId> copied;
    for (const Access& a : g.adds) {
      const ValueId sum = acc.at(a.s);
      const DType ty = k.params[a.s->param].dtype;
      std::vector<ValueId> idx;
      if (a.has_row) {
        ValueId row = vals.copy_to(rw, a.s->args[0], copied);
        idx.push_back(row != kNoValue ? row : row_value(rw, k, a.row));
      }
      for (size_t e = 0; e < dims; ++e) idx.push_back(j[e]);
      const ValueId old = rw.access(Op::kLoad, ty, a.s->param, idx);
      std::vector<ValueId> st = idx;
      st.push_back(rw.op(Op::kAdd, ty, {old, rw.load_local(sum, ty)}));
      rw.access(Op::kStore, DType::kF32, a.s->param, st);
    }
  });
  f.tasks.push_back(std::move(nt));
  drop_dead(f);
  VKAD_TRY(verify(f));
  return f;
}

namespace {

// ---- The blocking plan ----

struct SlotKey {
  uint32_t param = 0;
  bool has_row = false;
  int64_t row = 0;  // relative to the first launch's row parameter (or the constant row)
  bool operator<(const SlotKey& o) const {
    return std::tie(param, has_row, row) < std::tie(o.param, o.has_row, o.row);
  }
};

struct Plan {
  Kernel kernel;  // the gather form of the launch's kernel
  size_t dims = 0;
  std::vector<bool> carried, written;
  std::vector<Access> loads, stores;  // of carried arrays
  std::array<int64_t, kMaxTaskDims> rlo{}, rhi{};
  std::array<int64_t, kMaxTaskDims> tile{};
  std::array<bool, kMaxTaskDims> periodic{};  // some carried access wraps around the box
  int64_t local = 0;
  int row_param = -1;  // the scalar every carried row is built on (-1: none)
  // The one element type of the carried arrays (the stash's), where they share one.
  std::optional<DType> carried_type;
};

using Fail = std::function<Status(const std::string&)>;

// A write-only array's store: at the thread's own cell, the other axes launch-uniform.
Status write_only_store(const Stmt& s, const Param& prm, Values& vals, size_t dims,
                        const std::unordered_set<ValueId>& uniform, const Fail& fail) {
  std::vector<bool> seen_dim(dims, false);
  for (size_t a = 0; a + 1 < s.args.size(); ++a) {
    const ValueId x = s.args[a];
    Offset o = vals.offset(x);
    if (o.ok && o.dim >= 0 && o.lo == 0 && o.hi == 0 && x == vals.indices()[o.dim]) {
      seen_dim[o.dim] = true;
    } else if (!uniform.count(x)) {
      return fail("a store into '" + prm.name + "' at another thread's element");
    }
  }
  if (std::find(seen_dim.begin(), seen_dim.end(), false) != seen_dim.end())
    return fail("a store into '" + prm.name + "' not at the thread's own cell");
  return {};
}

// An access of a carried array into p.loads / p.stores; `row_param` the one scalar the rows
// are built on so far (-2: none yet).
Status carried_access(const Stmt& s, int depth, Values& vals, Plan& p, int* row_param,
                      const Fail& fail) {
  const Kernel& k = p.kernel;
  const Param& prm = k.params[s.param];
  if (s.op == Op::kAtomicAdd)
    return fail("an atomic add into '" + prm.name + "', which it also reads");
  std::optional<Access> a = classify(vals, s, prm.rank, p.dims);
  if (!a) return fail("an access of '" + prm.name + "' at no bounded offset of the thread's cell");
  if (a->has_row) {
    if (a->row.param >= 0 && (k.params[a->row.param].kind != ParamKind::kScalar ||
                              k.params[a->row.param].dtype != DType::kI32)) {
      return fail("a row of '" + prm.name + "' built on a parameter that is not an i32 scalar");
    }
    if (*row_param != -2 && *row_param != a->row.param)
      return fail("rows built on two different parameters");
    *row_param = a->row.param;
  }
  a->depth = depth;
  if (s.op != Op::kStore) {
    p.loads.push_back(*a);
    return {};
  }
  if (!a->own_cell) return fail("a store into '" + prm.name + "' at another thread's cell");
  p.stores.push_back(*a);
  return {};
}

// Which arrays are written, and carried (read and written); false when none is carried.
bool carried_arrays(Plan& p) {
  const Kernel& k = p.kernel;
  std::vector<bool> read(k.params.size());
  p.written.assign(k.params.size(), false);
  walk(k.tasks[0].body, 0, [&](const Stmt& s, int) {
    if (s.op == Op::kLoad) read[s.param] = true;
    if (s.op == Op::kStore || s.op == Op::kAtomicAdd) p.written[s.param] = true;
  });
  p.carried.assign(k.params.size(), false);
  bool any = false;
  for (size_t q = 0; q < k.params.size(); ++q) {
    p.carried[q] = read[q] && p.written[q];
    any = any || p.carried[q];
    if (!p.carried[q]) continue;
    const DType ty = k.params[q].dtype;
    if (!p.carried_type) p.carried_type = ty;
    if (*p.carried_type != ty) p.carried_type = DType::kBool;  // mixed: no stash
  }
  if (p.carried_type == DType::kBool) p.carried_type.reset();
  return any;
}

// The reach and periodic dimensions of the loads, and the tile.
void reach_and_tile(Plan& p) {
  for (const Access& ld : p.loads) {
    for (size_t d = 0; d < p.dims; ++d) {
      p.rlo[d] = std::max(p.rlo[d], -ld.cell[d].lo);
      p.rhi[d] = std::max(p.rhi[d], ld.cell[d].hi);
      p.periodic[d] = p.periodic[d] || ld.cell[d].periodic;
    }
  }
  static constexpr std::array<std::array<int64_t, 3>, 3> kTiles = {
      {{256, 1, 1}, {16, 16, 1}, {8, 8, 4}}};
  p.local = 1;
  for (size_t d = 0; d < p.dims; ++d) {
    p.tile[d] = kTiles[p.dims - 1][d];
    p.local *= p.tile[d];
  }
}

// Fills `p` in place: its accesses point into p.kernel, which must not move afterwards.
Status plan_of(const StencilLaunch& l, Plan& p) {
  const Fail fail = [&](const std::string& w) {
    return make_error(ErrorCode::kInvalidArgument,
                      "stencil '" + (l.kernel ? l.kernel->name : std::string("?")) + "': " + w);
  };
  if (!l.kernel) return fail("no kernel");
  std::string why;
  if (!one_task(*l.kernel, l.box, &why)) return fail(why);
  const Kernel& k0 = *l.kernel;
  if (l.arrays.size() != k0.params.size() || l.step.size() != k0.params.size())
    return fail("the launch does not match its kernel");
  // Two parameters bound to one array would alias what the analysis tells apart.
  std::unordered_set<uint64_t> seen;
  for (uint64_t a : l.arrays) {
    if (a != 0 && !seen.insert(a).second) return fail("one array bound to two parameters");
  }
  VKAD_ASSIGN_OR_RETURN(p.kernel, gather_form(k0, l.box, l.shapes, &l.step, &l.first));
  const Kernel& k = p.kernel;
  p.dims = l.box.size();
  Values vals(k.tasks[0], l.box, &l.shapes);
  vals.set_launch(&l.step, &l.first);
  if (!carried_arrays(p)) return fail("no array is both read and written");
  const std::unordered_set<ValueId> uniform = launch_uniform_values(k);
  int row_param = -2;
  Status bad;
  walk(k.tasks[0].body, 0, [&](const Stmt& s, int depth) {
    if (!bad.ok() || !is_array_op(s.op)) return;
    if (p.carried[s.param]) {
      bad = carried_access(s, depth, vals, p, &row_param, fail);
    } else if (s.op == Op::kStore) {  // (reads anywhere; atomic adds commute)
      bad = write_only_store(s, k.params[s.param], vals, p.dims, uniform, fail);
    }
  });
  VKAD_TRY(bad);
  p.row_param = row_param >= 0 ? row_param : -1;
  // A load of a row the launch stores: at the thread's own cell (else the launch races).
  for (const Access& ld : p.loads) {
    for (const Access& st : p.stores) {
      if (ld.s->param == st.s->param && ld.row == st.row && !ld.own_cell)
        return fail("'" + k.params[ld.s->param].name + "' is read around a row it stores");
    }
  }
  reach_and_tile(p);
  return {};
}

// The relative row of an access by launch r of the run (step: its row parameter's per launch).
SlotKey key_of(const Access& a, uint32_t r, const StencilLaunch& l) {
  SlotKey s;
  s.param = a.s->param;
  s.has_row = a.has_row;
  if (a.has_row) {
    s.row = a.row.c + (a.row.param >= 0 ? static_cast<int64_t>(r) * l.step[a.row.param] : 0);
  }
  return s;
}

// Region r (r = -1 .. K - 1) of a tile, per dimension: [origin - lo, origin + tile + hi).
int64_t grow_lo(const Plan& p, size_t d, uint32_t K, int r) { return p.rlo[d] * (K - 1 - r); }
int64_t grow_hi(const Plan& p, size_t d, uint32_t K, int r) { return p.rhi[d] * (K - 1 - r); }
int64_t region_cells(const Plan& p, uint32_t K, int r) {
  int64_t n = 1;
  for (size_t d = 0; d < p.dims; ++d) n *= p.tile[d] + grow_lo(p, d, K, r) + grow_hi(p, d, K, r);
  return n;
}

std::map<SlotKey, size_t> slots_of(const Plan& p, const StencilLaunch& l, uint32_t K) {
  std::map<SlotKey, size_t> slots;
  for (uint32_t r = 0; r < K; ++r) {
    for (const Access& st : p.stores) slots.emplace(key_of(st, r, l), slots.size());
  }
  return slots;
}

size_t slot_bytes(const Plan& p, const std::map<SlotKey, size_t>& slots, uint32_t K) {
  size_t bytes = 0;
  for (const auto& [key, i] : slots)
    bytes += abi::dtype_bytes(p.kernel.params[key.param].dtype) *
             static_cast<size_t>(region_cells(p, K, -1));
  return bytes;
}

// Whether a launch of the K reads `key` before one stores it at every cell (its values from
// before the dispatch are needed).
bool read_before_written(const Plan& p, const StencilLaunch& l, uint32_t K, const SlotKey& key) {
  auto same = [](const SlotKey& a, const SlotKey& b) { return !(a < b) && !(b < a); };
  int first_store = -1, first_load = -1;
  for (uint32_t r = 0; r < K && (first_store < 0 || first_load < 0); ++r) {
    for (const Access& st : p.stores) {
      if (first_store < 0 && st.depth == 0 && same(key_of(st, r, l), key))
        first_store = static_cast<int>(r);
    }
    for (const Access& ld : p.loads) {
      if (first_load < 0 && same(key_of(ld, r, l), key)) first_load = static_cast<int>(r);
    }
  }
  return first_load >= 0 && (first_store < 0 || first_load <= first_store);
}

// Whether the rows read before written can come from a stash: every carried row built on one
// stepping i32 scalar, the carried arrays of one element type, the run's first value known.
bool stash_possible(const Plan& p, const StencilLaunch& l) {
  return p.row_param >= 0 && l.step[p.row_param] != 0 && p.carried_type &&
         static_cast<size_t>(p.row_param) < l.first.size();
}

bool needs_stash(const Plan& p, const StencilLaunch& l, uint32_t K) {
  for (const auto& [key, i] : slots_of(p, l, K)) {
    if (read_before_written(p, l, K, key)) return true;
  }
  return false;
}

int64_t box_cells(const StencilLaunch& l) {
  int64_t n = 1;
  for (const auto& [b, e] : l.box) n *= e - b;
  return n;
}

int64_t tiles_of(const Plan& p, const StencilLaunch& l) {
  int64_t groups = 1;
  for (size_t d = 0; d < p.dims; ++d)
    groups *= (l.box[d].second - l.box[d].first + p.tile[d] - 1) / p.tile[d];
  return groups;
}

// The row-major index of cell xw within the box (relative to its first cell), at the
// insertion point: the stash's layout, shared by the blocked kernel and its prologue.
ValueId box_index(Rewriter& rw, const StencilLaunch& l, const std::vector<ValueId>& xw) {
  ValueId at = kNoValue;
  for (size_t d = 0; d < l.box.size(); ++d) {
    const ValueId c = rw.op(Op::kSub, DType::kI32, {xw[d], rw.i32(l.box[d].first)});
    const int64_t n = l.box[d].second - l.box[d].first;
    at = at == kNoValue
             ? c
             : rw.op(Op::kAdd, DType::kI32, {rw.op(Op::kMul, DType::kI32, {at, rw.i32(n)}), c});
  }
  return at;
}

uint32_t choose_steps(const Plan& p, const StencilLaunch& l, uint32_t shared_bytes) {
  const int64_t tile_cells = p.local;
  if (tiles_of(p, l) < l.min_tiles) return 0;
  for (uint32_t K = kMaxStencilSteps; K >= 2; --K) {
    // A row read before it is written would have to be read around the tile from the array
    // while the neighbouring tiles write their cells of it back in the same dispatch (a
    // gathered adjoint adding into rows that hold earlier sums): not race-free, so not blocked.
    bool racy = false;
    for (const auto& [key, i] : slots_of(p, l, K)) racy = racy || read_before_written(p, l, K, key);
    if (racy && !stash_possible(p, l)) return 0;
    bool wraps_onto_itself = false;  // a periodic region longer than the box
    for (size_t d = 0; d < p.dims; ++d) {
      wraps_onto_itself =
          wraps_onto_itself || (p.periodic[d] && p.tile[d] + (p.rlo[d] + p.rhi[d]) * K >
                                                     l.box[d].second - l.box[d].first);
    }
    if (wraps_onto_itself) continue;
    if (slot_bytes(p, slots_of(p, l, K), K) > shared_bytes) continue;
    int64_t work = 0;
    for (uint32_t r = 0; r < K; ++r) work += region_cells(p, K, static_cast<int>(r));
    if (work > 2 * static_cast<int64_t>(K) * tile_cells) continue;
    return K;
  }
  return 0;
}

}  // namespace

uint32_t stencil_steps(const StencilLaunch& l, uint32_t shared_bytes, std::string* why) {
  Plan p;
  Status st = plan_of(l, p);
  if (!st.ok()) {
    if (why) *why = st.message();
    return 0;
  }
  const uint32_t K = choose_steps(p, l, shared_bytes);
  if (K == 0 && why && tiles_of(p, l) < l.min_tiles) {
    *why = "the box has " + std::to_string(tiles_of(p, l)) + " tiles, fewer than " +
           std::to_string(l.min_tiles);
  } else if (K == 0 && why) {
    *why =
        "a row is read before the run writes it and no stash can hold it (rows built on "
        "more than one scalar or none that steps, carried arrays of two element types), or "
        "no number of steps fits the shared memory and the halo";
  }
  return K;
}

namespace {

// Builds the blocked kernel's body (see the header) at the rewriter's insertion point.
// The array row of slot `key` at the insertion point: the row a store's index computes from
// the launch's arguments (the run's first launch's, as the dispatch gets them), moved by the
// key's distance from that store's row -- computed, not baked, so runs that differ only in a
// scalar that does not step (smoke's t) share one kernel.
ValueId slot_row(Rewriter& rw, const Plan& p, const StencilLaunch& l, const SlotKey& key) {
  for (const Access& st : p.stores) {
    if (!st.has_row) continue;
    const Values vals(p.kernel.tasks[0], l.box, &l.shapes);
    std::unordered_map<ValueId, ValueId> done;
    const ValueId base = vals.copy_to(rw, st.s->args[0], done);
    if (base == kNoValue) break;
    const int64_t by = key.row - key_of(st, 0, l).row;
    return by == 0 ? base : rw.op(Op::kAdd, DType::kI32, {base, rw.i32(by)});
  }
  return rw.op(Op::kAdd, DType::kI32,
               {rw.arg(DType::kI32, static_cast<uint32_t>(p.row_param)), rw.i32(key.row)});
}

class Blocker {
 public:
  Blocker(const Plan& p, const StencilLaunch& l, uint32_t K, Kernel& f, Rewriter& rw, int64_t group,
          int stash_param = -1)
      : p_(p),
        l_(l),
        steps_(K),
        f_(f),
        rw_(rw),
        slots_(slots_of(p, l, K)),
        group_(group),
        stash_(stash_param) {}

  void body(ValueId g) {
    const int64_t L = group_;
    const ValueId wg = rw_.op(Op::kFloorDiv, DType::kI32, {g, rw_.i32(L)});
    local_ = rw_.op(Op::kMod, DType::kI32, {g, rw_.i32(L)});
    // The tile's origin: workgroup wg's coordinates, the last dimension fastest.
    ValueId rest = wg;
    origin_.assign(p_.dims, kNoValue);
    for (size_t d = p_.dims; d-- > 0;) {
      const int64_t n = (l_.box[d].second - l_.box[d].first + p_.tile[d] - 1) / p_.tile[d];
      const ValueId c = d == 0 ? rest : rw_.op(Op::kMod, DType::kI32, {rest, rw_.i32(n)});
      if (d != 0) rest = rw_.op(Op::kFloorDiv, DType::kI32, {rest, rw_.i32(n)});
      origin_[d] = rw_.op(
          Op::kAdd, DType::kI32,
          {rw_.op(Op::kMul, DType::kI32, {c, rw_.i32(p_.tile[d])}), rw_.i32(l_.box[d].first)});
    }
    for (const auto& [key, i] : slots_) {
      Stmt s = rw_.make(Op::kSharedAlloc, p_.kernel.params[key.param].dtype);
      s.iimm = region_cells(p_, steps_, -1);
      shared_.push_back(rw_.insert(std::move(s)));
    }
    // What an earlier pass of the grid-stride loop left in shared memory is read no more.
    rw_.op(Op::kBarrier, DType::kF32, {});
    if (stash_ >= 0) {
      // This dispatch's half of the stash: its place in the run, mod 2.
      const int64_t per = static_cast<int64_t>(steps_) * l_.step[p_.row_param];
      const ValueId first = rw_.arg(DType::kI32, static_cast<uint32_t>(p_.row_param));
      const ValueId since = rw_.op(Op::kSub, DType::kI32, {first, rw_.i32(l_.first[p_.row_param])});
      const ValueId b = rw_.op(Op::kFloorDiv, DType::kI32, {since, rw_.i32(per)});
      phase_ = rw_.op(Op::kMod, DType::kI32, {b, rw_.i32(2)});
      preload();
    }
    for (uint32_t r = 0; r < steps_; ++r) member(r);
    if (stash_ >= 0) stash_next();
  }

  // The element of the stash for slot j of half `half` at cell xw (inside the box).
  ValueId stash_at(ValueId half, size_t j, const std::vector<ValueId>& xw) {
    const ValueId at = box_index(rw_, l_, xw);
    const int64_t S = static_cast<int64_t>(slots_.size());
    const ValueId slot = rw_.op(
        Op::kAdd, DType::kI32,
        {rw_.op(Op::kMul, DType::kI32, {half, rw_.i32(S)}), rw_.i32(static_cast<int64_t>(j))});
    return rw_.op(Op::kAdd, DType::kI32,
                  {rw_.op(Op::kMul, DType::kI32, {slot, rw_.i32(box_cells(l_))}), at});
  }

 private:
  // The rows read before written, around the tile, from this dispatch's half of the stash.
  void preload() {
    std::vector<std::pair<size_t, SlotKey>> need;
    for (const auto& [key, i] : slots_) {
      if (read_before_written(p_, l_, steps_, key)) need.push_back({i, key});
    }
    const DType ty = *p_.carried_type;
    each_cell(-1, [&](const std::vector<ValueId>& x, const std::vector<ValueId>& xw) {
      for (const auto& [i, key] : need) {
        const ValueId v =
            rw_.access(Op::kLoad, ty, static_cast<uint32_t>(stash_), {stash_at(phase_, i, xw)});
        rw_.op(Op::kStoreShared, DType::kF32, {shared_[i], lin(x), v});
      }
    });
    rw_.op(Op::kBarrier, DType::kF32, {});
  }
  // The next dispatch's rows at the tile's cells into the other half: a row this one wrote
  // from shared memory, any other from the array (which no launch of this dispatch writes).
  void stash_next() {
    const DType ty = *p_.carried_type;
    const int64_t shift = static_cast<int64_t>(steps_) * l_.step[p_.row_param];
    const ValueId other = rw_.op(Op::kSub, DType::kI32, {rw_.i32(1), phase_});
    each_cell(static_cast<int>(steps_) - 1, [&](const std::vector<ValueId>& x,
                                                const std::vector<ValueId>& xw) {
      rw_.if_(interior(x), [&](int side) {
        if (side != 0) return;
        for (const auto& [key, j] : slots_) {
          SlotKey next = key;
          if (next.has_row) next.row += shift;
          auto mine = slots_.find(next);
          if (mine != slots_.end()) {
            const ValueId v = rw_.op(Op::kLoadShared, ty, {shared_[mine->second], lin(x)});
            rw_.access(Op::kStore, DType::kF32, static_cast<uint32_t>(stash_),
                       {stash_at(other, j, xw), v});
            continue;
          }
          std::vector<ValueId> idx;
          ValueId row_ok = kNoValue;
          if (next.has_row) {
            // Past the array's rows there is no next dispatch (the run's last).
            const ValueId row = slot_row(rw_, p_, l_, next);
            Stmt ext = rw_.make(Op::kShape, DType::kI32);
            ext.param = next.param;
            ext.dim = 0;
            const ValueId rows = rw_.insert(std::move(ext));
            row_ok = rw_.op(Op::kAnd, DType::kBool,
                            {rw_.op(Op::kGe, DType::kBool, {row, rw_.i32(0)}),
                             rw_.op(Op::kLt, DType::kBool, {row, rows})});
            idx.push_back(row);
          }
          idx.insert(idx.end(), xw.begin(), xw.end());
          const size_t slot = j;  // (a structured binding: not captured by a lambda in C++17)
          auto copy = [&] {
            const ValueId v = rw_.access(Op::kLoad, ty, next.param, idx);
            rw_.access(Op::kStore, DType::kF32, static_cast<uint32_t>(stash_),
                       {stash_at(other, slot, xw), v});
          };
          if (row_ok == kNoValue) {
            copy();
          } else {
            rw_.if_(row_ok, [&](int side2) {
              if (side2 == 0) copy();
            });
          }
        }
      });
    });
  }

 public:
 private:
  // Calls f(cell, wrapped) for each cell of region r inside the box, per dimension; along a
  // periodic dimension the region reaches past the box and `wrapped` is the cell it stands for
  // (elsewhere the two are equal).
  template <typename F>
  void each_cell(int r, F&& f) {
    std::vector<int64_t> ext(p_.dims);
    int64_t cells = 1;
    for (size_t d = 0; d < p_.dims; ++d) {
      ext[d] = p_.tile[d] + grow_lo(p_, d, steps_, r) + grow_hi(p_, d, steps_, r);
      cells *= ext[d];
    }
    const int64_t passes = (cells + group_ - 1) / group_;
    auto one = [&](ValueId pass) {
      ValueId n = local_;
      if (pass != kNoValue)
        n = rw_.op(Op::kAdd, DType::kI32,
                   {n, rw_.op(Op::kMul, DType::kI32, {pass, rw_.i32(group_)})});
      rw_.if_(rw_.op(Op::kLt, DType::kBool, {n, rw_.i32(cells)}), [&](int side) {
        if (side != 0) return;
        std::vector<ValueId> x(p_.dims), xw(p_.dims);
        ValueId rest = n;
        std::vector<ValueId> inside;
        for (size_t d = p_.dims; d-- > 0;) {
          const ValueId c = d == 0 ? rest : rw_.op(Op::kMod, DType::kI32, {rest, rw_.i32(ext[d])});
          if (d != 0) rest = rw_.op(Op::kFloorDiv, DType::kI32, {rest, rw_.i32(ext[d])});
          x[d] = rw_.op(
              Op::kAdd, DType::kI32,
              {origin_[d], rw_.op(Op::kSub, DType::kI32, {c, rw_.i32(grow_lo(p_, d, steps_, r))})});
          if (p_.periodic[d]) {
            // Around the box's edge: the cell it wraps to (mod rounds toward -inf).
            xw[d] = rw_.op(Op::kMod, DType::kI32, {x[d], rw_.i32(l_.box[d].second)});
          } else {
            xw[d] = x[d];
            inside.push_back(in_range(x[d], d));
          }
        }
        rw_.if_(all(rw_, inside), [&](int s2) {
          if (s2 == 0) f(x, xw);
        });
      });
    };
    if (passes == 1) {
      one(kNoValue);
    } else {
      const ValueId zero = rw_.i32(0);
      rw_.for_(zero, rw_.i32(passes), std::nullopt, one);
    }
  }
  ValueId in_range(ValueId x, size_t d) {
    return rw_.op(Op::kAnd, DType::kBool,
                  {rw_.op(Op::kGe, DType::kBool, {x, rw_.i32(l_.box[d].first)}),
                   rw_.op(Op::kLt, DType::kBool, {x, rw_.i32(l_.box[d].second)})});
  }
  // The element of a shared array for cell y (inside region -1).
  ValueId lin(const std::vector<ValueId>& y) {
    ValueId at = kNoValue;
    for (size_t d = 0; d < p_.dims; ++d) {
      const int64_t ext = p_.tile[d] + grow_lo(p_, d, steps_, -1) + grow_hi(p_, d, steps_, -1);
      const ValueId base =
          rw_.op(Op::kSub, DType::kI32, {origin_[d], rw_.i32(grow_lo(p_, d, steps_, -1))});
      const ValueId c = rw_.op(Op::kSub, DType::kI32, {y[d], base});
      at = at == kNoValue ? c
                          : rw_.op(Op::kAdd, DType::kI32,
                                   {rw_.op(Op::kMul, DType::kI32, {at, rw_.i32(ext)}), c});
    }
    return at;
  }
  ValueId interior(const std::vector<ValueId>& x) {
    std::vector<ValueId> in;
    for (size_t d = 0; d < p_.dims; ++d) {
      in.push_back(rw_.op(Op::kGe, DType::kBool, {x[d], origin_[d]}));
      in.push_back(
          rw_.op(Op::kLt, DType::kBool,
                 {x[d], rw_.op(Op::kAdd, DType::kI32, {origin_[d], rw_.i32(p_.tile[d])})}));
      // The last tile's cells past a periodic box wrap onto the first tile's: not its own.
      if (p_.periodic[d]) in.push_back(in_range(x[d], d));
    }
    return all(rw_, in);
  }

  void member(uint32_t r) {
    // This launch's scalars: the first launch's + r * step.
    std::unordered_map<uint32_t, ValueId> scalars;
    for (size_t q = 0; q < l_.step.size(); ++q) {
      if (l_.step[q] == 0) continue;
      scalars[static_cast<uint32_t>(q)] = rw_.op(Op::kAdd, DType::kI32,
                                                 {rw_.arg(DType::kI32, static_cast<uint32_t>(q)),
                                                  rw_.i32(static_cast<int64_t>(r) * l_.step[q])});
    }
    const Task& t = p_.kernel.tasks[0];
    std::unordered_map<const Stmt*, const Access*> acc;
    for (const Access& a : p_.loads) acc[a.s] = &a;
    for (const Access& a : p_.stores) acc[a.s] = &a;
    each_cell(static_cast<int>(r),
              [&](const std::vector<ValueId>& x, const std::vector<ValueId>& xw) {
                const ValueId own = interior(x);
                Copier c(rw_);
                const std::vector<ValueId> old = task_indices(t);
                for (size_t d = 0; d < p_.dims; ++d) c.map[old[d]] = xw[d];
                c.on_array = [&](const Stmt& s) { return access(c, s, r, x, xw, own, acc); };
                copy_with_scalars(c, t.body, scalars);
              });
    rw_.op(Op::kBarrier, DType::kF32, {});
  }
  // Copies `b`, an `arg` of a stepping scalar replaced by this launch's value.
  void copy_with_scalars(Copier& c, const Block& b,
                         const std::unordered_map<uint32_t, ValueId>& scalars) {
    std::function<void(const Block&)> pre = [&](const Block& blk) {
      for (const Stmt& s : blk.stmts) {
        if (s.op == Op::kArg && scalars.count(s.param)) c.map[s.result] = scalars.at(s.param);
        for (const Block& n : s.blocks) pre(n);
      }
    };
    pre(b);
    for (const Stmt& s : b.stmts) copy_stmt(c, s, scalars);
  }
  void copy_stmt(Copier& c, const Stmt& s, const std::unordered_map<uint32_t, ValueId>& scalars) {
    if (s.op == Op::kArg && scalars.count(s.param)) return;  // mapped by pre()
    if (s.blocks.empty()) {
      c.stmt(s);
      return;
    }
    // A control statement: its blocks copied the same way.
    Stmt n = s;
    n.args.clear();
    for (Block& b : n.blocks) b.stmts.clear();
    if (s.result != kNoValue) n.result = c.map[s.result] = f_.fresh();
    const size_t at = rw_.block().stmts.size();
    rw_.insert(std::move(n));
    Stmt& placed = rw_.block().stmts[at];
    for (size_t b = 0; b < s.blocks.size(); ++b) {
      rw_.in(placed.blocks[b], [&] {
        for (const Stmt& x : s.blocks[b].stmts) copy_stmt(c, x, scalars);
      });
    }
    for (ValueId a : s.args) placed.args.push_back(c.v(a));
  }

  bool access(Copier& c, const Stmt& s, uint32_t r, const std::vector<ValueId>& x,
              const std::vector<ValueId>& xw, ValueId own,
              const std::unordered_map<const Stmt*, const Access*>& acc) {
    auto it = acc.find(&s);
    if (it == acc.end()) {
      if (s.op == Op::kLoad) return false;  // an array only read
      // A write-only array: the tile's cells only.
      rw_.if_(own, [&](int side) {
        if (side == 0) plain(c, s);
      });
      return true;
    }
    const Access& a = *it->second;
    auto slot = slots_.find(key_of(a, r, l_));
    if (s.op == Op::kStore) {
      const ValueId v = c.v(s.args.back());
      rw_.op(Op::kStoreShared, DType::kF32, {shared_[slot->second], lin(x), v});
      rw_.if_(own, [&](int side) {
        if (side == 0) plain(c, s);
      });
      return true;
    }
    if (slot == slots_.end()) return false;  // a row no launch of the block writes
    const DType ty = s.type;
    const size_t lead = a.has_row ? 1 : 0;
    if (a.own_cell) {
      c.map[s.result] = rw_.op(Op::kLoadShared, ty, {shared_[slot->second], lin(x)});
      return true;
    }
    std::vector<ValueId> y(p_.dims);
    std::vector<ValueId> in;
    for (size_t d = 0; d < p_.dims; ++d) {
      y[d] = c.v(s.args[lead + d]);
      if (p_.periodic[d]) {
        // The neighbour's cell next to x rather than across the box: x + the wrapped
        // difference folded into (-n / 2, n / 2].
        const int64_t n = l_.box[d].second;
        ValueId diff = rw_.op(Op::kSub, DType::kI32, {y[d], xw[d]});
        diff = rw_.op(Op::kSelect, DType::kI32,
                      {rw_.op(Op::kGt, DType::kBool, {diff, rw_.i32(n / 2)}),
                       rw_.op(Op::kSub, DType::kI32, {diff, rw_.i32(n)}), diff});
        diff = rw_.op(Op::kSelect, DType::kI32,
                      {rw_.op(Op::kLt, DType::kBool, {diff, rw_.i32(-(n / 2))}),
                       rw_.op(Op::kAdd, DType::kI32, {diff, rw_.i32(n)}), diff});
        y[d] = rw_.op(Op::kAdd, DType::kI32, {x[d], diff});
      } else if (a.cell[d].amin < l_.box[d].first || a.cell[d].amax >= l_.box[d].second) {
        // Outside the box the run writes nothing: the array holds the value. (An index that
        // stays inside the box at every cell of it -- a clamped neighbour, max(i - 1, 0) --
        // needs no test: each test and its branch to the array cost every cell of every step.)
        in.push_back(in_range(y[d], d));
      }
    }
    if (in.empty()) {
      c.map[s.result] = rw_.op(Op::kLoadShared, ty, {shared_[slot->second], lin(y)});
      return true;
    }
    const ValueId local = rw_.op(Op::kAlloca, ty, {});
    rw_.if_(all(rw_, in), [&](int side) {
      if (side == 0) {
        rw_.store_local(local, rw_.op(Op::kLoadShared, ty, {shared_[slot->second], lin(y)}));
      } else {
        const ValueId v = plain(c, s);
        rw_.store_local(local, v);
      }
    });
    c.map[s.result] = rw_.load_local(local, ty);
    return true;
  }
  // The statement as it is (operands mapped); its result id, if any.
  ValueId plain(Copier& c, const Stmt& s) {
    Stmt n = s;
    for (ValueId& a : n.args) a = c.v(a);
    n.result = kNoValue;
    if (s.result != kNoValue) n.result = f_.fresh();
    return rw_.insert(std::move(n));
  }

  const Plan& p_;
  const StencilLaunch& l_;
  const uint32_t steps_;
  Kernel& f_;
  Rewriter& rw_;
  std::map<SlotKey, size_t> slots_;
  std::vector<ValueId> shared_;
  std::vector<ValueId> origin_;
  ValueId local_ = kNoValue;
  int64_t group_;   // invocations per workgroup (one tile each)
  int stash_ = -1;  // the stash parameter, -1 without one
  ValueId phase_ = kNoValue;
};

}  // namespace

namespace {

// The prologue of a run with a stash: the first dispatch's half (0) of the stash from the
// arrays, one cell per invocation over the box. Its parameters are the blocked kernel's.
Result<Kernel> stash_prologue(const Plan& p, const StencilLaunch& l, uint32_t steps,
                              const Kernel& blocked, int stash_param, DType ty) {
  Kernel pr;
  pr.name = blocked.name + "_prologue";
  pr.params = blocked.params;
  Task pt;
  pt.name = "stash";
  for (const auto& [lo, hi] : l.box) {
    TaskDim d;
    d.begin = SizeExpr::constant(lo);
    d.end = SizeExpr::constant(hi);
    d.index = pr.fresh();
    pt.dims.push_back(d);
  }
  pt.index = pt.dims[0].index;
  Rewriter prw(pr);
  prw.in(pt.body, [&] {
    const std::vector<ValueId> xw = task_indices(pt);
    for (const auto& [key, j] : slots_of(p, l, steps)) {
      std::vector<ValueId> idx;
      if (key.has_row) {
        idx.push_back(slot_row(prw, p, l, key));
      }
      idx.insert(idx.end(), xw.begin(), xw.end());
      const ValueId v = prw.access(Op::kLoad, ty, key.param, idx);
      ValueId at = box_index(prw, l, xw);
      at = prw.op(Op::kAdd, DType::kI32, {prw.i32(static_cast<int64_t>(j) * box_cells(l)), at});
      prw.access(Op::kStore, DType::kF32, static_cast<uint32_t>(stash_param), {at, v});
    }
  });
  pr.tasks.push_back(std::move(pt));
  VKAD_TRY(verify(pr));
  return pr;
}

}  // namespace

Result<BlockedStencil> block_stencil(const StencilLaunch& l, uint32_t steps,
                                     const std::string& name) {
  Plan p;
  VKAD_TRY(plan_of(l, p));
  auto fail = [&](const std::string& w) {
    return make_error(ErrorCode::kInvalidArgument, "block_stencil '" + name + "': " + w);
  };
  if (steps < 2 || steps > kMaxStencilSteps)
    return fail("steps " + std::to_string(steps) + " not in [2, 8]");
  const bool stash = needs_stash(p, l, steps);
  if (stash && !stash_possible(p, l)) return fail("a row is read before the run writes it");
  BlockedStencil out;
  Kernel& f = out.kernel;
  f.name = name;
  f.params = p.kernel.params;
  for (Param& q : f.params) q.needs_grad = false;
  int stash_param = -1;
  if (stash) {
    out.stash_type = *p.carried_type;
    out.stash_elements = 2 * static_cast<int64_t>(slots_of(p, l, steps).size()) * box_cells(l);
    Param sp;
    sp.name = "stash";
    sp.kind = ParamKind::kNdArray;
    sp.dtype = out.stash_type;
    sp.rank = 1;
    stash_param = static_cast<int>(f.params.size());
    f.params.push_back(sp);
  }
  f.next_id = p.kernel.next_id;
  int64_t groups = 1;
  for (size_t d = 0; d < p.dims; ++d)
    groups *= (l.box[d].second - l.box[d].first + p.tile[d] - 1) / p.tile[d];
  Task t;
  t.name = "blocked";
  // A workgroup as large as the first launch's grown tile (in whole subgroups, at most
  // `max_group`): every launch's phase is then one pass over its cells, where a tile-sized
  // workgroup walked the grown regions in 2-3 dependent passes.
  const int64_t group = std::clamp<int64_t>((region_cells(p, steps, 0) + 31) / 32 * 32, p.local,
                                            std::max<int64_t>(p.local, l.max_group));
  t.local_size = static_cast<uint32_t>(group);
  t.begin = RangeBound::constant(0);
  t.end = RangeBound::constant(groups * group);
  t.index = f.fresh();
  Rewriter rw(f);
  Blocker b(p, l, steps, f, rw, group, stash_param);
  rw.in(t.body, [&] { b.body(t.index); });
  f.tasks.push_back(std::move(t));
  drop_dead(f);
  VKAD_TRY(verify(f));
  if (!stash) return out;
  VKAD_ASSIGN_OR_RETURN(Kernel pr, stash_prologue(p, l, steps, f, stash_param, out.stash_type));
  out.prologue = std::move(pr);
  return out;
}

}  // namespace vkad::codegen
