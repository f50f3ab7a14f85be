// The f64 transcendentals of spirv/f64_math.h, run on the host through the same sequence of
// operations the emitter emits, against glibc's double functions: the largest error in ulps
// over a dense sample of each domain. tests/gpu/f64_math_device_test.cpp measures the same
// on the device.
#include "spirv/f64_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>

namespace vkad::codegen {
namespace {

// |got - want| in units of want's ulp (the spacing of doubles at |want|).
double ulps(double got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : std::numeric_limits<double>::infinity();
  if (std::isinf(want)) return got == want ? 0 : std::numeric_limits<double>::infinity();
  double spacing = want == 0 ? std::numeric_limits<double>::denorm_min()
                             : std::max(std::ldexp(1.0, std::ilogb(want) - 52),
                                        std::numeric_limits<double>::denorm_min());
  return std::fabs(got - want) / spacing;
}

struct Sample {
  double lo, hi;
  int n;
};

// Max ulp error of f against ref over n evenly spaced points and n random points of [lo, hi].
double max_ulps(const std::function<double(double)>& f, const std::function<double(double)>& ref,
                Sample s, double* worst_x) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(s.lo, s.hi);
  double worst = 0;
  for (int i = 0; i < 2 * s.n; ++i) {
    double x = i < s.n ? s.lo + (s.hi - s.lo) * i / (s.n - 1) : u(rng);
    double e = ulps(f(x), ref(x));
    if (e > worst) worst = e, *worst_x = x;
  }
  return worst;
}

TEST(F64Math, UnaryFunctionsWithinFourUlpOfLibm) {
  HostF64 b;
  F64Math<HostF64> m(b);
  struct Case {
    const char* name;
    std::function<double(double)> f, ref;
    std::vector<Sample> domains;
  };
  const std::vector<Case> cases = {
      {"exp",
       [&](double x) { return m.exp(x); },
       [](double x) { return std::exp(x); },
       {{-745, 709.7, 200000}, {-1, 1, 200000}}},
      {"log",
       [&](double x) { return m.log(x); },
       [](double x) { return std::log(x); },
       {{1e-300, 1e300, 200000}, {0.5, 2, 200000}, {1e-5, 10, 200000}}},
      {"sin",
       [&](double x) { return m.sin(x); },
       [](double x) { return std::sin(x); },
       {{-10, 10, 200000}, {-1e6, 1e6, 200000}}},
      {"cos",
       [&](double x) { return m.cos(x); },
       [](double x) { return std::cos(x); },
       {{-10, 10, 200000}, {-1e6, 1e6, 200000}}},
      {"tan",
       [&](double x) { return m.tan(x); },
       [](double x) { return std::tan(x); },
       {{-10, 10, 200000}, {-1e6, 1e6, 200000}}},
      {"tanh",
       [&](double x) { return m.tanh(x); },
       [](double x) { return std::tanh(x); },
       {{-30, 30, 200000}, {-1, 1, 200000}, {-1e-3, 1e-3, 100000}}},
      {"asin",
       [&](double x) { return m.asin(x); },
       [](double x) { return std::asin(x); },
       {{-1, 1, 200000}}},
      {"acos",
       [&](double x) { return m.acos(x); },
       [](double x) { return std::acos(x); },
       {{-1, 1, 200000}}},
      {"atan2(x, 1)",
       [&](double x) { return m.atan2(x, 1); },
       [](double x) { return std::atan2(x, 1.0); },
       {{-100, 100, 200000}}},
      {"atan2(1, x)",
       [&](double x) { return m.atan2(1, x); },
       [](double x) { return std::atan2(1.0, x); },
       {{-100, 100, 200000}}},
      {"atan2(-0.3, x)",
       [&](double x) { return m.atan2(-0.3, x); },
       [](double x) { return std::atan2(-0.3, x); },
       {{-5, 5, 200000}}},
  };
  for (const Case& c : cases) {
    for (const Sample& s : c.domains) {
      double wx = 0, e = max_ulps(c.f, c.ref, s, &wx);
      std::printf("%-15s [%g, %g]: max %.2f ulp (at %.17g)\n", c.name, s.lo, s.hi, e, wx);
      EXPECT_LE(e, 4.0) << c.name << " on [" << s.lo << ", " << s.hi << "] at x = " << wx;
    }
  }
}

TEST(F64Math, PowWithinFourUlpOfLibm) {
  HostF64 b;
  F64Math<HostF64> m(b);
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> ux(1e-3, 10), uy(-20, 20);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    double x = ux(rng), y = uy(rng);
    double e = ulps(m.pow(x, y), std::pow(x, y));
    double allowed = 4;  // precision.cpp's row
    worst = std::max(worst, e);
    ASSERT_LE(e, allowed) << "pow(" << x << ", " << y << ")";
  }
  std::printf("pow x in [1e-3, 10], y in [-20, 20]: max %.2f ulp\n", worst);
  // The whole exponent range: x log-uniform over [1e-300, 1e300], y chosen so that y log x is
  // uniform in [-700, 700] (where log x in plain double would lose up to 700 ulp); normal
  // results only.
  std::uniform_real_distribution<double> ue(-690, 690), ut(-700, 700);
  worst = 0;
  for (int i = 0; i < 200000; ++i) {
    double x = std::exp(ue(rng)), t = ut(rng);
    if (std::fabs(std::log(x)) < 1e-3) continue;
    double y = t / std::log(x), want = std::pow(x, y);
    if (!(want > 0x1p-1022) || std::isinf(want)) continue;
    double e = ulps(m.pow(x, y), want);
    worst = std::max(worst, e);
    ASSERT_LE(e, 4) << "pow(" << x << ", " << y << ")";
  }
  std::printf("pow |y log x| <= 700: max %.2f ulp\n", worst);
}

TEST(F64Math, EdgeValues) {
  HostF64 b;
  F64Math<HostF64> m(b);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  EXPECT_EQ(m.exp(1000), inf);
  EXPECT_EQ(m.exp(-1000), 0);
  EXPECT_EQ(m.exp(-inf), 0);
  EXPECT_EQ(m.exp(inf), inf);
  EXPECT_TRUE(std::isnan(m.exp(nan)));
  EXPECT_EQ(m.log(0), -inf);
  EXPECT_EQ(m.log(inf), inf);
  EXPECT_TRUE(std::isnan(m.log(-1)));
  EXPECT_TRUE(std::isnan(m.sin(inf)));
  EXPECT_TRUE(std::isnan(m.asin(1.5)));
  EXPECT_EQ(m.tanh(1000), 1);
  EXPECT_EQ(m.tanh(-1000), -1);
  EXPECT_EQ(m.pow(-2, 0), 1);
  EXPECT_TRUE(std::isnan(m.pow(-2, 2)));
  EXPECT_EQ(m.pow(0, 2), 0);
  EXPECT_EQ(m.pow(0, -2), inf);
  EXPECT_EQ(m.atan2(0, 0), 0);
}

}  // namespace
}  // namespace vkad::codegen
