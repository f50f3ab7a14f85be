// Which args-buffer words of a task codegen lets the runtime specialize (abi/kernel_abi.h,
// "Launch specialization"). Pure: a function of the IR and the args layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "abi/kernel_abi.h"
#include "ir/ir.h"

namespace vkad::codegen {

// For a task with adstacks: its adstacks' offset and capacity words, then the words of the
// 32-bit integer scalars and the extents that its `for` loops' bounds are computed from
// (through arithmetic, selects and casts; a bound that depends on loaded data contributes the
// launch constants it also uses). Sorted, without repeats, at most abi::kMaxSpecWords (the
// adstack words first: they decide private-array indices). Empty for a task without adstacks:
// a forward kernel gains little from constant trip counts and would pay a pipeline per value.
//
// With `shapes` (CompileOptions::specialize_shapes: the graph rework's kernels, whose launches
// bind arrays of shapes fixed at capture), also the extent words of every array the task
// accesses, adstacks or not. A pipeline with them fixed indexes by constant strides and
// bounds-checks against constants that the driver folds and shares, so no extent holds a
// register for the whole invocation (DiffTaichi's diffmpm backward kernel on an H100: 128
// registers with spills into shared memory -> 123 without, 30% less code).
// `layout`: the compiled kernel with every task's adstacks filled in.
std::vector<uint32_t> launch_spec_words(const Kernel& k, size_t task,
                                        const abi::CompiledKernel& layout, bool shapes = false);

}  // namespace vkad::codegen
