// f64 transcendentals computed in f64: GLSL.std.450 defines Sin, Exp, Log, Pow, Atan2, ... for
// 16- and 32-bit floats only, so the emitter builds them from operations Vulkan defines for
// f64 (add, sub, mul, div, sqrt, RoundEven, Floor, Ldexp, Frexp) -- argument reduction plus
// a polynomial, straight-line code with selects (no branches).
//
// The algorithms are written once, over a backend `B` that supplies those operations:
//   - HostF64 (below) runs them on the host in double, so unit tests measure their error
//     against libm without a GPU;
//   - the SPIR-V emitter's backend (spirv_emitter.cpp) emits them.
// Both see exactly the same sequence of operations.
//
// Accuracy (HostF64 against glibc, tests/unit/f64_math_test.cpp measures it): exp, log, sin,
// cos, tan, tanh, asin, acos, atan2 within 4 ulp over their domains; sin/cos/tan for
// |x| < 1e6 (the reduction by pi/2 keeps k * pi/2 exact up to |k| = 2^20). pow is
// exp(y * log(x)) with log(x) and the product in double-double: <= 2 ulp measured for
// |y log x| <= 700.
//
// Results at the edges: NaN in -> NaN out; exp overflows to +inf and underflows to 0;
// log(0) = -inf, log(x < 0) = NaN; asin/acos outside [-1, 1] = NaN; pow(x, 0) = 1,
// pow(x < 0, y) = NaN (GLSL's domain), pow(0, y > 0) = 0, pow(0, y < 0) = +inf;
// atan2(0, 0) = 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace vkad::codegen {

template <typename B>
class F64Math {
 public:
  using V = typename B::Value;
  explicit F64Math(B& b) : b_(b) {}

  V exp(V x) {
    // Past these the result is inf / 0 anyway; clamping keeps k an exact small integer.
    V xc = clamp(x, -746.0, 710.0);
    V k = b_.round_even(b_.mul(xc, c(kInvLn2)));
    V r = b_.sub(b_.sub(xc, b_.mul(k, c(kLn2Hi))), b_.mul(k, c(kLn2Lo)));  // |r| <= ln2 / 2
    // exp(r) by Taylor to degree 13: the next term is below 2^-60 relative for |r| <= 0.35.
    V p = c(1.0 / 6227020800.0);  // 1/13!
    for (double d : {479001600.0, 39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0,
                     24.0, 6.0, 2.0, 1.0, 1.0}) {
      p = b_.add(b_.mul(p, r), c(1.0 / d));
    }
    return nan_through(x, b_.ldexp(p, k));
  }

  V log(V x) {
    V e, m = b_.frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
    V small = b_.lt(m, c(0.70710678118654752440));
    m = b_.select(small, b_.add(m, m), m);  // now in [sqrt(1/2), sqrt(2))
    e = b_.select(small, b_.sub(e, c(1)), e);
    V f = b_.sub(m, c(1));  // exact
    V s = b_.div(f, b_.add(f, c(2)));
    V z = b_.mul(s, s);
    // log(1 + f) = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R)), R = sum 2 z^j / (2j + 1).
    V r = c(2.0 / 25);
    for (int j = 11; j >= 1; --j) r = b_.add(b_.mul(r, z), c(2.0 / (2 * j + 1)));
    r = b_.mul(r, z);
    V hfsq = b_.mul(c(0.5), b_.mul(f, f));
    V lo = b_.add(b_.mul(s, b_.add(hfsq, r)), b_.mul(e, c(kLn2Lo)));
    V y = b_.add(b_.mul(e, c(kLn2Hi)), b_.sub(f, b_.sub(hfsq, lo)));
    // frexp of 0, inf and NaN is not what the formula wants: pick those results directly.
    y = b_.select(b_.eq(x, c(0)), c(-kInf), y);
    y = b_.select(b_.eq(x, c(kInf)), c(kInf), y);
    y = b_.select(b_.lt(x, c(0)), c(kNaN), y);
    return nan_through(x, y);
  }

  V sin(V x) { return trig(x, 0); }
  V cos(V x) { return trig(x, 1); }
  V tan(V x) { return trig(x, 2); }

  V tanh(V x) {
    V ax = b_.abs(x);
    V e = expm1(b_.add(b_.min(ax, c(22)), b_.min(ax, c(22))));  // tanh(22) == 1 in f64
    V t = b_.div(e, b_.add(e, c(2)));
    return nan_through(x, b_.select(b_.lt(x, c(0)), b_.neg(t), t));
  }

  V atan2(V y, V x) {
    V ay = b_.abs(y), ax = b_.abs(x);
    V swap = b_.lt(ax, ay);
    V n = b_.select(swap, ax, ay), d = b_.select(swap, ay, ax);  // n <= d
    // atan(n/d) with n/d in [0, 1]; above tan(pi/8), atan(t) = pi/4 + atan((t-1)/(t+1)).
    V big = b_.lt(b_.mul(d, c(0.41421356237309504880)), n);
    V num = b_.select(big, b_.sub(n, d), n), den = b_.select(big, b_.add(n, d), d);
    V u = b_.div(num, b_.select(b_.eq(den, c(0)), c(1), den));  // atan2(0, 0) = 0
    V z = b_.mul(u, u);
    // atan(u) = u - u^3/3 + u^5/5 ... to u^47 (|u| <= 0.4143: the next term < 2^-60 u).
    V p = c(-1.0 / 47);
    for (int j = 22; j >= 1; --j) p = b_.add(b_.mul(p, z), c((j % 2 ? -1.0 : 1.0) / (2 * j + 1)));
    V a = b_.add(u, b_.mul(u, b_.mul(z, p)));
    a = b_.select(big, b_.add(c(kPiO4Hi), b_.add(a, c(kPiO4Lo))), a);
    a = b_.select(swap, b_.add(c(kPiO2Hi), b_.sub(c(kPiO2Lo), a)), a);
    a = b_.select(b_.lt(x, c(0)), b_.add(c(kPiHi), b_.sub(c(kPiLo), a)), a);
    a = b_.select(b_.lt(y, c(0)), b_.neg(a), a);
    return nan_through(y, nan_through(x, a));
  }

  V asin(V x) { return inverse_sine(x, false); }
  V acos(V x) { return inverse_sine(x, true); }

  // pow = exp(y * log x) with log x and the product carried in double-double: an error of d in
  // y log x is a relative error of d in the result, so log x in plain double (1 ulp) cost up to
  // |y log x| ulp (77 at y log x = 138). With ~2^-64 relative in log x the result is within a
  // few ulp for every finite |y log x| < 709.
  V pow(V x, V y) {
    Dd l = log_dd(x);
    Dd t = two_prod(y, l.hi);
    V tl = b_.add(t.lo, b_.mul(y, l.lo));
    // Past |t| = 1000 the result is 0 or inf anyway, and the splits in two_prod overflow for
    // huge y: keep the correction out of it.
    V big = b_.lt(c(1000), b_.abs(t.hi));  // NaN t: not big, and NaN flows through below
    V r0 = exp(t.hi);
    V r = b_.select(big, r0, b_.add(r0, b_.mul(r0, b_.select(big, c(0), tl))));
    r = b_.select(b_.eq(y, c(0)), c(1), r);
    return nan_through(y, r);
  }

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  // ln 2 in two parts (fdlibm): kLn2Hi has 32 trailing zero bits, so k * kLn2Hi is exact for
  // |k| < 2^20.
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kInvLn2 = 1.44269504088896338700e+00;
  // 2/3 as a double plus the rest.
  static constexpr double kTwoThirds = 2.0 / 3;
  static constexpr double kTwoThirdsLo =
      static_cast<double>(2.0L / 3 - static_cast<long double>(2.0 / 3));
  // pi/2 in three 33-bit parts (fdlibm's pio2_1, pio2_2, pio2_3): k * part is exact for
  // |k| < 2^20, and each subtraction cancels exactly (Sterbenz).
  static constexpr double kPiO2_1 = 1.57079632673412561417e+00;
  static constexpr double kPiO2_2 = 6.07710050630396597660e-11;
  static constexpr double kPiO2_3 = 2.02226624871116645580e-21;
  static constexpr double kTwoOverPi = 6.36619772367581382433e-01;
  // pi/4, pi/2 and pi as a double plus the rest.
  static constexpr double kPiO4Hi = 7.85398163397448278999e-01,
                          kPiO4Lo = 3.06161699786838301793e-17;
  static constexpr double kPiO2Hi = 1.57079632679489655800e+00,
                          kPiO2Lo = 6.12323399573676603587e-17;
  static constexpr double kPiHi = 3.14159265358979311600e+00, kPiLo = 1.22464679914735317720e-16;

  // Double-double: hi + lo, |lo| <= ulp(hi) / 2. The error-free transformations below need each
  // add/sub/mul rounded on its own (no fma contraction; the device backend says NoContraction).
  struct Dd {
    V hi, lo;
  };
  Dd two_sum(V a, V b) {
    V s = b_.add(a, b);
    V bb = b_.sub(s, a);
    return {s, b_.add(b_.sub(a, b_.sub(s, bb)), b_.sub(b, bb))};
  }
  Dd split(V a) {  // Veltkamp: a = hi + lo, each with 26 significant bits (|a| < 2^995)
    V t = b_.mul(c(134217729.0), a);
    V hi = b_.sub(t, b_.sub(t, a));
    return {hi, b_.sub(a, hi)};
  }
  Dd two_prod(V a, V b) {  // Dekker: a * b = p + err exactly
    V p = b_.mul(a, b);
    Dd x = split(a), y = split(b);
    V err = b_.add(
        b_.add(b_.add(b_.sub(b_.mul(x.hi, y.hi), p), b_.mul(x.hi, y.lo)), b_.mul(x.lo, y.hi)),
        b_.mul(x.lo, y.lo));
    return {p, err};
  }

  // log x in double-double, ~2^-64 relative, for pow. x = m 2^e with m in [sqrt(1/2), sqrt(2)),
  // f = m - 1 (exact), log m = 2 atanh(s), s = f / (2 + f) carried as sh + sl, and
  // 2 atanh(s) = 2s + (2/3) s^3 + s^5 Q(s^2): the first two terms in double-double, the rest
  // (below 3e-4 of the total) in double. 0, inf, negative and NaN x give log's results (lo 0).
  Dd log_dd(V x) {
    V e, m = b_.frexp(x, &e);
    V small = b_.lt(m, c(0.70710678118654752440));
    m = b_.select(small, b_.add(m, m), m);
    e = b_.select(small, b_.sub(e, c(1)), e);
    V f = b_.sub(m, c(1));
    Dd den = two_sum(c(2), f);
    V sh = b_.div(f, den.hi);
    Dd p = two_prod(sh, den.hi);
    V sl = b_.div(b_.sub(b_.sub(b_.sub(f, p.hi), p.lo), b_.mul(sh, den.lo)), den.hi);
    Dd z = two_prod(sh, sh);
    Dd s3 = two_prod(sh, z.hi);
    s3.lo = b_.add(s3.lo, b_.mul(sh, z.lo));
    Dd t1 = two_prod(s3.hi, c(kTwoThirds));
    t1.lo = b_.add(t1.lo, b_.add(b_.mul(s3.lo, c(kTwoThirds)), b_.mul(s3.hi, c(kTwoThirdsLo))));
    // Q(z) = sum_{j>=2} 2 z^(j-2) / (2j + 1), to j = 16 (z <= 0.0295: the next term < 2^-75).
    V q = c(2.0 / 33);
    for (int j = 15; j >= 2; --j) q = b_.add(b_.mul(q, z.hi), c(2.0 / (2 * j + 1)));
    V rest = b_.mul(b_.mul(s3.hi, z.hi), q);
    // (2/3) * 3 s^2 sl: the first-order effect of sl on the cubic term.
    V small_terms =
        b_.add(b_.add(b_.add(sl, sl), t1.lo),
               b_.add(b_.add(rest, b_.mul(c(2), b_.mul(z.hi, sl))), b_.mul(e, c(kLn2Lo))));
    Dd a = two_sum(b_.mul(e, c(kLn2Hi)), b_.add(sh, sh));  // both exact
    Dd b = two_sum(a.hi, t1.hi);
    Dd r = two_sum(b.hi, b_.add(b_.add(a.lo, b.lo), small_terms));
    V hi = b_.select(b_.eq(x, c(0)), c(-kInf), r.hi), lo = b_.select(b_.eq(x, c(0)), c(0), r.lo);
    hi = b_.select(b_.eq(x, c(kInf)), c(kInf), hi);
    lo = b_.select(b_.eq(x, c(kInf)), c(0), lo);
    hi = b_.select(b_.lt(x, c(0)), c(kNaN), hi);
    lo = b_.select(b_.lt(x, c(0)), c(0), lo);
    return {nan_through(x, hi), lo};
  }

  V c(double v) { return b_.constant(v); }
  V clamp(V x, double lo, double hi) {
    V a = b_.select(b_.lt(x, c(lo)), c(lo), x);
    return b_.select(b_.lt(c(hi), a), c(hi), a);
  }
  // NaN in -> NaN out, whatever the selects above made of it.
  V nan_through(V x, V r) { return b_.select(b_.is_nan(x), x, r); }

  // expm1 for y >= 0 (tanh's use): exact relative accuracy near 0.
  V expm1(V y) {
    V k = b_.round_even(b_.mul(y, c(kInvLn2)));
    V r = b_.sub(b_.sub(y, b_.mul(k, c(kLn2Hi))), b_.mul(k, c(kLn2Lo)));
    // exp(r) - 1 = r + r^2/2 + ... + r^14/14!
    V q = c(1.0 / 87178291200.0);  // 1/14!
    for (double d : {6227020800.0, 479001600.0, 39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0,
                     720.0, 120.0, 24.0, 6.0, 2.0, 1.0}) {
      q = b_.add(b_.mul(q, r), c(1.0 / d));
    }
    q = b_.mul(q, r);
    // 2^k (q + 1) - 1 = 2^k q + (2^k - 1); 2^k - 1 is exact up to k = 53, and beyond it the
    // -1 is below the result's ulp anyway.
    V two_k = b_.ldexp(c(1), k);
    return b_.add(b_.ldexp(q, k), b_.sub(two_k, c(1)));
  }

  // which: 0 sin, 1 cos, 2 tan.
  V trig(V x, int which) {
    V k = b_.round_even(b_.mul(x, c(kTwoOverPi)));
    V r = b_.sub(b_.sub(b_.sub(x, b_.mul(k, c(kPiO2_1))), b_.mul(k, c(kPiO2_2))),
                 b_.mul(k, c(kPiO2_3)));
    V z = b_.mul(r, r);
    // sin r = r + r^3 (-1/3! + z (1/5! - ...)) to r^19; cos r = 1 - z/2 + ... to r^20.
    double fact[21] = {1};
    for (int i = 1; i <= 20; ++i) fact[i] = fact[i - 1] * i;
    V sp = c(-1.0 / fact[19]);
    for (int i = 17; i >= 3; i -= 2)
      sp = b_.add(b_.mul(sp, z), c(((i / 2) % 2 ? -1.0 : 1.0) / fact[i]));
    V s = b_.add(r, b_.mul(b_.mul(r, z), sp));
    V cp = c(1.0 / fact[20]);
    for (int i = 18; i >= 2; i -= 2)
      cp = b_.add(b_.mul(cp, z), c(((i / 2) % 2 ? -1.0 : 1.0) / fact[i]));
    V co = b_.add(c(1), b_.mul(z, cp));
    // Quadrant q = k mod 4.
    V q = b_.sub(k, b_.mul(c(4), b_.floor(b_.mul(k, c(0.25)))));
    V odd = b_.eq(b_.sub(q, b_.mul(c(2), b_.floor(b_.mul(q, c(0.5))))), c(1));
    if (which == 2) {
      V t = b_.select(odd, b_.neg(b_.div(co, s)), b_.div(s, co));
      return nan_through(x, t);
    }
    V first = which == 0 ? s : co, second = which == 0 ? co : b_.neg(s);
    V base = b_.select(odd, second, first);
    V negate = b_.lt(c(1.5), q);  // quadrants 2 and 3
    return nan_through(x, b_.select(negate, b_.neg(base), base));
  }

  V inverse_sine(V x, bool cosine) {
    V y = b_.sqrt(b_.mul(b_.sub(c(1), x), b_.add(c(1), x)));
    V r = cosine ? atan2(y, x) : atan2(x, y);
    return nan_through(x, b_.select(b_.lt(c(1), b_.abs(x)), c(kNaN), r));
  }

  B& b_;
};

// The host backend: plain double arithmetic, for measuring the algorithms.
struct HostF64 {
  using Value = double;
  double constant(double v) { return v; }
  double add(double a, double b) { return a + b; }
  double sub(double a, double b) { return a - b; }
  double mul(double a, double b) { return a * b; }
  double div(double a, double b) { return a / b; }
  double neg(double a) { return -a; }
  double abs(double a) { return std::fabs(a); }
  double min(double a, double b) { return a < b ? a : b; }
  double sqrt(double a) { return std::sqrt(a); }
  double floor(double a) { return std::floor(a); }
  double round_even(double a) { return std::nearbyint(a); }
  double ldexp(double a, double k) {
    return std::isnan(k) ? k : std::ldexp(a, static_cast<int>(k));
  }
  double frexp(double a, double* e) {
    int i = 0;
    double m = std::frexp(a, &i);
    *e = i;
    return m;
  }
  double lt(double a, double b) { return a < b; }
  double eq(double a, double b) { return a == b; }
  double is_nan(double a) { return std::isnan(a); }
  double select(double cond, double a, double b) { return cond != 0 ? a : b; }
};

}  // namespace vkad::codegen
