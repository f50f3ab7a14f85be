#include "autodiff/derivative_rules.h"

#include <cstddef>
#include <iterator>

namespace vkad::codegen {

namespace {

using B = PartialBuilder;
using P = PartialArgs;

ValueId mul(B& b, DType t, ValueId x, ValueId y) { return b.op(Op::kMul, t, {x, y}); }
ValueId neg(B& b, DType t, ValueId x) { return b.op(Op::kNeg, t, {x}); }
ValueId sel(B& b, DType t, ValueId c, ValueId x, ValueId y) {
  return b.op(Op::kSelect, t, {c, x, y});
}

// 1 / sqrt(1 - a^2): asin' and -acos'.
ValueId inv_sqrt_one_minus_sq(B& b, const P& a) {
  ValueId sq = mul(b, a.type, a.arg[0], a.arg[0]);
  return b.op(Op::kRsqrt, a.type, {b.op(Op::kSub, a.type, {b.constant(a.type, 1), sq})});
}

ValueId min_max_first(B& b, const P& a, Op cmp) {
  return b.op(cmp, DType::kBool, {a.arg[0], a.arg[1]});
}

const DerivativeRule kAdd = {
    {{0, [](B&, const P& a) { return a.g; }}, {0, [](B&, const P& a) { return a.g; }}}};
const DerivativeRule kSub = {{{0, [](B&, const P& a) { return a.g; }},
                              {0, [](B& b, const P& a) { return neg(b, a.type, a.g); }}}};
const DerivativeRule kNeg = {{{0, [](B& b, const P& a) { return neg(b, a.type, a.g); }}}};
// d(a*b) = b da + a db: each operand's partial reads only the other one, so scaling by a
// constant or an inactive value needs no checkpoint.
const DerivativeRule kMul = {
    {{kReadArg1, [](B& b, const P& a) { return mul(b, a.type, a.g, a.arg[1]); }},
     {kReadArg0, [](B& b, const P& a) { return mul(b, a.type, a.g, a.arg[0]); }}}};
const DerivativeRule kDiv = {
    {{kReadArg1,
      [](B& b, const P& a) {
        return b.op(Op::kDiv, a.type, {a.g, a.arg[1]});
      }},
     {kReadArg1 | kReadResult, [](B& b, const P& a) {
        return neg(b, a.type, b.op(Op::kDiv, a.type, {mul(b, a.type, a.g, a.result), a.arg[1]}));
      }}}};
const DerivativeRule kMin = {
    {{kReadArg0 | kReadArg1,
      [](B& b, const P& a) {
        return sel(b, a.type, min_max_first(b, a, Op::kLe), a.g, b.constant(a.type, 0));
      }},
     {kReadArg0 | kReadArg1, [](B& b, const P& a) {
        return sel(b, a.type, min_max_first(b, a, Op::kLe), b.constant(a.type, 0), a.g);
      }}}};
const DerivativeRule kMax = {
    {{kReadArg0 | kReadArg1,
      [](B& b, const P& a) {
        return sel(b, a.type, min_max_first(b, a, Op::kGe), a.g, b.constant(a.type, 0));
      }},
     {kReadArg0 | kReadArg1, [](B& b, const P& a) {
        return sel(b, a.type, min_max_first(b, a, Op::kGe), b.constant(a.type, 0), a.g);
      }}}};
const DerivativeRule kAbs = {
    {{kReadArg0, [](B& b, const P& a) {
        ValueId negative = b.op(Op::kLt, DType::kBool, {a.arg[0], b.constant(a.type, 0)});
        return sel(b, a.type, negative, neg(b, a.type, a.g), a.g);
      }}}};
const DerivativeRule kSqrt = {
    {{kReadResult, [](B& b, const P& a) {
        return b.op(Op::kDiv, a.type, {mul(b, a.type, a.g, b.constant(a.type, 0.5)), a.result});
      }}}};
const DerivativeRule kRsqrt = {
    {{kReadResult, [](B& b, const P& a) {
        ValueId f3 = mul(b, a.type, a.result, mul(b, a.type, a.result, a.result));
        return mul(b, a.type, mul(b, a.type, a.g, b.constant(a.type, -0.5)), f3);
      }}}};
const DerivativeRule kExp = {
    {{kReadResult, [](B& b, const P& a) { return mul(b, a.type, a.g, a.result); }}}};
const DerivativeRule kLog = {{{kReadArg0, [](B& b, const P& a) {
                                 return b.op(Op::kDiv, a.type, {a.g, a.arg[0]});
                               }}}};
const DerivativeRule kSin = {{{kReadArg0, [](B& b, const P& a) {
                                 return mul(b, a.type, a.g, b.op(Op::kCos, a.type, {a.arg[0]}));
                               }}}};
const DerivativeRule kCos = {
    {{kReadArg0, [](B& b, const P& a) {
        return neg(b, a.type, mul(b, a.type, a.g, b.op(Op::kSin, a.type, {a.arg[0]})));
      }}}};
const DerivativeRule kTan = {
    {{kReadResult, [](B& b, const P& a) {
        ValueId sec2 =
            b.op(Op::kAdd, a.type, {b.constant(a.type, 1), mul(b, a.type, a.result, a.result)});
        return mul(b, a.type, a.g, sec2);
      }}}};
const DerivativeRule kTanh = {
    {{kReadResult, [](B& b, const P& a) {
        ValueId sech2 =
            b.op(Op::kSub, a.type, {b.constant(a.type, 1), mul(b, a.type, a.result, a.result)});
        return mul(b, a.type, a.g, sech2);
      }}}};
const DerivativeRule kAsin = {{{kReadArg0, [](B& b, const P& a) {
                                  return mul(b, a.type, a.g, inv_sqrt_one_minus_sq(b, a));
                                }}}};
const DerivativeRule kAcos = {{{kReadArg0, [](B& b, const P& a) {
                                  return neg(b, a.type,
                                             mul(b, a.type, a.g, inv_sqrt_one_minus_sq(b, a)));
                                }}}};
const DerivativeRule kPow = {
    {{kReadArg0 | kReadArg1,
      [](B& b, const P& a) {
        ValueId bm1 = b.op(Op::kSub, a.type, {a.arg[1], b.constant(a.type, 1)});
        return mul(b, a.type, mul(b, a.type, a.g, a.arg[1]),
                   b.op(Op::kPow, a.type, {a.arg[0], bm1}));
      }},
     {kReadArg0 | kReadResult, [](B& b, const P& a) {
        // log(a) only where a > 0; the derivative in b is 0 (not NaN) elsewhere.
        ValueId pos = b.op(Op::kGt, DType::kBool, {a.arg[0], b.constant(a.type, 0)});
        ValueId safe = sel(b, a.type, pos, a.arg[0], b.constant(a.type, 1));
        ValueId d = mul(b, a.type, a.result, b.op(Op::kLog, a.type, {safe}));
        return mul(b, a.type, a.g, sel(b, a.type, pos, d, b.constant(a.type, 0)));
      }}}};
ValueId atan2_den(B& b, const P& a) {
  return b.op(Op::kAdd, a.type,
              {mul(b, a.type, a.arg[0], a.arg[0]), mul(b, a.type, a.arg[1], a.arg[1])});
}
const DerivativeRule kAtan2 = {
    {{kReadArg0 | kReadArg1,
      [](B& b, const P& a) {
        return b.op(Op::kDiv, a.type, {mul(b, a.type, a.g, a.arg[1]), atan2_den(b, a)});
      }},
     {kReadArg0 | kReadArg1, [](B& b, const P& a) {
        return neg(b, a.type,
                   b.op(Op::kDiv, a.type, {mul(b, a.type, a.g, a.arg[0]), atan2_den(b, a)}));
      }}}};
const DerivativeRule kSelect = {
    {{},
     {kReadArg0,
      [](B& b, const P& a) { return sel(b, a.type, a.arg[0], a.g, b.constant(a.type, 0)); }},
     {kReadArg0,
      [](B& b, const P& a) { return sel(b, a.type, a.arg[0], b.constant(a.type, 0), a.g); }}}};
// Only float operands carry derivatives, so the partial is a float-to-float conversion.
const DerivativeRule kCast = {
    {{0, [](B& b, const P& a) { return b.op(Op::kCast, a.arg_type[0], {a.g}); }}}};
const DerivativeRule kZero = {};
// The slot of ops without a row (ops.def says kNoRule): reverse mode handles them
// structurally, or rejects them.
const DerivativeRule kNoRule = {};

// One entry per op, in ops.def's order: the row its `rule` column names.
constexpr const DerivativeRule* kRuleOf[] = {
#define VKAD_OP(family, name, text, has_result, operands, blocks, rule) &(rule),
#include "ir/ops.def"
};
static_assert(std::size(kRuleOf) == kNumOps);

}  // namespace

const DerivativeRule* derivative_rule(Op op) {
  const DerivativeRule* rule = kRuleOf[static_cast<size_t>(op)];
  return rule == &kNoRule ? nullptr : rule;
}

}  // namespace vkad::codegen
