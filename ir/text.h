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

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

// The text of a kernel `name(params)` of one parallel task `task` that visits every element of
// ndarray parameter `array` over its first `axes` axes: an N-d task over the first three, serial
// loops over the rest (innermost last); `prologue` opens the task's body, `body(index)` gives
// the statements for the element at `index` ("%i0, %i1, ..."). The session's copy kernels
// (api/session_arrays.cpp) and the rename pass's fill kernels (graph/rename_pass.cpp).
std::string whole_array_kernel_text(const std::string& name, const std::string& params,
                                    const std::string& task, const std::string& array,
                                    uint32_t axes, const std::string& prologue,
                                    const std::function<std::string(const std::string&)>& body);

// The text of a kernel `name(params)` of one parallel task `task` over axes [first, last) of
// ndarray parameter `array` (extents `shape`), every other axis unrolled: its coordinates are
// constants (`%k<c>`), and `body(index, e)` gives the statements for the e-th element of the
// unrolled axes (the last fastest) at `index` ("%k0, %i1, %i2, %k1"); `prologue` opens the body.
// The slice pass's copies and the rename pass's fills of a one-row grid.
std::string unrolled_array_kernel_text(
    const std::string& name, const std::string& params, const std::string& task,
    const std::string& array, const std::vector<uint32_t>& shape, uint32_t first, uint32_t last,
    const std::string& prologue,
    const std::function<std::string(const std::string&, uint64_t)>& body);

// The session's copy kernel for arrays of dtype `t` ("f32") and `rank`: `vkad_copy_<t>_<rank>(src,
// dst)`, dst[i...] = src[i...] over every element (whole_array_kernel_text's task). The slice
// graph pass recognizes its launches by this text (graph/slice_pass.cpp).
std::string copy_kernel_text(const std::string& t, uint32_t rank);

}  // namespace vkad::codegen
