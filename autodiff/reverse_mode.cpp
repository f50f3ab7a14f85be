#include "autodiff/reverse_mode.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "autodiff/accumulations.h"
#include "autodiff/adjoint_plan.h"
#include "autodiff/checkpoint.h"
#include "autodiff/derivative_rules.h"
#include "autodiff/forward_stores.h"
#include "autodiff/jumps.h"
#include "autodiff/trip_counter.h"
#include "ir/rewriter.h"
#include "ir/verifier.h"
#include "ir/walk.h"

namespace vkad::codegen {

namespace {

class ReverseMode : public PartialBuilder {
 public:
  // Applies `plan` (plan_adjoint of `f`). `clear_seeds`: per parameter, whether its stores'
  // adjoints clear the seed (make_clearing_adjoint: all; AdjointOptions::clear_seeds_of).
  ReverseMode(const Kernel& f, const AdjointPlan& plan, std::vector<bool> clear_seeds)
      : f_(f), plan_(plan), clear_seeds_(std::move(clear_seeds)) {}

  Kernel run() {
    a_.name = f_.name + "_adjoint";
    a_.params = f_.params;
    for (uint32_t q = 0; q < f_.params.size(); ++q) {
      a_.params[q].needs_grad = false;
      if (plan_.grad_param[q] == UINT32_MAX) continue;
      Param g = f_.params[q];
      g.name += "_grad";
      g.needs_grad = false;
      g.read_only = false;
      if (g.kind == ParamKind::kScalar) {  // d loss / d scalar: one element
        g.kind = ParamKind::kNdArray;
        g.rank = 1;
      }
      a_.params.push_back(std::move(g));
    }
    for (const Stmt* loop : plan_.counted_loops) {
      Param q;
      q.name = "trips_" + std::to_string(loop->result);
      q.kind = ParamKind::kScalar;
      q.dtype = DType::kI32;
      a_.params.push_back(std::move(q));
    }
    for (size_t i = f_.tasks.size(); i-- > 0;) task(f_.tasks[i], plan_.tasks[i]);
    return std::move(a_);
  }

 private:
  bool act(ValueId v) const { return tp_->active.count(v) > 0; }
  uint8_t primal_reads(const Stmt& s) const { return adjoint_primal_reads(s, tp_->active); }

  // ------------------------------------------------------------ emission helpers (adjoint ids)
  ValueId p(ValueId forward) const { return map_.at(forward); }
  DType ft(ValueId forward) const { return tp_->types.at(forward); }

  // The adjoint of forward value `x` += d (nothing if x carries no derivative).
  void acc(ValueId x, ValueId d) {
    if (!act(x) || !vadj_.count(x)) return;
    ValueId local = vadj_.at(x);
    rw_.store_local(local, rw_.op(Op::kAdd, ft(x), {rw_.load_local(local, ft(x)), d}));
  }

  // Emits `for idx in [b, e) { body(idx) }` into the current block. `like`: the forward loop
  // it runs the trips of; a constant max_trip of it carries over (the emitter asks the driver to
  // unroll a loop that short: spirv_emitter.cpp, kUnrollMaxTrips).
  template <typename Body>
  void emit_for(ValueId b, ValueId e, Body body, const Stmt* like = nullptr) {
    std::optional<SizeExpr> cap;
    if (like && like->has_cap && like->cap.kind == SizeExpr::Kind::kConst) cap = like->cap;
    rw_.for_(b, e, std::move(cap), body);
  }

  // Checkpoint stacks hold numbers; bool locals travel as i32.
  static DType stack_type(DType t) { return t == DType::kBool ? DType::kI32 : t; }

  void push_checkpoints(const Stmt& ctrl) {
    const LoopCheckpoint* c = tp_->checkpoint_of(&ctrl);
    if (!c) return;
    for (size_t i = 0; i < c->locals.size(); ++i) {
      ValueId L = c->locals[i];
      DType t = ft(L);
      ValueId v = rw_.load_local(p(L), t);
      if (t == DType::kBool) v = rw_.op(Op::kCast, DType::kI32, {v});
      rw_.op(Op::kStackPush, DType::kF32, {stacks_.at(&ctrl)[i], v});
    }
  }
  void restore_checkpoints(const Stmt& ctrl) {
    const LoopCheckpoint* c = tp_->checkpoint_of(&ctrl);
    if (!c) return;
    for (size_t i = 0; i < c->locals.size(); ++i) {
      ValueId L = c->locals[i];
      DType t = ft(L);
      ValueId v = rw_.op(Op::kStackTop, stack_type(t), {stacks_.at(&ctrl)[i]});
      if (t == DType::kBool) v = rw_.op(Op::kCast, DType::kBool, {v});
      rw_.store_local(p(L), v);
    }
  }
  void pop_checkpoints(const Stmt& ctrl) {
    auto it = stacks_.find(&ctrl);
    if (it == stacks_.end()) return;
    for (ValueId s : it->second) rw_.op(Op::kStackPop, DType::kF32, {s});
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
        trips_[&s] = rw_.op(Op::kAlloca, DType::kI32, {});
        continue;
      }
      if (if_depth > 0 &&
          (s.op == Op::kAlloca || (s.result != kNoValue && tp_->read.count(s.result)))) {
        hoist_[s.result] = rw_.op(Op::kAlloca, s.type, {});
      }
      for (const Block& c : s.blocks) hoist_frame(c, if_depth + 1);
    }
  }

  void fwd(const Block& b, bool frame, int if_depth = 0) {
    for (const Stmt& s : b.stmts) fwd_stmt(s, frame, if_depth);
  }

  // One statement of the forward replay, by family (every member listed: a new op is a
  // compile error here, ir/ops.def).
  void fwd_stmt(const Stmt& s, bool frame, int if_depth) {
    LocationScope at(rw_, s.loc);
    switch (op_info(s.op).family) {
      case OpFamily::kArray:
        switch (array_op(s.op)) {
          case ArrayOp::kStore:
          case ArrayOp::kAtomicAdd: return;  // the adjoint writes no primal ndarray
          case ArrayOp::kLoad:
          case ArrayOp::kAtomicMax: replay(s, frame && if_depth > 0); return;
        }
        return;
      case OpFamily::kControl: fwd_control(s, frame, if_depth); return;
      case OpFamily::kLocal: fwd_local(s, frame, if_depth); return;
      // Replayed as they are (operands mapped).
      case OpFamily::kLeaf:
      case OpFamily::kUnary:
      case OpFamily::kBinary:
      case OpFamily::kCompare:
      case OpFamily::kSelect:
      case OpFamily::kCast:
      case OpFamily::kStack: replay(s, frame && if_depth > 0); return;
    }
  }

  void fwd_local(const Stmt& s, bool frame, int if_depth) {
    switch (local_op(s.op)) {
      case LocalOp::kAlloca:
        if (frame && if_depth > 0) {  // declared at the frame's top; zeroed here
          map_[s.result] = hoist_.at(s.result);
          rw_.store_local(map_[s.result], rw_.constant(s.type, 0));
          return;
        }
        replay(s, frame && if_depth > 0);
        return;
      case LocalOp::kLoadLocal:
      case LocalOp::kStoreLocal:
      case LocalOp::kSharedAlloc:  // (adjoint_plan refuses shared arrays)
      case LocalOp::kLoadShared:
      case LocalOp::kStoreShared: replay(s, frame && if_depth > 0); return;
    }
  }

  void fwd_control(const Stmt& s, bool frame, int if_depth) {
    switch (control_op(s.op)) {
      case ControlOp::kFor:
        emit_for(
            p(s.args[0]), p(s.args[1]),
            [&](ValueId idx) {
              map_[s.result] = idx;
              if (frame) push_checkpoints(s);
              fwd(s.blocks[0], false);
            },
            &s);
        return;
      case ControlOp::kWhile:
        if (frame) rw_.store_local(trips_.at(&s), rw_.constant(DType::kI32, 0));
        rw_.while_(
            [&](ValueId idx) {
              map_[s.result] = idx;
              fwd(s.blocks[0], false);
              return p(s.args[0]);
            },
            [&](ValueId idx) {
              map_[s.result] = idx;
              if (frame) {
                push_checkpoints(s);
                rw_.store_local(trips_.at(&s),
                                rw_.op(Op::kAdd, DType::kI32, {idx, rw_.constant(DType::kI32, 1)}));
              }
              fwd(s.blocks[1], false);
            });
        return;
      case ControlOp::kIf:
        rw_.if_(p(s.args[0]), [&](int side) { fwd(s.blocks[side], frame, if_depth + 1); });
        return;
      case ControlOp::kBreak:
      case ControlOp::kContinue:
      case ControlOp::kBarrier: replay(s, frame && if_depth > 0); return;
      // What the forward printed or asserted, once, with the forward's values: not again in
      // each reversed iteration's replay of a loop body.
      case ControlOp::kPrint:
      case ControlOp::kAssert:
        if (reversing_ == 0) replay(s, false);
        return;
    }
  }
  // `s` copied into the replay with its operands mapped; `hoisted`: in a branch of a frame,
  // where a value the reverse sweep reads is also kept in its frame-top local.
  void replay(const Stmt& s, bool hoisted) {
    Stmt c = s;
    for (ValueId& x : c.args) x = p(x);
    ValueId r = rw_.emit(std::move(c));
    if (s.result != kNoValue) map_[s.result] = r;
    if (hoisted && hoist_.count(s.result)) rw_.store_local(hoist_.at(s.result), r);
  }

  // In the reverse of a branch side: the hoisted values defined directly in it, loaded.
  void load_hoisted(const Block& side) {
    for (const Stmt& s : side.stmts) {
      if (s.op != Op::kAlloca && s.result != kNoValue && hoist_.count(s.result)) {
        map_[s.result] = rw_.load_local(hoist_.at(s.result), s.type);
      }
    }
  }

  // ------------------------------------------------------------ reverse sweep
  void rev(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue && is_float(s.type) && act(s.result) && s.op != Op::kAlloca &&
          s.op != Op::kFor) {
        vadj_[s.result] = rw_.op(Op::kAlloca, s.type, {});
      }
    }
    plan_sinks(b);
    for (auto it = b.stmts.rbegin(); it != b.stmts.rend(); ++it) {
      if (!sunk_.count(&*it)) rev_stmt(*it);
    }
  }

  // Per sinkable value of a block: the later statements of the block that use it, each with
  // whether the use is in that `if`'s then-side alone, its else-side alone or anywhere else
  // (plan_sinks).
  enum class SinkUse : uint8_t { kThen, kElse, kOther };
  using SinkUses = std::unordered_map<ValueId, std::vector<std::pair<size_t, SinkUse>>>;
  static SinkUses sink_uses(const Block& b, const std::unordered_map<ValueId, size_t>& def) {
    SinkUses uses;
    for (size_t m = 0; m < b.stmts.size(); ++m) {
      const Stmt& u = b.stmts[m];
      std::unordered_set<ValueId> sides[2], other;
      if (u.op == Op::kIf) {
        collect_args(u.blocks[0], sides[0]);
        collect_args(u.blocks[1], sides[1]);
        for (ValueId v : sides[0]) {
          if (sides[1].count(v)) other.insert(v);
        }
        other.insert(u.args.begin(), u.args.end());
      } else {
        if (op_info(u.op).family != OpFamily::kCompare) other.insert(u.args.begin(), u.args.end());
        for (const Block& c : u.blocks) collect_args(c, other);
      }
      for (ValueId v : other) {
        if (def.count(v)) uses[v].push_back({m, SinkUse::kOther});
      }
      for (int side = 0; side < 2; ++side) {
        const SinkUse kind = side == 0 ? SinkUse::kThen : SinkUse::kElse;
        for (ValueId v : sides[side]) {
          if (def.count(v) && !other.count(v)) uses[v].push_back({m, kind});
        }
      }
    }
    return uses;
  }

  // Values only a branch uses. A value of block `b` whose every use that can carry an adjoint
  // lies in one side of one later `if` of `b` (nested there at any depth, or through other such
  // values of `b`) has a zero adjoint wherever that side did not run. Its reverse then runs
  // at the end of that side's reverse (rev_control) instead of after the `if`: where the side
  // did not run -- a contact, a collision, a clamp that did not happen -- it does no arithmetic
  // and adds nothing. billiards' collide tests 10 pairs a ball, nearly all apart, and each
  // pair's distance, norm and relative velocity, computed before the contact's `if`, had their
  // zero adjoints propagated and added. The sums are the same: every adjoint those values get
  // comes from that side (uses in comparisons carry none), and the reverse still runs each
  // after all of its uses' reverses (the sunk ones in descending order). Only values whose
  // reverse commutes with what the `if` moves it past sink: arithmetic, selects, casts and
  // ndarray loads; local loads (ordered against the local's stores), arguments and control
  // flow stay. A sunk load's gradient add now runs before the reverse of any store or
  // atomic_add between the load and the `if`, which reads (and, clearing, zeroes) its seed
  // there: that commutes because a task that reads an array and writes it touches disjoint
  // elements for the two, and a reload of an element the invocation stored was forwarded away
  // (the rules in reverse_mode.h).
  void plan_sinks(const Block& b) {
    std::unordered_map<ValueId, size_t> def;  // sinkable value -> its statement's index in b
    for (size_t j = 0; j < b.stmts.size(); ++j) {
      if (sinkable(b.stmts[j])) def[b.stmts[j].result] = j;
    }
    if (def.empty()) return;
    const SinkUses uses = sink_uses(b, def);
    for (size_t k = 0; k < b.stmts.size(); ++k) {
      if (b.stmts[k].op != Op::kIf) continue;
      for (int side = 0; side < 2; ++side) {
        std::unordered_set<size_t> into;  // indices sunk into this side
        std::vector<const Stmt*>& list = sink_into_[&b.stmts[k]][side];
        const SinkUse here = side == 0 ? SinkUse::kThen : SinkUse::kElse;
        for (size_t j = k; j-- > 0;) {
          const Stmt& s = b.stmts[j];
          if (!sinkable(s) || sunk_.count(&s)) continue;
          auto it = uses.find(s.result);
          if (it == uses.end()) continue;
          const bool only_here = std::all_of(it->second.begin(), it->second.end(), [&](auto& u) {
            return (u.first == k && u.second == here) || into.count(u.first) > 0;
          });
          if (!only_here) continue;
          into.insert(j);
          list.push_back(&s);  // descending: the order the reverse takes them
          sunk_.insert(&s);
        }
      }
    }
  }
  bool sinkable(const Stmt& s) const {
    if (s.result == kNoValue || !is_float(s.type) || !act(s.result)) return false;
    switch (op_info(s.op).family) {
      case OpFamily::kUnary:
      case OpFamily::kBinary:
      case OpFamily::kSelect:
      case OpFamily::kCast: return true;
      case OpFamily::kArray: return s.op == Op::kLoad;
      default: return false;
    }
  }
  static void collect_args(const Block& b, std::unordered_set<ValueId>& out) {
    for_each_stmt(b, [&](const Stmt& s) { out.insert(s.args.begin(), s.args.end()); });
  }

  // Control flow's reverse (every member listed).
  void rev_control(const Stmt& s) {
    switch (control_op(s.op)) {
      case ControlOp::kFor: rev_for(s); return;
      case ControlOp::kWhile: rev_while(s); return;
      case ControlOp::kIf:
        // The condition and the side's values are the frame replay's: the same path.
        rw_.if_(p(s.args[0]), [&](int side) {
          load_hoisted(s.blocks[side]);
          rev(s.blocks[side]);
          auto sunk = sink_into_.find(&s);
          if (sunk != sink_into_.end()) {
            for (const Stmt* t : sunk->second[side]) rev_stmt(*t);  // plan_sinks
          }
        });
        return;
      // Jumps and barriers are not in a forward reverse mode accepts (jumps.h lowers the
      // first, the plan's checks refuse the second): no rule.
      case ControlOp::kBreak:
      case ControlOp::kContinue:
      case ControlOp::kBarrier: rev_value(s); return;
      case ControlOp::kPrint:
      case ControlOp::kAssert: return;  // no adjoint
    }
  }

  // One forward statement's reverse: control flow and memory by their own rules, values by
  // their derivative rule (derivative_rules.h).
  void rev_stmt(const Stmt& s) {
    LocationScope at(rw_, s.loc);
    switch (op_info(s.op).family) {
      case OpFamily::kControl: rev_control(s); return;
      case OpFamily::kLocal:
        switch (local_op(s.op)) {
          case LocalOp::kAlloca:
            if (ladj_.count(s.result)) rw_.store_local(ladj_.at(s.result), rw_.constant(s.type, 0));
            return;
          case LocalOp::kStoreLocal: rev_store_local(s); return;
          case LocalOp::kLoadLocal: rev_read(s); return;
          case LocalOp::kSharedAlloc:  // (adjoint_plan refuses shared arrays)
          case LocalOp::kLoadShared:
          case LocalOp::kStoreShared: return;
        }
        return;
      case OpFamily::kArray:
        switch (array_op(s.op)) {
          case ArrayOp::kStore:
          case ArrayOp::kAtomicAdd: rev_store(s); return;
          case ArrayOp::kLoad: rev_read(s); return;
          case ArrayOp::kAtomicMax: rev_value(s); return;  // refused by the plan's checks
        }
        return;
      case OpFamily::kLeaf:
        switch (leaf_op(s.op)) {
          case LeafOp::kArg: rev_read(s); return;
          case LeafOp::kConst:
          case LeafOp::kShape: rev_value(s); return;  // no rule: nothing to propagate
        }
        return;
      // Values: their derivative rule (none for integer, bool and constant ones); adstack
      // statements are not in a forward reverse mode accepts and have no rule either.
      case OpFamily::kUnary:
      case OpFamily::kBinary:
      case OpFamily::kCompare:
      case OpFamily::kSelect:
      case OpFamily::kCast:
      case OpFamily::kStack: rev_value(s); return;
    }
  }

  // A for loop runs reversed over the same bounds: each reversed iteration restores its
  // checkpoint, recomputes the iteration, then walks it backwards.
  void rev_for(const Stmt& s) {
    ValueId b = p(s.args[0]), e = p(s.args[1]);
    emit_for(
        b, e,
        [&](ValueId jr) {
          // j = b + e - 1 - jr walks [b, e) backwards.
          ValueId last =
              rw_.op(Op::kSub, DType::kI32,
                     {rw_.op(Op::kAdd, DType::kI32, {b, e}), rw_.constant(DType::kI32, 1)});
          map_[s.result] = rw_.op(Op::kSub, DType::kI32, {last, jr});
          reverse_iteration(s, s.blocks[0]);
        },
        &s);
  }

  // The trips the frame's replay counted, reversed: like a for loop over [0, n).
  void rev_while(const Stmt& s) {
    ValueId n = rw_.load_local(trips_.at(&s), DType::kI32);
    emit_for(rw_.constant(DType::kI32, 0), n, [&](ValueId jr) {
      ValueId last = rw_.op(Op::kSub, DType::kI32, {n, rw_.constant(DType::kI32, 1)});
      map_[s.result] = rw_.op(Op::kSub, DType::kI32, {last, jr});
      reverse_iteration(s, s.blocks[1]);
    });
  }

  void reverse_iteration(const Stmt& loop, const Block& body) {
    hoist_frame(body, 0);
    restore_checkpoints(loop);
    ++reversing_;
    fwd(body, true);
    rev(body);
    --reversing_;
    pop_checkpoints(loop);
  }

  void rev_store_local(const Stmt& s) {
    ValueId L = s.args[0], v = s.args[1];
    if (!ladj_.count(L)) return;
    ValueId la = ladj_.at(L);
    acc(v, rw_.load_local(la, ft(L)));
    rw_.store_local(la, rw_.constant(ft(L), 0));
  }

  // A store (or atomic_add) into a grad ndarray: its value's adjoint is the seed in the
  // gradient at the element.
  void rev_store(const Stmt& s) {
    uint32_t g = plan_.grad_param[s.param];
    if (g == UINT32_MAX) return;
    std::vector<ValueId> idx;
    for (size_t i = 0; i + 1 < s.args.size(); ++i) idx.push_back(p(s.args[i]));
    if (act(s.args.back())) {
      acc(s.args.back(), rw_.access(Op::kLoad, f_.params[s.param].dtype, g, idx));
    }
    if (clear_seeds_[s.param] && s.op == Op::kStore) {
      // The store replaced the element: what the array held before (an earlier step's
      // value, when a checkpointed tape reuses the array) gets none of this seed.
      idx.push_back(rw_.constant(f_.params[s.param].dtype, 0));
      rw_.access(Op::kStore, DType::kF32, g, std::move(idx));
    }
  }

  // A read's adjoint goes where the value came from: the gradient ndarray (owned: load-add-
  // store; else atomic_add), the local's adjoint, the scalar's per-iteration sum.
  void rev_read(const Stmt& s) {
    if (s.result == kNoValue || !vadj_.count(s.result)) return;
    const DType t = s.type;
    ValueId g = rw_.load_local(vadj_.at(s.result), t);
    if (s.op == Op::kLoadLocal || s.op == Op::kArg) {
      ValueId local = s.op == Op::kArg ? scalar_adj_.at(s.param) : ladj_.at(s.args[0]);
      rw_.store_local(local, rw_.op(Op::kAdd, t, {rw_.load_local(local, t), g}));
      return;
    }
    uint32_t gp = plan_.grad_param[s.param];
    if (gp == UINT32_MAX) return;
    std::vector<ValueId> idx;
    for (ValueId x : s.args) idx.push_back(p(x));
    if (tp_->owned[s.param]) {
      // This invocation alone touches the element (owned_ndarrays): no atomic needed.
      ValueId sum = rw_.op(Op::kAdd, t, {rw_.access(Op::kLoad, t, gp, idx), g});
      idx.push_back(sum);
      rw_.access(Op::kStore, DType::kF32, gp, std::move(idx));
      return;
    }
    idx.push_back(g);
    rw_.access(Op::kAtomicAdd, DType::kF32, gp, std::move(idx));
  }

  // A value's adjoint flows to its active operands through its derivative rule's partials.
  void rev_value(const Stmt& s) {
    if (s.result == kNoValue || !vadj_.count(s.result)) return;
    const DType t = s.type;
    ValueId g = rw_.load_local(vadj_.at(s.result), t);
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
  ValueId op(Op o, DType t, std::vector<ValueId> args) override {
    return rw_.op(o, t, std::move(args));
  }
  ValueId constant(DType t, double v) override { return rw_.constant(t, v); }

  // ------------------------------------------------------------ one task
  void task(const Task& t, const TaskPlan& plan) {
    tp_ = &plan;
    stacks_.clear(), hoist_.clear(), map_.clear(), vadj_.clear(), ladj_.clear(), trips_.clear();
    sink_into_.clear(), sunk_.clear();
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
    rw_.in(at.body, [&] {
      declare_task_locals(t);
      hoist_frame(t.body, 0);
      fwd(t.body, true);
      rev(t.body);
      for (const auto& [q, local] : scalar_adj_) {
        rw_.access(Op::kAtomicAdd, DType::kF32, plan_.grad_param[q],
                   {rw_.constant(DType::kI32, 0), rw_.load_local(local, f_.params[q].dtype)});
      }
    });
    a_.tasks.push_back(std::move(at));
  }

  // The task's stacks (the plan's checkpoints, in its order), the adjoints of its active float
  // locals, and its differentiable scalars' adjoint sums, at the top of the adjoint task.
  void declare_task_locals(const Task& t) {
    for (const LoopCheckpoint& c : tp_->checkpoints) {
      for (ValueId L : c.locals) {
        Stmt st;
        st.op = Op::kStackAlloc;
        st.type = stack_type(ft(L));
        st.cap = c.capacity;
        st.has_cap = true;
        st.loc = c.loop->loc;  // an overflow means this loop ran past its trip bound
        stacks_[c.loop].push_back(rw_.emit(std::move(st)));
      }
    }
    for (ValueId id : tp_->active_locals) ladj_[id] = rw_.op(Op::kAlloca, ft(id), {});
    // Differentiable scalars: this iteration's d loss / d scalar, summed over every use, then
    // added into the 1-element gradient once per iteration (one atomic, not one per use).
    scalar_adj_.clear();
    for (uint32_t q = 0; q < f_.params.size(); ++q) {
      if (f_.params[q].kind == ParamKind::kScalar && f_.params[q].needs_grad &&
          uses_arg(t.body, q)) {
        scalar_adj_[q] = rw_.op(Op::kAlloca, f_.params[q].dtype, {});
      }
    }
  }

  static bool uses_arg(const Block& b, uint32_t param) {
    bool used = false;
    for_each_stmt(b, [&](const Stmt& s) { used = used || (s.op == Op::kArg && s.param == param); });
    return used;
  }

  const Kernel& f_;
  const AdjointPlan& plan_;
  std::vector<bool> clear_seeds_;  // per parameter: make_clearing_adjoint, clear_seeds_of
  int reversing_ = 0;              // reversed loop iterations being written (prints skip them)
  const TaskPlan* tp_ = nullptr;   // the current task's plan
  Kernel a_;
  Rewriter rw_{a_};                             // writes a_
  std::map<uint32_t, ValueId> scalar_adj_;      // differentiable scalar param -> its adjoint local
  std::unordered_map<ValueId, ValueId> hoist_;  // forward value / local in a branch -> frame local
  // Forward while loop -> the local (adjoint id) its frame's replay counts its trips into.
  std::unordered_map<const Stmt*, ValueId> trips_;
  std::unordered_map<const Stmt*, std::vector<ValueId>> stacks_;  // adjoint stack ids
  std::unordered_map<ValueId, ValueId> map_, vadj_, ladj_;
  // plan_sinks: per forward `if` and side, the values whose reverse ends that side's reverse,
  // in the order they run; and every such value's statement (rev skips them where they stand).
  std::unordered_map<const Stmt*, std::array<std::vector<const Stmt*>, 2>> sink_into_;
  std::unordered_set<const Stmt*> sunk_;
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
        if (n != own.size() || !std::equal(own.begin(), own.end(), s.args.begin()))
          other[s.param] = true;
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
  return verify_output(adjoint, target,
                       "the adjoint of kernel '" + forward.name + "' needs what the device lacks",
                       "reverse mode of kernel '" + forward.name +
                           "' produced an adjoint that does not verify (a bug in vkad; please "
                           "report it with the forward kernel's text)");
}

namespace {

// reverse-mode: plan_adjoint, then apply the plan; the adjoint is verified (verify_adjoint).
// `counted` (optional) receives the counted loops' ids, in trips_ parameter order.
Result<Kernel> differentiate(const Kernel& k, const Target& target, const AdjointOptions& options,
                             bool counting, bool clear_seeds, std::vector<ValueId>* counted) {
  VKAD_TRY(check_adjoint_options(options));
  VKAD_TRY(verify(k, target));
  if (has_jumps(k)) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "reverse-mode: kernel '" + k.name + "' holds break / continue; run lower-jumps first");
  }
  VKAD_ASSIGN_OR_RETURN(AdjointPlan plan, plan_adjoint(k, options, counting));
  std::vector<bool> clear(k.params.size(), clear_seeds);
  for (uint32_t p : options.clear_seeds_of) {
    if (p < clear.size()) clear[p] = true;
  }
  Kernel adjoint = ReverseMode(k, plan, std::move(clear)).run();
  VKAD_TRY(verify_adjoint(k, adjoint, target));
  if (counted) {
    counted->clear();
    for (const Stmt* loop : plan.counted_loops) counted->push_back(loop->result);
  }
  return adjoint;
}

// segment-loops: `k` with the loops the plan selects split into segments (checkpoint.h); `k` as
// it came when checkpoint_segment is off or no loop qualifies. Planning errors are reverse
// mode's (the same kernel would be refused by reverse-mode).
Result<Kernel> segment_for_adjoint(Kernel k, const AdjointOptions& options, bool counting) {
  VKAD_TRY(check_adjoint_options(options));
  if (options.checkpoint_segment < 2) return k;
  VKAD_ASSIGN_OR_RETURN(AdjointPlan plan, plan_adjoint(k, options, counting));
  std::unordered_map<ValueId, uint32_t> loops;
  for (const TaskPlan& t : plan.tasks) loops.insert(t.segmentable.begin(), t.segmentable.end());
  if (loops.empty()) return k;
  return segment_loops(k, loops, options.checkpoint_segment);
}

// The atomic_max statements of `k`. Reverse mode rejects them in a forward, so in a kernel that
// trip_counter.h made from one they are its recordings: one per counted loop it found.
size_t count_atomic_max(const Kernel& k) {
  size_t n = 0;
  for_each_stmt(k, [&](const Stmt& s) { n += s.op == Op::kAtomicMax; });
  return n;
}

// The steps every adjoint pipeline begins with: verify, (`accumulate`) updates x[I] = x[I] + v
// as the atomic adds they compute (accumulations.h), refuse overwrites reverse mode cannot
// undo, lower jumps, forward stores to loads.
void add_adjoint_prefix(Pipeline& p, const Target& target, bool accumulate) {
  p.add(verify_pass(target));
  if (accumulate) p.add(accumulate_stores_pass());
  p.add("check-overwrites", [](Kernel k) -> Result<Kernel> {
    VKAD_TRY(check_overwrites(k));
    return k;
  });
  p.add(lower_jumps_pass(target));
  p.add(forward_stores_pass());
}

// make_adjoint's sequence with its steps' outputs kept for make_adjoint_counted: `lowered`
// receives the kernel without jumps, `differentiated` the one the adjoint was made of.
Pipeline counted_pipeline(const Target& target, const AdjointOptions& options, bool clear_seeds,
                          Kernel* lowered, Kernel* differentiated, std::vector<ValueId>* counted) {
  Pipeline p(target);
  // No accumulate-stores: `lowered` becomes the counting forward, which the user launches in
  // place of the forward, so it must be the kernel as written.
  add_adjoint_prefix(p, target, /*accumulate=*/false);
  p.add("keep-lowered", [lowered](Kernel k) -> Result<Kernel> {
    *lowered = k;
    return k;
  });
  p.add("segment-loops", [options](Kernel k) {
    return segment_for_adjoint(std::move(k), options, /*counting=*/true);
  });
  p.add("reverse-mode-counted", [=](Kernel k) {
    *differentiated = k;
    return differentiate(k, target, options, /*counting=*/true, clear_seeds, counted);
  });
  return p;
}

}  // namespace

Pass segment_loops_pass(const AdjointOptions& options) {
  return {"segment-loops", [options](Kernel k) {
            return segment_for_adjoint(std::move(k), options, /*counting=*/false);
          }};
}

Pass reverse_mode_pass(const Target& target, const AdjointOptions& options, bool clear_seeds) {
  return {clear_seeds ? "clearing-reverse-mode" : "reverse-mode", [=](const Kernel& k) {
            return differentiate(k, target, options, false, clear_seeds, nullptr);
          }};
}

Pipeline adjoint_pipeline(const Target& target, const AdjointOptions& options, bool clear_seeds) {
  Pipeline p(target);
  add_adjoint_prefix(p, target, /*accumulate=*/true);
  p.add(segment_loops_pass(options));
  p.add(reverse_mode_pass(target, options, clear_seeds));
  return p;
}

Result<CountedAdjoint> make_adjoint_counted(const Kernel& forward, const Target& target,
                                            const AdjointOptions& options, bool clear_seeds) {
  Kernel lowered, differentiated;
  std::vector<ValueId> loops;
  CountedAdjoint out;
  VKAD_ASSIGN_OR_RETURN(
      out.adjoint, counted_pipeline(target, options, clear_seeds, &lowered, &differentiated, &loops)
                       .run(forward));
  out.counted = static_cast<uint32_t>(loops.size());
  if (!out.counted) return out;
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
    const std::string what =
        "the " + std::string(k == &out.counter ? "trip-counting kernel" : "counting forward") +
        " of '" + forward.name + "' does not verify";
    VKAD_TRY(verify_output(*k, target, what, what));
  }
  return out;
}

Result<Kernel> make_adjoint(const Kernel& forward, const Target& target,
                            const AdjointOptions& options) {
  return adjoint_pipeline(target, options).run(forward);
}

Result<Kernel> make_clearing_adjoint(const Kernel& forward, const Target& target,
                                     const AdjointOptions& options) {
  return adjoint_pipeline(target, options, /*clear_seeds=*/true).run(forward);
}

}  // namespace vkad::codegen
