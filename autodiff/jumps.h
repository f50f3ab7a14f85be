// break / continue rewritten into flags and guards, for reverse mode.
//
// Reverse mode replays loop bodies in its reverse sweep, inside loops of its own, where a
// `break` would leave the wrong loop. It differentiates the rewritten kernel instead, in which
// no statement jumps:
//   - `continue` sets a `skip` flag (a bool local declared at the top of the loop body, so
//     false at every iteration's start); every statement after one that may set it (the jump
//     itself, or a branch holding one) runs under `if (!skip)`;
//   - `break` also sets a `broke` flag declared before the loop: a for loop's body runs under
//     `if (!broke)` (the remaining iterations do nothing, so the loop's trip bound, and its
//     stacks' capacity, are unchanged); a while loop's test becomes `test && !broke`, so the
//     loop ends after the iteration that broke and its trip count is the iterations that ran.
// The rewritten kernel computes what the original does (the same stores, in the same order);
// reverse mode's replay and checkpoints then treat the flags like any other locals.
#pragma once

#include "ir/ir.h"
#include "ir/pass.h"
#include "ir/target.h"

namespace vkad::codegen {

// Whether any task of `k` holds a break or continue.
bool has_jumps(const Kernel& k);

// `k` (verified) with every break / continue rewritten as above; new ids come from k.next_id.
// Adds one if level per jump that has statements after it in its block chain, so a kernel
// near kMaxNestingDepth may exceed it (verify() then says so).
Kernel lower_jumps(Kernel k);

// "lower-jumps": lower_jumps on a kernel with jumps, verified against `target` (a kernel that
// the added levels push past kMaxNestingDepth gets verify()'s error); one without them as it
// came.
Pass lower_jumps_pass(const Target& target);

}  // namespace vkad::codegen
