#include "autodiff/accumulations.h"

#include <algorithm>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autodiff/forward_stores.h"
#include "autodiff/reverse_mode.h"
#include "ir/walk.h"

namespace vkad::codegen {

namespace {

// Where a statement stands: its block, its place there, its task.
struct Site {
  Block* block = nullptr;
  size_t at = 0;
  const Task* task = nullptr;
  Stmt& stmt() const { return block->stmts[at]; }
  bool operator<(const Site& o) const { return std::pair(block, at) < std::pair(o.block, o.at); }
};

// One `load x[I]; add; store x[I]` of the header, and the value it adds.
struct Update {
  Site load, add, store;
  ValueId v = kNoValue;
};

class Accumulations {
 public:
  explicit Accumulations(Kernel& k) : k_(k), numbers_(k) {
    for (Task& t : k.tasks) scan(t, t.body);
  }

  uint32_t rewrite() {
    std::vector<Update> all;
    for (uint32_t p = 0; p < k_.params.size(); ++p) {
      const Param& prm = k_.params[p];
      if (prm.kind != ParamKind::kNdArray || !is_float(prm.dtype)) continue;
      std::vector<Update> ups = updates_of(p);
      all.insert(all.end(), ups.begin(), ups.end());
    }
    // Each store becomes the atomic add; its load and add go (later sites first, so the
    // earlier ones keep their places).
    std::vector<Site> gone;
    for (const Update& u : all) {
      Stmt& st = u.store.stmt();
      st.op = Op::kAtomicAdd;
      st.type = k_.params[st.param].dtype;
      st.args.back() = u.v;
      gone.push_back(u.load);
      gone.push_back(u.add);
    }
    std::sort(gone.begin(), gone.end(), [](const Site& a, const Site& b) { return b < a; });
    for (const Site& s : gone) s.block->stmts.erase(s.block->stmts.begin() + s.at);
    return static_cast<uint32_t>(all.size());
  }

 private:
  void scan(const Task& t, Block& b) {
    for (size_t i = 0; i < b.stmts.size(); ++i) {
      Stmt& s = b.stmts[i];
      for (ValueId a : s.args) ++uses_[a];
      if (s.result != kNoValue) def_[s.result] = {&b, i, &t};
      if (is_array_access(s)) accesses_[s.param].push_back({&b, i, &t});
      for (Block& c : s.blocks) scan(t, c);
    }
  }

  // x's updates where the header's conditions hold for x, else none.
  std::vector<Update> updates_of(uint32_t p) {
    std::vector<Update> ups;
    std::set<Site> loads;
    for (const Site& a : accesses_[p]) {
      const Op op = a.stmt().op;
      if (op == Op::kAtomicAdd) continue;
      if (op == Op::kLoad) {
        loads.insert(a);
        continue;
      }
      std::optional<Update> u = op == Op::kStore ? update_at(p, a) : std::nullopt;
      if (!u) return {};  // a plain store or an atomic_max
      ups.push_back(*u);
    }
    for (const Update& u : ups) loads.erase(u.load);
    if (!loads.empty()) return {};  // a value of x is read
    std::unordered_map<const Task*, bool> one_invocation;
    for (const Update& u : ups) {
      auto [it, fresh] = one_invocation.try_emplace(u.store.task, false);
      if (fresh) it->second = u.store.task->serial || owned_ndarrays(k_, *u.store.task)[p];
      if (!it->second) return {};
    }
    return ups;
  }

  // The update whose store is at `store`, if it is one.
  std::optional<Update> update_at(uint32_t p, const Site& store) const {
    const Stmt& st = store.stmt();
    const ValueId sum = st.args.back();
    auto add = def_.find(sum);
    if (add == def_.end() || add->second.block != store.block || use_count(sum) != 1) return {};
    const Stmt& a = add->second.stmt();
    if (a.op != Op::kAdd || a.type != k_.params[p].dtype) return {};
    for (int side = 0; side < 2; ++side) {
      const ValueId old = a.args[side], v = a.args[1 - side];
      auto load = def_.find(old);
      if (load == def_.end() || v == old || use_count(old) != 1) continue;
      const Site& l = load->second;
      const Stmt& ld = l.stmt();
      if (ld.op != Op::kLoad || ld.param != p || l.block != store.block) continue;
      if (ld.args.size() + 1 != st.args.size()) continue;
      bool same = true;
      for (size_t i = 0; i < ld.args.size(); ++i) {
        same = same && numbers_.of(ld.args[i]) == numbers_.of(st.args[i]);
      }
      if (!same) continue;
      // (The load precedes the add, which precedes the store: definitions precede uses.)
      for (size_t i = l.at + 1; i < store.at; ++i) {
        if (accesses_param(store.block->stmts[i], p)) return {};
      }
      return Update{l, add->second, store, v};
    }
    return {};
  }

  size_t use_count(ValueId v) const {
    auto it = uses_.find(v);
    return it == uses_.end() ? 0 : it->second;
  }

  Kernel& k_;
  ValueNumbers numbers_;
  std::unordered_map<ValueId, size_t> uses_;
  std::unordered_map<ValueId, Site> def_;
  std::unordered_map<uint32_t, std::vector<Site>> accesses_;
};

}  // namespace

Kernel accumulations_as_atomic_adds(Kernel k, uint32_t* rewritten) {
  const uint32_t n = Accumulations(k).rewrite();
  if (rewritten) *rewritten = n;
  return k;
}

Pass accumulate_stores_pass() {
  return {"accumulate-stores",
          [](Kernel k) -> Result<Kernel> { return accumulations_as_atomic_adds(std::move(k)); }};
}

}  // namespace vkad::codegen
