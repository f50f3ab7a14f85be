// How many loop passes one iteration of a task's range makes, as a symbolic upper bound the
// runtime evaluates per launch: for devices that cap the loop passes of one shader invocation.
//
// Why: Mesa's lavapipe (llvmpipe) gives every shader invocation one counter of 65,535 loop
// passes, decremented at the end of every pass of every loop (the task's grid-stride loop,
// serial `for` loops, compare-and-swap loops of float atomics), and leaves the loop when it
// reaches zero, without an error: a long kernel silently computes something else. The runtime
// refuses such a launch instead (runtime.h, docs/reference.md "Loop limit on lavapipe").
//
// The model, measured on lavapipe (Mesa 22.3; tests/gpu/loop_limit_test.cpp): every pass of
// every loop decrements the counter once, including the pass in which no lane of the SIMD
// batch is active any more and the loop ends; in that pass the loops of the body run once
// each, with no lane active. Both sides of a branch may run (lanes diverge). Hence, with
// idle(b) = the number of loops in b, nested ones included:
//   passes(block) = sum over its statements of
//     for with a known trip bound T:  T * (1 + passes(body)) + 1 + idle(body)
//     for whose bounds depend on data: 1 + idle(body)   (a lower bound: not checked)
//     while:                           1 + idle(body)   (data-dependent: not checked)
//     if:                              passes(then) + passes(else)
//     float atomic_add lowered to a compare-and-swap loop: 1 (retries under contention are
//                                      not counted)
// and a launch makes G * (1 + passes(body)) + 1 + idle(body) per invocation, G being its
// grid-stride iterations (runtime.cpp). The driver cuts at its 65,535th pass, so a launch
// within the limit is never cut; one just past it may still have finished (the last passes
// do no work).
// A trip bound is known when the begin has a constant lower bound and the end a symbolic upper
// bound: constants, integer scalar parameters, ndarray extents, the task index and enclosing
// loop indices, and +, -, *, min, max, mod / div by positive constants, integer casts of them.
// Bounds read from ndarrays or mutable locals are data: such loops are counted once.
#pragma once

#include <string>
#include <vector>

#include "ir/ir.h"

namespace vkad::codegen {

struct LoopPassBound {
  // Upper bound of the loop passes one iteration of the task's range makes in its body (the
  // grid-stride loop itself is not included; the runtime adds it per launch).
  SizeExpr per_iteration = SizeExpr::constant(0);
  // idle(body): the passes of the body in the grid-stride loop's last pass, with no lane active.
  uint64_t idle = 0;
  // Loops whose trip count depends on data (counted as one pass each, so the bound is not an
  // upper bound for them), as "%<index id>" in statement order.
  std::vector<std::string> unchecked_loops;
};

// `cas_float_atomics_f32 / _f64`: whether float atomic adds of that width become
// compare-and-swap loops in the emitted module (EmitOptions / Target decide).
LoopPassBound loop_pass_bound(const Kernel& k, const Task& task, bool cas_float_atomics_f32,
                              bool cas_float_atomics_f64);

}  // namespace vkad::codegen
