#include "ir/loop_passes.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

namespace vkad::codegen {

namespace {

using K = SizeExpr::Kind;

// An integer value's range: a constant lower bound (when one is known) and a symbolic upper
// bound (when one is known).
struct Range {
  std::optional<int64_t> lo;
  std::optional<SizeExpr> up;
};

SizeExpr add(SizeExpr a, SizeExpr b) {
  return SizeExpr::combine(K::kAdd, std::move(a), std::move(b));
}
SizeExpr mul(SizeExpr a, SizeExpr b) {
  return SizeExpr::combine(K::kMul, std::move(a), std::move(b));
}

class Analysis {
 public:
  Analysis(const Kernel& k, const Task& t, bool cas32, bool cas64)
      : k_(k), t_(t), cas32_(cas32), cas64_(cas64) {
    index(t.body);
  }

  SizeExpr passes(const Block& b) {
    SizeExpr total = SizeExpr::constant(0);
    for (const Stmt& s : b.stmts) {
      switch (s.op) {
        case Op::kFor: {
          // T iterations, each ending with one pass (decrement), then the pass in which no
          // lane is active any more, which still runs every loop of the body once.
          SizeExpr last = SizeExpr::constant(1 + idle_passes(s.blocks[0]));
          std::optional<SizeExpr> trips = trip_bound(s);
          if (!trips) {
            unchecked.push_back("%" + std::to_string(s.result));
            total = add(total, last);
          } else {
            SizeExpr per = add(SizeExpr::constant(1), passes(s.blocks[0]));
            total = add(total, add(mul(*trips, per), last));
          }
          break;
        }
        case Op::kWhile:
          // Its passes depend on data: counted once, like a for loop with data bounds.
          unchecked.push_back("%" + std::to_string(s.result));
          total = add(total, SizeExpr::constant(1 + idle_passes(s.blocks[1])));
          break;
        case Op::kIf:
          for (const Block& c : s.blocks) total = add(total, passes(c));
          break;
        case Op::kAtomicAdd:
          if (cas(s)) total = add(total, SizeExpr::constant(1));
          break;
        default: break;
      }
    }
    return total;
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

  void index(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) def_[s.result] = &s;
      for (const Block& c : s.blocks) index(c);
    }
  }

  // end - begin, bounded above: the end's upper bound minus the begin's lower bound.
  std::optional<SizeExpr> trip_bound(const Stmt& loop) {
    Range b = range(loop.args[0], 0), e = range(loop.args[1], 0);
    if (!b.lo || !e.up) return std::nullopt;
    SizeExpr trips = add(*e.up, SizeExpr::constant(-*b.lo));
    // A loop whose end is below its begin runs no iteration (and must not subtract passes
    // from its neighbours). Built by hand: combine() folds max(x, 0) to x.
    if (trips.kind == K::kConst) return SizeExpr::constant(std::max<int64_t>(trips.value, 0));
    SizeExpr clamped;
    clamped.kind = K::kMax;
    clamped.operands = {std::move(trips), SizeExpr::constant(0)};
    return clamped;
  }

  // `depth` bounds the recursion over long arithmetic chains.
  Range range(ValueId v, int depth) {
    if (depth > 64) return {};
    {
      // The runtime refuses a negative range begin, so 0 is a lower bound of every index.
      int64_t lo = 0;
      SizeExpr up;
      if (task_index_bounds(t_, v, &lo, &up)) return {lo, std::move(up)};
    }
    auto it = def_.find(v);
    if (it == def_.end()) return {};
    const Stmt& s = *it->second;
    auto arg = [&](size_t i) { return range(s.args[i], depth + 1); };
    switch (s.op) {
      case Op::kConst: return {s.iimm, SizeExpr::constant(s.iimm)};
      case Op::kArg: {
        // A u32 is never negative; a signed scalar may be, so it has no lower bound here.
        // evaluate() counts a negative leaf as 0, which stays an upper bound.
        DType t = k_.params[s.param].dtype;
        if (!is_int(t)) return {};
        return {t == DType::kU32 ? std::optional<int64_t>(0) : std::nullopt,
                SizeExpr::scalar(s.param)};
      }
      case Op::kShape: return {0, SizeExpr::array_dim(s.param, s.dim)};
      case Op::kFor: {
        Range b = arg(0), e = arg(1);
        if (!e.up) return {b.lo, std::nullopt};
        return {b.lo, add(*e.up, SizeExpr::constant(-1))};
      }
      case Op::kCast: {
        // i32 <-> u32 <-> i64 keep the value when it is non-negative.
        Range a = arg(0);
        if (!is_int(s.type) || !a.lo || *a.lo < 0) return {};
        return a;
      }
      case Op::kAdd: {
        Range a = arg(0), b = arg(1);
        Range r;
        if (a.lo && b.lo) r.lo = *a.lo + *b.lo;
        if (a.up && b.up) r.up = add(*a.up, *b.up);
        return r;
      }
      case Op::kSub: {
        Range a = arg(0), b = arg(1);
        Range r;
        if (a.up && b.lo) r.up = add(*a.up, SizeExpr::constant(-*b.lo));
        if (a.lo && b.up && b.up->kind == K::kConst) r.lo = *a.lo - b.up->value;
        return r;
      }
      case Op::kMul: {
        Range a = arg(0), b = arg(1);
        if (!a.lo || !b.lo || *a.lo < 0 || *b.lo < 0) return {};
        Range r{*a.lo * *b.lo, std::nullopt};
        if (a.up && b.up) r.up = mul(*a.up, *b.up);
        return r;
      }
      case Op::kMax: {
        Range a = arg(0), b = arg(1);
        Range r;
        if (a.lo || b.lo) r.lo = std::max(a.lo.value_or(INT64_MIN), b.lo.value_or(INT64_MIN));
        if (a.up && b.up) r.up = SizeExpr::combine(K::kMax, *a.up, *b.up);
        return r;
      }
      case Op::kMin: {
        Range a = arg(0), b = arg(1);
        Range r;
        if (a.lo && b.lo) r.lo = std::min(*a.lo, *b.lo);
        if (a.up && b.up)
          r.up = b.up->kind == K::kConst ? *b.up : *a.up;
        else if (a.up)
          r.up = *a.up;
        else if (b.up)
          r.up = *b.up;
        return r;
      }
      case Op::kMod: {
        // mod rounds toward -inf: by a positive constant c the result is in [0, c).
        auto c = def_.find(s.args[1]);
        if (c == def_.end() || c->second->op != Op::kConst || c->second->iimm <= 0) return {};
        return {0, SizeExpr::constant(c->second->iimm - 1)};
      }
      case Op::kDiv:
      case Op::kFloorDiv: {
        Range a = arg(0);
        auto c = def_.find(s.args[1]);
        if (!a.lo || *a.lo < 0 || c == def_.end() || c->second->op != Op::kConst ||
            c->second->iimm < 1) {
          return {};
        }
        // Non-negative by a constant >= 1: div and floordiv agree, floor(up / c) bounds it.
        if (!a.up) return {0, std::nullopt};
        return {0, SizeExpr::div(*a.up, c->second->iimm)};
      }
      default: return {};
    }
  }

  const Kernel& k_;
  const Task& t_;
  bool cas32_, cas64_;
  std::unordered_map<ValueId, const Stmt*> def_;
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
