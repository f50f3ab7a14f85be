#include "ir/launch_access.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace vkad::codegen {

namespace {

bool is_word(DType t) { return t == DType::kI32 || t == DType::kU32; }

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

  static uint32_t arity(Op op) {
    switch (op) {
      case Op::kConst:
      case Op::kArg:
      case Op::kShape: return 0;
      case Op::kNeg:
      case Op::kNot:
      case Op::kAbs:
      case Op::kCast: return 1;
      case Op::kSelect: return 3;
      default: return 2;
    }
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
    switch (s.op) {
      case Op::kConst: n.imm = s.iimm; break;
      case Op::kArg: n.param = s.param; break;
      case Op::kShape:
        n.param = s.param;
        n.dim = s.dim;
        break;
      case Op::kNeg:
      case Op::kNot:
      case Op::kAbs:
      case Op::kAdd:
      case Op::kSub:
      case Op::kMul:
      case Op::kDiv:
      case Op::kMod:
      case Op::kFloorDiv:
      case Op::kMin:
      case Op::kMax:
      case Op::kAnd:
      case Op::kOr:
      case Op::kLt:
      case Op::kLe:
      case Op::kGt:
      case Op::kGe:
      case Op::kEq:
      case Op::kNe:
      case Op::kSelect:
      case Op::kCast: {
        if (s.args.size() != arity(s.op)) return UINT32_MAX;
        for (size_t i = 0; i < s.args.size(); ++i) {
          const uint32_t o = node_of(s.args[i]);
          if (o == UINT32_MAX) return UINT32_MAX;  // an operand that is not launch-uniform
          n.operands[i] = o;
        }
        // The operand type decides comparisons and casts; a select's is its value operands'.
        n.from = nodes_[n.operands[s.op == Op::kSelect ? 1 : 0]].type;
        break;
      }
      default: return UINT32_MAX;  // indices, locals, loads, float math, control flow
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
      switch (s.op) {
        case Op::kLoad: add(s, ArrayAccess::Kind::kRead, s.args.size()); break;
        case Op::kAtomicAdd: add(s, ArrayAccess::Kind::kAccumulate, s.args.size() - 1); break;
        case Op::kStore:
        case Op::kAtomicMax: add(s, ArrayAccess::Kind::kOverwrite, s.args.size() - 1); break;
        default: break;
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
    default: return v;
  }
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
    int64_t r = 0;
    switch (n.op) {
      case Op::kConst: r = n.imm; break;
      case Op::kArg: r = in.scalar(n.param); break;
      case Op::kShape: {
        std::optional<uint32_t> x = in.extent(n.param, n.dim);
        if (!x) return std::nullopt;
        r = *x;
        break;
      }
      case Op::kNeg: r = -a; break;
      case Op::kNot: r = a != 0 ? 0 : 1; break;  // as the CPU reference (cpu_eval.cpp)
      case Op::kAbs: r = a < 0 ? -a : a; break;
      case Op::kAdd: r = a + b; break;
      case Op::kSub: r = a - b; break;
      case Op::kMul:
        r = static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
        break;
      case Op::kDiv:
      case Op::kMod:
      case Op::kFloorDiv: {
        // i32 / u32 operands held exactly: int64 holds INT_MIN / -1 (2^31, wrapped back to
        // INT_MIN below). By zero: div and floordiv 0, mod the dividend.
        if (b == 0) {
          r = n.op == Op::kMod ? a : 0;
          break;
        }
        const int64_t q = a / b, rem = a % b;
        const bool adjust = rem != 0 && ((rem < 0) != (b < 0));
        r = n.op == Op::kDiv   ? q
            : n.op == Op::kMod ? (adjust ? rem + b : rem)
                               : (adjust ? q - 1 : q);
        break;
      }
      case Op::kMin: r = std::min(a, b); break;
      case Op::kMax: r = std::max(a, b); break;
      case Op::kAnd: r = a != 0 && b != 0; break;
      case Op::kOr: r = a != 0 || b != 0; break;
      case Op::kLt: r = a < b; break;
      case Op::kLe: r = a <= b; break;
      case Op::kGt: r = a > b; break;
      case Op::kGe: r = a >= b; break;
      case Op::kEq: r = a == b; break;
      case Op::kNe: r = a != b; break;
      case Op::kSelect: r = a != 0 ? b : v[n.operands[2]]; break;
      case Op::kCast: r = a; break;  // between i32, u32 and bool: wrap() below
      default: return std::nullopt;
    }
    v[i] = wrap(n.type, r);
  }
  return static_cast<uint32_t>(v[e.nodes.size() - 1]);
}

std::unordered_set<ValueId> launch_uniform_values(const Kernel& k) {
  return UniformPool(k).values();
}

KernelAccess kernel_access(const Kernel& k) {
  KernelAccess out;
  out.kernel = k.name;
  Collector collect(k, out);
  return out;
}

}  // namespace vkad::codegen
