#include "adstack/size_expr.h"

#include <algorithm>

namespace vkad::adstack {

SizeExpr SizeExpr::combine(Kind k, SizeExpr a, SizeExpr b) {
  if (a.kind == Kind::kConst && b.kind == Kind::kConst) {
    int64_t v = k == Kind::kAdd ? a.value + b.value
                : k == Kind::kMul ? a.value * b.value
                                  : std::max(a.value, b.value);
    return constant(v);
  }
  // Identities keep printed bounds readable: x+0, x*1, x*0, max(x, 0) for sizes.
  auto is_const = [](const SizeExpr& e, int64_t v) { return e.kind == Kind::kConst && e.value == v; };
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

int64_t evaluate(const SizeExpr& e, const SizeInputs& in) {
  switch (e.kind) {
    case SizeExpr::Kind::kConst: return e.value;  // may be negative inside a sum (x - 1)
    case SizeExpr::Kind::kScalar: return std::max<int64_t>(in.scalar(e.param), 0);
    case SizeExpr::Kind::kDim: return std::max<int64_t>(in.dim(e.param, e.dim), 0);
    default: break;
  }
  int64_t v = e.kind == SizeExpr::Kind::kMul ? 1 : 0;
  for (const SizeExpr& o : e.operands) {
    int64_t x = evaluate(o, in);
    v = e.kind == SizeExpr::Kind::kAdd ? v + x : e.kind == SizeExpr::Kind::kMul ? v * x : std::max(v, x);
  }
  return v;
}

}  // namespace vkad::adstack
