// Outlining deep loop nests of an emitted module into functions of their own, so that SPIR-V
// validation stays fast on deeply nested kernels (issue 27).
//
// Why: SPIRV-Tools' structured control flow checks (validate_cfg.cpp, Construct::blocks) walk,
// for every construct, each of its blocks up the structural dominator tree to the construct's
// header: the cost grows with blocks x enclosing constructs x dominator depth, all of which grow
// with nesting. The adjoint of a depth-d nest holds about d^2 / 2 loops (each reversed level
// recomputes the levels inside it, docs/architecture.md), nested up to d deep, and validating it
// took seconds at d = 64. In functions of at most `every` loop levels each, a block sits in few
// constructs and near its function's entry: the same module validates in a fraction of the time.
// Drivers inline the calls (NVIDIA, Mesa), so the code they compile is the same.
#pragma once

#include <cstdint>
#include <vector>

namespace vkad::codegen {

// The loop depth at which compile() outlines (loops nested 8, 16, ... deep in the task's
// function, the grid-stride loop counting as depth 0). Kernels nested less deeply are untouched.
inline constexpr uint32_t kOutlineLoopDepth = 8;

// `words`: a valid module with one function (as spirv_emitter.h emits them: the task's entry
// point, function variables in its entry block, every loop's blocks contiguous from its header
// to just before its merge block). Returns the module with every loop at depth k x `every`
// (k >= 1) moved into a new function `void f(free values..., pointers to function variables...)`
// that the entry point calls in its place, deepest first, so no function nests more than
// `every` loop levels. A loop whose values are used after it, that branches anywhere but its own
// blocks and merge block, or that uses a pointer other than a variable defined outside it stays
// where it is. The result is semantically the same module; callers validate it as any other.
// Unparseable input, or a module with more than one function, is returned unchanged.
std::vector<uint32_t> outline_deep_loops(const std::vector<uint32_t>& words, uint32_t every);

}  // namespace vkad::codegen
