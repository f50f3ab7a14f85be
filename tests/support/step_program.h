// DiffTaichi-style programs for the disjoint-access gradient tests: state arrays with one row per
// time step, a step kernel launched once per step that reads row f and writes row f + 1 of the
// same arrays (its scalar parameter `f` = 0, 1, ..., steps - 1), then a loss kernel that adds
// a scalar loss into `l[0]` from the last row (scalar parameter `last` = steps). Backward runs
// the loss kernel's adjoint, then the step kernel's adjoint for f = steps - 1 down to 0, every
// adjoint on the arrays as the whole forward program left them, with one gradient array per
// `grad` parameter shared by name across kernels (`x_grad` for `x`).
//
// Kernels run through a callback, so the same checks run on the CPU evaluator (unit tier) and
// on a device (GPU tier).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "ir/ir.h"
#include "ir/target.h"
#include "reference/cpu_eval.h"

namespace vkad::testing {

// Arguments by parameter name: arrays (written in place by a run) and scalars.
struct NamedValues {
  std::map<std::string, codegen::HostArray> arrays;
  std::map<std::string, double> scalars;
};

// Runs kernel `k` (verified) on `values`, which must hold every parameter of k by name, and
// writes the arrays back. Fails on any error, device error flags included.
using RunKernel = std::function<Status(const codegen::Kernel& k, NamedValues& values)>;

// The CPU evaluator as a RunKernel.
Status run_on_cpu(const codegen::Kernel& k, NamedValues& values);

struct StepProgram {
  std::string name;
  codegen::Kernel step, loss;                  // forward kernels
  codegen::Kernel step_adjoint, loss_adjoint;  // make_adjoint of each
  uint32_t steps = 0;
  // The state arrays (rank >= 2, row = leading index) and their shape; each gets random rows
  // (row 0 the initial state; the others garbage the forward overwrites).
  std::vector<std::string> state;
  std::vector<uint32_t> shape;
  // State arrays whose intermediate rows hold dL/d(row as the step launch before left it) after
  // backward: every array whose row f + 1 is written by the step kernel's last writing task,
  // after all of that launch's reads of it (not, e.g., a velocity that a later task of the same
  // launch reads back).
  std::vector<std::string> mid_rows_checked;
};

// Parses, verifies and differentiates the two kernels (make_adjoint for `target`).
Result<StepProgram> make_step_program(const std::string& name, const std::string& step_text,
                                      const std::string& loss_text, uint32_t steps,
                                      std::vector<std::string> state, std::vector<uint32_t> shape,
                                      std::vector<std::string> mid_rows_checked,
                                      const codegen::Target& target = codegen::Target::host());

// The program's inputs: random state rows in [-1, 1], the remaining parameters' scalars and
// arrays as given in `extra` (e.g. dt, k, target), `l` = {0}.
NamedValues initial_values(const StepProgram& p, const NamedValues& extra, uint32_t seed);

// The forward program from step `from` on (the state rows before it as given), then the loss.
// Returns l[0].
Result<double> run_forward(const StepProgram& p, NamedValues& values, const RunKernel& run,
                           uint32_t from = 0);

// Forward, then backward with the seed dL/dl = 1; `values` receives the final state and every
// gradient array (`<name>_grad`).
Status run_forward_and_backward(const StepProgram& p, NamedValues& values, const RunKernel& run);

struct ProgramGradCheck {
  std::string failure;  // "" when every checked derivative agrees
  int checked = 0;
};

// Runs forward and backward on `init`, then compares, with central differences of the forward
// program (step h relative to max(1, |value|), |adjoint - fd| <= tol * max(1, |fd|)):
//  - every element of row 0 of each state array, and each differentiable scalar;
//  - every element of row steps / 2 of each array of mid_rows_checked: perturbed after the
//    forward has run the steps before it, then run from there.
ProgramGradCheck check_program_gradients(const StepProgram& p, const NamedValues& init,
                                         const RunKernel& run, double h, double tol);

// The programs both tiers run, by name (f64; `particles` columns; dt = 0.05, k = 1.5 grad,
// a random target row):
//   "euler": one task; x[f + 1] = x[f] + dt v[f], v[f + 1] = v[f] - dt k sin(x[f]) (both arrays
//            read at f and written at f + 1 in one task); 20 steps; loss sum (x - target)^2 +
//            v^2 / 2 on the last row.
//   "semi_implicit": task `kick` writes v[f + 1] from v[f] and x[f]; task `drift` reads v[f + 1]
//            (written by the earlier task: no conflict) and writes x[f + 1]; 20 steps.
//   "planar": 3-d state [steps + 1, particles, 2] over a 2-d task (particle, component), each
//            component's force from the other one (x[f, p, 1 - c]); 10 steps.
std::vector<std::string> step_program_names();
Result<StepProgram> named_step_program(const std::string& name, uint32_t particles,
                                       const codegen::Target& target = codegen::Target::host());
// initial_values with dt, k and target for named_step_program's programs.
NamedValues named_step_program_values(const StepProgram& p, uint32_t seed);

}  // namespace vkad::testing
