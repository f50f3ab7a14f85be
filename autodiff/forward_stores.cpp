#include "autodiff/forward_stores.h"

#include <cstring>
#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace vkad::codegen {

ValueNumbers::ValueNumbers(const Kernel& k) {
  for (const Task& t : k.tasks) walk(t.body);
}

void ValueNumbers::walk(const Block& b) {
  for (const Stmt& s : b.stmts) {
    const OpFamily f = op_info(s.op).family;
    const bool pure = f == OpFamily::kLeaf || f == OpFamily::kUnary || f == OpFamily::kBinary ||
                      f == OpFamily::kCompare || f == OpFamily::kSelect || f == OpFamily::kCast;
    if (pure && s.result != kNoValue) {
      std::vector<ValueId> args;
      for (ValueId a : s.args) args.push_back(of(a));
      uint64_t bits = 0;
      std::memcpy(&bits, &s.fimm, sizeof bits);
      Key key{s.op, s.type, s.param, s.dim, s.iimm, bits, std::move(args)};
      auto [it, fresh] = first_.try_emplace(std::move(key), s.result);
      if (!fresh) number_[s.result] = it->second;
    }
    for (const Block& c : s.blocks) walk(c);
  }
}

namespace {

// The ndarray parameters a statement writes, itself or anywhere in its blocks.
void written_params(const Stmt& s, std::unordered_set<uint32_t>& out) {
  if (s.op == Op::kStore || s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax) out.insert(s.param);
  for (const Block& b : s.blocks) {
    for (const Stmt& c : b.stmts) written_params(c, out);
  }
}

class Forwarder {
 public:
  explicit Forwarder(const Kernel& k) : numbers_(k) {}

  // Forwards within `b` (and, each on its own, the blocks nested in it).
  void block(Block& b) {
    // Per parameter, the last store of this block not overwritten since: its numbered indices
    // and the stored value.
    std::unordered_map<uint32_t, std::pair<std::vector<ValueId>, ValueId>> stored;
    TreeChildren<Stmt> kept;
    kept.reserve(b.stmts.size());
    for (Stmt& s : b.stmts) {
      if (s.op == Op::kLoad) {
        auto it = stored.find(s.param);
        if (it != stored.end() && same_indices(it->second.first, s.args)) {
          rename_[s.result] = it->second.second;
          ++forwarded_;
          continue;  // the load is gone; its uses are renamed below
        }
      } else if (s.op == Op::kStore) {
        // A store at other indices may name the same element: it alone is known now.
        std::vector<ValueId> idx(s.args.begin(), s.args.end() - 1);
        for (ValueId& v : idx) v = numbers_.of(resolve(v));
        stored[s.param] = {std::move(idx), resolve(s.args.back())};
      } else if (s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax) {
        stored.erase(s.param);
      } else if (!s.blocks.empty()) {
        std::unordered_set<uint32_t> written;
        written_params(s, written);
        for (uint32_t p : written) stored.erase(p);
        for (Block& c : s.blocks) block(c);
      } else if (op_info(s.op).family == OpFamily::kControl) {
        stored.clear();  // a barrier (other invocations' stores become visible), or a jump
      }
      kept.push_back(std::move(s));
    }
    b.stmts = std::move(kept);
  }

  // Every operand renamed to the value its forwarded load stood for.
  void rename(Block& b) {
    for (Stmt& s : b.stmts) {
      for (ValueId& a : s.args) a = resolve(a);
      for (Block& c : s.blocks) rename(c);
    }
  }
  bool any() const { return forwarded_ > 0; }
  uint32_t forwarded() const { return forwarded_; }

 private:
  ValueId resolve(ValueId v) const {
    for (auto it = rename_.find(v); it != rename_.end(); it = rename_.find(v)) v = it->second;
    return v;
  }
  bool same_indices(const std::vector<ValueId>& stored, const std::vector<ValueId>& load) const {
    if (stored.size() != load.size()) return false;
    for (size_t i = 0; i < load.size(); ++i) {
      if (numbers_.of(resolve(load[i])) != stored[i]) return false;
    }
    return true;
  }

  ValueNumbers numbers_;
  std::unordered_map<ValueId, ValueId> rename_;
  uint32_t forwarded_ = 0;
};

}  // namespace

Kernel forward_stores(Kernel k, uint32_t* forwarded) {
  Forwarder f(k);
  for (Task& t : k.tasks) f.block(t.body);
  if (f.any()) {
    for (Task& t : k.tasks) f.rename(t.body);
  }
  if (forwarded) *forwarded = f.forwarded();
  return k;
}

Pass forward_stores_pass() {
  return {"forward-stores",
          [](Kernel k) -> Result<Kernel> { return forward_stores(std::move(k)); }};
}

}  // namespace vkad::codegen
