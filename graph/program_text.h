// A launch sequence in text, for tests of the graph passes (tests/programs/*.vkprog) and for
// reading a plan: kernels in the IR's text form (ir/text.h), arrays, and the steps.
//
//   kernel add(x: ndarray<f32, 1>, y: ndarray<f32, 1>) {     IR text; it ends at a line "}"
//     ...
//   }
//   array x: f32[64]                                       an ndarray and its extents
//   array p: f32[10, 20, 13]
//   launch add(x, y)                                       a launch: arrays by name, scalars as
//   launch step(3, 0.5, p)                                 numbers typed by the parameter
//   fill y 0                                               a fill (Session::zero / fill)
//
// `//` starts a comment (a whole line, or after a step). Kernels get handle ids 1, 2, ... and
// arrays 1, 2, ... in the order they are declared. Errors name the line and what is wrong.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "graph/graph_rework.h"
#include "ir/ir.h"

namespace vkad {

struct ProgramText {
  std::vector<codegen::Kernel> kernels;  // kernel i has handle id i + 1
  struct Array {
    std::string name;
    runtime::DType dtype = runtime::DType::kF32;
    std::vector<uint32_t> extents;
  };
  std::vector<Array> arrays;  // array i has id i + 1
  std::vector<CapturedStep> steps;
};

Result<ProgramText> parse_program(const std::string& text);

}  // namespace vkad
