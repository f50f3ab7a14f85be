#include "graph/if_conversion.h"

#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/rewriter.h"

namespace vkad::codegen {

namespace {

// Whether `s` may run whatever its branch decides: it computes a value from values, or declares
// or reads a local (stores and nested ifs are converted, not hoisted as they are).
bool speculable(const Stmt& s) {
  // Every value op is defined on every input: an integer x / 0 is 0 (ir.h); a float one inf or
  // NaN, which the select then discards.
  switch (op_info(s.op).family) {
    case OpFamily::kLeaf:
    case OpFamily::kUnary:
    case OpFamily::kBinary:
    case OpFamily::kCompare:
    case OpFamily::kSelect:
    case OpFamily::kCast: return true;
    case OpFamily::kLocal: return s.op == Op::kAlloca || s.op == Op::kLoadLocal;
    default: return false;
  }
}

class Converter {
 public:
  explicit Converter(Kernel& k) : rw_(k) {
    for (const Task& t : k.tasks) note_locals(t.body);
  }

  // `in`'s statements appended to `out`, its ifs converted; false where one cannot be.
  bool block(const Block& in, std::vector<Stmt>& out) {
    for (const Stmt& s : in.stmts) {
      if (s.op == Op::kIf) {
        if (!convert_if(s, out)) return false;
        continue;
      }
      if (s.op == Op::kStoreLocal && !guards_.empty()) {
        store(s, out);
        continue;
      }
      if (guards_.empty() || speculable(s)) {  // outside the branches: kept as it is
        out.push_back(s);
        continue;
      }
      return false;
    }
    return true;
  }

  bool converted() const { return converted_; }

 private:
  void note_locals(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kAlloca) local_type_[s.result] = s.type;
      for (const Block& c : s.blocks) note_locals(c);
    }
  }

  bool convert_if(const Stmt& s, std::vector<Stmt>& out) {
    LocationScope at(rw_, s.loc);
    for (int side = 0; side < 2; ++side) {
      guards_.emplace_back(s.args[0], side == 0);
      std::vector<Stmt> body;
      const bool ok = block(s.blocks[static_cast<size_t>(side)], body);
      guards_.pop_back();
      if (!ok) return false;
      for (Stmt& b : body) out.push_back(std::move(b));
    }
    converted_ = true;
    return true;
  }

  // store_local %l, %v under the guards: %l keeps its value where a guard is not met.
  void store(const Stmt& s, std::vector<Stmt>& out) {
    LocationScope at(rw_, s.loc);
    const ValueId local = s.args[0];
    const DType type = local_type_.at(local);
    const ValueId old = Rewriter::append(out, rw_.make(Op::kLoadLocal, type, {local}));
    ValueId v = s.args[1];
    for (auto g = guards_.rbegin(); g != guards_.rend(); ++g) {
      const auto [cond, then] = *g;
      v = Rewriter::append(out, rw_.make(Op::kSelect, type,
                                         then ? std::vector<ValueId>{cond, v, old}
                                              : std::vector<ValueId>{cond, old, v}));
    }
    Stmt st = s;
    st.args[1] = v;
    out.push_back(std::move(st));
  }

  Rewriter rw_;
  std::unordered_map<ValueId, DType> local_type_;
  // The enclosing branches' conditions and the side being converted (true: then).
  std::vector<std::pair<ValueId, bool>> guards_;
  bool converted_ = false;
};

}  // namespace

std::optional<Kernel> if_converted(const Kernel& k) {
  Kernel out = k;
  Converter c(out);
  for (size_t t = 0; t < k.tasks.size(); ++t) {
    std::vector<Stmt> body;
    if (!c.block(k.tasks[t].body, body)) return std::nullopt;
    Block b;
    for (Stmt& s : body) b.stmts.push_back(std::move(s));
    out.tasks[t].body = std::move(b);
  }
  if (!c.converted()) return std::nullopt;
  return out;
}

}  // namespace vkad::codegen
