#include "support/ad_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"

namespace vkad::testing {

using codegen::HostArg;
using codegen::HostArray;
using codegen::Kernel;

std::vector<HostArg> HostValues::view() {
  std::vector<HostArg> v;
  for (size_t p = 0; p < scalars.size(); ++p) {
    v.push_back(arrays[p].shape.empty() && arrays[p].data.empty() ? HostArg::of(scalars[p])
                                                                  : HostArg::of(arrays[p]));
  }
  return v;
}

bool writes_param(const Kernel& k, uint32_t p) {
  std::function<bool(const codegen::Block&)> walk = [&](const codegen::Block& b) {
    for (const codegen::Stmt& s : b.stmts) {
      if ((s.op == codegen::Op::kStore || s.op == codegen::Op::kAtomicAdd ||
           s.op == codegen::Op::kAtomicMax) &&
          s.param == p) {
        return true;
      }
      for (const codegen::Block& c : s.blocks) {
        if (walk(c)) return true;
      }
    }
    return false;
  };
  for (const codegen::Task& t : k.tasks) {
    if (walk(t.body)) return true;
  }
  return false;
}

HostValues adjoint_args(const Kernel& forward, const HostValues& base,
                        const std::vector<HostArray>& seeds) {
  HostValues a = base;
  for (uint32_t p = 0; p < forward.params.size(); ++p) {
    if (!forward.params[p].needs_grad) continue;
    // A differentiable scalar's gradient is a 1-element ndarray.
    std::vector<uint32_t> shape = forward.params[p].kind == codegen::ParamKind::kScalar
                                      ? std::vector<uint32_t>{1}
                                      : base.arrays[p].shape;
    a.arrays.push_back(seeds[p].data.empty() ? HostArray(forward.params[p].dtype, shape)
                                             : seeds[p]);
    a.scalars.push_back(0);
  }
  return a;
}

std::vector<HostArray> random_seeds(const Kernel& forward, const HostValues& base, uint32_t seed) {
  std::vector<HostArray> w(forward.params.size());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  for (uint32_t p = 0; p < forward.params.size(); ++p) {
    if (!forward.params[p].needs_grad || !writes_param(forward, p)) continue;
    w[p] = HostArray(forward.params[p].dtype, base.arrays[p].shape);
    for (double& x : w[p].data) x = codegen::round_to(forward.params[p].dtype, u(rng));
  }
  return w;
}

namespace {

Status check_flags(const Kernel& k, const codegen::EvalResult& r) {
  for (size_t t = 0; t < r.error_flags.size(); ++t) {
    if (r.error_flags[t] != 0) {
      return make_error(ErrorCode::kInternal, "kernel '" + k.name + "', task '" + k.tasks[t].name +
                                                  "' raised device error " +
                                                  std::to_string(r.error_flags[t]) +
                                                  " on the CPU evaluator");
    }
  }
  return {};
}

}  // namespace

Result<double> cpu_loss(const Kernel& forward, HostValues args,
                        const std::vector<HostArray>& seeds) {
  auto v = args.view();
  VKAD_ASSIGN_OR_RETURN(codegen::EvalResult r, codegen::evaluate(forward, v));
  VKAD_TRY(check_flags(forward, r));
  double l = 0;
  for (size_t p = 0; p < seeds.size(); ++p) {
    for (size_t e = 0; e < seeds[p].size(); ++e) l += seeds[p].data[e] * args.arrays[p].data[e];
  }
  return l;
}

Result<GradCheckReport> check_gradients_cpu(const Kernel& forward, const HostValues& base,
                                            uint32_t seed, const GradCheckOptions& o) {
  VKAD_ASSIGN_OR_RETURN(Kernel adjoint, codegen::make_adjoint(forward));
  std::vector<HostArray> seeds = random_seeds(forward, base, seed);
  // The adjoint runs on the arrays as the forward left them (make_adjoint's contract): a kernel
  // that reads what it wrote (a recurrence kept in its array) replays from those values.
  HostValues primal = base;
  {
    auto v = primal.view();
    VKAD_ASSIGN_OR_RETURN(codegen::EvalResult r, codegen::evaluate(forward, v));
    VKAD_TRY(check_flags(forward, r));
  }
  HostValues adj = adjoint_args(forward, primal, seeds);
  {
    auto v = adj.view();
    VKAD_ASSIGN_OR_RETURN(codegen::EvalResult r, codegen::evaluate(adjoint, v));
    VKAD_TRY(check_flags(adjoint, r));
  }
  GradCheckReport report;
  size_t grad_index = forward.params.size();
  for (uint32_t p = 0; p < forward.params.size(); ++p) {
    if (!forward.params[p].needs_grad) continue;
    const HostArray& g = adj.arrays[grad_index++];
    if (writes_param(forward, p)) continue;  // an output: its gradient array held the seed
    const bool scalar = forward.params[p].kind == codegen::ParamKind::kScalar;
    // The perturbed input: element e of the ndarray, or the scalar itself.
    auto at_ref = [&](HostValues& v, size_t e) -> double& {
      return scalar ? v.scalars[p] : v.arrays[p].data[e];
    };
    size_t n = g.size();
    size_t count = o.max_elements == 0 ? n : std::min(n, o.max_elements);
    for (size_t c = 0; c < count; ++c) {
      size_t e = count == n ? c : c * (n - 1) / std::max<size_t>(count - 1, 1);
      HostValues base_copy = base;
      double x0 = at_ref(base_copy, e);
      auto quotient = [&](double h) -> Result<double> {
        HostValues plus = base, minus = base;
        at_ref(plus, e) = codegen::round_to(forward.params[p].dtype, x0 + h);
        at_ref(minus, e) = codegen::round_to(forward.params[p].dtype, x0 - h);
        double span = at_ref(plus, e) - at_ref(minus, e);
        VKAD_ASSIGN_OR_RETURN(double lp, cpu_loss(forward, plus, seeds));
        VKAD_ASSIGN_OR_RETURN(double lm, cpu_loss(forward, minus, seeds));
        return (lp - lm) / span;
      };
      double h = o.h * std::max(1.0, std::fabs(x0));
      VKAD_ASSIGN_OR_RETURN(double fd1, quotient(h));
      VKAD_ASSIGN_OR_RETURN(double fd2, quotient(h / 2));
      // One-sided quotients tell a kink at x0 (abs at 0) that central differences average out.
      HostValues at = base;
      VKAD_ASSIGN_OR_RETURN(double l0, cpu_loss(forward, at, seeds));
      at_ref(at, e) = codegen::round_to(forward.params[p].dtype, x0 + h / 2);
      double right_span = at_ref(at, e) - x0;
      VKAD_ASSIGN_OR_RETURN(double lr, cpu_loss(forward, at, seeds));
      double right = (lr - l0) / right_span;
      // Richardson: the h^2 error terms of the two central quotients cancel.
      double fd = (4 * fd2 - fd1) / 3;
      double tol = o.rtol * std::max(1.0, std::fabs(fd)) + o.atol;
      // The smoothness thresholds are tighter than the comparison's: a kink within h of x0 that
      // could move `fd` by tol moves one of these by more than tol / 2 (worked through for a
      // kink at any distance in [0, h] on either side), so it is skipped, never failed.
      if (!std::isfinite(fd1) || !std::isfinite(fd2) || !std::isfinite(right) ||
          std::fabs(fd1 - fd2) > tol / 4 || std::fabs(right - fd) > tol / 2) {
        ++report.skipped;  // not smooth (or not finite) around x0 at the scale of h
        continue;
      }
      ++report.checked;
      if (!(std::fabs(g.data[e] - fd) <= tol) && report.failure.empty()) {
        report.failure = "d loss / d " + forward.params[p].name +
                         (scalar ? "" : "[" + std::to_string(e) + "]") + ": adjoint " +
                         std::to_string(g.data[e]) + ", finite differences " + std::to_string(fd) +
                         " (central quotients at h = " + std::to_string(h) +
                         " and h/2: " + std::to_string(fd1) + ", " + std::to_string(fd2) + ")";
      }
    }
  }
  return report;
}

}  // namespace vkad::testing
