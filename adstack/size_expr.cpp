#include "adstack/size_expr.h"

#include <algorithm>

namespace vkad::adstack {

namespace {
// a op b, false when it overflows int64.
bool apply(SizeExpr::Kind k, int64_t a, int64_t b, int64_t* out) {
  switch (k) {
    case SizeExpr::Kind::kAdd: return !__builtin_add_overflow(a, b, out);
    case SizeExpr::Kind::kMul: return !__builtin_mul_overflow(a, b, out);
    default: *out = std::max(a, b); return true;
  }
}
}  // namespace

SizeExpr SizeExpr::combine(Kind k, SizeExpr a, SizeExpr b) {
  int64_t v = 0;
  if (a.kind == Kind::kConst && b.kind == Kind::kConst && apply(k, a.value, b.value, &v)) {
    return constant(v);
  }
  // Identities keep printed bounds readable: x+0, x*1, x*0, max(x, 0) for sizes.
  auto is_const = [](const SizeExpr& e, int64_t v) {
    return e.kind == Kind::kConst && e.value == v;
  };
  if (k == Kind::kAdd && is_const(a, 0)) return b;
  if (k == Kind::kAdd && is_const(b, 0)) return a;
  if (k == Kind::kMul && (is_const(a, 0) || is_const(b, 0))) return constant(0);
  if (k == Kind::kMul && is_const(a, 1)) return b;
  if (k == Kind::kMul && is_const(b, 1)) return a;
  if (k == Kind::kMax && is_const(a, 0)) return b;
  if (k == Kind::kMax && is_const(b, 0)) return a;
  if (k == Kind::kMax && a == b) return a;
  SizeExpr e;
  e.kind = k;
  e.operands = {std::move(a), std::move(b)};
  return e;
}

namespace {
int64_t floor_div(int64_t a, int64_t d) {
  int64_t q = a / d;
  return (a % d != 0 && a < 0) ? q - 1 : q;
}
}  // namespace

SizeExpr SizeExpr::div(SizeExpr a, int64_t divisor) {
  if (divisor == 1) return a;
  if (a.kind == Kind::kConst) return constant(floor_div(a.value, divisor));
  SizeExpr e;
  e.kind = Kind::kDiv;
  e.value = divisor;
  e.operands = {std::move(a)};
  return e;
}

Result<int64_t> evaluate(const SizeExpr& e, const SizeInputs& in) {
  switch (e.kind) {
    case SizeExpr::Kind::kConst: return e.value;  // may be negative inside a sum (x - 1)
    case SizeExpr::Kind::kScalar: return std::max<int64_t>(in.scalar(e.param), 0);
    case SizeExpr::Kind::kNegScalar: {
      const int64_t v = in.scalar(e.param);
      return v < 0 ? (v == INT64_MIN ? INT64_MAX : -v) : 0;
    }
    case SizeExpr::Kind::kDim: return std::max<int64_t>(in.dim(e.param, e.dim), 0);
    case SizeExpr::Kind::kDiv: {
      if (e.operands.size() != 1 || e.value < 1) {
        return make_error(ErrorCode::kInvalidArgument,
                          "size quotient needs one operand and a divisor >= 1");
      }
      VKAD_ASSIGN_OR_RETURN(int64_t x, evaluate(e.operands[0], in));
      return floor_div(x, e.value);
    }
    default: break;
  }
  int64_t v = e.kind == SizeExpr::Kind::kMul ? 1 : 0;
  for (const SizeExpr& o : e.operands) {
    VKAD_ASSIGN_OR_RETURN(int64_t x, evaluate(o, in));
    if (!apply(e.kind, v, x, &v)) {
      return make_error(ErrorCode::kInvalidArgument,
                        std::string("size overflows 64 bits (") +
                            (e.kind == SizeExpr::Kind::kAdd ? "a sum" : "a product") +
                            " past 2^63 - 1)");
    }
  }
  return v;
}

}  // namespace vkad::adstack
