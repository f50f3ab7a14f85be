// Symbolic ranges of a task's integer values: a constant lower bound and a symbolic upper bound
// (a SizeExpr over scalar parameters and extents, evaluated per launch), each where one is
// known. Reverse mode sizes adstacks from them (a loop's trip bound is its end's upper bound
// minus its begin's lower bound) and the lavapipe loop-pass bound (loop_passes.h) counts loop
// passes with them; both read this one analysis, so they agree on every value.
//
// A lower bound is a constant minus a symbolic negative part, lo - neg: an i32 / i64 scalar n
// may be negative, so its lower bound is 0 - neg(n) (SizeExpr::neg_scalar, max(-n, 0)), and a
// loop from n to e runs at most e - 0 + neg(n) times. (A SizeExpr counts a negative leaf as 0,
// so n itself is only an upper bound; reverse mode used to take 0 as n's lower bound, and
// sized the stack of a loop from a negative begin too small.)
//
// What is known (anything else, loads and mutable locals among it, has no range):
//   constants; a task index: [max(begin, 0), end - 1] (the runtime refuses a negative begin);
//   a u32 scalar: [0, itself]; an i32 / i64 scalar: [0 - neg(itself), itself]; an extent:
//   [0, itself]; a for loop's index: [begin's lo, end's up - 1], or, when the
//   end has no upper bound, [begin's lo, begin's up + trips - 1] with `trips` from the caller's
//   hook (a stated max_trip, a counted bound); a while loop's index: [0, trips - 1] likewise;
//   add, sub, mul of non-negative values, min, max, mod and div / floordiv by a positive
//   constant, and integer casts of values known non-negative (lo >= 0 and no negative part).
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <unordered_map>

#include "ir/ir.h"

namespace vkad::codegen {

struct ValueRange {
  // The lower bound is lo - neg where lo is known; neg (>= 0 at every launch) is the constant
  // 0 for values that cannot go below lo.
  std::optional<int64_t> lo;
  SizeExpr neg = SizeExpr::constant(0);
  std::optional<SizeExpr> up;  // a symbolic upper bound
  bool bounded() const { return lo && up; }
  // Known to be >= 0 at every launch.
  bool non_negative() const { return lo && *lo >= 0 && neg == SizeExpr::constant(0); }
};

class RangeAnalysis {
 public:
  // The trip bound of a loop that its own bounds do not give (a for loop whose end has no upper
  // bound, any while loop), or nullopt. Reverse mode answers with a stated max_trip or a
  // counted bound; without a hook there is none.
  using LoopTrips = std::function<std::optional<SizeExpr>(const Stmt& loop)>;

  // Borrows `k` and `t` (a task of `k`); both must outlive the analysis and stay unchanged.
  RangeAnalysis(const Kernel& k, const Task& t, LoopTrips loop_trips = nullptr);

  ValueRange range(ValueId v) const;

  // An upper bound on a for loop's iterations, end's up - begin's lower bound (up - lo + neg;
  // may be negative when the loop runs none: callers clamp where that matters), or nullopt
  // when either is unknown.
  std::optional<SizeExpr> for_trips(const Stmt& loop) const;

 private:
  ValueRange range(ValueId v, int depth) const;
  // range() of a statement's result, by kind: constants, scalars and extents; for / while
  // indices; add, sub; mul, min, max; casts, mod, div, floordiv.
  // One rule per op with a known range (rules() maps ops to them; nullptr: unknown).
  using Rule = ValueRange (RangeAnalysis::*)(const Stmt& s, int depth) const;
  static const std::array<Rule, kNumOps>& rules();
  ValueRange constant(const Stmt& s, int depth) const;
  ValueRange scalar_arg(const Stmt& s, int depth) const;
  ValueRange extent(const Stmt& s, int depth) const;
  ValueRange for_index(const Stmt& s, int depth) const;
  ValueRange while_index(const Stmt& s, int depth) const;
  ValueRange sum(const Stmt& s, int depth) const;
  ValueRange difference(const Stmt& s, int depth) const;
  ValueRange product(const Stmt& s, int depth) const;
  ValueRange maximum(const Stmt& s, int depth) const;
  ValueRange minimum(const Stmt& s, int depth) const;
  ValueRange cast(const Stmt& s, int depth) const;
  ValueRange modulo(const Stmt& s, int depth) const;
  ValueRange quotient(const Stmt& s, int depth) const;
  bool is_int_value(ValueId v) const;
  const Stmt* positive_constant(ValueId v, int64_t min) const;

  const Kernel& k_;
  const Task& t_;
  LoopTrips loop_trips_;
  std::unordered_map<ValueId, const Stmt*> def_;
};

}  // namespace vkad::codegen
