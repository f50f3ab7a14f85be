// A symbolic, non-negative size evaluated per launch on the host: constants, scalar kernel
// parameters, the negative part of a signed scalar (neg(n) = max(-n, 0): how far a loop that
// begins at n runs below 0), ndarray extents, and sums / products / maxima of those, and
// quotients by a positive constant (rounded down). Adstack capacities are
// SizeExprs derived by reverse mode from the loops around each push.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"
#include "base/tree_children.h"

namespace vkad::adstack {

struct SizeExpr {
  // kNegScalar comes last: the serialized form (abi/compiled_kernel_io.h) stores the kind.
  enum class Kind : uint8_t { kConst, kScalar, kDim, kAdd, kMul, kMax, kDiv, kNegScalar };
  Kind kind = Kind::kConst;
  int64_t value = 0;   // kConst; kDiv: the divisor (>= 1)
  uint32_t param = 0;  // kScalar / kNegScalar / kDim: kernel parameter index
  uint32_t dim = 0;    // kDim
  // kAdd / kMul / kMax; kDiv: the dividend (one). Copied and freed without recursion
  // (base/tree_children.h): expressions built in memory may nest arbitrarily deep.
  TreeChildren<SizeExpr> operands;

  static SizeExpr constant(int64_t v) { return {Kind::kConst, v, 0, 0, {}}; }
  static SizeExpr scalar(uint32_t p) { return {Kind::kScalar, 0, p, 0, {}}; }
  static SizeExpr array_dim(uint32_t p, uint32_t d) { return {Kind::kDim, 0, p, d, {}}; }
  // max(-scalar, 0): with it a trip bound end - begin stays an upper bound when the begin is a
  // signed scalar that may be negative (a kScalar leaf counts a negative value as 0).
  static SizeExpr neg_scalar(uint32_t p) { return {Kind::kNegScalar, 0, p, 0, {}}; }
  // add / mul / max of two sizes, folding constants and identities (x+0, x*1, max(x, 0)).
  // Constants whose sum or product would overflow 64 bits stay unfolded, so evaluate()
  // reports the overflow at launch instead of folding to a wrapped value.
  static SizeExpr combine(Kind k, SizeExpr a, SizeExpr b);
  // floor(a / divisor), divisor >= 1 (segmented checkpointing's segment counts, checkpoint.h);
  // folds a constant and a divisor of 1.
  static SizeExpr div(SizeExpr a, int64_t divisor);
  bool operator==(const SizeExpr&) const = default;
};
// TreeChildren's hook: the operand list of `e`.
inline void detach_children(SizeExpr& e, std::vector<TreeChildren<SizeExpr>>& out) {
  if (e.operands.empty()) return;
  out.push_back(std::move(e.operands));
  e.operands.clear();
}

// Where a SizeExpr's leaves come from at a launch.
struct SizeInputs {
  std::function<int64_t(uint32_t param)> scalar;
  std::function<int64_t(uint32_t param, uint32_t dim)> dim;
};

// The value of `e`; negative leaves count as 0, neg(n) is max(-n, 0) (a loop with end < begin runs
// no iterations). kInvalidArgument "size overflows 64 bits" when a sum or product does (callers add
// which stack and kernel); never a wrapped value.
Result<int64_t> evaluate(const SizeExpr& e, const SizeInputs& in);

}  // namespace vkad::adstack
