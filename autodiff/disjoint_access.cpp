#include "autodiff/disjoint_access.h"

#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "ir/walk.h"

namespace vkad::codegen {

namespace {

bool is_word(DType t) { return t == DType::kI32 || t == DType::kU32; }

// A launch-uniform i32 / u32 / bool value: constant + sum(coefficient * term), modulo 2^32 (the
// i32 / u32 arithmetic of the IR wraps, and casts between them keep the bits, so the form is
// exact in the ring of 32-bit words).
struct Form {
  std::map<uint32_t, uint32_t> terms;  // term id -> coefficient, never 0
  uint32_t constant = 0;
  bool operator<(const Form& o) const {
    return std::tie(terms, constant) < std::tie(o.terms, o.constant);
  }
};

// What identifies a term: a scalar parameter, a shape() query, or a launch-uniform operation
// that is not linear (taken whole). Equal keys are equal values in any one launch: the ops are
// pure, and the operand types are in the key (a signed and an unsigned `lt` of the same words
// differ).
struct TermKey {
  Op op = Op::kConst;
  DType type = DType::kI32;
  uint32_t param = 0, dim = 0;
  std::vector<DType> operand_types;
  std::vector<Form> operands;
  bool operator<(const TermKey& o) const {
    return std::tie(op, type, param, dim, operand_types, operands) <
           std::tie(o.op, o.type, o.param, o.dim, o.operand_types, o.operands);
  }
};

// The forms of every launch-uniform value of a kernel, computed in one walk in program order
// (an operand is defined before its use), so no recursion over value chains.
class UniformForms {
 public:
  explicit UniformForms(const Kernel& k) {
    for (const Task& t : k.tasks) walk(t.body);
  }
  // Null when `v` is not launch-uniform (or not proven so).
  const Form* at(ValueId v) const {
    auto it = forms_.find(v);
    return it == forms_.end() ? nullptr : &it->second;
  }
  // A ring index: `f` is the single term `mod(a, m)` with m a constant power of two >= 2.
  // Then a, m, else none.
  std::optional<std::pair<Form, uint32_t>> ring_of(const Form& f) const {
    if (f.constant != 0 || f.terms.size() != 1 || f.terms.begin()->second != 1) return {};
    const TermKey& key = *keys_[f.terms.begin()->first];
    if (key.op != Op::kMod || !key.operands[1].terms.empty()) return {};
    const uint32_t m = key.operands[1].constant;
    // As an i32, m must be positive: 2 .. 2^30.
    if (m < 2 || m > (1u << 30) || (m & (m - 1)) != 0) return {};
    return std::make_pair(key.operands[0], m);
  }

 private:
  void walk(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) {
        if (std::optional<Form> f = form_of(s)) {
          forms_.emplace(s.result, std::move(*f));
          types_.emplace(s.result, s.type);
        }
      }
      for (const Block& c : s.blocks) walk(c);
    }
  }

  static Form constant(uint32_t c) {
    Form f;
    f.constant = c;
    return f;
  }
  Form term(TermKey key) {
    auto [it, added] = term_ids_.emplace(std::move(key), static_cast<uint32_t>(term_ids_.size()));
    if (added) keys_.push_back(&it->first);
    const uint32_t id = it->second;
    Form f;
    f.terms[id] = 1;
    return f;
  }
  static Form scaled(const Form& a, uint32_t by) {
    Form f;
    f.constant = a.constant * by;
    for (const auto& [t, c] : a.terms) {
      if (uint32_t m = c * by) f.terms[t] = m;
    }
    return f;
  }
  static Form sum(const Form& a, const Form& b, uint32_t b_sign) {
    Form f = a;
    f.constant += b.constant * b_sign;
    for (const auto& [t, c] : b.terms) {
      uint32_t m = f.terms[t] + c * b_sign;
      if (m)
        f.terms[t] = m;
      else
        f.terms.erase(t);
    }
    return f;
  }

  std::optional<Form> form_of(const Stmt& s) {
    if (!is_word(s.type) && s.type != DType::kBool) return std::nullopt;  // floats, i64
    if (op_info(s.op).family == OpFamily::kLeaf) return leaf_form(s);
    // Not launch-uniform values (locals, loads, indices, adstacks, control flow), and float
    // math, which no word-typed value comes from.
    if (!is_pure_value(s.op) || is_float_math(s.op)) return std::nullopt;
    TermKey key;
    key.op = s.op;
    key.type = s.type;
    for (ValueId x : s.args) {
      const Form* f = at(x);
      if (!f) return std::nullopt;  // an operand that is not launch-uniform
      key.operands.push_back(*f);
      key.operand_types.push_back(types_.at(x));
    }
    if (is_word(s.type)) {
      if (std::optional<Form> f = linear_form(key)) return f;
    }
    return term(std::move(key));
  }
  // Constants are themselves; a scalar parameter or an extent is a term of its own.
  std::optional<Form> leaf_form(const Stmt& s) {
    switch (leaf_op(s.op)) {
      case LeafOp::kConst: return constant(static_cast<uint32_t>(s.iimm));
      case LeafOp::kArg:
      case LeafOp::kShape: {
        TermKey key;
        key.op = s.op;
        key.type = s.type;
        key.param = s.param;
        key.dim = s.op == Op::kShape ? s.dim : 0;
        return term(std::move(key));
      }
    }
    return std::nullopt;
  }
  // The linear part of a word-typed op, exact modulo 2^32: sums, differences, negations,
  // products by a constant, and i32 <-> u32 casts (which keep the bits). None for the rest.
  static std::optional<Form> linear_form(const TermKey& key) {
    const std::vector<Form>& a = key.operands;
    if (key.op == Op::kAdd) return sum(a[0], a[1], 1);
    if (key.op == Op::kSub) return sum(a[0], a[1], UINT32_MAX);
    if (key.op == Op::kNeg) return scaled(a[0], UINT32_MAX);
    if (key.op == Op::kMul && a[0].terms.empty()) return scaled(a[1], a[0].constant);
    if (key.op == Op::kMul && a[1].terms.empty()) return scaled(a[0], a[1].constant);
    if (key.op == Op::kCast && is_word(key.operand_types[0])) return a[0];
    return std::nullopt;
  }

  std::unordered_map<ValueId, Form> forms_;
  std::unordered_map<ValueId, DType> types_;
  std::map<TermKey, uint32_t> term_ids_;
  std::vector<const TermKey*> keys_;  // by term id (map nodes do not move)
};

// Whether launch-uniform indices `w` and `r` differ in every launch: the same terms and
// different constants (a non-zero word apart), or ring indices mod(a + d, m) and mod(a, m) with
// m a power of two that does not divide d. mod's result is congruent to its operand modulo m,
// and for m dividing 2^32 the operand's wrap-around keeps that congruence, so the two results
// are congruent to a + d and a, which differ modulo m.
bool apart(const UniformForms& forms, const Form& w, const Form& r) {
  if (w.terms == r.terms) return w.constant != r.constant;
  const auto rw = forms.ring_of(w), rr = forms.ring_of(r);
  if (!rw || !rr || rw->second != rr->second || rw->first.terms != rr->first.terms) return false;
  return ((rw->first.constant - rr->first.constant) & (rw->second - 1)) != 0;
}

struct Access {
  const Stmt* stmt;
  size_t task;
};

void collect(const Block& b, uint32_t param, size_t task, std::vector<Access>& reads,
             std::vector<Access>& writes) {
  for (const Stmt& s : b.stmts) {
    if (s.param == param) {
      if (s.op == Op::kLoad) reads.push_back({&s, task});
      if (s.op == Op::kStore || s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax)
        writes.push_back({&s, task});
    }
    for (const Block& c : s.blocks) collect(c, param, task, reads, writes);
  }
}

}  // namespace

DisjointAccess disjoint_access(const Kernel& k, uint32_t param) {
  std::vector<Access> reads, writes;
  for (size_t t = 0; t < k.tasks.size(); ++t) collect(k.tasks[t].body, param, t, reads, writes);
  std::vector<std::pair<const Stmt*, const Stmt*>> pairs;  // (write, read)
  for (const Access& w : writes) {
    for (const Access& r : reads) {
      if (w.task >= r.task) pairs.push_back({w.stmt, r.stmt});
    }
  }
  DisjointAccess out;
  if (pairs.empty()) {
    out.kind = DisjointAccess::Kind::kNoConflict;
    return out;
  }
  UniformForms forms(k);
  for (uint32_t axis = 0; axis < k.params[param].rank; ++axis) {
    bool separated = true;
    for (const auto& [w, r] : pairs) {
      const Form* fw = forms.at(w->args[axis]);
      const Form* fr = forms.at(r->args[axis]);
      if (!fw || !fr || !apart(forms, *fw, *fr)) {
        separated = false;
        break;
      }
    }
    if (separated) {
      out.kind = DisjointAccess::Kind::kDisjoint;
      out.axis = axis;
      return out;
    }
  }
  return out;
}

namespace {

// written_before_read's walk (see the header).
class WriteBeforeRead {
 public:
  WriteBeforeRead(const Kernel& k, uint32_t p) : k_(k), p_(p) {
    for_each_stmt(k, [&](const Stmt& s) {
      if (s.result != kNoValue) def_[s.result] = &s;
    });
  }

  bool run() {
    if (k_.params[p_].rank != 1) return false;
    const Task* task = one_task();
    if (!task) return false;
    const Stmt* loop = nullptr;
    std::vector<int64_t> before;  // the constant indices stored before the loop
    if (!top_level(*task, &loop, &before)) return false;
    if (!loop || !in_loop(loop->blocks[0], loop->result)) return false;
    if (!store_offset_) return true;  // the loop only reads
    for (int64_t l : load_offsets_) {
      if (l >= *store_offset_) return false;
    }
    if (before.empty()) return true;
    std::optional<int64_t> b = constant(loop->args[0]);
    if (!b) return false;
    for (int64_t c : before) {
      if (c >= *b + *store_offset_) return false;
    }
    return true;
  }

 private:
  // The one task that touches p, where it runs one iteration (serial or parallel alike: one
  // invocation runs the loop); else null.
  const Task* one_task() const {
    const Task* task = nullptr;
    for (const Task& t : k_.tasks) {
      bool any = false;
      for (const Stmt& s : t.body.stmts) any = any || accesses_param(s, p_);
      if (!any) continue;
      if (task) return nullptr;  // several tasks
      task = &t;
    }
    using K = RangeBound::Kind;
    if (!task || !task->dims.empty() || task->begin.kind != K::kConstant ||
        task->end.kind != K::kConstant || task->end.value - task->begin.value != 1) {
      return nullptr;
    }
    return task;
  }

  // The task body's statements touching p, in the admitted order: stores at constants (into
  // `before`), the one loop (`loop`), loads. False on anything else.
  bool top_level(const Task& task, const Stmt** loop, std::vector<int64_t>* before) const {
    for (const Stmt& s : task.body.stmts) {
      if (!accesses_param(s, p_)) continue;
      if (!*loop && s.op == Op::kStore) {
        std::optional<int64_t> c = constant(s.args[0]);
        if (!c) return false;
        before->push_back(*c);
      } else if (!*loop && s.op == Op::kFor) {
        *loop = &s;
      } else if (!*loop || s.op != Op::kLoad) {
        return false;  // a load before the loop, a second loop, a branch, a store after it
      }
    }
    return true;
  }

  // The accesses of p in the loop body `b` (index `i`), their offsets noted; false on one the
  // header does not admit.
  bool in_loop(const Block& b, ValueId i) {
    for (const Stmt& s : b.stmts) {
      if (!accesses_param(s, p_)) continue;
      if (s.op == Op::kLoad || s.op == Op::kStore) {
        std::optional<int64_t> c = offset(s.args[0], i);
        if (!c) return false;
        if (s.op == Op::kLoad) {
          load_offsets_.push_back(*c);
        } else if (store_offset_ && *store_offset_ != *c) {
          return false;
        } else {
          store_offset_ = *c;
        }
      } else if (s.op == Op::kIf) {
        for (const Block& side : s.blocks) {
          if (!in_loop(side, i)) return false;
        }
      } else {
        return false;  // an atomic, or a nested loop
      }
    }
    return true;
  }

  std::optional<int64_t> constant(ValueId v) const {
    auto it = def_.find(v);
    if (it == def_.end() || it->second->op != Op::kConst || !is_word(it->second->type)) return {};
    return it->second->iimm;
  }

  // c where v is i, i + c, c + i or i - c.
  std::optional<int64_t> offset(ValueId v, ValueId i) const {
    if (v == i) return 0;
    auto it = def_.find(v);
    if (it == def_.end()) return {};
    const Stmt& s = *it->second;
    if (s.op != Op::kAdd && s.op != Op::kSub) return {};
    std::optional<int64_t> c;
    if (s.args[0] == i) c = constant(s.args[1]);
    if (s.op == Op::kAdd && s.args[1] == i) c = constant(s.args[0]);
    if (!c) return {};
    return s.op == Op::kSub ? -*c : *c;
  }

  const Kernel& k_;
  const uint32_t p_;
  std::unordered_map<ValueId, const Stmt*> def_;
  std::optional<int64_t> store_offset_;
  std::vector<int64_t> load_offsets_;
};

}  // namespace

bool written_before_read(const Kernel& k, uint32_t param) {
  return WriteBeforeRead(k, param).run();
}

}  // namespace vkad::codegen
