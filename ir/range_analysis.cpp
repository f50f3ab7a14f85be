#include "ir/range_analysis.h"

#include <algorithm>
#include <array>
#include <utility>

#include "ir/walk.h"

namespace vkad::codegen {

namespace {

using K = SizeExpr::Kind;

// Bounds the recursion over long arithmetic chains (a value deeper than this has no range).
constexpr int kMaxDepth = 256;

SizeExpr add(SizeExpr a, SizeExpr b) {
  return SizeExpr::combine(K::kAdd, std::move(a), std::move(b));
}

SizeExpr plus(SizeExpr a, int64_t c) { return add(std::move(a), SizeExpr::constant(c)); }

}  // namespace

RangeAnalysis::RangeAnalysis(const Kernel& k, const Task& t, LoopTrips loop_trips)
    : k_(k), t_(t), loop_trips_(std::move(loop_trips)) {
  for_each_stmt(t.body, [&](const Stmt& s) {
    if (s.result != kNoValue) def_[s.result] = &s;
  });
}

ValueRange RangeAnalysis::range(ValueId v) const { return range(v, 0); }

std::optional<SizeExpr> RangeAnalysis::for_trips(const Stmt& loop) const {
  ValueRange b = range(loop.args[0]), e = range(loop.args[1]);
  if (!b.lo || !e.up) return std::nullopt;
  return add(plus(std::move(*e.up), -*b.lo), std::move(b.neg));
}

bool RangeAnalysis::is_int_value(ValueId v) const {
  auto it = def_.find(v);
  if (it == def_.end()) return true;  // a task index (i32)
  return is_int(it->second->type);
}

// The statement defining `v` when it is an integer constant >= min.
const Stmt* RangeAnalysis::positive_constant(ValueId v, int64_t min) const {
  auto c = def_.find(v);
  if (c == def_.end() || c->second->op != Op::kConst || c->second->iimm < min) return nullptr;
  return c->second;
}

ValueRange RangeAnalysis::range(ValueId v, int depth) const {
  if (depth > kMaxDepth) return {};
  {
    int64_t lo = 0;
    SizeExpr up;
    if (task_index_bounds(t_, v, &lo, &up)) return {lo, SizeExpr::constant(0), std::move(up)};
  }
  auto it = def_.find(v);
  if (it == def_.end()) return {};
  const Stmt& s = *it->second;
  const Rule rule = rules()[static_cast<size_t>(s.op)];
  return rule ? (this->*rule)(s, depth) : ValueRange{};
}

// The ops whose values have a range this analysis knows; every other op's is unknown (a
// partial analysis: a new op is conservatively unbounded until it gets a rule here).
const std::array<RangeAnalysis::Rule, kNumOps>& RangeAnalysis::rules() {
  static const std::array<Rule, kNumOps> table = [] {
    std::array<Rule, kNumOps> t{};
    auto set = [&](Op op, Rule r) { t[static_cast<size_t>(op)] = r; };
    set(Op::kConst, &RangeAnalysis::constant);
    set(Op::kArg, &RangeAnalysis::scalar_arg);
    set(Op::kShape, &RangeAnalysis::extent);
    set(Op::kFor, &RangeAnalysis::for_index);
    set(Op::kWhile, &RangeAnalysis::while_index);
    set(Op::kAdd, &RangeAnalysis::sum);
    set(Op::kSub, &RangeAnalysis::difference);
    set(Op::kMul, &RangeAnalysis::product);
    set(Op::kMax, &RangeAnalysis::maximum);
    set(Op::kMin, &RangeAnalysis::minimum);
    set(Op::kCast, &RangeAnalysis::cast);
    set(Op::kMod, &RangeAnalysis::modulo);
    set(Op::kDiv, &RangeAnalysis::quotient);
    set(Op::kFloorDiv, &RangeAnalysis::quotient);
    return t;
  }();
  return table;
}

ValueRange RangeAnalysis::constant(const Stmt& s, int) const {
  if (!is_int(s.type)) return {};
  return {s.iimm, SizeExpr::constant(0), SizeExpr::constant(s.iimm)};
}

ValueRange RangeAnalysis::scalar_arg(const Stmt& s, int) const {
  // A u32 is never negative; a signed scalar may be: its lower bound is 0 - neg(n). (As an
  // upper bound n itself serves: evaluate() counts a negative leaf as 0.)
  const DType t = k_.params[s.param].dtype;
  if (!is_int(t)) return {};
  return {0, t == DType::kU32 ? SizeExpr::constant(0) : SizeExpr::neg_scalar(s.param),
          SizeExpr::scalar(s.param)};
}

ValueRange RangeAnalysis::extent(const Stmt& s, int) const {
  return {0, SizeExpr::constant(0), SizeExpr::array_dim(s.param, s.dim)};
}

ValueRange RangeAnalysis::for_index(const Stmt& s, int depth) const {
  ValueRange b = range(s.args[0], depth + 1), e = range(s.args[1], depth + 1);
  if (e.up) return {b.lo, std::move(b.neg), plus(std::move(*e.up), -1)};
  // A trip bound caps the index too: index < begin + trips (a launch past a stated one
  // overflows the loop's own stack, which is reported).
  std::optional<SizeExpr> trips = b.up && loop_trips_ ? loop_trips_(s) : std::nullopt;
  if (!trips) return {b.lo, std::move(b.neg), std::nullopt};
  return {b.lo, std::move(b.neg), plus(add(std::move(*b.up), std::move(*trips)), -1)};
}

ValueRange RangeAnalysis::while_index(const Stmt& s, int) const {
  std::optional<SizeExpr> trips = loop_trips_ ? loop_trips_(s) : std::nullopt;
  if (!trips) return {0, SizeExpr::constant(0), std::nullopt};
  return {0, SizeExpr::constant(0), plus(std::move(*trips), -1)};
}

ValueRange RangeAnalysis::sum(const Stmt& s, int depth) const {
  ValueRange a = range(s.args[0], depth + 1), b = range(s.args[1], depth + 1);
  ValueRange r;
  if (a.lo && b.lo) r.lo = *a.lo + *b.lo, r.neg = add(std::move(a.neg), std::move(b.neg));
  if (a.up && b.up) r.up = add(std::move(*a.up), std::move(*b.up));
  return r;
}

ValueRange RangeAnalysis::difference(const Stmt& s, int depth) const {
  ValueRange a = range(s.args[0], depth + 1), b = range(s.args[1], depth + 1);
  ValueRange r;
  // a - b <= a.up - (b.lo - b.neg), and a - b >= (a.lo - a.neg) - b.up: a constant b.up
  // lowers lo, a symbolic one joins the negative part (it evaluates to at least b).
  if (a.up && b.lo) r.up = add(plus(*a.up, -*b.lo), std::move(b.neg));
  if (a.lo && b.up && b.up->kind == K::kConst) {
    r.lo = *a.lo - b.up->value, r.neg = std::move(a.neg);
  } else if (a.lo && b.up) {
    r.lo = a.lo, r.neg = add(std::move(a.neg), std::move(*b.up));
  }
  return r;
}

ValueRange RangeAnalysis::product(const Stmt& s, int depth) const {
  ValueRange a = range(s.args[0], depth + 1), b = range(s.args[1], depth + 1);
  if (!a.non_negative() || !b.non_negative()) return {};
  ValueRange r{*a.lo * *b.lo, SizeExpr::constant(0), std::nullopt};
  if (a.up && b.up) r.up = SizeExpr::combine(K::kMul, std::move(*a.up), std::move(*b.up));
  return r;
}

ValueRange RangeAnalysis::maximum(const Stmt& s, int depth) const {
  ValueRange a = range(s.args[0], depth + 1), b = range(s.args[1], depth + 1);
  ValueRange r;
  // max(a, b) is at least either side's lower bound: the one without a negative part where
  // there is one, the larger constant among those.
  auto plain = [](const ValueRange& x) { return x.lo && x.neg == SizeExpr::constant(0); };
  if (plain(a) && plain(b))
    r.lo = std::max(*a.lo, *b.lo);
  else if (plain(a) || (a.lo && !b.lo))
    r.lo = a.lo, r.neg = a.neg;
  else if (b.lo)
    r.lo = b.lo, r.neg = b.neg;
  if (a.up && b.up) r.up = SizeExpr::combine(K::kMax, std::move(*a.up), std::move(*b.up));
  return r;
}

ValueRange RangeAnalysis::minimum(const Stmt& s, int depth) const {
  ValueRange a = range(s.args[0], depth + 1), b = range(s.args[1], depth + 1);
  ValueRange r;
  if (a.lo && b.lo) r.lo = std::min(*a.lo, *b.lo), r.neg = add(a.neg, b.neg);
  // Either operand's upper bound bounds the minimum; a constant one is the tighter to read.
  if (b.up && (b.up->kind == K::kConst || !a.up))
    r.up = std::move(b.up);
  else
    r.up = std::move(a.up);
  return r;
}

ValueRange RangeAnalysis::cast(const Stmt& s, int depth) const {
  // Integer casts keep a value that is non-negative (and below 2^31 where it narrows: the
  // upper bound is a size, which the launch checks).
  if (!is_int(s.type) || !is_int_value(s.args[0])) return {};
  ValueRange a = range(s.args[0], depth + 1);
  if (!a.non_negative()) return {};
  return a;
}

ValueRange RangeAnalysis::modulo(const Stmt& s, int) const {
  // mod rounds toward -inf: by a positive constant c the result is in [0, c).
  const Stmt* c = positive_constant(s.args[1], 1);
  if (!c) return {};
  return {0, SizeExpr::constant(0), SizeExpr::constant(c->iimm - 1)};
}

ValueRange RangeAnalysis::quotient(const Stmt& s, int depth) const {
  ValueRange a = range(s.args[0], depth + 1);
  const Stmt* c = positive_constant(s.args[1], 1);
  if (!a.non_negative() || !c) return {};
  // Non-negative by a constant >= 1: div and floordiv agree, floor(up / c) bounds it.
  const int64_t lo = *a.lo / c->iimm;
  if (!a.up) return {lo, SizeExpr::constant(0), std::nullopt};
  return {lo, SizeExpr::constant(0), SizeExpr::div(std::move(*a.up), c->iimm)};
}

}  // namespace vkad::codegen
