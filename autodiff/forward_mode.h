// Forward mode (JVP): the tangent kernel of a forward kernel, driven by the same derivative
// rule table as reverse mode (derivative_rules.h). Every partial there is linear in its seed,
// so the tangent of a result is the sum over its operands of partial_k(seed = operand's
// tangent); the rows need no second copy.
//
// Parameters of the JVP kernel: the forward kernel's parameters, unchanged and in order, then
// one tangent parameter per parameter marked `grad`, called `<name>_dot`: for a scalar, a
// scalar of its dtype (the input direction); for an ndarray, an ndarray of its dtype and rank.
// The JVP kernel does everything the forward does (it writes the primal outputs) and, beside
// every store or atomic_add into a `grad` ndarray, stores (atomically adds) the value's tangent
// into `<name>_dot` at the same index; a load from a `grad` ndarray reads its tangent from
// `<name>_dot`. So for an input, `x_dot` holds the direction; for an output, `y_dot` receives
// J * direction (atomic adds add onto what it holds). Values that depend on no `grad` input
// have tangent zero and cost nothing. No adstacks: the tangent is carried beside the primal, so
// loops of any kind (data-dependent bounds included) need no trip bound.
//
// Rejected like reverse mode's input: the forward must verify; the result is verified against
// `target` (kUnsupported when it needs what the target lacks, e.g. an f64 atomic_add).
#pragma once

#include "base/status.h"
#include "ir/ir.h"
#include "ir/target.h"

namespace vkad::codegen {

Result<Kernel> make_jvp(const Kernel& forward, const Target& target = Target::host());

}  // namespace vkad::codegen
