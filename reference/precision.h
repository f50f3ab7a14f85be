// How far a device's float result may lie from the CPU reference's, per IR operation, from
// the Vulkan specification's accuracy requirements ("Precision and Operation of SPIR-V
// Instructions", Vulkan 1.3 appendix; the rows in precision.cpp cite it), and how an error
// already in the operands carries through an operation.
//
// The CPU reference (cpu_eval.h) uses these to attach a bound to every value it computes:
//   bound(result) = carried(op, operands +- their bounds) + local(op, operands)
// so a test compares a device's output element against `reference +- bound` whatever the
// kernel does (a loop that amplifies errors gets a wide bound, a contracting one a tight one),
// instead of an ad-hoc tolerance per test. Bounds are first-order for sin/cos/atan2 and exact
// interval images for the monotone functions; a comparison, branch or float -> int cast on
// an inexact float is taken as exact (a kernel whose control flow flips inside the bound is
// ill-conditioned, and its test must keep away from the flip).
//
// An infinite bound means Vulkan does not constrain the result there (sqrt of a negative,
// log of 0, sin of a huge argument, exp overflow, ...).
#pragma once

#include "ir/ir.h"

namespace vkad::codegen {

// One unit in the last place of `v` as a value of float type `t` (f32: 2^(e-23), f64:
// 2^(e-52)); the smallest subnormal for 0; +inf for inf/NaN.
double ulp(DType t, double v);

// The largest |device - reference| Vulkan allows for `op` of float type `t` (the result type;
// for kCast the source type) when both see the operands `a` (and `b`) exactly, and the
// reference produced `r`. Includes the reference's own error (libm's <= 1 ulp for the
// transcendentals), fused multiply-adds (SPIR-V lets drivers contract OpFMul + OpFAdd) and
// subnormal flushing. 0 for exact operations (neg, abs, floor, min, ...).
double local_error(Op op, DType t, double a, double b, double r);

// The largest change of the result of `op` when its operands move by up to `ea` and `eb`
// (>= 0) from `a`, `b` (the reference's result `r`), before the result is rounded; +inf when
// that can be anything (a pole, leaving the domain).
double carried_error(Op op, DType t, double a, double ea, double b, double eb, double r);

}  // namespace vkad::codegen
