#include "autodiff/reverse_mode.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "autodiff/adjoint_plan.h"
#include "autodiff/checkpoint.h"
#include "autodiff/derivative_rules.h"
#include "autodiff/jumps.h"
#include "autodiff/trip_counter.h"
#include "ir/verifier.h"
#include "ir/walk.h"

namespace vkad::codegen {

namespace {

class ReverseMode : public PartialBuilder {
 public:
  // Applies `plan` (plan_adjoint of `f`). `clear_seeds`: make_clearing_adjoint.
  ReverseMode(const Kernel& f, const AdjointPlan& plan, bool clear_seeds = false)
      : f_(f), plan_(plan), clear_seeds_(clear_seeds) {}

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
    if (is_float(t))
      s.fimm = t == DType::kF32 ? static_cast<float>(v) : v;
    else
      s.iimm = static_cast<int64_t>(v), s.fimm = v;
    return emit(std::move(s));
  }
  void store_local(ValueId local, ValueId v) { mk(Op::kStoreLocal, DType::kF32, {local, v}); }
  ValueId load_local(ValueId local, DType t) { return mk(Op::kLoadLocal, t, {local}); }
  ValueId p(ValueId forward) const { return map_.at(forward); }
  DType ft(ValueId forward) const { return tp_->types.at(forward); }

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
    const LoopCheckpoint* c = tp_->checkpoint_of(&ctrl);
    if (!c) return;
    for (size_t i = 0; i < c->locals.size(); ++i) {
      ValueId L = c->locals[i];
      DType t = ft(L);
      ValueId v = load_local(p(L), t);
      if (t == DType::kBool) v = mk(Op::kCast, DType::kI32, {v});
      mk(Op::kStackPush, DType::kF32, {stacks_.at(&ctrl)[i], v});
    }
  }
  void restore_checkpoints(const Stmt& ctrl) {
    const LoopCheckpoint* c = tp_->checkpoint_of(&ctrl);
    if (!c) return;
    for (size_t i = 0; i < c->locals.size(); ++i) {
      ValueId L = c->locals[i];
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
      if (if_depth > 0 &&
          (s.op == Op::kAlloca || (s.result != kNoValue && tp_->read.count(s.result)))) {
        hoist_[s.result] = mk(Op::kAlloca, s.type, {});
      }
      for (const Block& c : s.blocks) hoist_frame(c, if_depth + 1);
    }
  }

  void fwd(const Block& b, bool frame, int if_depth = 0) {
    for (const Stmt& s : b.stmts) {
      switch (s.op) {
        case Op::kStore:
        case Op::kAtomicAdd: break;  // the adjoint writes no primal ndarray
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
        uint32_t g = plan_.grad_param[s.param];
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
        uint32_t gp = plan_.grad_param[s.param];
        if (gp == UINT32_MAX) return;
        std::vector<ValueId> idx;
        for (ValueId x : s.args) idx.push_back(p(x));
        if (tp_->owned[s.param]) {
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
  ValueId op(Op o, DType t, std::vector<ValueId> args) override {
    return mk(o, t, std::move(args));
  }
  ValueId constant(DType t, double v) override { return cst(t, v); }


  // ------------------------------------------------------------ one task
  void task(const Task& t, const TaskPlan& plan) {
    tp_ = &plan;
    stacks_.clear(), hoist_.clear(), map_.clear(), vadj_.clear(), ladj_.clear(), trips_.clear();
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
    declare_task_locals(t);
    hoist_frame(t.body, 0);
    fwd(t.body, true);
    rev(t.body);
    for (const auto& [q, local] : scalar_adj_) {
      Stmt add;
      add.op = Op::kAtomicAdd;
      add.param = plan_.grad_param[q];
      add.args = {cst(DType::kI32, 0), load_local(local, f_.params[q].dtype)};
      emit(std::move(add));
    }
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
        stacks_[c.loop].push_back(emit(std::move(st)));
      }
    }
    for (ValueId id : tp_->active_locals) ladj_[id] = mk(Op::kAlloca, ft(id), {});
    // Differentiable scalars: this iteration's d loss / d scalar, summed over every use, then
    // added into the 1-element gradient once per iteration (one atomic, not one per use).
    scalar_adj_.clear();
    for (uint32_t q = 0; q < f_.params.size(); ++q) {
      if (f_.params[q].kind == ParamKind::kScalar && f_.params[q].needs_grad &&
          uses_arg(t.body, q)) {
        scalar_adj_[q] = mk(Op::kAlloca, f_.params[q].dtype, {});
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
  bool clear_seeds_ = false;  // make_clearing_adjoint
  const TaskPlan* tp_ = nullptr;  // the current task's plan
  Kernel a_;
  std::map<uint32_t, ValueId> scalar_adj_;  // differentiable scalar param -> its adjoint local
  std::unordered_map<ValueId, ValueId> hoist_;  // forward value / local in a branch -> frame local
  // Forward while loop -> the local (adjoint id) its frame's replay counts its trips into.
  std::unordered_map<const Stmt*, ValueId> trips_;
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
    return make_error(ErrorCode::kInvalidArgument,
                      "reverse-mode: kernel '" + k.name +
                          "' holds break / continue; run lower-jumps first");
  }
  VKAD_ASSIGN_OR_RETURN(AdjointPlan plan, plan_adjoint(k, options, counting));
  Kernel adjoint = ReverseMode(k, plan, clear_seeds).run();
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

// make_adjoint's sequence with its steps' outputs kept for make_adjoint_counted: `lowered`
// receives the kernel without jumps, `differentiated` the one the adjoint was made of.
Pipeline counted_pipeline(const Target& target, const AdjointOptions& options, Kernel* lowered,
                          Kernel* differentiated, std::vector<ValueId>* counted) {
  Pipeline p(target);
  p.add(verify_pass(target));
  p.add(lower_jumps_pass(target));
  p.add("keep-lowered", [lowered](Kernel k) -> Result<Kernel> {
    *lowered = k;
    return k;
  });
  p.add("segment-loops", [options](Kernel k) {
    return segment_for_adjoint(std::move(k), options, /*counting=*/true);
  });
  p.add("reverse-mode-counted", [=](Kernel k) {
    *differentiated = k;
    return differentiate(k, target, options, /*counting=*/true, false, counted);
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
  p.add(verify_pass(target));
  p.add(lower_jumps_pass(target));
  p.add(segment_loops_pass(options));
  p.add(reverse_mode_pass(target, options, clear_seeds));
  return p;
}

Result<CountedAdjoint> make_adjoint_counted(const Kernel& forward, const Target& target,
                                            const AdjointOptions& options) {
  Kernel lowered, differentiated;
  std::vector<ValueId> loops;
  CountedAdjoint out;
  VKAD_ASSIGN_OR_RETURN(
      out.adjoint,
      counted_pipeline(target, options, &lowered, &differentiated, &loops).run(forward));
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
