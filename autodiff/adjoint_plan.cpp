#include "autodiff/adjoint_plan.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "autodiff/checkpoint.h"
#include "autodiff/derivative_rules.h"
#include "autodiff/disjoint_access.h"
#include "autodiff/reverse_mode.h"
#include "ir/range_analysis.h"
#include "ir/text.h"
#include "ir/walk.h"

namespace vkad::codegen {

Status check_adjoint_options(const AdjointOptions& options) {
  const uint32_t k = options.checkpoint_segment;
  if (k == 0 || (k >= 2 && k <= kMaxCheckpointSegment)) return {};
  return make_error(
      ErrorCode::kInvalidArgument,
      "AdjointOptions::checkpoint_segment is " + std::to_string(k) +
          "; it must be 0 (off) or 2 to " + std::to_string(kMaxCheckpointSegment) +
          " iterations (the environment variable VKAD_ADJOINT_CHECKPOINT sets it: off or a "
          "segment length)");
}

const LoopCheckpoint* TaskPlan::checkpoint_of(const Stmt* loop) const {
  for (const LoopCheckpoint& c : checkpoints) {
    if (c.loop == loop) return &c;
  }
  return nullptr;
}

size_t TaskPlan::stack_count() const {
  size_t n = 0;
  for (const LoopCheckpoint& c : checkpoints) n += c.locals.size();
  return n;
}

uint8_t adjoint_primal_reads(const Stmt& s, const std::unordered_set<ValueId>& active) {
  const DerivativeRule* r = derivative_rule(s.op);
  if (!r) return 0;
  uint8_t reads = 0;
  for (size_t k = 0; k < s.args.size() && k < 3; ++k) {
    if (r->partial[k].emit && active.count(s.args[k])) reads |= r->partial[k].reads;
  }
  return reads;
}

namespace {

// Per parameter: whether any task of `k` stores to it or adds to it atomically.
std::vector<bool> written_params(const Kernel& k) {
  std::vector<bool> out(k.params.size(), false);
  for (const Task& t : k.tasks) {
    for_each_stmt(t.body, [&](const Stmt& s) {
      if (s.op == Op::kStore || s.op == Op::kAtomicAdd || s.op == Op::kAtomicMax)
        out[s.param] = true;
    });
  }
  return out;
}

bool is_loop(const Stmt& s) { return s.op == Op::kFor || s.op == Op::kWhile; }

bool contains_loop(const Block& b) {
  bool found = false;
  for_each_stmt(b, [&](const Stmt& s) { found = found || is_loop(s); });
  return found;
}

// A store into a grad ndarray replaces its element, so the value stored there before gets
// none of the element's seed. The adjoint hands each store the seed it finds in the gradient
// array and leaves it there (the seed array is the caller's, read again by later launches), so
// where one launch writes an element twice the overwritten value would get the seed too: a
// silently wrong gradient (y[i] = x * x then y[i] = sin x gave 2x + cos x). Refused:
//  - a store where an earlier write (store or atomic_add, any task) of the same ndarray may
//    reach the same element: not when their index ranges are apart on some axis (a vector's
//    components; a row before a loop over the rows after it: ir/range_analysis.h), not from
//    the other branch of an if, and not from a branch that left its loop (`break`, or
//    `continue` in a loop of one trip: the front end's early `return`) until that loop ends;
//  - a store inside a loop of more than one trip whose indices do not vary with the loop's
//    index (every iteration but the last is overwritten). An index read from a local is taken
//    to vary (its value is not followed).
struct OverwriteRefusal {
  const Task* task;
  const Stmt* stmt;
  std::string what;
};

class OverwriteCheck {
 public:
  explicit OverwriteCheck(const Kernel& f) : f_(f), writes_(f.params.size()) {
    for (const Task& t : f.tasks) defs(t.body);
  }

  std::optional<OverwriteRefusal> run() {
    for (const Task& t : f_.tasks) {
      walk(t, t.body);
      if (refusal_) break;
    }
    return std::move(refusal_);
  }

 private:
  struct Write {
    const Stmt* s;
    const Task* t;
  };
  struct Loop {
    ValueId index;
    bool one_trip;
    std::vector<std::pair<uint32_t, Write>> left;  // writes of branches that left it
  };
  using Writes = std::vector<std::vector<Write>>;

  void defs(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) def_[s.result] = &s;
      for (const Block& c : s.blocks) defs(c);
    }
  }

  // Whether `v` is computed from `index` (a loop's), following the statements defining it.
  bool varies(ValueId v, ValueId index, std::unordered_map<ValueId, bool>* memo) const {
    if (v == index) return true;
    auto d = def_.find(v);
    if (d == def_.end()) return false;  // a task's index or a value from outside the loop
    if (d->second->op == Op::kLoadLocal) return true;
    auto [m, fresh] = memo->try_emplace(v, false);
    if (!fresh) return m->second;
    bool any = false;
    for (ValueId a : d->second->args) any = any || varies(a, index, memo);
    (*memo)[v] = any;
    return any;
  }

  RangeAnalysis& ranges(const Task& t) {
    std::unique_ptr<RangeAnalysis>& r = ranges_[&t];
    if (!r) r = std::make_unique<RangeAnalysis>(f_, t);
    return *r;
  }

  // Constant bounds only: [lo, up] with up a constant (inclusive, as range() bounds it).
  static bool below(const ValueRange& a, const ValueRange& b) {
    return a.up && a.up->kind == adstack::SizeExpr::Kind::kConst && b.lo &&
           b.neg == adstack::SizeExpr::constant(0) && a.up->value < *b.lo;
  }

  bool apart(const Write& a, const Stmt& b, const Task& tb) {
    if (a.s->args.size() != b.args.size()) return false;
    for (size_t k = 0; k + 1 < b.args.size(); ++k) {
      const ValueRange ra = ranges(*a.t).range(a.s->args[k]);
      const ValueRange rb = ranges(tb).range(b.args[k]);
      if (below(ra, rb) || below(rb, ra)) return true;
    }
    return false;
  }

  void refuse(const Task& t, const Stmt& s, std::string what) {
    if (!refusal_) refusal_ = OverwriteRefusal{&t, &s, std::move(what)};
  }

  void store(const Task& t, const Stmt& s) {
    const std::string name = "ndarray '" + f_.params[s.param].name + "' (grad)";
    for (const Write& w : writes_[s.param]) {
      if (apart(w, s, t)) continue;
      return refuse(t, s,
                    name + " is stored over an element that the earlier `" + print_stmt(f_, *w.s) +
                        "` may have written; the adjoint would give the overwritten value the "
                        "element's gradient too. Keep the value in a local and store the "
                        "element once");
    }
    for (const Loop& loop : loops_) {
      if (loop.one_trip) continue;
      bool moves = false;
      for (size_t k = 0; k + 1 < s.args.size(); ++k) {
        std::unordered_map<ValueId, bool> memo;
        moves = moves || varies(s.args[k], loop.index, &memo);
      }
      if (moves) continue;
      return refuse(t, s,
                    name +
                        " is stored in every iteration of an enclosing loop at the same "
                        "element (its indices do not use the loop's index); the adjoint "
                        "would give each overwritten value the element's gradient too. Keep "
                        "the value in a local and store it after the loop");
    }
  }

  // The if's branches see the writes before it, not each other's; after it, both branches'.
  void branches(const Task& t, const Stmt& s) {
    const Writes before = writes_;
    walk(t, s.blocks[0]);
    Writes then = std::move(writes_);
    writes_ = before;
    if (s.blocks.size() > 1) walk(t, s.blocks[1]);
    for (size_t p = 0; p < then.size(); ++p) {
      for (size_t i = before[p].size(); i < then[p].size(); ++i) writes_[p].push_back(then[p][i]);
    }
  }

  void loop(const Task& t, const Stmt& s) {
    std::optional<adstack::SizeExpr> trips =
        s.op == Op::kFor ? ranges(t).for_trips(s) : std::nullopt;
    const bool one = trips && trips->kind == adstack::SizeExpr::Kind::kConst && trips->value <= 1;
    loops_.push_back(Loop{s.result, one, {}});
    for (const Block& c : s.blocks) walk(t, c);
    for (auto& [p, w] : loops_.back().left) writes_[p].push_back(w);
    loops_.pop_back();
  }

  void walk(const Task& t, const Block& b) {
    std::vector<size_t> at_entry(writes_.size());
    for (size_t p = 0; p < writes_.size(); ++p) at_entry[p] = writes_[p].size();
    for (const Stmt& s : b.stmts) {
      if (refusal_) return;
      const bool write = s.op == Op::kStore || s.op == Op::kAtomicAdd;
      if (write && f_.params[s.param].needs_grad) {
        if (s.op == Op::kStore) store(t, s);
        writes_[s.param].push_back({&s, &t});
      }
      if (s.op == Op::kIf) {
        branches(t, s);
      } else if (s.op == Op::kFor || s.op == Op::kWhile) {
        loop(t, s);
      } else {
        for (const Block& c : s.blocks) walk(t, c);
      }
    }
    // A block that leaves its loop: what it wrote reaches what follows the loop, not the rest
    // of the loop's body.
    const bool leaves = !b.stmts.empty() && !loops_.empty() &&
                        (b.stmts.back().op == Op::kBreak ||
                         (b.stmts.back().op == Op::kContinue && loops_.back().one_trip));
    if (!leaves) return;
    for (size_t p = 0; p < writes_.size(); ++p) {
      for (size_t i = at_entry[p]; i < writes_[p].size(); ++i) {
        loops_.back().left.emplace_back(static_cast<uint32_t>(p), writes_[p][i]);
      }
      writes_[p].resize(at_entry[p]);
    }
  }

  const Kernel& f_;
  std::unordered_map<ValueId, const Stmt*> def_;
  std::unordered_map<const Task*, std::unique_ptr<RangeAnalysis>> ranges_;
  Writes writes_;
  std::vector<Loop> loops_;
  std::optional<OverwriteRefusal> refusal_;
};

// What a statement of `op` is called where reverse mode refuses it; nullptr where it does not.
const char* not_differentiable(Op op) {
  if (op == Op::kBarrier) return "barrier";
  if (op == Op::kSharedAlloc || op == Op::kLoadShared || op == Op::kStoreShared)
    return "shared arrays";
  if (op >= Op::kStackAlloc) return "adstack statements";
  if (op == Op::kAtomicMax) return "atomic_max";
  return nullptr;
}

class Planner {
 public:
  Planner(const Kernel& f, const AdjointOptions& o, bool counting)
      : f_(f), o_(o), counting_(counting), written_(written_params(f)) {}

  Result<AdjointPlan> run() {
    VKAD_TRY(check_adjoint_options(o_));
    VKAD_TRY(check_rules());
    plan_.grad_param.assign(f_.params.size(), UINT32_MAX);
    plan_.param_count = static_cast<uint32_t>(f_.params.size());
    for (uint32_t p = 0; p < f_.params.size(); ++p) {
      if (f_.params[p].needs_grad) plan_.grad_param[p] = plan_.param_count++;
    }
    plan_.tasks.resize(f_.tasks.size());
    // Reverse order, as the adjoint runs them: counted loops number their parameters so.
    for (size_t i = f_.tasks.size(); i-- > 0;) VKAD_TRY(task(f_.tasks[i], &plan_.tasks[i]));
    return std::move(plan_);
  }

 private:
  // ------------------------------------------------------------ rules
  Status error(const Task& t, const Stmt& s, const std::string& what) const {
    return make_error(ErrorCode::kInvalidArgument, "reverse mode of kernel '" + f_.name +
                                                       "', task '" + t.name + "', statement `" +
                                                       print_stmt(f_, s) + "`: " + what);
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
  // check_rules' refusal of an ndarray (grad) read and written in one task, with the fixes.
  static std::string read_and_written(const std::string& name, const std::string& task) {
    return name + " (grad) is both read and written in task '" + task +
           "'; its gradient would need the values the stores overwrite, which the adjoint (run "
           "after the forward) no longer sees. Write the result to a separate ndarray, or move "
           "the stores into an earlier task than the reads, or index the reads and the stores on "
           "one axis by launch-uniform values a constant apart (read x[f, i], store x[f + 1, i]; "
           "in a ring of a power-of-two size: read x[f % 2, i], store x[(f + 1) % 2, i]). "
           "To read back what this invocation stored, keep the value in a local (or load it "
           "right after the store, in the same block, with the same indices: forwarded)";
  }

  Status check_rules() {
    std::vector<const Stmt*> first_read(f_.params.size(), nullptr),
        first_write(f_.params.size(), nullptr);
    const size_t none = SIZE_MAX;
    std::vector<size_t> first_read_task(f_.params.size(), none),
        last_write_task(f_.params.size(), none);
    std::vector<const Stmt*> last_write(f_.params.size(), nullptr);
    size_t task_no = 0;
    int depth = 0;
    std::function<Status(const Task&, const Block&)> walk = [&](const Task& t,
                                                                const Block& b) -> Status {
      for (const Stmt& s : b.stmts) {
        if (const char* what = not_differentiable(s.op))
          return error(t, s, std::string(what) + " cannot be differentiated");
        if (!s.blocks.empty() && depth == kMaxAdjointNesting) {
          return error(t, s,
                       "loops and branches are nested " + std::to_string(depth + 1) +
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
          disjoint_access(f_, static_cast<uint32_t>(p)).kind != DisjointAccess::Kind::kUnproven ||
          written_before_read(f_, static_cast<uint32_t>(p));
      const std::string name = "ndarray '" + f_.params[p].name + "'";
      if (!f_.params[p].needs_grad) {
        rw_no_grad_[p] = true;
        rw_unordered_[p] = !ordered;
        continue;
      }
      if (ordered) continue;
      const Task& rt = f_.tasks[first_read_task[p]];
      const Task& wt = f_.tasks[last_write_task[p]];
      if (&rt == &wt) return error(wt, *last_write[p], read_and_written(name, wt.name));
      return error(wt, *last_write[p],
                   name + " (grad) is read in task '" + rt.name +
                       "' and written by the later task '" + wt.name +
                       "'; the gradient of the read needs the values the write "
                       "overwrites. Write the result to a separate ndarray, or index the reads "
                       "and the stores on one axis by launch-uniform values a constant apart "
                       "(read x[f, i], store x[f + 1, i]; or x[f % 2, i], x[(f + 1) % 2, i])");
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
          return error(
              t, s,
              name +
                  " has no gradient, yet the kernel stores a differentiable value into "
                  "it and reads it back: the gradient through it would be lost. Mark it grad "
                  "(and write it in an earlier task than the reads), or keep the value in a "
                  "local");
        }
        if (s.op == Op::kLoad && rw_unordered_[s.param] && needed_anywhere(s.result)) {
          return error(
              t, s,
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
      if (!ctrl.empty() &&
          std::any_of(ctrl.begin(), ctrl.end(), [](const Stmt* c) { return is_loop(*c); })) {
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
      if (s.result == kNoValue || !is_float(s.type) || s.op == Op::kAlloca || s.op == Op::kFor)
        continue;
      if (value_active(s) && active_.insert(s.result).second) changed = true;
    }
    return changed;
  }

  // Whether float value `s` carries a derivative: read from a grad ndarray or scalar, or
  // computed from an operand that carries one (a select: from a chosen operand).
  bool value_active(const Stmt& s) const {
    switch (op_info(s.op).family) {
      case OpFamily::kLeaf:
        switch (leaf_op(s.op)) {
          case LeafOp::kArg: return f_.params[s.param].needs_grad;
          case LeafOp::kConst:
          case LeafOp::kShape: return false;
        }
        return false;
      case OpFamily::kArray:
        switch (array_op(s.op)) {
          case ArrayOp::kLoad: return f_.params[s.param].needs_grad;
          case ArrayOp::kStore:
          case ArrayOp::kAtomicAdd:
          case ArrayOp::kAtomicMax: return false;  // no result: never asked
        }
        return false;
      // A local's load: from its local (the rest are not values, never asked; shared arrays
      // are refused before).
      case OpFamily::kLocal: return s.op == Op::kLoadLocal && act(s.args[0]);
      case OpFamily::kSelect: return act(s.args[1]) || act(s.args[2]);
      // Arithmetic, math, casts: from any operand (control and adstack statements with a float
      // result never come).
      case OpFamily::kUnary:
      case OpFamily::kBinary:
      case OpFamily::kCompare:
      case OpFamily::kCast:
      case OpFamily::kControl:
      case OpFamily::kStack: break;
    }
    bool a = false;
    for (ValueId x : s.args) a = a || act(x);
    return a;
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

  uint8_t primal_reads(const Stmt& s) const { return adjoint_primal_reads(s, active_); }

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

  // The trip bound that a loop's own bounds do not give (RangeAnalysis's hook): a stated
  // max_trip, else a counted one (not while probing).
  std::optional<SizeExpr> stated_trips(const Stmt& loop) {
    if (loop.has_cap) return loop.cap;
    if (counting_ && !probing_) return counted(loop);
    return std::nullopt;
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
    std::optional<SizeExpr> trips = ranges_->for_trips(loop);
    if (!trips && counting_) return counted(loop);
    if (!trips) {
      // Which bound failed, so the message says why.
      const bool begin_known = ranges_->range(loop.args[0]).lo.has_value();
      return error(*task_, loop,
                   std::string("reverse mode needs a bound on this loop's trip count to size its "
                               "adstack, and ") +
                       (begin_known ? "its end depends on ndarray contents or mutable locals"
                                    : "its begin has no lower bound (it depends on ndarray "
                                      "contents or mutable locals, or on a signed scalar that "
                                      "may be negative; a u32 one is never negative)") +
                       ". State one: `for %i in [%b, %e) max_trip(<size>)` in text, or "
                       "KernelBuilder::for_range(begin, end, max_trip, body); or let "
                       "make_adjoint_counted count it on the device");
    }
    return std::move(*trips);
  }

  // The counted trip bound of `loop`: a new i32 scalar parameter of the adjoint, named after the
  // loop, that launch_counted (runtime/counted_launch.h) sets from the counting kernel.
  SizeExpr counted(const Stmt& loop) {
    auto it = counted_.find(&loop);
    if (it == counted_.end()) {
      it = counted_.emplace(&loop, plan_.param_count++).first;
      plan_.counted_loops.push_back(&loop);
    }
    return SizeExpr::scalar(it->second);
  }

  // ------------------------------------------------------------ one task
  Status task(const Task& t, TaskPlan* out) {
    task_ = &t;
    ranges_.emplace(f_, t, [this](const Stmt& loop) { return stated_trips(loop); });
    def_.clear(), type_.clear(), active_.clear(), needed_.clear(), ckpt_.clear();
    path_.clear(), stores_.clear(), read_.clear();
    for (ValueId ix : task_indices(t)) type_[ix] = DType::kI32;
    std::vector<const Stmt*> ctrl;
    std::vector<Pos> pos;
    index_defs(t.body, ctrl, pos);
    while (activity(t.body)) {
    }
    seed_needed(t.body);
    propagate_needed();
    VKAD_TRY(check_read_write(t, t.body));
    // Checkpoint stacks, in a deterministic order (statement order).
    std::vector<const Stmt*> order;
    for_each_stmt(t.body, [&](const Stmt& s) {
      if (ckpt_.count(&s)) order.push_back(&s);
    });
    if (o_.checkpoint_segment >= 2) {
      for (const Stmt* c : order) {
        // W from the locals it checkpoints per iteration (checkpoint.h, "whole tape").
        const uint32_t whole = whole_tape_trips(o_.checkpoint_segment, ckpt_.at(c).size());
        if (segmentable(*c, whole)) out->segmentable[c->result] = whole;
      }
    }
    for (const Stmt* c : order) {
      LoopCheckpoint cp;
      cp.loop = c;
      cp.locals = ckpt_.at(c);
      cp.capacity = SizeExpr::constant(1);
      if (is_loop(*c)) {
        VKAD_ASSIGN_OR_RETURN(cp.capacity, trip_bound(*c));
      }
      out->checkpoints.push_back(std::move(cp));
    }
    // Adjoints of active float locals live for the whole iteration.
    for (const auto& [id, s] : def_) {
      if (s->op == Op::kAlloca && is_float(s->type) && act(id)) out->active_locals.push_back(id);
    }
    std::sort(out->active_locals.begin(), out->active_locals.end());
    out->owned = owned_ndarrays(f_, t);
    // A parameter the forward only reads gets its gradient added atomically where the device
    // adds its type in hardware (AdjointOptions::atomic_f32_add).
    for (size_t p = 0; p < out->owned.size(); ++p) {
      const DType d = f_.params[p].dtype;
      const bool hw =
          (d == DType::kF32 && o_.atomic_f32_add) || (d == DType::kF64 && o_.atomic_f64_add);
      if (out->owned[p] && hw && !written_[p]) out->owned[p] = false;
    }
    out->active = std::move(active_);
    out->read = std::move(read_);
    out->types = std::move(type_);
    return {};
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
    const bool derivable =
        ranges_->range(loop.args[0]).bounded() && ranges_->range(loop.args[1]).bounded();
    probing_ = false;
    if (!derivable) return false;
    // (A bound may be a task index, which def_ does not hold.)
    auto b = def_.find(loop.args[0]), e = def_.find(loop.args[1]);
    if (b != def_.end() && e != def_.end() && b->second->op == Op::kConst &&
        e->second->op == Op::kConst) {
      return e->second->iimm - b->second->iimm > static_cast<int64_t>(whole);
    }
    return true;
  }

  const Kernel& f_;
  const AdjointOptions& o_;
  bool counting_ = false;
  std::vector<bool> written_;  // per parameter: written_params(f_)
  AdjointPlan plan_;
  bool probing_ = false;  // range() without creating counted trip bounds
  std::unordered_map<const Stmt*, uint32_t> counted_;  // loop -> the adjoint's trips_ parameter
  const Task* task_ = nullptr;
  std::optional<RangeAnalysis> ranges_;  // of task_
  // Per parameter (check_rules): read and written with no gradient; and of those, not written
  // strictly before every read.
  std::vector<bool> rw_no_grad_, rw_unordered_;
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
  std::vector<std::pair<ValueId, const Stmt*>> work_;
  std::unordered_map<const Stmt*, std::vector<ValueId>> ckpt_;  // forward locals
};

}  // namespace

Status check_overwrites(const Kernel& forward) {
  std::optional<OverwriteRefusal> r = OverwriteCheck(forward).run();
  if (!r) return {};
  return make_error(ErrorCode::kInvalidArgument,
                    "reverse mode of kernel '" + forward.name + "', task '" + r->task->name +
                        "', statement `" + print_stmt(forward, *r->stmt) + "`: " + r->what);
}

Result<AdjointPlan> plan_adjoint(const Kernel& forward, const AdjointOptions& options,
                                 bool counting) {
  return Planner(forward, options, counting).run();
}

}  // namespace vkad::codegen
