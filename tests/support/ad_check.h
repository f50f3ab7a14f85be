// Gradient checks on the CPU reference evaluator (no device): the adjoint kernel that
// make_adjoint derives, run by codegen::evaluate, against central finite differences of the
// forward kernel, run by the same evaluator. Used by the reverse-mode regression tests and
// the reverse-mode fuzzer (unit tier), and by the GPU tests to get CPU adjoints to compare.
//
// The loss is L = sum over every differentiable output ndarray of (w . output) with seeds w
// drawn from [-1, 1]; the adjoint's gradient of an input element must equal dL/d(element).
//
// Noise: the evaluator computes f64 transcendentals in f32 (as the emitter does), so L carries
// relative noise ~1e-7 and finite differences ~1e-7/h. The reference derivative is the
// Richardson extrapolation of the central quotients at h and h/2. Points where the function
// is not smooth at the scale of h (a branch or an integer cast flips between x - h and x + h,
// a kink such as abs at x) are detected — the two central quotients disagree, or the
// one-sided quotient disagrees with them — and skipped, not failed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"
#include "reference/cpu_eval.h"

namespace vkad::testing {

// Arguments owned by value, one entry per parameter (arrays[p] empty for scalars).
struct HostValues {
  std::vector<codegen::HostArray> arrays;
  std::vector<double> scalars;
  // Borrowed views for codegen::evaluate; valid while *this is unchanged.
  std::vector<codegen::HostArg> view();
};

// Whether the kernel stores or atomically adds into ndarray parameter `p`.
bool writes_param(const codegen::Kernel& k, uint32_t p);

// The adjoint's arguments: `base`, then one gradient array per `grad` parameter (the seed for
// outputs, zeros for inputs), in make_adjoint's parameter order.
HostValues adjoint_args(const codegen::Kernel& forward, const HostValues& base,
                        const std::vector<codegen::HostArray>& seeds);

// Random seeds (uniform in [-1, 1], rounded to the dtype) for every differentiable output.
std::vector<codegen::HostArray> random_seeds(const codegen::Kernel& forward, const HostValues& base,
                                             uint32_t seed);

// sum(w . outputs) after running `forward` on a copy of `args` on the CPU evaluator; fails if
// the evaluator raises a device error flag (out of bounds, adstack overflow).
Result<double> cpu_loss(const codegen::Kernel& forward, HostValues args,
                        const std::vector<codegen::HostArray>& seeds);

struct GradCheckOptions {
  double h = 1e-3;     // step, relative to max(1, |x|)
  double rtol = 1e-2;  // |adjoint - fd| <= rtol * max(1, |fd|) + atol
  double atol = 1e-4;
  // Check at most this many elements per input ndarray (spread evenly; 0: all of them).
  size_t max_elements = 0;
};

struct GradCheckReport {
  std::string failure;  // "" when every checked element agrees
  int checked = 0;      // elements compared
  int skipped = 0;      // elements where the loss is not smooth at the scale of h
};

// Derives the adjoint of `forward` (which must verify), runs it on the CPU evaluator, and
// compares every input gradient with central finite differences. An error from make_adjoint,
// or a device error flag raised by either kernel, is returned as the status.
Result<GradCheckReport> check_gradients_cpu(const codegen::Kernel& forward, const HostValues& base,
                                            uint32_t seed, const GradCheckOptions& options = {});

}  // namespace vkad::testing
