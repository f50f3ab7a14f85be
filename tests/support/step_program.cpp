#include "support/step_program.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"

namespace vkad::testing {

using codegen::HostArray;
using codegen::Kernel;

Status run_on_cpu(const Kernel& k, NamedValues& values) {
  std::vector<codegen::HostArg> args;
  for (const codegen::Param& p : k.params) {
    if (p.kind == codegen::ParamKind::kNdArray) {
      auto it = values.arrays.find(p.name);
      if (it == values.arrays.end())
        return make_error(ErrorCode::kInvalidArgument, "no array '" + p.name + "'");
      args.push_back(codegen::HostArg::of(it->second));
    } else {
      auto it = values.scalars.find(p.name);
      if (it == values.scalars.end())
        return make_error(ErrorCode::kInvalidArgument, "no scalar '" + p.name + "'");
      args.push_back(codegen::HostArg::of(it->second));
    }
  }
  VKAD_ASSIGN_OR_RETURN(codegen::EvalResult r, codegen::evaluate(k, args));
  for (size_t t = 0; t < r.error_flags.size(); ++t) {
    if (r.error_flags[t]) {
      return make_error(ErrorCode::kInternal, "kernel '" + k.name + "', task '" + k.tasks[t].name +
                                                  "' raised device error " +
                                                  std::to_string(r.error_flags[t]));
    }
  }
  return {};
}

namespace {

Result<Kernel> parse_verified(const std::string& text) {
  VKAD_ASSIGN_OR_RETURN(Kernel k, codegen::parse(text));
  VKAD_TRY(codegen::verify(k));  // the host target: make_adjoint checks the device's
  return k;
}

Status run_steps(const StepProgram& p, NamedValues& values, const RunKernel& run, uint32_t from,
                 uint32_t to) {
  for (uint32_t f = from; f < to; ++f) {
    values.scalars["f"] = f;
    VKAD_TRY(run(p.step, values));
  }
  return {};
}

Result<double> run_loss(const StepProgram& p, NamedValues& values, const RunKernel& run) {
  values.scalars["last"] = p.steps;
  values.arrays["l"] = HostArray(codegen::DType::kF64, {1});
  VKAD_TRY(run(p.loss, values));
  return values.arrays["l"].data[0];
}

size_t row_size(const StepProgram& p) {
  size_t n = 1;
  for (size_t d = 1; d < p.shape.size(); ++d) n *= p.shape[d];
  return n;
}

}  // namespace

Result<StepProgram> make_step_program(const std::string& name, const std::string& step_text,
                                      const std::string& loss_text, uint32_t steps,
                                      std::vector<std::string> state, std::vector<uint32_t> shape,
                                      std::vector<std::string> mid_rows_checked,
                                      const codegen::Target& target) {
  StepProgram p;
  p.name = name;
  VKAD_ASSIGN_OR_RETURN(p.step, parse_verified(step_text));
  VKAD_ASSIGN_OR_RETURN(p.loss, parse_verified(loss_text));
  VKAD_ASSIGN_OR_RETURN(p.step_adjoint, codegen::make_adjoint(p.step, target));
  VKAD_ASSIGN_OR_RETURN(p.loss_adjoint, codegen::make_adjoint(p.loss, target));
  p.steps = steps;
  p.state = std::move(state);
  p.shape = std::move(shape);
  p.mid_rows_checked = std::move(mid_rows_checked);
  return p;
}

NamedValues initial_values(const StepProgram& p, const NamedValues& extra, uint32_t seed) {
  NamedValues v = extra;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  for (const std::string& s : p.state) {
    HostArray a(codegen::DType::kF64, p.shape);
    for (double& x : a.data) x = u(rng);
    v.arrays[s] = std::move(a);
  }
  v.arrays["l"] = HostArray(codegen::DType::kF64, {1});
  return v;
}

Result<double> run_forward(const StepProgram& p, NamedValues& values, const RunKernel& run,
                           uint32_t from) {
  VKAD_TRY(run_steps(p, values, run, from, p.steps));
  return run_loss(p, values, run);
}

Status run_forward_and_backward(const StepProgram& p, NamedValues& values, const RunKernel& run) {
  VKAD_TRY(run_forward(p, values, run).status());
  // Gradients start at zero, except the loss's seed.
  for (const Kernel* k : {&p.step, &p.loss}) {
    for (const codegen::Param& q : k->params) {
      if (!q.needs_grad) continue;
      std::vector<uint32_t> shape = q.kind == codegen::ParamKind::kScalar
                                        ? std::vector<uint32_t>{1}
                                        : values.arrays.at(q.name).shape;
      values.arrays[q.name + "_grad"] = HostArray(q.dtype, shape);
    }
  }
  values.arrays.at("l_grad").data[0] = 1;
  VKAD_TRY(run(p.loss_adjoint, values));
  for (uint32_t f = p.steps; f-- > 0;) {
    values.scalars["f"] = f;
    VKAD_TRY(run(p.step_adjoint, values));
  }
  return {};
}

ProgramGradCheck check_program_gradients(const StepProgram& p, const NamedValues& init,
                                         const RunKernel& run, double h, double tol) {
  ProgramGradCheck out;
  NamedValues adjoint = init;
  if (Status st = run_forward_and_backward(p, adjoint, run); !st.ok()) {
    out.failure = "forward and backward: " + st.to_string();
    return out;
  }
  // d loss / d (one value), by central differences: `at` picks the value in a copy of `base`,
  // `rest` runs the program from there.
  auto compare = [&](const std::string& what, double adj, const NamedValues& base,
                     const std::function<double&(NamedValues&)>& at, uint32_t from) {
    if (!out.failure.empty()) return;
    NamedValues plus = base, minus = base;
    const double x0 = at(plus);
    const double step = h * std::max(1.0, std::fabs(x0));
    at(plus) = x0 + step;
    at(minus) = x0 - step;
    auto lp = run_forward(p, plus, run, from), lm = run_forward(p, minus, run, from);
    if (!lp.ok() || !lm.ok()) {
      out.failure = what + ": forward failed: " + (lp.ok() ? lm.status() : lp.status()).to_string();
      return;
    }
    double fd = (*lp - *lm) / (2 * step);
    ++out.checked;
    if (!(std::fabs(adj - fd) <= tol * std::max(1.0, std::fabs(fd)))) {
      out.failure = p.name + ": d loss / d " + what + ": adjoint " + std::to_string(adj) +
                    ", finite differences " + std::to_string(fd);
    }
  };
  const size_t n = row_size(p);
  for (const std::string& s : p.state) {
    for (size_t e = 0; e < n; ++e) {
      compare(
          s + "[0, " + std::to_string(e) + "]", adjoint.arrays.at(s + "_grad").data[e], init,
          [&](NamedValues& v) -> double& { return v.arrays.at(s).data[e]; }, 0);
    }
  }
  for (const codegen::Param& q : p.step.params) {
    if (q.kind != codegen::ParamKind::kScalar || !q.needs_grad) continue;
    compare(
        q.name, adjoint.arrays.at(q.name + "_grad").data[0], init,
        [&](NamedValues& v) -> double& { return v.scalars.at(q.name); }, 0);
  }
  // Intermediate rows: the gradient array holds d loss / d (the row as written), seed plus the
  // later steps' accumulations (the adjoint of a store does not clear it).
  const uint32_t mid = p.steps / 2;
  NamedValues at_mid = init;
  if (Status st = run_steps(p, at_mid, run, 0, mid); !st.ok()) {
    out.failure = "forward to the middle row: " + st.to_string();
    return out;
  }
  for (const std::string& s : p.mid_rows_checked) {
    for (size_t e = 0; e < n; ++e) {
      const size_t i = mid * n + e;
      compare(
          s + "[" + std::to_string(mid) + ", " + std::to_string(e) + "]",
          adjoint.arrays.at(s + "_grad").data[i], at_mid,
          [&](NamedValues& v) -> double& { return v.arrays.at(s).data[i]; }, mid);
    }
  }
  return out;
}

namespace {

const char* kEulerStep =
    R"(kernel euler_step(x: ndarray<f64, 2> grad, v: ndarray<f64, 2> grad, f: i32, dt: f64, k: f64 grad) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %xv = load x[%f, %p] : f64
    %vv = load v[%f, %p] : f64
    %dt = arg dt : f64
    %k = arg k : f64
    %dx = mul %dt, %vv : f64
    %nx = add %xv, %dx : f64
    store x[%f1, %p], %nx
    %s = sin %xv : f64
    %ks = mul %k, %s : f64
    %dv = mul %dt, %ks : f64
    %nv = sub %vv, %dv : f64
    store v[%f1, %p], %nv
  }
})";

const char* kSemiImplicitStep =
    R"(kernel semi_implicit_step(x: ndarray<f64, 2> grad, v: ndarray<f64, 2> grad, f: i32, dt: f64, k: f64 grad) {
  task kick parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %xv = load x[%f, %p] : f64
    %vv = load v[%f, %p] : f64
    %dt = arg dt : f64
    %k = arg k : f64
    %s = sin %xv : f64
    %ks = mul %k, %s : f64
    %dv = mul %dt, %ks : f64
    %nv = sub %vv, %dv : f64
    store v[%f1, %p], %nv
  }
  task drift parallel %q in [0, shape(x, 1)) {
    %f_ = arg f : i32
    %one_ = const 1 : i32
    %f1_ = add %f_, %one_ : i32
    %xv_ = load x[%f_, %q] : f64
    %vv_ = load v[%f1_, %q] : f64
    %dt_ = arg dt : f64
    %dx_ = mul %dt_, %vv_ : f64
    %nx_ = add %xv_, %dx_ : f64
    store x[%f1_, %q], %nx_
  }
})";

const char* kLoss =
    R"(kernel loss(x: ndarray<f64, 2> grad, v: ndarray<f64, 2> grad, target: ndarray<f64, 1>, last: i32, l: ndarray<f64, 1> grad) {
  task main parallel %p in [0, shape(x, 1)) {
    %t = arg last : i32
    %xv = load x[%t, %p] : f64
    %tv = load target[%p] : f64
    %d = sub %xv, %tv : f64
    %d2 = mul %d, %d : f64
    %vv = load v[%t, %p] : f64
    %half = const 0.5 : f64
    %v2 = mul %vv, %vv : f64
    %e = mul %v2, %half : f64
    %sum = add %d2, %e : f64
    %zero = const 0 : i32
    atomic_add l[%zero], %sum
  }
})";

const char* kPlanarStep =
    R"(kernel planar_step(x: ndarray<f64, 3> grad, v: ndarray<f64, 3> grad, f: i32, dt: f64, k: f64 grad) {
  task main parallel %p in [0, shape(x, 1)), %c in [0, shape(x, 2)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %o = sub %one, %c : i32
    %xv = load x[%f, %p, %c] : f64
    %xo = load x[%f, %p, %o] : f64
    %vv = load v[%f, %p, %c] : f64
    %dt = arg dt : f64
    %k = arg k : f64
    %dx = mul %dt, %vv : f64
    %nx = add %xv, %dx : f64
    store x[%f1, %p, %c], %nx
    %s = sin %xo : f64
    %xs = mul %xv, %s : f64
    %ks = mul %k, %xs : f64
    %dv = mul %dt, %ks : f64
    %nv = sub %vv, %dv : f64
    store v[%f1, %p, %c], %nv
  }
})";

const char* kPlanarLoss =
    R"(kernel planar_loss(x: ndarray<f64, 3> grad, v: ndarray<f64, 3> grad, target: ndarray<f64, 1>, last: i32, l: ndarray<f64, 1> grad) {
  task main parallel %p in [0, shape(x, 1)), %c in [0, shape(x, 2)) {
    %t = arg last : i32
    %xv = load x[%t, %p, %c] : f64
    %tv = load target[%p] : f64
    %d = sub %xv, %tv : f64
    %d2 = mul %d, %d : f64
    %vv = load v[%t, %p, %c] : f64
    %v2 = mul %vv, %vv : f64
    %sum = add %d2, %v2 : f64
    %zero = const 0 : i32
    atomic_add l[%zero], %sum
  }
})";

}  // namespace

std::vector<std::string> step_program_names() { return {"euler", "semi_implicit", "planar"}; }

Result<StepProgram> named_step_program(const std::string& name, uint32_t particles,
                                       const codegen::Target& target) {
  if (name == "euler") {
    return make_step_program(name, kEulerStep, kLoss, 20, {"x", "v"}, {21, particles}, {"x", "v"},
                             target);
  }
  if (name == "semi_implicit") {
    // v's row f + 1 is read back by `drift` in the launch that writes it: only x's rows are
    // d loss / d (row as the launch left it).
    return make_step_program(name, kSemiImplicitStep, kLoss, 20, {"x", "v"}, {21, particles}, {"x"},
                             target);
  }
  if (name == "planar") {
    return make_step_program(name, kPlanarStep, kPlanarLoss, 10, {"x", "v"}, {11, particles, 2},
                             {"x", "v"}, target);
  }
  return make_error(ErrorCode::kInvalidArgument, "no step program '" + name + "'");
}

NamedValues named_step_program_values(const StepProgram& p, uint32_t seed) {
  NamedValues extra;
  extra.scalars["dt"] = 0.05;
  extra.scalars["k"] = 1.5;
  HostArray target(codegen::DType::kF64, {p.shape[1]});
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<double> u(-1, 1);
  for (double& t : target.data) t = u(rng);
  extra.arrays["target"] = std::move(target);
  return initial_values(p, extra, seed);
}

}  // namespace vkad::testing
