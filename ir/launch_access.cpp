#include "ir/launch_access.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ir/walk.h"

namespace vkad::codegen {

namespace {

bool is_word(DType t) { return t == DType::kI32 || t == DType::kU32; }

// i32 / u32 operands held exactly: int64 holds INT_MIN / -1 (2^31, wrapped back to INT_MIN by
// wrap()). By zero: div and floordiv 0, mod the dividend (as the CPU reference, cpu_eval.cpp).
int64_t int_div(int64_t a, int64_t b) { return b == 0 ? 0 : a / b; }
int64_t int_mod(int64_t a, int64_t b) {
  if (b == 0) return a;
  const int64_t rem = a % b;
  return rem != 0 && (rem < 0) != (b < 0) ? rem + b : rem;
}
int64_t int_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  const int64_t q = a / b, rem = a % b;
  return rem != 0 && (rem < 0) != (b < 0) ? q - 1 : q;
}

// The integer and boolean ops a launch-uniform expression holds besides its leaves (const,
// arg, shape), select and cast: arity and value on operands held exactly (wrap() after).
struct IntOp {
  Op op;
  uint32_t arity;
  int64_t (*fn)(int64_t, int64_t);
};
constexpr IntOp kIntOps[] = {
    {Op::kNeg, 1, [](int64_t a, int64_t) { return -a; }},
    {Op::kNot, 1, [](int64_t a, int64_t) -> int64_t { return a != 0 ? 0 : 1; }},
    {Op::kAbs, 1, [](int64_t a, int64_t) { return a < 0 ? -a : a; }},
    {Op::kAdd, 2, [](int64_t a, int64_t b) { return a + b; }},
    {Op::kSub, 2, [](int64_t a, int64_t b) { return a - b; }},
    {Op::kMul, 2,
     [](int64_t a, int64_t b) {
       return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
     }},
    {Op::kDiv, 2, int_div},
    {Op::kMod, 2, int_mod},
    {Op::kFloorDiv, 2, int_floordiv},
    {Op::kMin, 2, [](int64_t a, int64_t b) { return std::min(a, b); }},
    {Op::kMax, 2, [](int64_t a, int64_t b) { return std::max(a, b); }},
    {Op::kAnd, 2, [](int64_t a, int64_t b) -> int64_t { return a != 0 && b != 0; }},
    {Op::kOr, 2, [](int64_t a, int64_t b) -> int64_t { return a != 0 || b != 0; }},
    {Op::kLt, 2, [](int64_t a, int64_t b) -> int64_t { return a < b; }},
    {Op::kLe, 2, [](int64_t a, int64_t b) -> int64_t { return a <= b; }},
    {Op::kGt, 2, [](int64_t a, int64_t b) -> int64_t { return a > b; }},
    {Op::kGe, 2, [](int64_t a, int64_t b) -> int64_t { return a >= b; }},
    {Op::kEq, 2, [](int64_t a, int64_t b) -> int64_t { return a == b; }},
    {Op::kNe, 2, [](int64_t a, int64_t b) -> int64_t { return a != b; }},
};

const IntOp* int_op(Op op) {
  for (const IntOp& o : kIntOps) {
    if (o.op == op) return &o;
  }
  return nullptr;
}

bool is_leaf(Op op) { return op == Op::kConst || op == Op::kArg || op == Op::kShape; }

// The launch-uniform values of a kernel, as nodes of one pool shared by the whole kernel
// (identical nodes are one), found in one walk in program order: an operand is defined before
// its use, so nothing recurses over value chains.
class UniformPool {
 public:
  explicit UniformPool(const Kernel& k) {
    for (const Task& t : k.tasks) walk(t.body);
  }
  // Every launch-uniform value.
  std::unordered_set<ValueId> values() const {
    std::unordered_set<ValueId> out;
    for (const auto& [v, n] : node_of_) out.insert(v);
    return out;
  }
  // The pool node of `v`, or UINT32_MAX when `v` is not launch-uniform.
  uint32_t node_of(ValueId v) const {
    auto it = node_of_.find(v);
    return it == node_of_.end() ? UINT32_MAX : it->second;
  }
  // The expression rooted at pool node `root`: the nodes it reaches, renumbered in pool order
  // (which is topological).
  UniformExpr extract(uint32_t root) const {
    std::vector<uint32_t> reached{root}, stack{root};
    while (!stack.empty()) {
      const UniformExpr::Node& n = nodes_[stack.back()];
      stack.pop_back();
      for (uint32_t i = 0; i < arity(n.op); ++i) {
        const uint32_t o = n.operands[i];
        if (std::find(reached.begin(), reached.end(), o) == reached.end()) {
          reached.push_back(o);
          stack.push_back(o);
        }
      }
    }
    std::sort(reached.begin(), reached.end());
    UniformExpr e;
    for (uint32_t p : reached) {
      UniformExpr::Node n = nodes_[p];
      for (uint32_t i = 0; i < arity(n.op); ++i) {
        n.operands[i] = static_cast<uint32_t>(
            std::lower_bound(reached.begin(), reached.end(), n.operands[i]) - reached.begin());
      }
      e.nodes.push_back(n);
    }
    return e;
  }

  // Operands of a pool node's op.
  static uint32_t arity(Op op) {
    if (is_leaf(op)) return 0;
    if (op == Op::kSelect) return 3;
    if (op == Op::kCast) return 1;
    return int_op(op)->arity;
  }

 private:
  void walk(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) {
        const uint32_t n = node(s);
        if (n != UINT32_MAX) node_of_.emplace(s.result, n);
      }
      for (const Block& c : s.blocks) walk(c);
    }
  }

  uint32_t node(const Stmt& s) {
    if (!is_word(s.type) && s.type != DType::kBool) return UINT32_MAX;  // floats, i64
    UniformExpr::Node n;
    n.op = s.op;
    n.type = s.type;
    n.imm = s.op == Op::kConst ? s.iimm : 0;
    n.param = s.op == Op::kArg || s.op == Op::kShape ? s.param : 0;
    n.dim = s.op == Op::kShape ? s.dim : 0;
    if (!is_leaf(s.op)) {
      // Indices, locals, loads, float math and control flow are not launch-uniform.
      if (s.op != Op::kSelect && s.op != Op::kCast && !int_op(s.op)) return UINT32_MAX;
      if (s.args.size() != arity(s.op)) return UINT32_MAX;
      for (size_t i = 0; i < s.args.size(); ++i) {
        const uint32_t o = node_of(s.args[i]);
        if (o == UINT32_MAX) return UINT32_MAX;  // an operand that is not launch-uniform
        n.operands[i] = o;
      }
      // The operand type decides comparisons and casts; a select's is its value operands'.
      n.from = nodes_[n.operands[s.op == Op::kSelect ? 1 : 0]].type;
    }
    const auto key = std::make_tuple(n.op, n.type, n.from, n.imm, n.param, n.dim, n.operands[0],
                                     n.operands[1], n.operands[2]);
    auto [it, added] = index_.emplace(key, static_cast<uint32_t>(nodes_.size()));
    if (added) nodes_.push_back(n);
    return it->second;
  }

  std::vector<UniformExpr::Node> nodes_;
  std::map<std::tuple<Op, DType, DType, int64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>,
           uint32_t>
      index_;
  std::unordered_map<ValueId, uint32_t> node_of_;
};

class Collector {
 public:
  Collector(const Kernel& k, KernelAccess& out) : pool_(k), out_(out) {
    for (uint32_t p = 0; p < k.params.size(); ++p) {
      out_.names.push_back(k.params[p].name);
      if (k.params[p].kind == ParamKind::kNdArray) {
        param_slot_[p] = static_cast<uint32_t>(out_.params.size());
        out_.params.push_back({p, k.params[p].rank, k.params[p].needs_grad, {}});
      }
    }
    for (const Task& t : k.tasks) walk(t.body);
    std::erase_if(out_.params, [](const ParamAccess& p) { return p.accesses.empty(); });
  }

 private:
  void walk(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (op_info(s.op).family == OpFamily::kArray) {
        switch (array_op(s.op)) {
          case ArrayOp::kLoad: add(s, ArrayAccess::Kind::kRead, s.args.size()); break;
          case ArrayOp::kAtomicAdd:
            add(s, ArrayAccess::Kind::kAccumulate, s.args.size() - 1);
            break;
          case ArrayOp::kStore:
          case ArrayOp::kAtomicMax: add(s, ArrayAccess::Kind::kOverwrite, s.args.size() - 1); break;
        }
      }
      for (const Block& c : s.blocks) walk(c);
    }
  }

  void add(const Stmt& s, ArrayAccess::Kind kind, size_t axes) {
    auto slot = param_slot_.find(s.param);
    if (slot == param_slot_.end()) return;
    ArrayAccess a;
    a.kind = kind;
    for (size_t axis = 0; axis < axes; ++axis) a.rows.push_back(expr(s.args[axis]));
    std::vector<ArrayAccess>& list = out_.params[slot->second].accesses;
    if (std::find(list.begin(), list.end(), a) == list.end()) list.push_back(std::move(a));
  }

  uint32_t expr(ValueId v) {
    const uint32_t root = pool_.node_of(v);
    if (root == UINT32_MAX) return ArrayAccess::kNotUniform;
    auto [it, added] = expr_of_root_.emplace(root, static_cast<uint32_t>(out_.exprs.size()));
    if (added) out_.exprs.push_back(pool_.extract(root));
    return it->second;
  }

  UniformPool pool_;
  KernelAccess& out_;
  std::unordered_map<uint32_t, uint32_t> param_slot_;    // parameter -> index in out_.params
  std::unordered_map<uint32_t, uint32_t> expr_of_root_;  // pool node -> index in out_.exprs
};

// A value of `t` held exactly: i32 signed, u32 and bool non-negative.
int64_t wrap(DType t, int64_t v) {
  switch (t) {
    case DType::kI32: return static_cast<int32_t>(static_cast<uint32_t>(v));
    case DType::kU32: return static_cast<uint32_t>(v);
    case DType::kBool: return v != 0 ? 1 : 0;
    case DType::kI64:
    case DType::kF32:
    case DType::kF64: return v;  // only words and bools reach here (UniformPool::node)
  }
  return v;
}

}  // namespace

std::optional<uint32_t> evaluate(const UniformExpr& e, const UniformInputs& in) {
  if (e.nodes.empty()) return std::nullopt;
  int64_t small[16];
  std::vector<int64_t> large;
  int64_t* v = small;
  if (e.nodes.size() > 16) {
    large.resize(e.nodes.size());
    v = large.data();
  }
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    const UniformExpr::Node& n = e.nodes[i];
    const int64_t a = v[n.operands[0]], b = v[n.operands[1]];
    int64_t r = a;  // a cast between i32, u32 and bool: wrap() below
    if (n.op == Op::kConst) {
      r = n.imm;
    } else if (n.op == Op::kArg) {
      r = in.scalar(n.param);
    } else if (n.op == Op::kShape) {
      std::optional<uint32_t> x = in.extent(n.param, n.dim);
      if (!x) return std::nullopt;
      r = *x;
    } else if (n.op == Op::kSelect) {
      r = a != 0 ? b : v[n.operands[2]];
    } else if (n.op != Op::kCast) {
      const IntOp* op = int_op(n.op);
      if (!op) return std::nullopt;
      r = op->fn(a, b);
    }
    v[i] = wrap(n.type, r);
  }
  return static_cast<uint32_t>(v[e.nodes.size() - 1]);
}

std::unordered_set<ValueId> launch_uniform_values(const Kernel& k) {
  return UniformPool(k).values();
}

namespace {

bool integral(DType t) { return t == DType::kI32 || t == DType::kU32 || t == DType::kBool; }

void table_values(const Block& b, const std::unordered_set<ValueId>& uniform,
                  std::unordered_set<ValueId>& out) {
  for (const Stmt& s : b.stmts) {
    for (const Block& c : s.blocks) table_values(c, uniform, out);
    if (s.result == kNoValue || !integral(s.type)) continue;
    if (s.op == Op::kLoad) {
      out.insert(s.result);
      continue;
    }
    const OpFamily f = op_info(s.op).family;
    if (f != OpFamily::kUnary && f != OpFamily::kBinary && f != OpFamily::kCompare &&
        f != OpFamily::kSelect && f != OpFamily::kCast) {
      continue;
    }
    bool table = false, other = false;
    for (ValueId a : s.args) {
      if (out.count(a)) {
        table = true;
      } else if (!uniform.count(a)) {
        other = true;
      }
    }
    if (table && !other) out.insert(s.result);
  }
}

}  // namespace

std::unordered_set<ValueId> table_index_values(const Kernel& k) {
  const std::unordered_set<ValueId> uniform = launch_uniform_values(k);
  std::unordered_set<ValueId> out;
  for (const Task& t : k.tasks) table_values(t.body, uniform, out);
  return out;
}

namespace {

// masked_values' walk: every statement with a result, by value, and each local's stored values.
void collect_defs(const Kernel& k, std::unordered_map<ValueId, const Stmt*>& defs,
                  std::unordered_map<ValueId, std::vector<ValueId>>& stores) {
  for_each_stmt(k, [&](const Stmt& s) {
    if (s.result != kNoValue) defs[s.result] = &s;
    if (s.op == Op::kStoreLocal) stores[s.args[0]].push_back(s.args[1]);
  });
}

// The stores into locals that lie inside more `if`s than the local's alloca, as (local, value)
// pairs, less any pair also stored at the alloca's depth: a local (zero from its alloca) that
// only such stores change is zero unless one of their branches ran -- a contact that did not
// happen, a pair that did not collide -- or, allocated outside a loop, ran in an earlier
// iteration (masked_values is a heuristic of likely zeros, not a proof).
using LocalValue = std::pair<ValueId, ValueId>;
struct LocalValueHash {
  size_t operator()(const LocalValue& p) const {
    return std::hash<uint64_t>()((static_cast<uint64_t>(p.first) << 32) ^ p.second);
  }
};
using ConditionalStores = std::unordered_set<LocalValue, LocalValueHash>;

struct DepthWalk {
  std::unordered_map<ValueId, int> alloca_depth;
  std::vector<std::tuple<ValueId, ValueId, int>> stores;  // local, value, `if` depth
  void walk(const Block& b, int depth) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kAlloca) alloca_depth[s.result] = depth;
      if (s.op == Op::kStoreLocal) stores.emplace_back(s.args[0], s.args[1], depth);
      for (const Block& c : s.blocks) walk(c, depth + (s.op == Op::kIf ? 1 : 0));
    }
  }
};

ConditionalStores conditional_stores(const Kernel& k) {
  DepthWalk w;
  for (const Task& t : k.tasks) w.walk(t.body, 0);
  ConditionalStores deeper, level;
  for (const auto& [local, value, depth] : w.stores) {
    auto d = w.alloca_depth.find(local);
    if (d == w.alloca_depth.end()) continue;
    (depth > d->second ? deeper : level).insert({local, value});
  }
  for (const LocalValue& p : level) deeper.erase(p);
  return deeper;
}

bool is_float_type(DType t) { return t == DType::kF32 || t == DType::kF64; }

// An integer or bool `v` every definition of which is a constant, one of them 0: a flag (an
// integer local assigned constants in branches, a select of two constants).
bool flag_value(ValueId v, const std::unordered_map<ValueId, const Stmt*>& defs,
                const std::unordered_map<ValueId, std::vector<ValueId>>& stores) {
  auto it = defs.find(v);
  if (it == defs.end()) return false;
  const Stmt& s = *it->second;
  if (s.type == DType::kBool) return true;
  auto is_const = [&](ValueId x, bool* zero) {
    auto d = defs.find(x);
    if (d == defs.end() || d->second->op != Op::kConst) return false;
    *zero = *zero || d->second->iimm == 0;
    return true;
  };
  bool zero = false;
  if (s.op == Op::kSelect) return is_const(s.args[1], &zero) && is_const(s.args[2], &zero) && zero;
  if (s.op != Op::kLoadLocal) return false;
  auto st = stores.find(s.args[0]);
  if (st == stores.end()) return false;
  for (ValueId x : st->second) {
    if (!is_const(x, &zero)) return false;
  }
  return zero;
}

}  // namespace

namespace {

using Defs = std::unordered_map<ValueId, const Stmt*>;
using LocalStores = std::unordered_map<ValueId, std::vector<ValueId>>;

// Whether masked_values starts from `s`'s result: a float value a rule may keep.
bool mask_candidate(const Stmt& s, const Defs& defs, const LocalStores& stores) {
  if (!is_float_type(s.type)) return false;
  switch (s.op) {
    case Op::kConst: return s.fimm == 0;
    case Op::kSelect:
    case Op::kMul:
    case Op::kDiv:
    case Op::kNeg:
    case Op::kAdd:
    case Op::kSub:
    case Op::kLoadLocal: return true;
    case Op::kCast: {
      auto d = defs.find(s.args[0]);
      return d != defs.end() && !is_float_type(d->second->type) &&
             flag_value(s.args[0], defs, stores);
    }
    default: return false;
  }
}

// Whether `s`'s result stays in masked_values' set `in`.
bool stays_masked(const Stmt& s, const std::unordered_set<ValueId>& in, const LocalStores& stores,
                  const ConditionalStores& cond) {
  auto m = [&](size_t i) { return in.count(s.args[i]) > 0; };
  switch (s.op) {
    case Op::kSelect: return m(1) || m(2);
    case Op::kMul: return m(0) || m(1);
    case Op::kDiv:
    case Op::kNeg: return m(0);
    case Op::kAdd:
    case Op::kSub: return m(0) && m(1);
    case Op::kLoadLocal: {
      auto st = stores.find(s.args[0]);
      auto kept = [&](ValueId x) { return in.count(x) > 0 || cond.count({s.args[0], x}) > 0; };
      return st != stores.end() && std::all_of(st->second.begin(), st->second.end(), kept);
    }
    default: return true;  // a zero constant, a cast flag
  }
}

}  // namespace

std::unordered_set<ValueId> masked_values(const Kernel& k) {
  Defs defs;
  LocalStores stores;
  collect_defs(k, defs, stores);
  const ConditionalStores cond = conditional_stores(k);
  // The greatest set closed under the rules: start from every float value a rule may keep and
  // drop those whose rule fails; a drop re-checks the values whose rules read the dropped one (a
  // worklist: linear in the kernel, whatever the order of the chains).
  std::unordered_set<ValueId> in;
  for (const auto& [v, s] : defs) {
    if (mask_candidate(*s, defs, stores)) in.insert(v);
  }
  std::unordered_map<ValueId, std::vector<ValueId>> readers;
  for (ValueId v : in) {
    const Stmt& s = *defs.at(v);
    if (s.op == Op::kLoadLocal) {
      auto st = stores.find(s.args[0]);
      if (st == stores.end()) continue;
      for (ValueId x : st->second) readers[x].push_back(v);
    } else if (s.op != Op::kConst && s.op != Op::kCast) {
      for (ValueId a : s.args) readers[a].push_back(v);
    }
  }
  std::vector<ValueId> work(in.begin(), in.end());
  while (!work.empty()) {
    const ValueId v = work.back();
    work.pop_back();
    if (!in.count(v) || stays_masked(*defs.at(v), in, stores, cond)) continue;
    in.erase(v);
    auto r = readers.find(v);
    if (r == readers.end()) continue;
    for (ValueId u : r->second) {
      if (in.count(u)) work.push_back(u);
    }
  }
  return in;
}

namespace {

void index_values(const Block& b, std::vector<ValueId>& out) {
  for (const Stmt& s : b.stmts) {
    if (op_info(s.op).family == OpFamily::kArray) {
      const size_t axes = s.args.size() - (s.op == Op::kLoad ? 0 : 1);
      out.insert(out.end(), s.args.begin(), s.args.begin() + static_cast<std::ptrdiff_t>(axes));
    }
    for (const Block& c : s.blocks) index_values(c, out);
  }
}

}  // namespace

std::vector<std::pair<ValueId, UniformExpr>> uniform_index_exprs(const Kernel& k) {
  std::vector<ValueId> values;
  for (const Task& t : k.tasks) index_values(t.body, values);
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  const UniformPool pool(k);
  std::vector<std::pair<ValueId, UniformExpr>> out;
  for (ValueId v : values) {
    const uint32_t n = pool.node_of(v);
    if (n != UINT32_MAX) out.emplace_back(v, pool.extract(n));
  }
  return out;
}

std::optional<uint32_t> UniformWords::find(ValueId v) const {
  auto it = std::lower_bound(
      sorted.begin(), sorted.end(), v,
      [](const std::pair<ValueId, uint32_t>& e, ValueId x) { return e.first < x; });
  if (it == sorted.end() || it->first != v) return std::nullopt;
  return it->second;
}

UniformWords launch_uniform_words(const Kernel& k, const UniformInputs& in) {
  const UniformPool pool(k);
  UniformWords out;
  for (ValueId v : pool.values()) {
    std::optional<uint32_t> w = evaluate(pool.extract(pool.node_of(v)), in);
    if (w) out.sorted.emplace_back(v, *w);
  }
  std::sort(out.sorted.begin(), out.sorted.end());
  return out;
}

KernelAccess kernel_access(const Kernel& k) {
  KernelAccess out;
  out.kernel = k.name;
  Collector collect(k, out);
  return out;
}

std::vector<uint32_t> used_loads(const Kernel& k) {
  // Liveness from the statements with effects: every value an effect's operands reach through
  // the statements that define them. A statement without a result (store, atomic, store_local,
  // if, print, ...) or with blocks (for, while: their bounds) is an effect; so is a stack op
  // (its adstack is state the kernel keeps).
  std::unordered_map<ValueId, const Stmt*> def;
  std::vector<ValueId> work;
  for_each_stmt(k, [&](const Stmt& s) {
    if (s.result != kNoValue) def[s.result] = &s;
    const OpInfo& info = op_info(s.op);
    if (!info.has_result || !s.blocks.empty() || info.family == OpFamily::kStack) {
      work.insert(work.end(), s.args.begin(), s.args.end());
    }
  });
  std::unordered_set<ValueId> live;
  std::vector<uint32_t> out;
  while (!work.empty()) {
    const ValueId v = work.back();
    work.pop_back();
    if (!live.insert(v).second) continue;
    auto d = def.find(v);
    if (d == def.end()) continue;  // a task index or a loop variable
    const Stmt& s = *d->second;
    if (s.op == Op::kLoad) out.push_back(s.param);
    work.insert(work.end(), s.args.begin(), s.args.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

// One store's index on one axis, classified (whole_stores).
bool classify_axis(ValueId v, const std::vector<ValueId>& dims,
                   const std::unordered_map<ValueId, const Stmt*>& def,
                   const std::unordered_set<ValueId>& uniform, WholeStore::Axis::Kind* kind,
                   size_t* dim, int64_t* value) {
  for (size_t d = 0; d < dims.size(); ++d) {
    if (v == dims[d]) {
      *kind = WholeStore::Axis::Kind::kTaskDim;
      *dim = d;
      return true;
    }
  }
  auto it = def.find(v);
  if (it != def.end() && it->second->op == Op::kConst && !is_float(it->second->type)) {
    *kind = WholeStore::Axis::Kind::kConst;
    *value = it->second->iimm;
    return true;
  }
  if (uniform.count(v)) {
    *kind = WholeStore::Axis::Kind::kUniform;
    return true;
  }
  return false;
}

}  // namespace

namespace {

// What whole_stores needs of the kernel to judge one parameter's stores.
struct StoreContext {
  std::vector<ValueId> dims;   // the task's index values
  std::vector<SizeExpr> ends;  // their ranges' ends (every begin is 0)
  std::unordered_map<ValueId, const Stmt*> def;
  std::unordered_set<ValueId> uniform;
};

// One store's index on axis `a`, merged into `w`'s axis: false where it differs in kind (or
// task dimension) from the earlier stores'.
bool merge_axis(const StoreContext& c, ValueId v, bool first, uint32_t a, WholeStore* w,
                std::vector<size_t>* axis_dim) {
  WholeStore::Axis::Kind kind;
  size_t dim = 0;
  int64_t value = 0;
  if (!classify_axis(v, c.dims, c.def, c.uniform, &kind, &dim, &value)) return false;
  WholeStore::Axis& axis = w->axes[a];
  if (first) {
    axis.kind = kind;
  } else if (axis.kind != kind) {
    return false;
  }
  if (kind == WholeStore::Axis::Kind::kTaskDim) {
    if (!first && (*axis_dim)[a] != dim) return false;
    (*axis_dim)[a] = dim;
    axis.end = c.ends[dim];
  } else if (kind == WholeStore::Axis::Kind::kConst &&
             std::find(axis.consts.begin(), axis.consts.end(), value) == axis.consts.end()) {
    axis.consts.push_back(value);
  }
  return true;
}

// The parameter `w.param`'s top-level stores, as a WholeStore: false where they do not cover
// an array whole on some axis however the launch's extents are.
bool store_axes(const StoreContext& c, std::span<const Stmt* const> stores, uint32_t rank,
                WholeStore* w) {
  w->axes.resize(rank);
  std::vector<size_t> axis_dim(rank, SIZE_MAX);
  for (size_t si = 0; si < stores.size(); ++si) {
    if (stores[si]->args.size() != rank + 1) return false;
    for (uint32_t a = 0; a < rank; ++a) {
      if (!merge_axis(c, stores[si]->args[a], si == 0, a, w, &axis_dim)) return false;
    }
  }
  // Every task dimension on one axis at most (a diagonal covers nothing whole), and one axis
  // of constants varying at most (two would cover their diagonal, not their product).
  std::vector<size_t> used;
  for (size_t d : axis_dim) {
    if (d == SIZE_MAX) continue;
    if (std::find(used.begin(), used.end(), d) != used.end()) return false;
    used.push_back(d);
  }
  if (std::count_if(w->axes.begin(), w->axes.end(),
                    [](const WholeStore::Axis& x) { return x.consts.size() > 1; }) > 1) {
    return false;
  }
  for (WholeStore::Axis& axis : w->axes) std::sort(axis.consts.begin(), axis.consts.end());
  return true;
}

}  // namespace

std::vector<WholeStore> whole_stores(const Kernel& k) {
  std::vector<WholeStore> out;
  if (k.tasks.size() != 1 || k.tasks[0].serial) return out;
  const Task& t = k.tasks[0];
  StoreContext c;
  c.dims = task_indices(t);
  if (t.dims.empty()) {
    if (!(bound_expr(t.begin) == SizeExpr::constant(0))) return out;
    c.ends.push_back(bound_expr(t.end));
  } else {
    for (const TaskDim& d : t.dims) {
      if (!(d.begin == SizeExpr::constant(0))) return out;
      c.ends.push_back(d.end);
    }
  }
  std::unordered_map<uint32_t, size_t> accesses;  // param -> its loads, stores and atomics
  for_each_stmt(k, [&](const Stmt& s) {
    if (s.result != kNoValue) c.def[s.result] = &s;
    if (accesses_array(s.op)) ++accesses[s.param];
  });
  std::map<uint32_t, std::vector<const Stmt*>> top;  // param -> its top-level stores
  for (const Stmt& s : t.body.stmts) {
    if (s.op == Op::kStore) top[s.param].push_back(&s);
  }
  c.uniform = launch_uniform_values(k);
  for (const auto& [param, stores] : top) {
    if (accesses[param] != stores.size()) continue;  // loads, atomics or nested stores too
    WholeStore w;
    w.param = param;
    if (store_axes(c, stores, k.params[param].rank, &w)) out.push_back(std::move(w));
  }
  return out;
}

namespace {

// Whether every access of `param` in `access` has launch-uniform row 0 on `axis`.
bool rows_zero(const KernelAccess* access, uint32_t param, size_t axis, const UniformInputs& in) {
  if (access == nullptr) return false;
  for (const ParamAccess& pa : access->params) {
    if (pa.param != param) continue;
    for (const ArrayAccess& acc : pa.accesses) {
      if (axis >= acc.rows.size() || acc.rows[axis] == ArrayAccess::kNotUniform) return false;
      std::optional<uint32_t> v = evaluate(access->exprs[acc.rows[axis]], in);
      if (!v || *v != 0) return false;
    }
  }
  return true;
}

}  // namespace

bool whole_store_covers(const WholeStore& w, std::span<const uint32_t> shape,
                        const std::function<std::optional<int64_t>(const SizeExpr&)>& end_of,
                        const KernelAccess* access, const UniformInputs& rows) {
  if (shape.size() != w.axes.size()) return false;
  for (size_t a = 0; a < w.axes.size(); ++a) {
    const WholeStore::Axis& axis = w.axes[a];
    const int64_t e = shape[a];
    switch (axis.kind) {
      case WholeStore::Axis::Kind::kTaskDim:
        if (end_of(axis.end) != e) return false;
        break;
      case WholeStore::Axis::Kind::kConst:
        if (static_cast<int64_t>(axis.consts.size()) != e) return false;
        for (int64_t i = 0; i < e; ++i) {
          if (axis.consts[static_cast<size_t>(i)] != i) return false;
        }
        break;
      case WholeStore::Axis::Kind::kUniform:
        if (e != 1 || !rows_zero(access, w.param, a, rows)) return false;
        break;
    }
  }
  return true;
}

}  // namespace vkad::codegen
