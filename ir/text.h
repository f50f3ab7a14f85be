// The text form of the IR: a printer and a parser that round-trip, so passes are tested
// text in / text out and kernels can live in files.
//
//   kernel saxpy(a: f32, x: ndarray<f32, 1>, y: ndarray<f32, 1> grad) {
//     task main parallel %0 in [0, shape(x, 0)) {
//       %1 = arg a : f32
//       %2 = load x[%0] : f32
//       %3 = mul %1, %2 : f32
//       store y[%0], %3
//     }
//   }
//
// Every value-producing statement prints as `%id = op operands : type`; `for %i in [%b, %e)`,
// `if %c { } else { }` and the stores print without a result. Task bounds and adstack
// capacities are symbolic sizes: an integer, a scalar parameter name, `shape(array, dim)`,
// or add/mul/max of two sizes. `//` starts a comment. Ids are kept as written, so
// print(parse(print(k))) == print(k).
//
// A statement may end with its source location (Stmt::loc), quoted after `@`, before the `{`
// of a for / while / if: `store y[%0], %3 @"sim.py:12:9"`, `for %5 in [%1, %2) @"sim.py:14:5" {`.
// print_stmt prints it too, so every error that quotes a statement says where it was written.
#pragma once

#include <string>

#include "base/status.h"
#include "ir/ir.h"

namespace vkad::codegen {

// Bounded: statements or size expressions nested deeper than kMaxNestingDepth (which verify()
// and the parser refuse) print as "..." (no round trip for such kernels).
std::string print(const Kernel& k);
// One statement on one line (a for / if prints its header only): what error messages quote.
std::string print_stmt(const Kernel& k, const Stmt& s);
std::string print_size(const Kernel& k, const SizeExpr& e);

// kInvalidArgument "line L, column C: <what was expected>, got '<token>'" on a syntax error.
// The result is not verified; run verify() on it.
Result<Kernel> parse(const std::string& text);

}  // namespace vkad::codegen
