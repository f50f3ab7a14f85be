#include "reference/precision.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vkad::codegen {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The relative size of one ulp: ulp(v) <= eps * |v| for a normal v.
double eps_of(DType t) { return t == DType::kF64 ? 0x1p-52 : 0x1p-23; }
// Vulkan lets a device flush subnormal inputs and results to zero: where an operand or the
// result is subnormal, the result may move by up to the smallest normal.
double flush_of(DType t, double a, double b, double r) {
  double min_normal = t == DType::kF64 ? 0x1p-1022 : 0x1p-126;
  auto sub = [&](double v) { return v != 0 && std::fabs(v) < min_normal; };
  return sub(a) || sub(b) || sub(r) ? min_normal : 0;
}

// sin/cos/tan arguments are reduced by 2*pi in the emitter (two-term Cody-Waite, f32) before
// GLSL Sin/Cos/Tan, so Vulkan's "inside [-pi, pi]" bound applies to every |x| below this; the
// product k * C1 and the first subtraction of the reduction stay exact up to |k| = 2^14.
constexpr double kTrigReducedMax = 102944.0;  // 2^14 * 2 * pi, rounded down
// Error of the reduced argument: k * C2 rounded (|k * C2| < 32: 2^-20) and the subtraction
// (|r| < 4: 2^-23), fused or not, plus the constant's tail e * |k| <= 2^-34 |x| / (2 pi);
// with margin (spirv_emitter.cpp, reduce_two_pi).
double reduction_error(double x) { return 0x1p-19 + std::fabs(x) * 0x1p-36; }

// Vulkan: sin, cos "absolute error <= 2^-11 inside the range [-pi, pi]".
constexpr double kSinCosAbs = 0x1p-11;

// Vulkan: log, log2 "3 ULP outside the range [0.5, 2.0]; absolute error < 2^-21 inside".
double log_error(DType t, double a, double r) {
  if (a >= 0.5 && a <= 2.0) return 0x1p-21;
  return 3 * ulp(t, r);
}

// Largest |f(corner) - r| over the box [a - ea, a + ea] x [b - eb, b + eb]: the exact image
// bound for a function monotone in each argument on the box.
template <typename F>
double corners(F f, double a, double ea, double b, double eb, double r) {
  double worst = 0;
  for (double da : {-ea, ea}) {
    for (double db : {-eb, eb}) {
      double v = f(a + da, b + db);
      if (std::isnan(v)) return kInf;
      worst = std::max(worst, std::fabs(v - r));
    }
  }
  return worst;
}

// What the precision table tells apart: unary and binary arithmetic, casts, and the rest
// (comparisons and selects, taken as exact; leaves, locals, loads, control flow and adstacks,
// which round nothing).
enum class Rounding : uint8_t { kUnary, kBinary, kCast, kNone };
Rounding rounding_of(Op op) {
  switch (op_info(op).family) {
    case OpFamily::kUnary: return Rounding::kUnary;
    case OpFamily::kBinary: return Rounding::kBinary;
    case OpFamily::kCast: return Rounding::kCast;
    case OpFamily::kLeaf:
    case OpFamily::kCompare:
    case OpFamily::kSelect:
    case OpFamily::kLocal:
    case OpFamily::kArray:
    case OpFamily::kControl:
    case OpFamily::kStack: return Rounding::kNone;
  }
  return Rounding::kNone;
}

// f64_transcendental_error's unary part; `u`: one ulp of the result, plus flushing.
double f64_unary_error(UnaryOp op, double a, double u) {
  switch (op) {
    case UnaryOp::kSin:
    case UnaryOp::kCos:
    case UnaryOp::kTan:
      return std::fabs(a) < 1e6 ? 8 * u : kInf;  // the pi/2 reduction is exact below 1e6
    case UnaryOp::kExp:
    case UnaryOp::kLog:
    case UnaryOp::kTanh:
    case UnaryOp::kAsin:
    case UnaryOp::kAcos: return 8 * u;
    case UnaryOp::kNeg:
    case UnaryOp::kNot:
    case UnaryOp::kSqrt:
    case UnaryOp::kRsqrt:
    case UnaryOp::kAbs:
    case UnaryOp::kFloor:
    case UnaryOp::kCeil: return -1;
  }
  return -1;
}

// f64 transcendentals are vkad's own (f64_math.h; Vulkan specifies none): the error measured
// against glibc on the host (tests/unit/f64_math_test.cpp: <= 4 ulp, pow included),
// doubled for a device whose f64 division and sqrt are only as good as Vulkan requires
// (2.5 ulp) and for libm's own error. -1 for the other ops.
double f64_transcendental_error(Op op, double a, double r) {
  if (std::isnan(r) || std::isinf(r)) return 0;  // the algorithms produce these exactly
  double u = ulp(DType::kF64, r) + 0x1p-1022;    // (and subnormals may flush)
  switch (rounding_of(op)) {
    case Rounding::kUnary: return f64_unary_error(unary_op(op), a, u);
    case Rounding::kBinary:
      if (op == Op::kAtan2) return 8 * u;
      if (op == Op::kPow) return a < 0 ? kInf : 8 * u;  // NaN there; libm defines integer
      return -1;                                        // powers of negatives
    case Rounding::kCast:
    case Rounding::kNone: return -1;
  }
  return -1;
}

// Exact operations propagate inf/NaN the IEEE way on every device; the rest are free to
// produce anything there.
bool propagates_inf_nan_exactly(Op op) {
  switch (rounding_of(op)) {
    case Rounding::kUnary:
      return op == Op::kNeg || op == Op::kAbs || op == Op::kFloor || op == Op::kCeil;
    case Rounding::kBinary: return op == Op::kMin || op == Op::kMax;
    case Rounding::kCast: return true;
    case Rounding::kNone: return false;
  }
  return false;
}

// Vulkan: tan "inherited from sin() / cos()": each with its absolute error d, then a
// 2.5-ulp division: (d + |tan| * d) / (|cos| - d) + 2.5 ulp.
double tan_error(DType t, double a, double r, double flush) {
  if (std::fabs(a) > kTrigReducedMax) return kInf;
  double d = kSinCosAbs + reduction_error(a), c = std::fabs(std::cos(a));
  if (c <= d) return kInf;
  return (d + std::fabs(r) * d) / (c - d) + 3.5 * ulp(t, r) + flush;
}
// Vulkan: tanh "inherited from sinh() / cosh()", sinh and cosh "inherited from
// (exp(x) -+ exp(-x)) * 0.5". With E the relative error of each exp (3 + 2|x| ulp), the
// subtraction, addition and division roundings: E * (1 + |tanh|) + 4.5 eps |tanh|.
// Past |x| = 88 exp overflows f32 and the formula is inf / inf.
double tanh_error(DType t, double a, double r, double flush) {
  if (t == DType::kF32 && std::fabs(a) > 88) return kInf;
  const double eps = eps_of(t);
  double e = (3 + 2 * std::fabs(a)) * eps;
  return e * (1 + std::fabs(r)) + 4.5 * eps * std::fabs(r) + ulp(t, r) + flush;
}
// Vulkan: asin "inherited from atan2(x, sqrt(1.0 - x * x))", acos "inherited from
// atan2(sqrt(1.0 - x * x), x)". The inner y = sqrt(1 - x^2) carries the product's and the
// difference's rounding (eps x^2 + eps y^2, through sqrt's slope 1/2y) and sqrt's own 4.5
// ulp; atan2's slope in y is |x| for both (x^2 + y^2 = 1).
double asin_acos_error(DType t, double a, double r, double flush) {
  double ax = std::fabs(a);
  if (ax > 1) return kInf;
  const double eps = eps_of(t);
  double y = std::sqrt(1 - a * a);
  double dy = y > 0 ? eps * (a * a + y * y) / (2 * y) + 4.5 * eps * y : 0;
  return 4097 * ulp(t, r) + ax * dy + flush;
}
// Vulkan: pow "inherited from exp2(y * log2(x))"; undefined for x < 0, and for x = 0
// with y <= 0.
double pow_error(DType t, double a, double b, double r, double flush) {
  if (a < 0 || (a == 0 && b <= 0)) return kInf;
  if (a == 0) return flush;
  const double eps = eps_of(t);
  double l = std::log2(a), p = b * l;
  double dl = log_error(t, a, l);
  double dp = std::fabs(b) * dl + eps * std::fabs(p);
  double rel = (3 + 2 * std::fabs(p)) * eps + std::log(2.0) * dp;
  return std::fabs(r) * rel + ulp(t, r) + flush;
}

double unary_local_error(UnaryOp op, DType t, double a, double r, double flush) {
  switch (op) {
    // Vulkan: InverseSqrt "2 ULP"; sqrt "inherited from 1.0 / inversesqrt()": 2 + 2.5 ULP.
    // The reference is correctly rounded in both (computed in double, then rounded).
    case UnaryOp::kRsqrt: return a <= 0 ? kInf : 2.5 * ulp(t, r) + flush;
    case UnaryOp::kSqrt: return a < 0 ? kInf : 5 * ulp(t, r) + flush;
    // Vulkan: exp, exp2 "3 + 2 * |x| ULP". libm's expf: <= 1 ulp.
    case UnaryOp::kExp: return (4 + 2 * std::fabs(a)) * ulp(t, r) + flush;
    case UnaryOp::kLog: return a <= 0 ? kInf : log_error(t, a, r) + ulp(t, r) + flush;
    case UnaryOp::kSin:
    case UnaryOp::kCos:
      if (std::fabs(a) > kTrigReducedMax) return kInf;
      return kSinCosAbs + reduction_error(a) + ulp(t, r) + flush;
    case UnaryOp::kTan: return tan_error(t, a, r, flush);
    case UnaryOp::kTanh: return tanh_error(t, a, r, flush);
    case UnaryOp::kAsin:
    case UnaryOp::kAcos: return asin_acos_error(t, a, r, flush);
    case UnaryOp::kNeg:
    case UnaryOp::kNot:
    case UnaryOp::kAbs:
    case UnaryOp::kFloor:
    case UnaryOp::kCeil: return 0;  // exact on every device
  }
  return 0;
}

double binary_local_error(BinaryOp op, DType t, double a, double b, double r, double flush) {
  switch (op) {
    // Vulkan: OpFAdd, OpFSub, OpFMul "correctly rounded", like the reference, so the two agree
    // on exact operands -- except that SPIR-V lets a driver contract OpFMul + OpFAdd into one
    // fma, skipping the product's rounding (<= 1/2 ulp of an operand) and changing the sum's
    // (<= 1 ulp). The slack is charged to the add.
    case BinaryOp::kAdd:
    case BinaryOp::kSub: return ulp(t, r) + 0.5 * (ulp(t, a) + ulp(t, b)) + flush;
    case BinaryOp::kMul: return flush;
    // Vulkan: OpFDiv "2.5 ULP for |y| in the range [2^-126, 2^126]"; the reference is
    // correctly rounded (1/2 ulp).
    case BinaryOp::kDiv: {
      double ay = std::fabs(b);
      if (t == DType::kF32 && (ay < 0x1p-126 || ay > 0x1p126)) return kInf;
      return 3 * ulp(t, r) + flush;
    }
    // Vulkan: atan, atan2 "4096 ULP"; undefined for atan2(0, 0).
    case BinaryOp::kAtan2: return a == 0 && b == 0 ? kInf : 4097 * ulp(t, r) + flush;
    case BinaryOp::kPow: return pow_error(t, a, b, r, flush);
    case BinaryOp::kMod:
    case BinaryOp::kFloorDiv:
    case BinaryOp::kMin:
    case BinaryOp::kMax:
    case BinaryOp::kAnd:
    case BinaryOp::kOr: return 0;  // exact on every device
  }
  return 0;
}

// What an integer result inherits from inexact integer operands: sums, differences, products
// and min / max have a bound; div, mod and casts of an inexact integer have none useful.
double carried_int_error(Op op, double a, double ea, double b, double eb) {
  switch (rounding_of(op)) {
    case Rounding::kUnary: return op == Op::kNeg || op == Op::kAbs ? std::max(ea, eb) : kInf;
    case Rounding::kBinary: break;
    case Rounding::kCast:
    case Rounding::kNone: return kInf;
  }
  switch (binary_op(op)) {
    case BinaryOp::kAdd:
    case BinaryOp::kSub: return ea + eb;
    case BinaryOp::kMin:
    case BinaryOp::kMax: return std::max(ea, eb);
    case BinaryOp::kMul: return std::fabs(b) * ea + std::fabs(a) * eb + ea * eb;
    case BinaryOp::kDiv:
    case BinaryOp::kMod:
    case BinaryOp::kFloorDiv:
    case BinaryOp::kPow:
    case BinaryOp::kAtan2:
    case BinaryOp::kAnd:
    case BinaryOp::kOr: return kInf;
  }
  return kInf;
}

// The image of [a - ea, a + ea] under a monotone f, less r.
double image(double (*f)(double), double a, double ea, double r) {
  return corners([&](double x, double) { return f(x); }, a, ea, 0, 0, r);
}

double unary_carried_error(UnaryOp op, double a, double ea, double r) {
  switch (op) {
    case UnaryOp::kNeg:
    case UnaryOp::kAbs: return ea;
    // Monotone steps: the interval's image (0 unless it holds an integer).
    case UnaryOp::kFloor: return image([](double x) { return std::floor(x); }, a, ea, r);
    case UnaryOp::kCeil: return image([](double x) { return std::ceil(x); }, a, ea, r);
    case UnaryOp::kSqrt:
      return a - ea < 0 ? kInf : image([](double x) { return std::sqrt(x); }, a, ea, r);
    case UnaryOp::kRsqrt:
      return a - ea <= 0 ? kInf : image([](double x) { return 1 / std::sqrt(x); }, a, ea, r);
    case UnaryOp::kLog:
      return a - ea <= 0 ? kInf : image([](double x) { return std::log(x); }, a, ea, r);
    case UnaryOp::kExp: return image([](double x) { return std::exp(x); }, a, ea, r);
    case UnaryOp::kTanh: return image([](double x) { return std::tanh(x); }, a, ea, r);
    case UnaryOp::kAsin:
      return std::fabs(a) + ea > 1 ? kInf : image([](double x) { return std::asin(x); }, a, ea, r);
    case UnaryOp::kAcos:
      return std::fabs(a) + ea > 1 ? kInf : image([](double x) { return std::acos(x); }, a, ea, r);
    // |sin'|, |cos'| <= 1 and the second-order term.
    case UnaryOp::kSin: return std::min(2.0, std::fabs(std::cos(a)) * ea + ea * ea / 2);
    case UnaryOp::kCos: return std::min(2.0, std::fabs(std::sin(a)) * ea + ea * ea / 2);
    case UnaryOp::kTan: {
      // Monotone between poles: the interval's image, unless it contains a pole.
      double c0 = std::cos(a), c1 = std::cos(a - ea), c2 = std::cos(a + ea);
      if (ea >= 1.5 || (c1 > 0) != (c0 > 0) || (c2 > 0) != (c0 > 0)) return kInf;
      return image([](double x) { return std::tan(x); }, a, ea, r);
    }
    case UnaryOp::kNot: return kInf;
  }
  return kInf;
}

// Monotone in each argument away from the origin and the branch cut (x < 0, y = 0).
double atan2_carried_error(double a, double ea, double b, double eb) {
  if (std::fabs(a) <= ea && b - eb <= 0) return kInf;
  double d2 = a * a + b * b;
  if (d2 <= (ea + eb) * (ea + eb)) return kInf;
  double lo = d2 - 2 * (std::fabs(a) * ea + std::fabs(b) * eb);
  if (lo <= 0) return kInf;
  return (std::fabs(b) * ea + std::fabs(a) * eb) / lo;
}

double binary_carried_error(BinaryOp op, double a, double ea, double b, double eb, double r) {
  switch (op) {
    case BinaryOp::kAdd:
    case BinaryOp::kSub: return ea + eb;
    case BinaryOp::kMin:
    case BinaryOp::kMax: return std::max(ea, eb);
    case BinaryOp::kMul: return std::fabs(b) * ea + std::fabs(a) * eb + ea * eb;
    case BinaryOp::kDiv: {
      double lo = std::fabs(b) - eb;
      if (lo <= 0) return kInf;
      return (ea + std::fabs(r) * eb) / lo;
    }
    case BinaryOp::kPow:
      if (a - ea <= 0) return kInf;
      return corners([](double x, double y) { return std::pow(x, y); }, a, ea, b, eb, r);
    case BinaryOp::kAtan2: return atan2_carried_error(a, ea, b, eb);
    case BinaryOp::kMod:
    case BinaryOp::kFloorDiv:
    case BinaryOp::kAnd:
    case BinaryOp::kOr: return kInf;
  }
  return kInf;
}

}  // namespace

double ulp(DType t, double v) {
  if (!std::isfinite(v)) return kInf;
  double tiny = t == DType::kF64 ? std::numeric_limits<double>::denorm_min()
                                 : static_cast<double>(std::numeric_limits<float>::denorm_min());
  if (v == 0) return tiny;
  int e = std::ilogb(v);
  return std::max(std::ldexp(1.0, e - (t == DType::kF64 ? 52 : 23)), tiny);
}

double local_error(Op op, DType t, double a, double b, double r) {
  if (!is_float(t)) return 0;
  if (t == DType::kF64) {
    if (double e = f64_transcendental_error(op, a, r); e >= 0) return e;
  }
  const double flush = flush_of(t, a, b, r);
  if (std::isnan(r) || std::isinf(r)) return propagates_inf_nan_exactly(op) ? 0 : kInf;
  switch (rounding_of(op)) {
    case Rounding::kUnary: return unary_local_error(unary_op(op), t, a, r, flush);
    case Rounding::kBinary: return binary_local_error(binary_op(op), t, a, b, r, flush);
    case Rounding::kCast:  // float -> float: the rounding is the caller's (result_error)
    case Rounding::kNone: return 0;
  }
  return 0;
}

double carried_error(Op op, DType t, double a, double ea, double b, double eb, double r) {
  if (ea == 0 && eb == 0) return 0;
  if (std::isinf(ea) || std::isinf(eb) || std::isnan(ea) || std::isnan(eb)) return kInf;
  if (!is_float(t)) return carried_int_error(op, a, ea, b, eb);
  switch (rounding_of(op)) {
    case Rounding::kUnary: return unary_carried_error(unary_op(op), a, ea, r);
    case Rounding::kBinary: return binary_carried_error(binary_op(op), a, ea, b, eb, r);
    case Rounding::kCast: return ea;  // float -> float: the rounding is the caller's
    case Rounding::kNone: return kInf;
  }
  return kInf;
}

}  // namespace vkad::codegen
