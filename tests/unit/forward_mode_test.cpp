// Forward mode (JVP) on the CPU reference: for a random direction v over every differentiable
// input and random output weights w, the JVP's w . (J v) must equal the reverse mode's
// (J^T w) . v (the dot-product test: two independent derivations of one Jacobian) and the
// central difference of the loss along v.
#include "autodiff/forward_mode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "support/ad_check.h"
#include "support/ad_regressions.h"
#include "support/nd_kernels.h"
#include "support/scalar_grad_kernels.h"

namespace vkad::testing {
namespace {

using namespace codegen;  // NOLINT

struct Products {
  double jvp = 0, vjp = 0, fd = 0;
};

Result<Products> products(const Kernel& k, const HostValues& base, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  // The direction: one value per element (or scalar) of every differentiable input.
  std::vector<HostArray> dir(k.params.size());
  std::vector<double> sdir(k.params.size(), 0);
  for (uint32_t p = 0; p < k.params.size(); ++p) {
    if (!k.params[p].needs_grad || writes_param(k, p)) continue;
    if (k.params[p].kind == ParamKind::kScalar) {
      sdir[p] = u(rng);
    } else {
      dir[p] = HostArray(k.params[p].dtype, base.arrays[p].shape);
      for (double& x : dir[p].data) x = u(rng);
    }
  }
  std::vector<HostArray> w = random_seeds(k, base, seed + 1);
  Products r;
  // JVP: outputs' tangents, weighted by w.
  VKAD_ASSIGN_OR_RETURN(Kernel jvp, make_jvp(k));
  HostValues j = base;
  for (uint32_t p = 0; p < k.params.size(); ++p) {
    if (!k.params[p].needs_grad) continue;
    if (k.params[p].kind == ParamKind::kScalar) {
      j.arrays.emplace_back(), j.scalars.push_back(sdir[p]);
    } else {
      j.arrays.push_back(writes_param(k, p) ? HostArray(k.params[p].dtype, base.arrays[p].shape)
                                            : dir[p]);
      j.scalars.push_back(0);
    }
  }
  {
    auto v = j.view();
    VKAD_TRY(evaluate(jvp, v).status());
  }
  size_t d = k.params.size();
  for (uint32_t p = 0; p < k.params.size(); ++p) {
    if (!k.params[p].needs_grad) continue;
    const HostArray& t = j.arrays[d++];
    if (!writes_param(k, p)) continue;
    for (size_t e = 0; e < t.size(); ++e) r.jvp += w[p].data[e] * t.data[e];
  }
  // VJP: inputs' gradients against the direction.
  VKAD_ASSIGN_OR_RETURN(Kernel adj, make_adjoint(k));
  HostValues a = adjoint_args(k, base, w);
  {
    auto v = a.view();
    VKAD_TRY(evaluate(adj, v).status());
  }
  d = k.params.size();
  for (uint32_t p = 0; p < k.params.size(); ++p) {
    if (!k.params[p].needs_grad) continue;
    const HostArray& g = a.arrays[d++];
    if (writes_param(k, p)) continue;
    if (k.params[p].kind == ParamKind::kScalar)
      r.vjp += g.data[0] * sdir[p];
    else
      for (size_t e = 0; e < g.size(); ++e) r.vjp += g.data[e] * dir[p].data[e];
  }
  // Central difference of the loss along the direction.
  const double h = 1e-5;
  auto moved = [&](double s) {
    HostValues m = base;
    for (uint32_t p = 0; p < k.params.size(); ++p) {
      if (!k.params[p].needs_grad || writes_param(k, p)) continue;
      if (k.params[p].kind == ParamKind::kScalar)
        m.scalars[p] += s * sdir[p];
      else
        for (size_t e = 0; e < dir[p].size(); ++e) m.arrays[p].data[e] += s * dir[p].data[e];
    }
    return m;
  };
  VKAD_ASSIGN_OR_RETURN(double lp, cpu_loss(k, moved(h), w));
  VKAD_ASSIGN_OR_RETURN(double lm, cpu_loss(k, moved(-h), w));
  r.fd = (lp - lm) / (2 * h);
  return r;
}

HostArray filled(std::vector<uint32_t> shape, double a, double b) {
  HostArray h(DType::kF64, std::move(shape));
  for (size_t e = 0; e < h.size(); ++e) h.data[e] = std::sin(a * static_cast<double>(e) + b);
  return h;
}

void expect_consistent(const Kernel& k, const HostValues& base) {
  ASSERT_TRUE(verify(k).ok()) << verify(k).to_string();
  for (uint32_t seed : {1u, 2u}) {
    auto r = products(k, base, seed);
    ASSERT_TRUE(r.ok()) << r.status().to_string() << "\n" << print(*make_jvp(k));
    double scale = std::max(1.0, std::fabs(r->vjp));
    EXPECT_NEAR(r->jvp, r->vjp, 1e-10 * scale) << k.name;
    EXPECT_NEAR(r->jvp, r->fd, 1e-5 * scale) << k.name;
    EXPECT_NE(r->jvp, 0.0) << k.name;
  }
}

TEST(ForwardMode, SaxpyWithAScalarDirection) {
  HostValues v;
  v.scalars = {0.75, 0, 0, 0};
  v.arrays = {HostArray{}, filled({37}, 0.9, 0.1), filled({37}, 1.3, 0.4),
              HostArray(DType::kF64, {37})};
  expect_consistent(saxpy_grad_kernel(), v);
}

TEST(ForwardMode, LoopWithLocalsInAnNdTask) {
  HostValues v;
  v.scalars = {5, 0.6, 0.8, 0, 0};
  v.arrays = {HostArray{}, HostArray{}, HostArray{}, filled({3, 4}, 0.7, 0.2),
              HostArray(DType::kF64, {3, 4})};
  expect_consistent(loop_grad_kernel(), v);
}

TEST(ForwardMode, Stencil) {
  HostValues v;
  v.scalars = {0, 0, 0};
  v.arrays = {filled({5, 6}, 0.7, 0), filled({5, 6}, 1.3, 0.5), HostArray(DType::kF64, {5, 6})};
  expect_consistent(stencil_kernel(), v);
}

TEST(ForwardMode, ReverseModeRegressionKernels) {
  {
    HostValues v;
    v.arrays = {filled({4}, 0.8, 0.3), HostArray(DType::kF64, {4})};
    v.scalars = {0, 0};
    expect_consistent(*parse(kSwappedFloatLocals), v);
  }
  {
    HostValues v;
    v.arrays = {filled({6}, 0.6, 0.3), filled({7}, 1.1, 0.2), HostArray(DType::kF64, {6})};
    v.scalars = {0, 0, 0};
    expect_consistent(*parse(kSwappedIntegerIndexLocals), v);
  }
  {
    HostValues v;
    v.arrays = {HostArray{}, HostArray{}, filled({4}, 0.9, 0.1), filled({4}, 0.5, 0.7),
                HostArray(DType::kF64, {4})};
    v.scalars = {6, 0.1, 0, 0, 0};
    expect_consistent(*parse(kLinearlyCarriedPosition), v);
  }
}

// Every differentiable op of the rule table, in one kernel (the JVP reuses reverse mode's
// rows, so a row wrong for one direction would show here).
TEST(ForwardMode, EveryRule) {
  auto k = parse(
      R"(kernel ops(x: ndarray<f64, 1> grad readonly, z: ndarray<f64, 1> grad readonly, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %x = load x[%i] : f64
    %z = load z[%i] : f64
    %a = add %x, %z : f64
    %b = sub %a, %z : f64
    %c = mul %b, %z : f64
    %d = div %c, %a : f64
    %e = neg %d : f64
    %f = abs %e : f64
    %g = sqrt %f : f64
    %h = rsqrt %g : f64
    %j = exp %h : f64
    %k = log %j : f64
    %l = sin %k : f64
    %m = cos %l : f64
    %n = tan %m : f64
    %o = tanh %n : f64
    %p = asin %o : f64
    %q = acos %p : f64
    %r = pow %z, %x : f64
    %s = atan2 %q, %r : f64
    %t = min %s, %x : f64
    %u = max %t, %z : f64
    %lt = lt %x, %z : bool
    %v = select %lt, %u, %s : f64
    %w = cast %v : f32
    %w2 = cast %w : f64
    %fl = floor %w2 : f64
    %sum = add %v, %fl : f64
    store y[%i], %sum
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  HostValues v;
  v.arrays = {filled({9}, 0.3, 1.0), filled({9}, 0.2, 0.9), HostArray(DType::kF64, {9})};
  for (double& x : v.arrays[0].data) x = 0.6 + 0.3 * x;  // keep pow's base and logs positive
  for (double& x : v.arrays[1].data) x = 0.7 + 0.2 * x;
  v.scalars = {0, 0, 0};
  ASSERT_TRUE(verify(*k).ok());
  auto r = products(*k, v, 3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NEAR(r->jvp, r->vjp, 1e-10 * std::max(1.0, std::fabs(r->vjp)));
}

}  // namespace
}  // namespace vkad::testing
