// If-conversion: a kernel whose `if` statements only compute -- arithmetic, compares, selects,
// casts, constants and local variables on either side -- rewritten without them. Both sides run
// unconditionally and each store_local on a side stores a select between the side's value and
// the local's current one, on the branch's condition (and on the enclosing branches' conditions,
// for a nested `if`). The locals then hold what the branches would have left in them, so every
// load and store the kernel makes of arrays, and every value it stores, is the same.
//
// Why: gather recompute (graph/gather_recompute.h) copies a producer's body into the launch that
// gathers its output, and takes straight-line producers only. DiffTaichi writes grid_op's walls
// as runtime ifs on a local velocity (`if i < bound and v[0] < 0: v[0] = 0`, diffmpm_simple.py),
// which kept the grid update out of the recompute and each step at three dependent dispatches.
// The converted kernel serves only as the producer copied into others: the producer's own
// launches keep the kernel as written.
//
// Not converted (nullopt): a side that touches an array (a load out of the range the branch
// guards would be made unconditionally), loops, breaks, prints, asserts, barriers or adstacks; a
// kernel without an `if` in its tasks' top-level blocks. Every value op is defined on every
// input (ir.h: an integer x / 0 is 0), so a side's arithmetic runs wherever the branch would
// not have.
#pragma once

#include <optional>

#include "ir/ir.h"

namespace vkad::codegen {

std::optional<Kernel> if_converted(const Kernel& k);

}  // namespace vkad::codegen
