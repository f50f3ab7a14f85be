// The CPU reference: runs a verified kernel's IR on the host. Tests use it as the oracle for
// what the device computes, so it follows the device's semantics where they are defined:
//   - every value is rounded to its type after each operation (f32 arithmetic is f32);
//     values are held as doubles, so i64 is exact only while |v| <= 2^53;
//   - every operation is defined for every input, as ir.h's "Operation semantics" table
//     (and docs/reference.md) say, and the emitter produces exactly the same values: i32/u32
//     arithmetic wraps; div truncates; mod and floordiv round toward -inf; x / 0 = 0,
//     x mod 0 = x, floordiv(x, 0) = 0, INT_MIN / -1 = INT_MIN; float -> int saturates, NaN -> 0;
//     float min/max are `a < b ? a : b` / `a > b ? a : b`;
//   - the evaluator itself has no C++ undefined behaviour for any input (clean under UBSan);
//   - transcendentals are libm's: in f32 for f32 values, in f64 for f64 values (the emitter
//     computes f64 ones in f64 too, spirv/f64_math.h);
//   - an out-of-bounds ndarray access reads 0 and writes nothing, and raises error code 1;
//     an adstack push past capacity is dropped and raises error code 2 (as on the device);
//   - parallel iterations run in index order; atomic adds are plain adds;
//   - a while loop still running after 2^24 trips is taken as never ending: evaluate() returns
//     kInvalidArgument naming it (the device would hang, or lavapipe cut it short);
//   - a kernel nested deeper than kMaxNestingDepth (which verify() refuses) is kInvalidArgument
//     before anything runs: the evaluator recurses once per level;
//   - every value carries a bound on |device - reference| (precision.h), propagated through
//     the kernel and stored in HostArray::error for the arrays it writes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"

namespace vkad::codegen {

// Host storage for an ndarray: row-major, one double per element holding the element's exact
// value (f32 values are f32-representable; integers are exact).
//
// `error`: per element, how far a device's value may lie from `data` under Vulkan's precision
// requirements (precision.h), given that the kernel's inputs were exact. evaluate() fills it
// (sized like `data`) for every array it writes; empty means every element is exact. It is
// what tests compare a device's output against.
struct HostArray {
  DType dtype = DType::kF32;
  std::vector<uint32_t> shape;
  std::vector<double> data;
  std::vector<double> error;

  HostArray() = default;
  HostArray(DType t, std::vector<uint32_t> s);
  size_t size() const { return data.size(); }
};

// One argument per kernel parameter: `scalar` for scalar parameters (integers as exact
// doubles), `array` (borrowed, written in place) for ndarray parameters.
struct HostArg {
  double scalar = 0;
  HostArray* array = nullptr;
  static HostArg of(double v) { return {v, nullptr}; }
  static HostArg of(HostArray& a) { return {0, &a}; }
};

struct EvalResult {
  // Per task, the error code the device would have flagged (0: none), like the args buffer's
  // error words.
  std::vector<uint32_t> error_flags;
  // The lines the kernel's print statements (and failed asserts) wrote, as the device's print
  // area gives them (abi/print_records.h), in the reference's order of invocations.
  std::vector<std::string> prints;
};

// kInvalidArgument when the arguments do not match the parameters (count, kind, dtype, rank).
// The kernel must be verified.
Result<EvalResult> evaluate(const Kernel& k, std::span<const HostArg> args);

// `v` rounded to what a value of type `t` can hold (f32 rounding, integer wrap, bool 0/1).
double round_to(DType t, double v);

}  // namespace vkad::codegen
