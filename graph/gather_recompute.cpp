#include "graph/gather_recompute.h"

#include <algorithm>
#include <bit>
#include <map>
#include <string>
#include <unordered_set>

#include "graph/launch_fusion.h"

namespace vkad::codegen {

namespace {

bool is_write(Op op) { return op == Op::kStore || op == Op::kAtomicAdd || op == Op::kAtomicMax; }

// One axis of an access: the task dimension whose index it is, or a launch-uniform word.
struct Axis {
  int dim = -1;       // >= 0: the index of task dimension `dim`
  uint32_t word = 0;  // dim < 0: the evaluated launch-uniform value
  bool operator==(const Axis&) const = default;
};

// The producer's writes, per output array.
struct Write {
  size_t stmt = 0;  // position in the body
  std::vector<Axis> axes;
  bool add = false;
};

struct ProducerFacts {
  std::vector<ValueId> indices;                   // per task dimension
  std::map<uint64_t, std::vector<Write>> writes;  // output identity -> its writes
  std::unordered_set<uint64_t> reads;             // arrays loaded
};

// The axes of an access of `p` in `l`, or nullopt when one is neither a task index nor a
// known launch-uniform value, a task index repeats or is missing, or an index axis does not
// span the task's whole range.
std::optional<std::vector<Axis>> owned_axes(const GatherLaunch& l, const Stmt& s,
                                            const std::vector<ValueId>& indices) {
  const size_t n = s.args.size() - (is_write(s.op) ? 1 : 0);
  std::vector<Axis> axes(n);
  std::vector<bool> seen(indices.size(), false);
  for (size_t a = 0; a < n; ++a) {
    const ValueId v = s.args[a];
    auto k = std::find(indices.begin(), indices.end(), v);
    if (k != indices.end()) {
      const size_t d = static_cast<size_t>(k - indices.begin());
      if (seen[d] || s.param >= l.extents.size() || a >= l.extents[s.param].size() ||
          d >= l.ranges.size() || l.ranges[d].first != 0 ||
          l.ranges[d].second != static_cast<int64_t>(l.extents[s.param][a])) {
        return std::nullopt;
      }
      seen[d] = true;
      axes[a].dim = static_cast<int>(d);
      continue;
    }
    std::optional<uint32_t> u = l.uniform.find(v);
    if (!u) return std::nullopt;
    axes[a].word = *u;
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) return std::nullopt;
  return axes;
}

bool same_index_axes(const std::vector<Axis>& a, const std::vector<Axis>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if ((a[i].dim < 0) != (b[i].dim < 0) || (a[i].dim >= 0 && a[i].dim != b[i].dim)) return false;
  }
  return true;
}

std::optional<ProducerFacts> producer_facts(const GatherLaunch& p,
                                            std::span<const uint64_t> zero_outputs) {
  if (!recompute_producer(*p.kernel)) return std::nullopt;
  ProducerFacts f;
  f.indices = task_indices(p.kernel->tasks[0]);
  const Block& body = p.kernel->tasks[0].body;
  for (size_t i = 0; i < body.stmts.size(); ++i) {
    const Stmt& s = body.stmts[i];
    if (!accesses_array(s.op)) continue;
    if (s.param >= p.arrays.size() || p.arrays[s.param] == 0) return std::nullopt;
    const uint64_t id = p.arrays[s.param];
    std::optional<std::vector<Axis>> axes = owned_axes(p, s, f.indices);
    if (!axes) return std::nullopt;
    if (s.op == Op::kLoad) {
      f.reads.insert(id);
      continue;
    }
    const bool add = s.op == Op::kAtomicAdd;
    if (add && std::find(zero_outputs.begin(), zero_outputs.end(), id) == zero_outputs.end()) {
      return std::nullopt;  // the element would be the sum with what was there
    }
    std::vector<Write>& w = f.writes[id];
    if (!w.empty() && (w[0].add != add || !same_index_axes(w[0].axes, *axes))) return std::nullopt;
    w.push_back({i, std::move(*axes), add});
  }
  for (const auto& [id, w] : f.writes) {
    if (f.reads.count(id)) return std::nullopt;  // reads what it writes: not a pure function
  }
  if (f.writes.empty()) return std::nullopt;
  return f;
}

// Whether the consumer writes anything the producer reads or writes.
bool writes_producer_arrays(const Block& b, const GatherLaunch& c, const ProducerFacts& f) {
  for (const Stmt& s : b.stmts) {
    if (is_write(s.op) && s.param < c.arrays.size()) {
      const uint64_t id = c.arrays[s.param];
      if (f.reads.count(id) || f.writes.count(id)) return true;
    }
    for (const Block& k : s.blocks) {
      if (writes_producer_arrays(k, c, f)) return true;
    }
  }
  return false;
}

class Rewrite {
 public:
  Rewrite(const GatherLaunch& c, const GatherLaunch& p, const ProducerFacts& f, Recomputed& out)
      : c_(c), p_(p), f_(f), out_(out) {}

  // The parameters the copies of the producer's body use: arrays the consumer binds are its
  // parameters; the others, and every scalar, are new ones.
  void map_params() {
    Kernel& k = out_.kernel;
    for (uint32_t q = 0; q < p_.kernel->params.size(); ++q) {
      const Param& pp = p_.kernel->params[q];
      if (pp.kind == ParamKind::kNdArray) {
        auto at = std::find(c_.arrays.begin(), c_.arrays.end(), p_.arrays[q]);
        if (at != c_.arrays.end()) {
          pm_.push_back(static_cast<uint32_t>(at - c_.arrays.begin()));
          continue;
        }
      }
      Param np = pp;
      np.name = "r_" + pp.name;
      np.needs_grad = false;
      np.read_only = pp.kind == ParamKind::kNdArray;
      pm_.push_back(static_cast<uint32_t>(k.params.size()));
      k.params.push_back(std::move(np));
      out_.producer_param.push_back(q);
    }
  }

  // Whether some load of an output reads another invocation's element than the consumer's
  // own (a gather): loads at the consumer's own index are fusion's to merge, not ours.
  bool gathers(const Block& b, ValueId own) const {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kLoad && s.param < c_.arrays.size() && f_.writes.count(c_.arrays[s.param])) {
        const Write& w = f_.writes.at(c_.arrays[s.param]).front();
        for (size_t a = 0; a < w.axes.size() && a < s.args.size(); ++a) {
          if (w.axes[a].dim >= 0 && s.args[a] != own) return true;
        }
      }
      for (const Block& k : s.blocks) {
        if (gathers(k, own)) return true;
      }
    }
    return false;
  }

  // `in` rewritten into `out`; false when a load of an output matches none of its writes.
  bool block(const Block& in, Block& out) {
    scopes_.emplace_back();
    for (const Stmt& s : in.stmts) {
      Stmt c = s;
      for (ValueId& a : c.args) a = value(a);
      number(c);
      if (c.op == Op::kLoad && c.param < c_.arrays.size() && f_.writes.count(c_.arrays[c.param])) {
        std::optional<ValueId> v = recomputed(c, out);
        if (!v) return false;
        subst_[s.result] = *v;
        ++replaced_;
        continue;
      }
      for (size_t b = 0; b < s.blocks.size(); ++b) {
        c.blocks[b].stmts.clear();
        if (!block(s.blocks[b], c.blocks[b])) return false;
      }
      out.stmts.push_back(std::move(c));
    }
    scopes_.pop_back();
    return true;
  }

  size_t replaced() const { return replaced_; }

 private:
  ValueId value(ValueId v) const {
    auto it = subst_.find(v);
    return it == subst_.end() ? v : it->second;
  }

  // Value numbering of the consumer's pure statements, for copy_at's key: a builder that
  // writes `base + offset` once per access (diffmpm's p2g adds into two grid arrays at each of
  // its 9 cells) gives every load its own index values, and without it each load of a cell got
  // its own copy of the producer's body (the adjoint's gathers doubled: 36 loads where 18 do).
  // Equal canonical values are equal: same op, type and immediates on equal operands.
  void number(const Stmt& c) {
    const OpFamily fam = op_info(c.op).family;
    if (c.result == kNoValue || !c.blocks.empty() || fam == OpFamily::kLocal ||
        fam == OpFamily::kArray || fam == OpFamily::kControl || fam == OpFamily::kStack) {
      return;
    }
    std::vector<uint64_t> key = {
        static_cast<uint64_t>(c.op),     static_cast<uint64_t>(c.type), c.param, c.dim,
        std::bit_cast<uint64_t>(c.fimm), static_cast<uint64_t>(c.iimm)};
    for (ValueId a : c.args) key.push_back(canonical(a));
    canon_[c.result] = numbers_.try_emplace(std::move(key), c.result).first->second;
  }
  ValueId canonical(ValueId v) const {
    auto it = canon_.find(v);
    return it == canon_.end() ? v : it->second;
  }

  // The value of a consumer load `ld` (its operands already rewritten) of a producer output,
  // its copy of the producer's body appended to `out` unless one at the same indices is in
  // scope.
  std::optional<ValueId> recomputed(const Stmt& ld, Block& out) {
    const std::vector<Write>& writes = f_.writes.at(c_.arrays[ld.param]);
    // The load's indices per task dimension, and the writes whose uniform axes it matches.
    std::vector<ValueId> at(f_.indices.size(), kNoValue);
    std::vector<const Write*> match;
    for (const Write& w : writes) {
      if (w.axes.size() != ld.args.size()) return std::nullopt;
      bool ok = true;
      for (size_t a = 0; a < w.axes.size(); ++a) {
        if (w.axes[a].dim >= 0) {
          at[static_cast<size_t>(w.axes[a].dim)] = ld.args[a];
          continue;
        }
        auto u = uniform_word(ld, a);
        ok = ok && u && *u == w.axes[a].word;
      }
      if (ok) match.push_back(&w);
    }
    if (match.empty()) return std::nullopt;
    const std::vector<ValueId>& values = copy_at(at, out);
    if (!match[0]->add) return values[match.back()->stmt];
    // The sum of the adds onto zeros, in the body's order (the atomics' order is unspecified).
    ValueId sum = emit(out, Op::kConst, ld.type, {});
    for (const Write* w : match) sum = emit(out, Op::kAdd, ld.type, {sum, values[w->stmt]});
    return sum;
  }

  // The evaluated launch-uniform value of axis `a` of consumer load `ld`, whose operands were
  // rewritten: a replaced value is not uniform.
  std::optional<uint32_t> uniform_word(const Stmt& ld, size_t a) const {
    return c_.uniform.find(ld.args[a]);
  }

  ValueId emit(Block& out, Op op, DType t, std::vector<ValueId> args) {
    Stmt s;
    s.op = op;
    s.type = t;
    s.result = out_.kernel.fresh();
    s.args = std::move(args);
    out.stmts.push_back(std::move(s));
    return out.stmts.back().result;
  }

  // Per producer statement, the copy's value of what it writes, for the copy at indices `at`:
  // one in scope, else a new copy appended to `out`.
  const std::vector<ValueId>& copy_at(const std::vector<ValueId>& at, Block& out) {
    // Keyed by canonical indices: a copy in scope at equal indices serves (it dominates).
    std::vector<ValueId> key(at.size());
    for (size_t d = 0; d < at.size(); ++d) key[d] = canonical(at[d]);
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto it = s->find(key);
      if (it != s->end()) return it->second;
    }
    MemberCopier copier(out_.kernel, f_.indices[0], pm_);
    copier.new_index = at[0];
    for (size_t d = 1; d < at.size(); ++d) copier.substitute(f_.indices[d], at[d]);
    const Block& body = p_.kernel->tasks[0].body;
    std::vector<ValueId> written(body.stmts.size(), kNoValue);
    for (size_t i = 0; i < body.stmts.size(); ++i) {
      const Stmt& s = body.stmts[i];
      if (is_write(s.op)) {
        written[i] = copier.value(s.args.back());
      } else {
        out.stmts.push_back(copier.copy(s));
      }
    }
    return scopes_.back().emplace(std::move(key), std::move(written)).first->second;
  }

  const GatherLaunch& c_;
  const GatherLaunch& p_;
  const ProducerFacts& f_;
  Recomputed& out_;
  std::vector<uint32_t> pm_;  // producer parameter -> kernel parameter
  std::unordered_map<ValueId, ValueId> subst_;
  std::unordered_map<ValueId, ValueId> canon_;        // value -> its canonical value
  std::map<std::vector<uint64_t>, ValueId> numbers_;  // statement key -> canonical value
  std::vector<std::map<std::vector<ValueId>, std::vector<ValueId>>> scopes_;
  size_t replaced_ = 0;
};

}  // namespace

bool recompute_producer(const Kernel& k) {
  if (k.tasks.size() != 1 || k.tasks[0].serial || k.tasks[0].index == kNoValue) return false;
  for (const Stmt& s : k.tasks[0].body.stmts) {
    if (!s.blocks.empty() || s.has_cap || op_info(s.op).family == OpFamily::kStack ||
        s.op == Op::kBarrier || s.op == Op::kAtomicMax || s.op == Op::kPrint ||
        s.op == Op::kAssert) {  // recomputing a print would print it again
      return false;
    }
  }
  return true;
}

std::optional<Recomputed> recompute_gathers(const GatherLaunch& consumer,
                                            const GatherLaunch& producer,
                                            std::span<const uint64_t> zero_outputs) {
  std::optional<ProducerFacts> f = producer_facts(producer, zero_outputs);
  if (!f) return std::nullopt;
  const Kernel& c = *consumer.kernel;
  for (const Task& t : c.tasks) {
    if (writes_producer_arrays(t.body, consumer, *f)) return std::nullopt;
  }
  Recomputed out;
  Rewrite probe(consumer, producer, *f, out);
  bool any_gather = false;
  for (const Task& t : c.tasks) any_gather = any_gather || probe.gathers(t.body, t.index);
  if (!any_gather) return std::nullopt;
  out.kernel.name = c.name + "_with_" + producer.kernel->name;
  out.kernel.params = c.params;
  out.kernel.next_id = c.next_id;
  Rewrite rw(consumer, producer, *f, out);
  rw.map_params();
  for (const Task& t : c.tasks) {
    Task nt = t;
    nt.body.stmts.clear();
    if (!rw.block(t.body, nt.body)) return std::nullopt;
    out.kernel.tasks.push_back(std::move(nt));
  }
  if (rw.replaced() == 0) return std::nullopt;
  size_t arrays = 0;
  for (const Param& p : out.kernel.params) arrays += p.kind == ParamKind::kNdArray;
  if (arrays > kMaxRecomputeArrays) return std::nullopt;
  return out;
}

}  // namespace vkad::codegen
