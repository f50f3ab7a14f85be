#include "ir/loop_passes.h"

#include <algorithm>
#include <optional>

#include "ir/range_analysis.h"

namespace vkad::codegen {

namespace {

using K = SizeExpr::Kind;

SizeExpr add(SizeExpr a, SizeExpr b) {
  return SizeExpr::combine(K::kAdd, std::move(a), std::move(b));
}
SizeExpr mul(SizeExpr a, SizeExpr b) {
  return SizeExpr::combine(K::kMul, std::move(a), std::move(b));
}

class Analysis {
 public:
  Analysis(const Kernel& k, const Task& t, bool cas32, bool cas64)
      : k_(k), ranges_(k, t), cas32_(cas32), cas64_(cas64) {}

  SizeExpr passes(const Block& b) {
    SizeExpr total = SizeExpr::constant(0);
    for (const Stmt& s : b.stmts) {
      if (std::optional<SizeExpr> n = stmt_passes(s)) total = add(total, std::move(*n));
    }
    return total;
  }

  // The passes statement `s` adds; nullopt for none (straight-line code runs within its
  // enclosing pass; only loops, and compare-and-swap loops, add passes).
  std::optional<SizeExpr> stmt_passes(const Stmt& s) {
    if (s.op == Op::kAtomicAdd && cas(s)) return SizeExpr::constant(1);
    if (op_info(s.op).family != OpFamily::kControl) return std::nullopt;
    switch (control_op(s.op)) {
      case ControlOp::kFor: return for_passes(s);
      case ControlOp::kWhile:
        // Its passes depend on data: counted once, like a for loop with data bounds.
        unchecked.push_back("%" + std::to_string(s.result));
        return SizeExpr::constant(1 + idle_passes(s.blocks[1]));
      case ControlOp::kIf: {
        SizeExpr total = SizeExpr::constant(0);
        for (const Block& c : s.blocks) total = add(total, passes(c));
        return total;
      }
      case ControlOp::kBreak:
      case ControlOp::kContinue:
      case ControlOp::kBarrier:
      case ControlOp::kPrint:
      case ControlOp::kAssert: return std::nullopt;
    }
    return std::nullopt;
  }

  SizeExpr for_passes(const Stmt& s) {
    // T iterations, each ending with one pass (decrement), then the pass in which no
    // lane is active any more, which still runs every loop of the body once.
    SizeExpr last = SizeExpr::constant(1 + idle_passes(s.blocks[0]));
    std::optional<SizeExpr> trips = trip_bound(s);
    if (!trips) {
      unchecked.push_back("%" + std::to_string(s.result));
      return last;
    }
    SizeExpr per = add(SizeExpr::constant(1), passes(s.blocks[0]));
    return add(mul(*trips, per), last);
  }

  // Passes of `b` run with no lane active: one per loop (and per compare-and-swap loop).
  uint64_t idle_passes(const Block& b) {
    uint64_t n = 0;
    for (const Stmt& s : b.stmts) {
      if (s.op == Op::kFor)
        n += 1 + idle_passes(s.blocks[0]);
      else if (s.op == Op::kWhile)
        n += 1 + idle_passes(s.blocks[1]);
      else if (s.op == Op::kAtomicAdd && cas(s))
        n += 1;
      else
        for (const Block& c : s.blocks) n += idle_passes(c);
    }
    return n;
  }

  std::vector<std::string> unchecked;

 private:
  bool cas(const Stmt& s) const {
    DType t = k_.params[s.param].dtype;
    return (t == DType::kF32 && cas32_) || (t == DType::kF64 && cas64_);
  }

  // end - begin, bounded above: the end's upper bound minus the begin's lower bound.
  std::optional<SizeExpr> trip_bound(const Stmt& loop) {
    std::optional<SizeExpr> bound = ranges_.for_trips(loop);
    if (!bound) return std::nullopt;
    SizeExpr trips = std::move(*bound);
    // A loop whose end is below its begin runs no iteration (and must not subtract passes
    // from its neighbours). Built by hand: combine() folds max(x, 0) to x.
    if (trips.kind == K::kConst) return SizeExpr::constant(std::max<int64_t>(trips.value, 0));
    SizeExpr clamped;
    clamped.kind = K::kMax;
    clamped.operands = {std::move(trips), SizeExpr::constant(0)};
    return clamped;
  }

  const Kernel& k_;
  RangeAnalysis ranges_;
  bool cas32_, cas64_;
};

}  // namespace

LoopPassBound loop_pass_bound(const Kernel& k, const Task& task, bool cas_float_atomics_f32,
                              bool cas_float_atomics_f64) {
  Analysis a(k, task, cas_float_atomics_f32, cas_float_atomics_f64);
  LoopPassBound out;
  out.per_iteration = a.passes(task.body);
  out.idle = a.idle_passes(task.body);
  out.unchecked_loops = std::move(a.unchecked);
  return out;
}

}  // namespace vkad::codegen
