// The derivative rule table: per differentiable op, one row holding, for each operand, its
// partial (how the reverse sweep turns the result's adjoint g into that operand's share) and
// the primal values that partial reads. Reverse mode drives both its "needed values" analysis
// (which primals must be right in the replay, hence which locals get checkpoints) and its
// reverse sweep from this one row, so the two cannot disagree; a unit test checks that every
// partial reads exactly the primals its row declares.
//
// Ops without a row (loads, stores, locals, control flow, comparisons, integer-only ops) are
// handled structurally by reverse mode; floor and ceil have a row with no partials (their
// derivative is zero almost everywhere).
#pragma once

#include <cstdint>
#include <vector>

#include "ir/ir.h"

namespace vkad::codegen {

// What a partial may emit: statements appended to the adjoint being built.
class PartialBuilder {
 public:
  virtual ~PartialBuilder() = default;
  virtual ValueId op(Op op, DType t, std::vector<ValueId> args) = 0;
  virtual ValueId constant(DType t, double v) = 0;
};

// Primal values a partial reads, as a bit set.
enum PrimalRead : uint8_t {
  kReadArg0 = 1,
  kReadArg1 = 2,
  kReadArg2 = 4,
  kReadResult = 8,
};

// The inputs of one partial: the result's type, its adjoint, the operands' (replayed) values
// and types, and the result's value. A partial may use only the primals its row declares.
struct PartialArgs {
  DType type;
  ValueId g;
  ValueId arg[3];
  DType arg_type[3];
  ValueId result;
};

struct PartialRule {
  uint8_t reads = 0;
  // Emits d(result)/d(operand) * g; null: the operand gets no share (constant or zero).
  ValueId (*emit)(PartialBuilder& b, const PartialArgs& a) = nullptr;
};

struct DerivativeRule {
  PartialRule partial[3];
};

// The row of `op` (its `rule` column in ir/ops.def), or null when reverse mode handles it
// structurally (kNoRule there).
const DerivativeRule* derivative_rule(Op op);

}  // namespace vkad::codegen
