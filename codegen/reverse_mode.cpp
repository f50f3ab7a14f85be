#include "codegen/reverse_mode.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "codegen/checkpoint.h"
#include "codegen/derivative_rules.h"
#include "codegen/disjoint_access.h"
#include "codegen/jumps.h"
#include "codegen/text.h"
#include "codegen/trip_counter.h"
#include "codegen/verifier.h"

namespace vkad::codegen {

namespace {

bool is_loop(const Stmt& s) { return s.op == Op::kFor || s.op == Op::kWhile; }

// A symbolic integer range: lo is a constant (or assumed >= 0), up a SizeExpr.
struct SymRange {
  int64_t lo = 0;
  SizeExpr up;
};

class ReverseMode : public PartialBuilder {
 public:
  // `counting`: loops with no derivable or stated trip bound get a counted one (a scalar
  // parameter of the adjoint, measured by counter_kernel()) instead of an error.
  ReverseMode(const Kernel& f, const Target& t, bool counting = false, bool clear_seeds = false)
      : f_(f), t_(t), counting_(counting), clear_seeds_(clear_seeds) {}

  Result<Kernel> run() {
    VKAD_TRY(verify(f_, t_));
    VKAD_TRY(check_rules());
    a_.name = f_.name + "_adjoint";
    a_.params = f_.params;
    grad_param_.assign(f_.params.size(), UINT32_MAX);
    for (uint32_t p = 0; p < f_.params.size(); ++p) {
      a_.params[p].needs_grad = false;
      if (!f_.params[p].needs_grad) continue;
      Param g = f_.params[p];
      g.name += "_grad";
      g.needs_grad = false;
      g.read_only = false;
      if (g.kind == ParamKind::kScalar) {  // d loss / d scalar: one element
        g.kind = ParamKind::kNdArray;
        g.rank = 1;
      }
      grad_param_[p] = static_cast<uint32_t>(a_.params.size());
      a_.params.push_back(std::move(g));
    }
    for (auto it = f_.tasks.rbegin(); it != f_.tasks.rend(); ++it) VKAD_TRY(task(*it));
    VKAD_TRY(verify_adjoint(f_, a_, t_));
    return std::move(a_);
  }

 private:
  // ------------------------------------------------------------ rules
  Status error(const Task& t, const Stmt& s, const std::string& what) const {
    return make_error(ErrorCode::kInvalidArgument, "reverse mode of kernel '" + f_.name + "', task '" +
                                                       t.name + "', statement `" + print_stmt(f_, s) +
                                                       "`: " + what);
  }

  // Which ndarrays may be both read and written (the adjoint runs after the forward, so its
  // replay reads every ndarray as the forward left it, and it writes no primal ndarray):
  //  - written only in tasks before every task that reads it, or (disjoint_access.h) proven
  //    never to write, in a read's task or a later one, an element the read reads: the replay
  //    reads what the forward read. Accepted, with or without a gradient; a gradient flows
  //    from the reads into the writes through the gradient array (a store's adjoint reads its
  //    element's gradient as the seed, a load's adds into its own element, so disjoint
  //    elements keep the seeds apart from the accumulations).
  //  - otherwise (read and written in one task, or read before a later task writes it): only
  //    an array without gradient, and only while the reverse sweep needs none of the values
  //    read from it (checked per task in check_read_write, after the needed-values analysis).
  // An array without gradient must not carry differentiable values from a store to a read:
  // the gradient through it would be lost (also check_read_write).
  Status check_rules() {
    std::vector<const Stmt*> first_read(f_.params.size(), nullptr), first_write(f_.params.size(), nullptr);
    const size_t none = SIZE_MAX;
    std::vector<size_t> first_read_task(f_.params.size(), none), last_write_task(f_.params.size(), none);
    std::vector<const Stmt*> last_write(f_.params.size(), nullptr);
    size_t task_no = 0;
    int depth = 0;
    std::function<Status(const Task&, const Block&)> walk = [&](const Task& t, const Block& b) -> Status {
      for (const Stmt& s : b.stmts) {
        if (s.op == Op::kBarrier) return error(t, s, "barrier cannot be differentiated");
        if (s.op >= Op::kStackAlloc) return error(t, s, "adstack statements cannot be differentiated");
        if (s.op == Op::kAtomicMax) return error(t, s, "atomic_max cannot be differentiated");
        if (!s.blocks.empty() && depth == kMaxAdjointNesting) {
          return error(t, s, "loops and branches are nested " + std::to_string(depth + 1) +
                                 " deep here; reverse mode supports at most " +
                                 std::to_string(kMaxAdjointNesting) +
                                 " (the adjoint replays each loop level once per enclosing loop). "
                                 "Split the kernel into tasks or flatten the conditions");
        }
        if (s.op == Op::kLoad) {
          if (!first_read[s.param]) first_read[s.param] = &s;
          if (first_read_task[s.param] == none) first_read_task[s.param] = task_no;
        }
        if (s.op == Op::kStore || s.op == Op::kAtomicAdd) {
          if (!first_write[s.param]) first_write[s.param] = &s;
          if (last_write_task[s.param] != task_no) last_write[s.param] = &s;
          last_write_task[s.param] = task_no;
        }
        ++depth;
        for (const Block& c : s.blocks) VKAD_TRY(walk(t, c));
        --depth;
      }
      return {};
    };
    for (const Task& t : f_.tasks) {
      VKAD_TRY(walk(t, t.body));
      ++task_no;
    }
    rw_unordered_.assign(f_.params.size(), false);
    rw_no_grad_.assign(f_.params.size(), false);
    for (size_t p = 0; p < f_.params.size(); ++p) {
      if (!first_read[p] || !first_write[p]) continue;
      const bool ordered =
          last_write_task[p] < first_read_task[p] ||
          disjoint_access(f_, static_cast<uint32_t>(p)).kind != DisjointAccess::Kind::kUnproven;
      const std::string name = "ndarray '" + f_.params[p].name + "'";
      if (!f_.params[p].needs_grad) {
        rw_no_grad_[p] = true;
        rw_unordered_[p] = !ordered;
        continue;
      }
      if (ordered) continue;
      const Task& rt = f_.tasks[first_read_task[p]];
      const Task& wt = f_.tasks[last_write_task[p]];
      if (&rt == &wt) {
        return error(
            wt, *last_write[p],
            name + " (grad) is both read and written in task '" + wt.name +
                "'; its gradient would need the values the stores overwrite, which the "
                "adjoint (run after the forward) no longer sees. Write the result to a "
                "separate ndarray, or move the stores into an earlier task than the reads, "
                "or index the reads and the stores on one axis by launch-uniform values "
                "a constant apart (read x[f, i], store x[f + 1, i])");
      }
      return error(wt, *last_write[p],
                   name + " (grad) is read in task '" + rt.name +
                       "' and written by the later task '" + wt.name +
                       "'; the gradient of the read needs the values the write "
                       "overwrites. Write the result to a separate ndarray, or index the reads "
                       "and the stores on one axis by launch-uniform values a constant apart "
                       "(read x[f, i], store x[f + 1, i])");
    }
    return {};
  }

  // The per-task half of check_rules, after activity and needed values are known.
  Status check_read_write(const Task& t, const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kLoad || s.op == Op::kStore || s.op == Op::kAtomicAdd) {
        if (!rw_no_grad_[s.param]) continue;
        const std::string name = "ndarray '" + f_.params[s.param].name + "'";
        if (s.op != Op::kLoad && act(s.args.back())) {
          return error(t, s,
                       name + " has no gradient, yet the kernel stores a differentiable value into "
                       "it and reads it back: the gradient through it would be lost. Mark it grad "
                       "(and write it in an earlier task than the reads), or keep the value in a "
                       "local");
        }
        if (s.op == Op::kLoad && rw_unordered_[s.param] && needed_anywhere(s.result)) {
          return error(t, s,
                       name + " is read and written in task '" + t.name +
                           "' (or written after it is read), and the reverse sweep needs the value "
                           "this load read; the adjoint, run after the forward, would read the "
                           "overwritten value. Move the stores into an earlier task than the reads, "
                           "or write to a separate ndarray");
        }
      }
      for (const Block& c : s.blocks) VKAD_TRY(check_read_write(t, c));
    }
    return {};
  }

  // ------------------------------------------------------------ analysis (forward ids)
  //
  // Positions: each statement's path from the task body, one Pos per level (its index in the
  // block, which block of the statement at that level the path enters, that statement).
  struct Pos {
    uint32_t index = 0;
    uint32_t block = 0;
    const Stmt* stmt = nullptr;
  };
  void index_defs(const Block& b, std::vector<const Stmt*>& ctrl, std::vector<Pos>& at) {
    for (uint32_t i = 0; i < b.stmts.size(); ++i) {
      const Stmt& s = b.stmts[i];
      at.push_back({i, 0, &s});
      path_[&s] = at;
      if (s.result != kNoValue) {
        def_[s.result] = &s;
        type_[s.result] = s.type;
      }
      if (s.op == Op::kStoreLocal) stores_[s.args[0]].push_back(&s);
      // A loop's reversal replays its body: what the body uses is read in the reverse sweep.
      if (!ctrl.empty() && std::any_of(ctrl.begin(), ctrl.end(), [](const Stmt* c) { return is_loop(*c); })) {
        for (ValueId x : s.args) read_.insert(x);
      }
      if (!s.blocks.empty()) {
        ctrl.push_back(&s);
        for (uint32_t c = 0; c < s.blocks.size(); ++c) {
          at.back().block = c;
          index_defs(s.blocks[c], ctrl, at);
        }
        ctrl.pop_back();
      }
      at.pop_back();
    }
  }

  // Frames (see "forward replay" below): the task body (nullptr) and each loop's body (the
  // loop). Whether statement x lies in frame F's body, at any depth.
  bool inside(const Stmt* F, const Stmt* x) const {
    if (!F) return true;
    const std::vector<Pos>& p = path_.at(x);
    for (size_t d = 0; d + 1 < p.size(); ++d) {
      if (p[d].stmt == F) return true;
    }
    return false;
  }
  // The innermost frame around statement x: its innermost enclosing loop, or the task body.
  const Stmt* frame_of(const Stmt* x) const {
    const std::vector<Pos>& p = path_.at(x);
    for (size_t d = p.size() - 1; d-- > 0;) {
      if (is_loop(*p[d].stmt)) return p[d].stmt;
    }
    return nullptr;
  }
  // Whether, in one replay of frame F, store `st` can run before `at` (a statement in F; both
  // inside F) with no replay start of F in between: it comes first in the body, or both lie in
  // one loop nested in F (its back edge), or `at` is such a loop and `st` is inside it. Stores
  // on the other side of a branch do not; stores after `at` reach it only through F's own back
  // edge, which the replay cuts (it starts each iteration from F's checkpoint).
  bool reaches(const Stmt* F, const Stmt* st, const Stmt* at) const {
    const std::vector<Pos>& ps = path_.at(st);
    const std::vector<Pos>& pa = path_.at(at);
    for (size_t d = F ? path_.at(F).size() : 0; d < ps.size() && d < pa.size(); ++d) {
      if (ps[d].index != pa[d].index) return ps[d].index < pa[d].index;
      const Stmt* c = ps[d].stmt;  // a statement both lie in (or one of them)
      if (d + 1 == ps.size() || d + 1 == pa.size() || is_loop(*c)) return is_loop(*c);
      if (ps[d].block != pa[d].block) return false;  // two sides of a branch
    }
    return false;
  }

  bool act(ValueId v) const { return active_.count(v) > 0; }

  bool activity(const Block& b) {
    bool changed = false;
    for (const Stmt& s : b.stmts) {
      for (const Block& c : s.blocks) changed |= activity(c);
      if (s.op == Op::kStoreLocal) {
        if (act(s.args[1]) && active_.insert(s.args[0]).second) changed = true;
        continue;
      }
      if (s.result == kNoValue || !is_float(s.type) || s.op == Op::kAlloca || s.op == Op::kFor) continue;
      bool a = false;
      switch (s.op) {
        case Op::kLoad: a = f_.params[s.param].needs_grad; break;
        case Op::kLoadLocal: a = act(s.args[0]); break;
        case Op::kArg: a = f_.params[s.param].needs_grad; break;
        case Op::kConst: case Op::kShape: break;
        case Op::kSelect: a = act(s.args[1]) || act(s.args[2]); break;
        default:
          for (ValueId x : s.args) a = a || act(x);
      }
      if (a && active_.insert(s.result).second) changed = true;
    }
    return changed;
  }

  // v's primal is read by the reverse sweep of frame F (a seed).
  void mark(ValueId v, const Stmt* F) {
    read_.insert(v);
    need(v, F);
  }
  // v is needed in some frame (the reverse sweep reads it, directly or through a replay).
  bool needed_anywhere(ValueId v) const {
    auto it = needed_.lower_bound({v, nullptr});
    return it != needed_.end() && it->first == v;
  }
  // v must be recomputed right by the replay of frame F. A value defined outside F is not
  // recomputed there: it is its home frame's replay value.
  void need(ValueId v, const Stmt* F) {
    auto it = def_.find(v);
    if (it == def_.end()) return;  // the task index
    const Stmt* d = it->second;
    if (is_loop(*d)) return;  // a loop index: the replayed loop recomputes it
    if (!inside(F, d)) F = frame_of(d);
    if (needed_.insert({v, F}).second) work_.push_back({v, F});
  }

  // The union of the primals read by the partials rev_stmt will emit for `s`: those of its
  // operands that carry a derivative.
  uint8_t primal_reads(const Stmt& s) const {
    const DerivativeRule* r = derivative_rule(s.op);
    if (!r) return 0;
    uint8_t reads = 0;
    for (size_t k = 0; k < s.args.size() && k < 3; ++k) {
      if (r->partial[k].emit && act(s.args[k])) reads |= r->partial[k].reads;
    }
    return reads;
  }

  void seed_needed(const Block& b) {
    for (const Stmt& s : b.stmts) {
      const Stmt* F = frame_of(&s);  // the frame whose reverse sweep reverses s
      bool active = s.result != kNoValue && act(s.result);
      // The primals that the partials of active operands read (derivative_rules.h): the same
      // rows rev_stmt emits from.
      if (active) {
        uint8_t reads = primal_reads(s);
        for (size_t k = 0; k < s.args.size() && k < 3; ++k) {
          if (reads & (1u << k)) mark(s.args[k], F);
        }
        if (reads & kReadResult) mark(s.result, F);
      }
      // Loop bounds and conditions decide what every replay that runs them computes: needed in
      // each frame around them.
      // A while loop's test (args[0]) decides the trip count each replay of it finds; its own
      // reversal does not run the test (it reads that count), so the test is needed in the
      // frames around the loop only.
      if (s.op == Op::kFor || s.op == Op::kIf || s.op == Op::kWhile) {
        const std::vector<Pos>& p = path_.at(&s);
        for (size_t d = 0; d + 1 < p.size(); ++d) {
          if (!is_loop(*p[d].stmt)) continue;
          for (ValueId x : s.args) mark(x, p[d].stmt);
        }
        for (ValueId x : s.args) mark(x, nullptr);
      }
      if (s.op == Op::kLoad && active) {
        for (ValueId x : s.args) mark(x, F);
      }
      if ((s.op == Op::kStore || s.op == Op::kAtomicAdd) && f_.params[s.param].needs_grad &&
          act(s.args.back())) {
        for (size_t i = 0; i + 1 < s.args.size(); ++i) mark(s.args[i], F);
      }
      // A while loop's test is never reversed: it seeds nothing of its own (its value is
      // marked above).
      if (s.op == Op::kWhile) {
        seed_needed(s.blocks[1]);
        continue;
      }
      for (const Block& c : s.blocks) seed_needed(c);
    }
  }

  // Closes `needed_` over what the replays read to recompute needed values, and decides the
  // checkpoints. Frame F's replay starts from F's checkpoint, so a needed load of local L in it
  // is right when (a) every store to L that can run before the load in that replay
  // (`reaches`) stores a value F recomputes right, and (b) if L is declared outside F, L is
  // checkpointed at F. Only reaching stores count: a store after the load in F's body reaches
  // it only through F's back edge, i.e. through the checkpoint, which (b) covers. (Stopping at
  // the load, with no (a), left `t = q; q = p + q; p = t` reading a stale p: issue 12;
  // counting every store to L in the kernel made the training example checkpoint its linearly
  // updated positions as well, doubling its heap: issue 13.)
  void propagate_needed() {
    while (!work_.empty()) {
      auto [v, F] = work_.back();
      work_.pop_back();
      const Stmt& s = *def_.at(v);
      if (s.op == Op::kLoadLocal) {
        ValueId L = s.args[0];
        for (const Stmt* st : stores_[L]) {
          if (inside(F, st) && reaches(F, st, &s)) need(st->args[1], F);
        }
        if (F && !inside(F, def_.at(L))) checkpoint(F, L);
        continue;
      }
      for (ValueId x : s.args) need(x, F);
    }
  }

  // Local L is checkpointed at loop G: the replay of G's enclosing frame P pushes L at the start
  // of every iteration of G, so L must be right there: the stores in P that can run before G
  // (those inside G, through G's back edge, included) store values P recomputes right, and if L
  // is declared outside P, P checkpoints it too. Branches need no checkpoints: the reverse of
  // a branch reads the values its frame's replay left in hoisted locals (see fwd) instead of
  // replaying it.
  void checkpoint(const Stmt* G, ValueId L) {
    std::vector<ValueId>& list = ckpt_[G];
    if (std::find(list.begin(), list.end(), L) != list.end()) return;
    list.push_back(L);
    const Stmt* P = frame_of(G);
    for (const Stmt* st : stores_[L]) {
      if (inside(P, st) && reaches(P, st, G)) need(st->args[1], P);
    }
    if (P && !inside(P, def_.at(L))) checkpoint(P, L);
  }

  // Symbolic range of an integer value, or nullopt when it depends on data.
  std::optional<SymRange> range(ValueId v) {
    {
      int64_t lo = 0;
      SizeExpr up;
      if (task_index_bounds(*task_, v, &lo, &up)) {  // an index of the task (any dimension)
        SymRange r;
        r.lo = lo;
        r.up = std::move(up);
        return r;
      }
    }
    auto it = def_.find(v);
    if (it == def_.end()) return std::nullopt;
    const Stmt& s = *it->second;
    using K = SizeExpr::Kind;
    auto both = [&](auto f) -> std::optional<SymRange> {
      auto a = range(s.args[0]), b = range(s.args[1]);
      if (!a || !b) return std::nullopt;
      return f(*a, *b);
    };
    switch (s.op) {
      case Op::kConst: return SymRange{s.iimm, SizeExpr::constant(s.iimm)};
      case Op::kArg: return SymRange{0, SizeExpr::scalar(s.param)};
      case Op::kShape: return SymRange{0, SizeExpr::array_dim(s.param, s.dim)};
      case Op::kCast: return is_int(s.type) && is_int(type_.at(s.args[0])) ? range(s.args[0]) : std::nullopt;
      case Op::kFor: {
        auto b = range(s.args[0]), e = range(s.args[1]);
        if (b && e) return SymRange{b->lo, SizeExpr::combine(K::kAdd, e->up, SizeExpr::constant(-1))};
        // A stated trip bound caps the index too: index < begin + max_trip (a launch that
        // exceeds it overflows this loop's own stack, which is reported).
        if (b && (s.has_cap || (counting_ && !probing_))) {
          SizeExpr trips = s.has_cap ? s.cap : counted(s);
          return SymRange{b->lo, SizeExpr::combine(K::kAdd, SizeExpr::combine(K::kAdd, b->up, trips),
                                                   SizeExpr::constant(-1))};
        }
        return std::nullopt;
      }
      case Op::kWhile:
        // Its index is below the stated trip bound (a launch past it overflows the loop's
        // stack, or the counted bound is exact).
        if (s.has_cap) return SymRange{0, SizeExpr::combine(K::kAdd, s.cap, SizeExpr::constant(-1))};
        if (counting_ && !probing_) {
          return SymRange{0, SizeExpr::combine(K::kAdd, counted(s), SizeExpr::constant(-1))};
        }
        return std::nullopt;
      case Op::kAdd:
        return both([](SymRange a, SymRange b) -> std::optional<SymRange> {
          return SymRange{a.lo + b.lo, SizeExpr::combine(K::kAdd, a.up, b.up)};
        });
      case Op::kSub:
        return both([](SymRange a, SymRange b) -> std::optional<SymRange> {
          return SymRange{0, SizeExpr::combine(K::kAdd, a.up, SizeExpr::constant(-b.lo))};
        });
      case Op::kMul:
        return both([](SymRange a, SymRange b) -> std::optional<SymRange> {
          if (a.lo < 0 || b.lo < 0) return std::nullopt;
          return SymRange{a.lo * b.lo, SizeExpr::combine(K::kMul, a.up, b.up)};
        });
      case Op::kMax:
        return both([](SymRange a, SymRange b) -> std::optional<SymRange> {
          return SymRange{std::max(a.lo, b.lo), SizeExpr::combine(K::kMax, a.up, b.up)};
        });
      case Op::kMin:
        return both([](SymRange a, SymRange b) -> std::optional<SymRange> {
          return SymRange{std::min(a.lo, b.lo), b.up.kind == K::kConst ? b.up : a.up};
        });
      case Op::kMod: {
        auto c = def_.find(s.args[1]);
        if (c == def_.end() || c->second->op != Op::kConst || c->second->iimm <= 0) return std::nullopt;
        return SymRange{0, SizeExpr::constant(c->second->iimm - 1)};
      }
      case Op::kDiv:
      case Op::kFloorDiv: {
        auto a = range(s.args[0]);
        auto c = def_.find(s.args[1]);
        if (!a || a->lo < 0 || c == def_.end() || c->second->op != Op::kConst || c->second->iimm < 1) return std::nullopt;
        // Non-negative by a constant >= 1: div and floordiv agree, floor(up / c) bounds it.
        return SymRange{a->lo / c->second->iimm, SizeExpr::div(a->up, c->second->iimm)};
      }
      default: return std::nullopt;
    }
  }

  SizeExpr bound_size(const RangeBound& b) const {
    switch (b.kind) {
      case RangeBound::Kind::kConstant: return SizeExpr::constant(b.value);
      case RangeBound::Kind::kScalarParam: return SizeExpr::scalar(b.param);
      case RangeBound::Kind::kArrayDim: return SizeExpr::array_dim(b.param, b.dim);
    }
    return {};
  }

  Result<SizeExpr> trip_bound(const Stmt& loop) {
    if (loop.has_cap) return loop.cap;
    if (loop.op == Op::kWhile && counting_) return counted(loop);
    if (loop.op == Op::kWhile) {
      return error(*task_, loop,
                   "reverse mode needs a bound on this while loop's trip count to size its "
                   "adstack. State one: `while %i (%c) max_trip(<size>) { ... } do { ... }` in "
                   "text, or KernelBuilder::while_(cond, max_trip, body); or let "
                   "make_adjoint_counted count it on the device");
    }
    auto b = range(loop.args[0]), e = range(loop.args[1]);
    if ((!b || !e) && counting_) return counted(loop);
    if (!b || !e) {
      return error(*task_, loop,
                   "reverse mode needs a bound on this loop's trip count to size its adstack, and "
                   "its bounds depend on ndarray contents or mutable locals. State one: "
                   "`for %i in [%b, %e) max_trip(<size>)` in text, or "
                   "KernelBuilder::for_range(begin, end, max_trip, body); or let "
                   "make_adjoint_counted count it on the device");
    }
    return SizeExpr::combine(SizeExpr::Kind::kAdd, e->up, SizeExpr::constant(-b->lo));
  }

  // The counted trip bound of `loop`: a new i32 scalar parameter of the adjoint, named after the
  // loop, that launch_counted (runtime/counted_launch.h) sets from the counting kernel.
  SizeExpr counted(const Stmt& loop) {
    auto it = counted_.find(&loop);
    if (it == counted_.end()) {
      Param p;
      p.name = "trips_" + std::to_string(loop.result);
      p.kind = ParamKind::kScalar;
      p.dtype = DType::kI32;
      it = counted_.emplace(&loop, static_cast<uint32_t>(a_.params.size())).first;
      a_.params.push_back(std::move(p));
      counted_order_.push_back(&loop);
    }
    return SizeExpr::scalar(it->second);
  }

 public:
  // The counted loops (their result ids), in the order of the adjoint's trips_ parameters.
  // Valid after run().
  std::vector<ValueId> counted_loops() const {
    std::vector<ValueId> ids;
    for (const Stmt* l : counted_order_) ids.push_back(l->result);
    return ids;
  }
  // The loops (forward ids) that segmented checkpointing (checkpoint.h) should split, given
  // Target::checkpoint_segment. Valid after run().
  const std::unordered_map<ValueId, uint32_t>& segmentable_loops() const { return segmentable_; }

 private:
  // ------------------------------------------------------------ emission helpers (adjoint ids)
  ValueId emit(Stmt s) {
    if (op_info(s.op).has_result) s.result = a_.fresh();
    ValueId r = s.result;
    out_.back()->stmts.push_back(std::move(s));
    return r;
  }
  ValueId mk(Op op, DType t, std::vector<ValueId> args) {
    Stmt s;
    s.op = op;
    s.type = t;
    s.args = std::move(args);
    return emit(std::move(s));
  }
  ValueId cst(DType t, double v) {
    Stmt s;
    s.op = Op::kConst;
    s.type = t;
    if (is_float(t)) s.fimm = t == DType::kF32 ? static_cast<float>(v) : v;
    else s.iimm = static_cast<int64_t>(v), s.fimm = v;
    return emit(std::move(s));
  }
  void store_local(ValueId local, ValueId v) { mk(Op::kStoreLocal, DType::kF32, {local, v}); }
  ValueId load_local(ValueId local, DType t) { return mk(Op::kLoadLocal, t, {local}); }
  ValueId p(ValueId forward) const { return map_.at(forward); }
  DType ft(ValueId forward) const { return type_.at(forward); }

  // The adjoint of forward value `x` += d (nothing if x carries no derivative).
  void acc(ValueId x, ValueId d) {
    if (!act(x) || !vadj_.count(x)) return;
    ValueId local = vadj_.at(x);
    store_local(local, mk(Op::kAdd, ft(x), {load_local(local, ft(x)), d}));
  }

  // Emits `for idx in [b, e) { body(idx) }` into the current block.
  template <typename Body>
  // `like`: the forward loop it runs the trips of; a constant max_trip of it carries over (the
  // emitter asks the driver to unroll a loop that short: spirv_emitter.cpp, kUnrollMaxTrips).
  void emit_for(ValueId b, ValueId e, Body body, const Stmt* like = nullptr) {
    Stmt loop;
    loop.op = Op::kFor;
    loop.type = DType::kI32;
    loop.args = {b, e};
    if (like && like->has_cap && like->cap.kind == SizeExpr::Kind::kConst) {
      loop.has_cap = true;
      loop.cap = like->cap;
    }
    loop.blocks.resize(1);
    ValueId idx = emit(std::move(loop));
    in_block(out_.back()->stmts.back().blocks[0], [&] { body(idx); });
  }

  // Emits `while idx (test(idx)) { body(idx) }` into the current block; `test` returns the
  // test value it emitted.
  template <typename Test, typename Body>
  void emit_while(Test test, Body body) {
    Stmt loop;
    loop.op = Op::kWhile;
    loop.type = DType::kI32;
    loop.blocks.resize(2);
    ValueId idx = emit(std::move(loop));
    Stmt& st = out_.back()->stmts.back();  // stable: the callbacks fill its own blocks
    ValueId c = kNoValue;
    in_block(st.blocks[0], [&] { c = test(idx); });
    st.args = {c};
    in_block(st.blocks[1], [&] { body(idx); });
  }

  // Emits `if cond { side(0) } else { side(1) }` into the current block.
  template <typename Side>
  void emit_if(ValueId cond, Side side) {
    Stmt br;
    br.op = Op::kIf;
    br.type = DType::kBool;
    br.args = {cond};
    br.blocks.resize(2);
    emit(std::move(br));
    Stmt& st = out_.back()->stmts.back();
    for (int i = 0; i < 2; ++i) in_block(st.blocks[i], [&] { side(i); });
  }

  template <typename Body>
  void in_block(Block& b, Body body) {
    out_.push_back(&b);
    body();
    out_.pop_back();
  }

  // Checkpoint stacks hold numbers; bool locals travel as i32.
  static DType stack_type(DType t) { return t == DType::kBool ? DType::kI32 : t; }

  void push_checkpoints(const Stmt& ctrl) {
    auto it = ckpt_.find(&ctrl);
    if (it == ckpt_.end()) return;
    for (size_t i = 0; i < it->second.size(); ++i) {
      ValueId L = it->second[i];
      DType t = ft(L);
      ValueId v = load_local(p(L), t);
      if (t == DType::kBool) v = mk(Op::kCast, DType::kI32, {v});
      mk(Op::kStackPush, DType::kF32, {stacks_.at(&ctrl)[i], v});
    }
  }
  void restore_checkpoints(const Stmt& ctrl) {
    auto it = ckpt_.find(&ctrl);
    if (it == ckpt_.end()) return;
    for (size_t i = 0; i < it->second.size(); ++i) {
      ValueId L = it->second[i];
      DType t = ft(L);
      ValueId v = mk(Op::kStackTop, stack_type(t), {stacks_.at(&ctrl)[i]});
      if (t == DType::kBool) v = mk(Op::kCast, DType::kBool, {v});
      store_local(p(L), v);
    }
  }
  void pop_checkpoints(const Stmt& ctrl) {
    auto it = stacks_.find(&ctrl);
    if (it == stacks_.end()) return;
    for (ValueId s : it->second) mk(Op::kStackPop, DType::kF32, {s});
  }

  // ------------------------------------------------------------ forward replay
  //
  // A *frame* is a block whose replay the reverse sweep reads: the task body, and the body of
  // each reversed loop iteration. fwd(frame body, frame = true) pushes the checkpoints of the
  // loops in it (inside branches too) and replays their bodies plainly (frame = false); their
  // own reversal replays them again as frames of their own.
  //
  // Branches inside a frame are replayed once: values the reverse sweep reads that are defined
  // in a branch (and locals declared there) live in locals declared at the frame's top
  // (hoist_frame), so the reverse of the branch loads them rather than replaying the branch.
  // That keeps the adjoint linear in the nesting of branches (replaying each branch's subtree
  // in its reverse made it quadratic).
  void hoist_frame(const Block& b, int if_depth) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kFor) continue;  // its body is a frame of its own
      if (s.op == Op::kWhile) {
        // Its body is a frame of its own; its test is replayed plainly. The frame's replay
        // counts its trips into a local its reversal reads (declared here, at the frame's
        // top, so a loop inside a branch is covered too).
        trips_[&s] = mk(Op::kAlloca, DType::kI32, {});
        continue;
      }
      if (if_depth > 0 && (s.op == Op::kAlloca || (s.result != kNoValue && read_.count(s.result)))) {
        hoist_[s.result] = mk(Op::kAlloca, s.type, {});
      }
      for (const Block& c : s.blocks) hoist_frame(c, if_depth + 1);
    }
  }

  void fwd(const Block& b, bool frame, int if_depth = 0) {
    for (const Stmt& s : b.stmts) {
      switch (s.op) {
        case Op::kStore:
        case Op::kAtomicAdd:
          break;  // the adjoint writes no primal ndarray
        case Op::kFor:
          emit_for(
              p(s.args[0]), p(s.args[1]),
              [&](ValueId idx) {
                map_[s.result] = idx;
                if (frame) push_checkpoints(s);
                fwd(s.blocks[0], false);
              },
              &s);
          break;
        case Op::kWhile:
          if (frame) store_local(trips_.at(&s), cst(DType::kI32, 0));
          emit_while(
              [&](ValueId idx) {
                map_[s.result] = idx;
                fwd(s.blocks[0], false);
                return p(s.args[0]);
              },
              [&](ValueId idx) {
                map_[s.result] = idx;
                if (frame) {
                  push_checkpoints(s);
                  store_local(trips_.at(&s), mk(Op::kAdd, DType::kI32, {idx, cst(DType::kI32, 1)}));
                }
                fwd(s.blocks[1], false);
              });
          break;
        case Op::kIf:
          emit_if(p(s.args[0]), [&](int side) { fwd(s.blocks[side], frame, if_depth + 1); });
          break;
        case Op::kAlloca:
          if (frame && if_depth > 0) {  // declared at the frame's top; zeroed here
            map_[s.result] = hoist_.at(s.result);
            store_local(map_[s.result], cst(s.type, 0));
            break;
          }
          [[fallthrough]];
        default: {
          Stmt c = s;
          for (ValueId& x : c.args) x = p(x);
          ValueId r = emit(std::move(c));
          if (s.result != kNoValue) map_[s.result] = r;
          if (frame && if_depth > 0 && hoist_.count(s.result)) store_local(hoist_.at(s.result), r);
        }
      }
    }
  }

  // In the reverse of a branch side: the hoisted values defined directly in it, loaded.
  void load_hoisted(const Block& side) {
    for (const Stmt& s : side.stmts) {
      if (s.op != Op::kAlloca && s.result != kNoValue && hoist_.count(s.result)) {
        map_[s.result] = load_local(hoist_.at(s.result), s.type);
      }
    }
  }

  // ------------------------------------------------------------ reverse sweep
  void rev(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue && is_float(s.type) && act(s.result) && s.op != Op::kAlloca &&
          s.op != Op::kFor) {
        vadj_[s.result] = mk(Op::kAlloca, s.type, {});
      }
    }
    for (auto it = b.stmts.rbegin(); it != b.stmts.rend(); ++it) rev_stmt(*it);
  }

  void rev_stmt(const Stmt& s) {
    switch (s.op) {
      case Op::kFor: {
        ValueId b = p(s.args[0]), e = p(s.args[1]);
        emit_for(
            b, e,
            [&](ValueId jr) {
              // j = b + e - 1 - jr walks [b, e) backwards.
              ValueId last = mk(Op::kSub, DType::kI32,
                                {mk(Op::kAdd, DType::kI32, {b, e}), cst(DType::kI32, 1)});
              map_[s.result] = mk(Op::kSub, DType::kI32, {last, jr});
              hoist_frame(s.blocks[0], 0);
              restore_checkpoints(s);
              fwd(s.blocks[0], true);
              rev(s.blocks[0]);
              pop_checkpoints(s);
            },
            &s);
        return;
      }
      case Op::kWhile: {
        // The trips the frame's replay counted, reversed: like a for loop over [0, n).
        ValueId n = load_local(trips_.at(&s), DType::kI32);
        emit_for(cst(DType::kI32, 0), n, [&](ValueId jr) {
          ValueId last = mk(Op::kSub, DType::kI32, {n, cst(DType::kI32, 1)});
          map_[s.result] = mk(Op::kSub, DType::kI32, {last, jr});
          hoist_frame(s.blocks[1], 0);
          restore_checkpoints(s);
          fwd(s.blocks[1], true);
          rev(s.blocks[1]);
          pop_checkpoints(s);
        });
        return;
      }
      case Op::kIf:
        // The condition and the side's values are the frame replay's: the same path.
        emit_if(p(s.args[0]), [&](int side) {
          load_hoisted(s.blocks[side]);
          rev(s.blocks[side]);
        });
        return;
      case Op::kAlloca:
        if (ladj_.count(s.result)) store_local(ladj_.at(s.result), cst(s.type, 0));
        return;
      case Op::kStoreLocal: {
        ValueId L = s.args[0], v = s.args[1];
        if (!ladj_.count(L)) return;
        ValueId la = ladj_.at(L);
        acc(v, load_local(la, ft(L)));
        store_local(la, cst(ft(L), 0));
        return;
      }
      case Op::kStore:
      case Op::kAtomicAdd: {
        uint32_t g = grad_param_[s.param];
        if (g == UINT32_MAX) return;
        if (act(s.args.back())) {
          Stmt ld;
          ld.op = Op::kLoad;
          ld.param = g;
          ld.type = f_.params[s.param].dtype;
          for (size_t i = 0; i + 1 < s.args.size(); ++i) ld.args.push_back(p(s.args[i]));
          acc(s.args.back(), emit(std::move(ld)));
        }
        if (clear_seeds_ && s.op == Op::kStore) {
          // The store replaced the element: what the array held before (an earlier step's
          // value, when a checkpointed tape reuses the array) gets none of this seed.
          Stmt st;
          st.op = Op::kStore;
          st.param = g;
          for (size_t i = 0; i + 1 < s.args.size(); ++i) st.args.push_back(p(s.args[i]));
          st.args.push_back(cst(f_.params[s.param].dtype, 0));
          emit(std::move(st));
        }
        return;
      }
      default: break;
    }
    if (s.result == kNoValue || !vadj_.count(s.result)) return;
    DType t = s.type;
    ValueId g = load_local(vadj_.at(s.result), t);
    switch (s.op) {
      case Op::kLoad: {
        uint32_t gp = grad_param_[s.param];
        if (gp == UINT32_MAX) return;
        std::vector<ValueId> idx;
        for (ValueId x : s.args) idx.push_back(p(x));
        if (owned_[s.param]) {
          // This invocation alone touches the element (owned_ndarrays): no atomic needed.
          Stmt ld;
          ld.op = Op::kLoad;
          ld.param = gp;
          ld.type = t;
          ld.args = idx;
          ValueId sum = mk(Op::kAdd, t, {emit(std::move(ld)), g});
          Stmt st;
          st.op = Op::kStore;
          st.param = gp;
          st.args = std::move(idx);
          st.args.push_back(sum);
          emit(std::move(st));
          return;
        }
        Stmt add;
        add.op = Op::kAtomicAdd;
        add.param = gp;
        add.args = std::move(idx);
        add.args.push_back(g);
        emit(std::move(add));
        return;
      }
      case Op::kLoadLocal: {
        ValueId la = ladj_.at(s.args[0]);
        store_local(la, mk(Op::kAdd, t, {load_local(la, t), g}));
        return;
      }
      case Op::kArg: {
        ValueId sa = scalar_adj_.at(s.param);
        store_local(sa, mk(Op::kAdd, t, {load_local(sa, t), g}));
        return;
      }
      default: break;
    }
    const DerivativeRule* rule = derivative_rule(s.op);
    if (!rule) return;
    // Only the primals the row declares are handed over (kNoValue otherwise), so a partial
    // that reads an undeclared one yields an adjoint that fails verification.
    uint8_t reads = primal_reads(s);
    PartialArgs a{t, g, {kNoValue, kNoValue, kNoValue}, {t, t, t}, kNoValue};
    for (size_t k = 0; k < s.args.size() && k < 3; ++k) {
      if (reads & (1u << k)) a.arg[k] = p(s.args[k]);
      a.arg_type[k] = ft(s.args[k]);
    }
    if (reads & kReadResult) a.result = p(s.result);
    for (size_t k = 0; k < s.args.size() && k < 3; ++k) {
      const PartialRule& partial = rule->partial[k];
      if (partial.emit && act(s.args[k])) acc(s.args[k], partial.emit(*this, a));
    }
  }

  // PartialBuilder: what the derivative rules emit into the adjoint.
  ValueId op(Op o, DType t, std::vector<ValueId> args) override { return mk(o, t, std::move(args)); }
  ValueId constant(DType t, double v) override { return cst(t, v); }

  // ------------------------------------------------------------ one task
  Status task(const Task& t) {
    task_ = &t;
    def_.clear(), type_.clear(), active_.clear(), needed_.clear(), ckpt_.clear(), stacks_.clear();
    path_.clear(), stores_.clear(), hoist_.clear(), map_.clear(), vadj_.clear(), ladj_.clear();
    trips_.clear();
    for (ValueId ix : task_indices(t)) type_[ix] = DType::kI32;
    read_.clear();
    owned_ = owned_ndarrays(f_, t);
    std::vector<const Stmt*> ctrl;
    std::vector<Pos> pos;
    index_defs(t.body, ctrl, pos);
    while (activity(t.body)) {
    }
    seed_needed(t.body);
    propagate_needed();
    VKAD_TRY(check_read_write(t, t.body));

    Task at;
    at.name = t.name + "_adjoint";
    at.begin = t.begin;
    at.end = t.end;
    at.serial = t.serial;
    at.index = a_.fresh();
    map_[t.index] = at.index;
    // The adjoint of an N-d task ranges over the same box, with its own indices.
    at.dims = t.dims;
    for (size_t d = 0; d < at.dims.size(); ++d) {
      at.dims[d].index = d == 0 ? at.index : a_.fresh();
      map_[t.dims[d].index] = at.dims[d].index;
    }
    out_ = {&at.body};
    // Checkpoint stacks, in a deterministic order (statement order).
    std::vector<const Stmt*> order;
    std::function<void(const Block&)> walk = [&](const Block& b) {
      for (const Stmt& s : b.stmts) {
        if (ckpt_.count(&s)) order.push_back(&s);
        for (const Block& c : s.blocks) walk(c);
      }
    };
    walk(t.body);
    if (t_.checkpoint_segment >= 2) {
      for (const Stmt* c : order) {
        // W from the locals it checkpoints per iteration (checkpoint.h, "whole tape").
        const uint32_t whole = whole_tape_trips(t_.checkpoint_segment, ckpt_.at(c).size());
        if (segmentable(*c, whole)) segmentable_[c->result] = whole;
      }
    }
    for (const Stmt* c : order) {
      SizeExpr cap = SizeExpr::constant(1);
      if (is_loop(*c)) {
        VKAD_ASSIGN_OR_RETURN(cap, trip_bound(*c));
      }
      for (ValueId L : ckpt_.at(c)) {
        Stmt st;
        st.op = Op::kStackAlloc;
        st.type = stack_type(ft(L));
        st.cap = cap;
        st.has_cap = true;
        stacks_[c].push_back(emit(std::move(st)));
      }
    }
    // Adjoints of active float locals live for the whole iteration.
    for (const auto& [id, s] : def_) {
      if (s->op == Op::kAlloca && is_float(s->type) && act(id)) ladj_[id] = kNoValue;
    }
    std::vector<ValueId> locals;
    for (const auto& [id, unused] : ladj_) locals.push_back(id);
    std::sort(locals.begin(), locals.end());
    for (ValueId id : locals) ladj_[id] = mk(Op::kAlloca, ft(id), {});
    // Differentiable scalars: this iteration's d loss / d scalar, summed over every use, then
    // added into the 1-element gradient once per iteration (one atomic, not one per use).
    scalar_adj_.clear();
    for (uint32_t q = 0; q < f_.params.size(); ++q) {
      if (f_.params[q].kind == ParamKind::kScalar && f_.params[q].needs_grad && uses_arg(t.body, q)) {
        scalar_adj_[q] = mk(Op::kAlloca, f_.params[q].dtype, {});
      }
    }

    hoist_frame(t.body, 0);
    fwd(t.body, true);
    rev(t.body);
    for (const auto& [q, local] : scalar_adj_) {
      Stmt add;
      add.op = Op::kAtomicAdd;
      add.param = grad_param_[q];
      add.args = {cst(DType::kI32, 0), load_local(local, f_.params[q].dtype)};
      emit(std::move(add));
    }
    a_.tasks.push_back(std::move(at));
    return {};
  }

  static bool contains_loop(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (is_loop(s)) return true;
      for (const Block& c : s.blocks) {
        if (contains_loop(c)) return true;
      }
    }
    return false;
  }

  // Whether segmented checkpointing should split `loop`, one that checkpoints locals: an
  // innermost for loop (its body has no loops, so its index bounds no nested trip count and
  // the split adds one replay, not one per level), i32 bounds whose range derives (the outer
  // loop's trip bound is derived from them), no stated max_trip, room for the two extra nesting
  // levels (the branch and the segments' loop), and more than `whole` iterations unless its
  // bounds vary (up to that the split would run everything on its whole-tape path:
  // checkpoint.h).
  bool segmentable(const Stmt& loop, uint32_t whole) {
    if (loop.op != Op::kFor || loop.has_cap || contains_loop(loop.blocks[0])) return false;
    if (path_.at(&loop).size() + 3 > static_cast<size_t>(kMaxAdjointNesting)) return false;
    if (type_.at(loop.args[0]) != DType::kI32 || type_.at(loop.args[1]) != DType::kI32)
      return false;
    // Probing: a bound that only a counted trip count would bound is not derivable here (and
    // asking must not add a trips_ parameter).
    probing_ = true;
    const bool derivable = range(loop.args[0]) && range(loop.args[1]);
    probing_ = false;
    if (!derivable) return false;
    // (A bound may be a task index, which def_ does not hold.)
    auto b = def_.find(loop.args[0]), e = def_.find(loop.args[1]);
    if (b != def_.end() && e != def_.end() && b->second->op == Op::kConst && e->second->op == Op::kConst) {
      return e->second->iimm - b->second->iimm > static_cast<int64_t>(whole);
    }
    return true;
  }

  const Kernel& f_;
  const Target& t_;
  bool counting_ = false;
  bool clear_seeds_ = false;                           // make_clearing_adjoint
  std::unordered_map<ValueId, uint32_t> segmentable_;  // loop -> its whole tape's trip bound
  bool probing_ = false;  // range() without creating counted trip bounds
  std::unordered_map<const Stmt*, uint32_t> counted_;  // loop -> the adjoint's trips_ parameter
  std::vector<const Stmt*> counted_order_;
  Kernel a_;
  const Task* task_ = nullptr;
  std::vector<uint32_t> grad_param_;
  std::map<uint32_t, ValueId> scalar_adj_;  // differentiable scalar param -> its adjoint local
  static bool uses_arg(const Block& b, uint32_t param) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kArg && s.param == param) return true;
      for (const Block& c : s.blocks) {
        if (uses_arg(c, param)) return true;
      }
    }
    return false;
  }
  // Per parameter (check_rules): read and written with no gradient; and of those, not written
  // strictly before every read.
  std::vector<bool> rw_no_grad_, rw_unordered_;
  std::vector<bool> owned_;  // per forward parameter, for the current task
  std::unordered_map<ValueId, const Stmt*> def_;
  std::unordered_map<ValueId, DType> type_;
  std::unordered_map<const Stmt*, std::vector<Pos>> path_;
  std::unordered_map<ValueId, std::vector<const Stmt*>> stores_;  // local -> its store_locals
  std::unordered_set<ValueId> active_;
  // (value, frame): the value must be recomputed right by the frame's replay.
  std::set<std::pair<ValueId, const Stmt*>> needed_;
  // Forward values the reverse sweep reads directly: operands its derivative rules use, and
  // anything a loop body uses (the loop's reversal replays the body).
  std::unordered_set<ValueId> read_;
  std::unordered_map<ValueId, ValueId> hoist_;  // forward value / local in a branch -> frame local
  // Forward while loop -> the local (adjoint id) its frame's replay counts its trips into.
  std::unordered_map<const Stmt*, ValueId> trips_;
  std::vector<std::pair<ValueId, const Stmt*>> work_;
  std::unordered_map<const Stmt*, std::vector<ValueId>> ckpt_;    // forward locals
  std::unordered_map<const Stmt*, std::vector<ValueId>> stacks_;  // adjoint stack ids
  std::vector<Block*> out_;
  std::unordered_map<ValueId, ValueId> map_, vadj_, ladj_;
};

}  // namespace

std::vector<bool> owned_ndarrays(const Kernel& k, const Task& task) {
  std::vector<bool> accessed(k.params.size(), false), other(k.params.size(), false);
  // An N-d task owns [i, j(, k)]: its own indices, all of them, in order.
  const std::vector<ValueId> own = task_indices(task);
  std::function<void(const Block&)> walk = [&](const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kLoad || s.op == Op::kStore || s.op == Op::kAtomicAdd) {
        size_t n = s.args.size() - (s.op == Op::kLoad ? 0 : 1);  // index operands
        accessed[s.param] = true;
        if (n != own.size() || !std::equal(own.begin(), own.end(), s.args.begin())) other[s.param] = true;
      }
      for (const Block& c : s.blocks) walk(c);
    }
  };
  walk(task.body);
  std::vector<bool> owned(k.params.size(), false);
  if (task.serial || task.index == kNoValue) return owned;
  for (size_t p = 0; p < k.params.size(); ++p) {
    owned[p] = k.params[p].kind == ParamKind::kNdArray && accessed[p] && !other[p];
  }
  return owned;
}

Status verify_adjoint(const Kernel& forward, const Kernel& adjoint, const Target& target) {
  Status v = verify(adjoint, target);
  if (v.ok()) return v;
  if (v.code() == ErrorCode::kUnsupported) {
    return make_error(ErrorCode::kUnsupported, "the adjoint of kernel '" + forward.name +
                                                   "' needs what the device lacks: " + v.message());
  }
  return make_error(ErrorCode::kInternal, "reverse mode of kernel '" + forward.name +
                                              "' produced an adjoint that does not verify (a bug in vkad; "
                                              "please report it with the forward kernel's text): " +
                                              v.message());
}

namespace {

Status check_segment(const Target& target) {
  const uint32_t k = target.checkpoint_segment;
  if (k == 0 || (k >= 2 && k <= kMaxCheckpointSegment)) return {};
  return make_error(
      ErrorCode::kInvalidArgument,
      "Target::checkpoint_segment is " + std::to_string(k) + "; it must be 0 (off) or 2 to " +
          std::to_string(kMaxCheckpointSegment) +
          " iterations (the environment variable VKAD_ADJOINT_CHECKPOINT sets it: off or a "
          "segment length)");
}

// Reverse mode of `lowered` (no jumps), with segmented checkpointing (checkpoint.h) when the
// target asks for it: a first pass selects the loops worth splitting, the second
// differentiates the split kernel. `forward_out` receives the kernel actually differentiated
// (the trip counter must run its loops); `counted` its counted loops.
Result<Kernel> reverse(const Kernel& lowered, const Target& target, bool counting,
                       Kernel* forward_out, std::vector<ValueId>* counted,
                       bool clear_seeds = false) {
  VKAD_TRY(check_segment(target));
  ReverseMode rm(lowered, target, counting, clear_seeds);
  Result<Kernel> adjoint = rm.run();
  if (!adjoint.ok() || rm.segmentable_loops().empty()) {
    if (forward_out) *forward_out = lowered;
    if (counted) *counted = rm.counted_loops();
    return adjoint;
  }
  Kernel split = segment_loops(lowered, rm.segmentable_loops(), target.checkpoint_segment);
  ReverseMode again(split, target, counting, clear_seeds);
  Result<Kernel> out = again.run();
  if (counted) *counted = again.counted_loops();
  if (forward_out) *forward_out = std::move(split);
  return out;
}

// The atomic_max statements of `k`. Reverse mode rejects them in a forward, so in a kernel that
// trip_counter.h made from one they are its recordings: one per counted loop it found.
size_t count_atomic_max(const Kernel& k) {
  size_t n = 0;
  std::function<void(const Block&)> walk = [&](const Block& b) {
    for (const Stmt& s : b.stmts) {
      n += s.op == Op::kAtomicMax;
      for (const Block& c : s.blocks) walk(c);
    }
  };
  for (const Task& t : k.tasks) walk(t.body);
  return n;
}

}  // namespace

Result<CountedAdjoint> make_adjoint_counted(const Kernel& forward, const Target& target) {
  VKAD_TRY(verify(forward, target));
  Kernel lowered = has_jumps(forward) ? lower_jumps(forward) : forward;
  Kernel differentiated;
  std::vector<ValueId> loops;
  CountedAdjoint out;
  VKAD_ASSIGN_OR_RETURN(out.adjoint,
                        reverse(lowered, target, /*counting=*/true, &differentiated, &loops));
  out.counted = static_cast<uint32_t>(loops.size());
  if (out.counted) {
    const uint32_t slot_run = target.subgroup_arithmetic ? kTripSlotRun : 1;
    out.counter = trip_counter_kernel(differentiated, loops, slot_run);
    // From `lowered`, not `differentiated`: segmented checkpointing split the latter's long
    // loops for the adjoint's sake, and the user's forward launch should not pay for that. The
    // counted loops are the same statements in both: segment_loops splits only innermost for
    // loops with derivable bounds, never a counted loop or one around it (checked below).
    out.counting_forward = counting_forward_kernel(lowered, loops, slot_run);
    if (count_atomic_max(out.counting_forward) != out.counted) {
      return make_error(ErrorCode::kInternal, "the counting forward of '" + forward.name +
                                                  "' does not record every counted loop (a bug in "
                                                  "vkad; please report it with the kernel's text)");
    }
    for (const Kernel* k : {&out.counter, &out.counting_forward}) {
      Status v = verify(*k, target);
      if (!v.ok()) {
        return make_error(
            v.code() == ErrorCode::kUnsupported ? ErrorCode::kUnsupported : ErrorCode::kInternal,
            "the " + std::string(k == &out.counter ? "trip-counting kernel" : "counting forward") +
                " of '" + forward.name + "' does not verify: " + v.message());
      }
    }
  }
  return out;
}

Result<Kernel> make_adjoint(const Kernel& forward, const Target& target) {
  if (has_jumps(forward)) {
    // Differentiated without jumps (jumps.h): the reverse sweep's own loops would catch them.
    VKAD_TRY(verify(forward, target));
    return reverse(lower_jumps(forward), target, false, nullptr, nullptr);
  }
  return reverse(forward, target, false, nullptr, nullptr);
}

Result<Kernel> make_clearing_adjoint(const Kernel& forward, const Target& target) {
  if (has_jumps(forward)) {
    VKAD_TRY(verify(forward, target));
    return reverse(lower_jumps(forward), target, false, nullptr, nullptr, true);
  }
  return reverse(forward, target, false, nullptr, nullptr, true);
}

}  // namespace vkad::codegen
