// The verifier: runs before anything compiles or evaluates a kernel. A verified kernel is
// well-typed and well-scoped, so the emitter and the evaluators may rely on it; the emitter never
// produces invalid SPIR-V for a verified kernel (the validation gate checks that too).
//
// Every error is kInvalidArgument (kUnsupported for what the target device lacks) and reads
//   kernel 'K', task 'T', statement `<printed statement>`: <what is wrong>
// so the DSL author sees which statement to fix. Kinds reported: type mismatch, wrong operand
// count or kind, use before definition, use outside the defining scope, undefined or doubly
// defined ids, store / atomic add to a read-only parameter, index rank mismatch, bad parameter
// or bound references, and dtypes or atomics the target device lacks.
#pragma once

#include "base/status.h"
#include "ir/ir.h"
#include "ir/target.h"

namespace vkad::codegen {

Status verify(const Kernel& k, const Target& target = Target::host());

// The part of verify() that runs first and without recursion: kInvalidArgument when for / if
// bodies or size expressions nest deeper than kMaxNestingDepth. Anything that walks an
// unverified kernel recursively (CompileCache's print) calls this first.
Status check_nesting(const Kernel& k);

}  // namespace vkad::codegen
