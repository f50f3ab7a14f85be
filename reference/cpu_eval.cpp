#include "reference/cpu_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_map>

#include "abi/print_records.h"
#include "reference/precision.h"

namespace vkad::codegen {

HostArray::HostArray(DType t, std::vector<uint32_t> s) : dtype(t), shape(std::move(s)) {
  size_t n = 1;
  for (uint32_t d : shape) n *= d;
  data.assign(n, 0.0);
}

namespace {

// `v` rounded to the nearest f32 (ties to even), overflowing to +-inf as IEEE rounding does:
// a plain static_cast is undefined behaviour in C++ for finite values beyond FLT_MAX.
float to_f32(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  // FLT_MAX plus half an ulp: the midpoint to infinity, which ties to infinity (even).
  constexpr double kOverflow = kMax + 0x1p103;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (std::isfinite(v) && std::fabs(v) > kMax) {
    float mag = std::fabs(v) < kOverflow ? std::numeric_limits<float>::max() : kInf;
    return v > 0 ? mag : -mag;
  }
  return static_cast<float>(v);
}

// A double holding an integer (or whatever a caller passed as a scalar) as int64, saturating,
// NaN -> 0: every conversion of a host value stays free of undefined behaviour.
int64_t to_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v <= -0x1p63) return INT64_MIN;
  if (v >= 0x1p63) return INT64_MAX;
  return static_cast<int64_t>(v);
}

}  // namespace

double round_to(DType t, double v) {
  switch (t) {
    case DType::kF32: return static_cast<double>(to_f32(v));
    case DType::kF64: return v;
    case DType::kI32: {
      if (!std::isfinite(v)) return 0;
      return static_cast<double>(static_cast<int32_t>(
          static_cast<uint32_t>(static_cast<int64_t>(std::fmod(v, 4294967296.0)))));
    }
    case DType::kU32: {
      if (!std::isfinite(v)) return 0;
      int64_t i = static_cast<int64_t>(std::fmod(v, 4294967296.0));
      return static_cast<double>(static_cast<uint32_t>(i));
    }
    case DType::kI64: {
      // Wraps modulo 2^64 like the device. The reference holds values as doubles, so i64 is
      // exact only while |v| <= 2^53 (cpu_eval.h).
      if (!std::isfinite(v)) return 0;
      if (v >= -0x1p63 && v < 0x1p63) return v;
      double w = std::fmod(v, 0x1p64);
      if (w >= 0x1p63) w -= 0x1p64;
      if (w < -0x1p63) w += 0x1p64;
      return w;
    }
    case DType::kBool: return v != 0 ? 1 : 0;
  }
  return v;
}

namespace {

using abi::kErrorAdstackOverflow;
using abi::kErrorOutOfBounds;

// f32 transcendentals are computed in f32 (libm's float functions), f64 ones in f64.
template <typename F>
double in_precision(DType t, double x, F f) {
  if (t == DType::kF64) return f(x);
  return static_cast<double>(f(to_f32(x)));
}
template <typename F>
double in_precision(DType t, double x, double y, F f) {
  if (t == DType::kF64) return f(x, y);
  return static_cast<double>(f(to_f32(x), to_f32(y)));
}

double float_to_int(DType to, double v) {
  if (std::isnan(v)) return 0;
  v = std::trunc(v);
  double lo = to == DType::kU32 ? 0.0 : to == DType::kI64 ? -0x1p63 : -2147483648.0;
  // i64: the largest double below 2^63 (INT64_MAX itself has no double).
  double hi = to == DType::kU32 ? 4294967295.0 : to == DType::kI64 ? 0x1p63 - 1024 : 2147483647.0;
  return std::min(std::max(v, lo), hi);
}

struct Stack {
  DType type;
  int64_t cap = 0;
  std::vector<double> primal, adj;
  std::vector<double> primal_err, adj_err;  // the bounds of the values above
};

// The bound of a result computed from operands with bounds ea, eb: what the operands' error
// carries through, one rounding more when it is non-zero, and the operation's own error.
double result_error(Op op, DType t, double a, double ea, double b, double eb, double r) {
  double carried = carried_error(op, t, a, ea, b, eb, r);
  if (carried > 0 && is_float(t)) carried += ulp(t, r);
  return carried + local_error(op, t, a, b, r);
}

class Evaluator {
 public:
  Evaluator(const Kernel& k, std::span<const HostArg> args) : k_(k), args_(args) {}

  Result<EvalResult> run() {
    VKAD_TRY(check_args());
    for (const Task& t : k_.tasks) {
      for (ValueId ix : task_indices(t)) number(ix, DType::kI32);
      if (!number_block(t.body, 0)) {
        return make_error(
            ErrorCode::kInvalidArgument,
            "evaluate '" + k_.name + "', task '" + t.name +
                "': loops and branches nest deeper than " + std::to_string(kMaxNestingDepth) +
                " (kMaxNestingDepth); the reference evaluates verifiable kernels only");
      }
      if (contains_op(t.body, Op::kBarrier) || contains_op(t.body, Op::kSharedAlloc)) {
        // Invocations run one after another here: none could wait for the others.
        return make_error(
            ErrorCode::kUnsupported,
            "evaluate '" + k_.name + "', task '" + t.name +
                "': barrier and shared arrays need the workgroup's invocations to run "
                "together; the "
                "reference runs them one at a time (evaluate the launches the "
                "barriers separate instead)");
      }
    }
    densify();
    regs_.assign(slot_types_.size(), 0.0);
    errs_.assign(slot_types_.size(), 0.0);
    EvalResult r;
    for (const Task& t : k_.tasks) {
      flag_ = 0;
      task_ = &t;
      if (!t.dims.empty()) {
        VKAD_TRY(run_nd(t));
        r.error_flags.push_back(flag_);
        continue;
      }
      int64_t b = bound(t.begin), e = bound(t.end);
      for (int64_t i = b; i < e; ++i) {
        stacks_.clear();
        regs_[slot(t.index)] = static_cast<double>(static_cast<int32_t>(i));
        block(t.body);
        if (runaway_ != kNoValue) {
          return make_error(ErrorCode::kInvalidArgument,
                            "evaluate '" + k_.name + "', task '" + t.name + "': while loop %" +
                                std::to_string(runaway_) + " ran " +
                                std::to_string(kMaxWhileTrips) + " iterations in iteration " +
                                std::to_string(i) + " (the reference's limit); it may never end");
        }
      }
      r.error_flags.push_back(flag_);
    }
    r.prints = std::move(prints_);
    return r;
  }

 private:
  // An N-d task: the box's points in row-major order (the last dimension fastest). Bounds
  // are evaluated as the runtime does; one it would refuse (a negative begin, an end past
  // i32) is an error here too.
  Status run_nd(const Task& t) {
    size_t n = t.dims.size();
    std::vector<int64_t> b(n), e(n), i(n);
    for (size_t d = 0; d < n; ++d) {
      adstack::SizeInputs in{
          [&](uint32_t p) { return to_i64(args_[p].scalar); },
          [&](uint32_t p, uint32_t dd) { return static_cast<int64_t>(args_[p].array->shape[dd]); }};
      Result<int64_t> bv = adstack::evaluate(t.dims[d].begin, in);
      Result<int64_t> ev = adstack::evaluate(t.dims[d].end, in);
      if (!bv.ok() || !ev.ok() || *bv < 0 || *ev > INT32_MAX) {
        return make_error(ErrorCode::kInvalidArgument,
                          "evaluate '" + k_.name + "' task '" + t.name + "': dimension " +
                              std::to_string(d) + "'s range is out of bounds");
      }
      b[d] = *bv, e[d] = *ev;
      if (e[d] <= b[d]) return {};
    }
    i = b;
    while (true) {
      stacks_.clear();
      for (size_t d = 0; d < n; ++d) regs_[slot(t.dims[d].index)] = static_cast<double>(i[d]);
      block(t.body);
      size_t d = n;
      while (d > 0 && ++i[d - 1] == e[d - 1]) i[d - 1] = b[d - 1], --d;
      if (d == 0) return {};
    }
  }

  Status check_args() const {
    if (args_.size() != k_.params.size()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "evaluate '" + k_.name + "': " + std::to_string(k_.params.size()) +
                            " parameters, got " + std::to_string(args_.size()) + " arguments");
    }
    for (size_t i = 0; i < args_.size(); ++i) {
      const Param& p = k_.params[i];
      const HostArray* a = args_[i].array;
      if ((p.kind == ParamKind::kNdArray) != (a != nullptr) ||
          (a && (a->dtype != p.dtype || a->shape.size() != p.rank))) {
        return make_error(ErrorCode::kInvalidArgument, "evaluate '" + k_.name + "': argument " +
                                                           std::to_string(i) + " ('" + p.name +
                                                           "') does not match the parameter");
      }
    }
    return {};
  }

  // Ids map to dense register slots; small id spaces (the usual case) index directly.
  void number(ValueId id, DType t) {
    if (slots_.emplace(id, static_cast<uint32_t>(slot_types_.size())).second)
      slot_types_.push_back(t);
  }
  // The first walk of the kernel, so it bounds the depth of every later recursion (block,
  // stmt): false past kMaxNestingDepth, which verify() refuses too.
  bool number_block(const Block& b, uint32_t depth) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) number(s.result, s.type);
      if (!s.blocks.empty() && depth + 1 > kMaxNestingDepth) return false;
      for (const Block& c : s.blocks) {
        if (!number_block(c, depth + 1)) return false;
      }
    }
    return true;
  }
  void densify() {
    if (k_.next_id > (1u << 22)) return;
    direct_.assign(k_.next_id + 1, 0);
    for (const auto& [id, sl] : slots_) {
      if (id < direct_.size()) direct_[id] = sl;
    }
    dense_ = slots_.size() == 0 || std::all_of(slots_.begin(), slots_.end(), [&](const auto& kv) {
               return kv.first < direct_.size();
             });
  }
  uint32_t slot(ValueId id) const { return dense_ ? direct_[id] : slots_.at(id); }
  double get(ValueId id) const { return regs_[slot(id)]; }
  double err(ValueId id) const { return errs_[slot(id)]; }

  int64_t bound(const RangeBound& b) const {
    switch (b.kind) {
      case RangeBound::Kind::kConstant: return b.value;
      case RangeBound::Kind::kScalarParam: return to_i64(args_[b.param].scalar);
      case RangeBound::Kind::kArrayDim: return args_[b.param].array->shape[b.dim];
    }
    return 0;
  }

  int64_t size(const SizeExpr& e) const {
    adstack::SizeInputs in{
        [&](uint32_t p) { return to_i64(args_[p].scalar); },
        [&](uint32_t p, uint32_t d) { return static_cast<int64_t>(args_[p].array->shape[d]); }};
    // A capacity past 64 bits is a launch error on the device (runtime plan_rows); here it
    // means no push can reach it.
    Result<int64_t> v = adstack::evaluate(e, in);
    return v.ok() ? std::max<int64_t>(*v, 1) : INT64_MAX;
  }

  // Linear element index, or -1 (and the out-of-bounds flag) when any index is outside.
  int64_t linear(const Stmt& s, size_t n) {
    const HostArray& a = *args_[s.param].array;
    int64_t lin = 0;
    for (size_t d = 0; d < n; ++d) {
      double iv = get(s.args[d]);
      // Indices compare unsigned on the device, so a negative i32 is out of bounds too.
      if (iv < 0 || iv >= a.shape[d]) {
        flag_ = flag_ ? flag_ : kErrorOutOfBounds;
        return -1;
      }
      lin = lin * a.shape[d] + static_cast<int64_t>(iv);
    }
    return lin;
  }

  double unary(const Stmt& s, double x) const {
    switch (unary_op(s.op)) {
      case UnaryOp::kNeg: return -x;
      case UnaryOp::kNot: return x != 0 ? 0 : 1;
      case UnaryOp::kSqrt: return std::sqrt(x);
      case UnaryOp::kRsqrt: return 1.0 / std::sqrt(x);
      case UnaryOp::kExp: return in_precision(s.type, x, [](auto v) { return std::exp(v); });
      case UnaryOp::kLog: return in_precision(s.type, x, [](auto v) { return std::log(v); });
      case UnaryOp::kSin: return in_precision(s.type, x, [](auto v) { return std::sin(v); });
      case UnaryOp::kCos: return in_precision(s.type, x, [](auto v) { return std::cos(v); });
      case UnaryOp::kTan: return in_precision(s.type, x, [](auto v) { return std::tan(v); });
      case UnaryOp::kTanh: return in_precision(s.type, x, [](auto v) { return std::tanh(v); });
      case UnaryOp::kAsin: return in_precision(s.type, x, [](auto v) { return std::asin(v); });
      case UnaryOp::kAcos: return in_precision(s.type, x, [](auto v) { return std::acos(v); });
      case UnaryOp::kAbs: return std::fabs(x);
      case UnaryOp::kFloor: return std::floor(x);
      case UnaryOp::kCeil: return std::ceil(x);
    }
    return 0;
  }

  double binary(const Stmt& s, DType t, double a, double b) const {
    switch (binary_op(s.op)) {
      case BinaryOp::kAdd: return a + b;
      case BinaryOp::kSub: return a - b;
      case BinaryOp::kMul: return is_float(t) ? a * b : wrapped_product(t, a, b);
      case BinaryOp::kDiv:
      case BinaryOp::kMod:
      case BinaryOp::kFloorDiv: return is_float(t) ? a / b : int_division(s.op, a, b);
      case BinaryOp::kMin: return a < b ? a : b;
      case BinaryOp::kMax: return a > b ? a : b;
      case BinaryOp::kPow:
        return in_precision(t, a, b, [](auto x, auto y) { return std::pow(x, y); });
      case BinaryOp::kAtan2:
        return in_precision(t, a, b, [](auto x, auto y) { return std::atan2(x, y); });
      case BinaryOp::kAnd: return (a != 0 && b != 0) ? 1 : 0;
      case BinaryOp::kOr: return (a != 0 || b != 0) ? 1 : 0;
    }
    return 0;
  }
  // The exact wrap of a 32x32-bit product (64-bit for i64).
  static double wrapped_product(DType t, double a, double b) {
    uint64_t p = static_cast<uint64_t>(to_i64(a)) * static_cast<uint64_t>(to_i64(b));
    if (t == DType::kI64) return static_cast<double>(static_cast<int64_t>(p));
    return static_cast<double>(static_cast<uint32_t>(p));
  }
  // div truncates, mod and floordiv round toward -inf (ir.h).
  static double int_division(Op op, double a, double b) {
    // i32 and u32 operands: int64 holds them and INT_MIN / -1 (2^31, which round_to wraps
    // back to INT_MIN) without overflow. By zero: div and floordiv 0, mod the dividend.
    int64_t x = to_i64(a), y = to_i64(b);
    if (y == 0) return op == Op::kMod ? a : 0;
    if (y == -1 && x == INT64_MIN) return op == Op::kMod ? 0 : a;  // i64's INT_MIN / -1
    int64_t q = x / y, r = x % y;
    if (op == Op::kDiv) return static_cast<double>(q);
    bool adjust = r != 0 && ((r < 0) != (y < 0));
    if (op == Op::kMod) return static_cast<double>(adjust ? r + y : r);
    return static_cast<double>(adjust ? q - 1 : q);
  }
  static double compare(CompareOp op, double a, double b) {
    return compare_values(op, a, b) ? 1.0 : 0.0;
  }

  double cast(DType from, DType to, double v) const {
    if (to == DType::kBool) return v != 0;
    if (is_float(from) && is_int(to)) return float_to_int(to, v);
    return round_to(to, v);  // int<->int wraps (a bitcast), int->float and f32<->f64 round
  }

  // A break / continue unwinds the blocks up to its loop (jump_ set), which takes it.
  void block(const Block& b) {
    for (const Stmt& s : b.stmts) {
      stmt(s);
      if (jump_ != Op::kConst) return;
    }
  }
  Op take_jump() {
    Op j = jump_;
    jump_ = Op::kConst;
    return j;
  }

  DType type_of(ValueId id) const { return slot_types_[slot(id)]; }

  // A value and the bound on |device - reference| for it (precision.h).
  struct Bounded {
    double value = 0;
    double error = 0;
  };

  void stmt(const Stmt& s) {
    switch (op_info(s.op).family) {
      case OpFamily::kLeaf: return set(s, {leaf(s), 0});
      case OpFamily::kUnary: {
        double a = get(s.args[0]);
        double r = round_to(s.type, unary(s, a));
        return set(s, {r, result_error(s.op, s.type, a, err(s.args[0]), 0, 0, r)});
      }
      case OpFamily::kBinary: {
        double a = get(s.args[0]), b = get(s.args[1]);
        double r = round_to(s.type, binary(s, operand_type(s), a, b));
        return set(s, {r, result_error(s.op, s.type, a, err(s.args[0]), b, err(s.args[1]), r)});
      }
      case OpFamily::kCompare:  // taken as exact (precision.h)
        return set(s, {compare(compare_op(s.op), get(s.args[0]), get(s.args[1])), 0});
      case OpFamily::kSelect: {
        ValueId pick = get(s.args[0]) != 0 ? s.args[1] : s.args[2];
        return set(s, {get(pick), err(pick)});
      }
      case OpFamily::kCast: return set(s, cast_value(s));
      case OpFamily::kLocal: return local(s);
      case OpFamily::kArray: return array(s);
      case OpFamily::kControl: return control(s);
      case OpFamily::kStack: return stack(s);
    }
  }
  void set(const Stmt& s, Bounded v) {
    if (s.result == kNoValue) return;
    regs_[slot(s.result)] =
        (s.op == Op::kStackAlloc || s.op == Op::kAlloca) ? v.value : round_to(s.type, v.value);
    errs_[slot(s.result)] = v.error;
  }

  double leaf(const Stmt& s) const {
    switch (leaf_op(s.op)) {
      case LeafOp::kConst: return is_float(s.type) ? s.fimm : static_cast<double>(s.iimm);
      case LeafOp::kArg: return args_[s.param].scalar;
      case LeafOp::kShape: return args_[s.param].array->shape[s.dim];
    }
    return 0;
  }

  Bounded cast_value(const Stmt& s) const {
    DType from = type_of(s.args[0]);
    double a = get(s.args[0]), ea = err(s.args[0]);
    double r = round_to(s.type, cast(from, s.type, a));
    // A float -> int cast of an inexact value may truncate one unit either way.
    if (ea == 0 || s.type == DType::kBool) return {r, 0};  // to bool: taken as exact, like compares
    if (is_float(s.type)) return {r, result_error(Op::kCast, s.type, a, ea, 0, 0, r)};
    if (is_float(from)) {  // truncation is monotone: the interval's image
      return {r, std::max(std::fabs(cast(from, s.type, a - ea) - r),
                          std::fabs(cast(from, s.type, a + ea) - r))};
    }
    return {r, ea};  // i32 <-> u32
  }

  void local(const Stmt& s) {
    switch (local_op(s.op)) {
      case LocalOp::kAlloca: return set(s, {0, 0});
      case LocalOp::kLoadLocal: return set(s, {get(s.args[0]), err(s.args[0])});
      case LocalOp::kStoreLocal:
        regs_[slot(s.args[0])] = get(s.args[1]);
        errs_[slot(s.args[0])] = err(s.args[1]);
        return;
      // run() refuses kernels with shared arrays (they go with barriers)
      case LocalOp::kSharedAlloc:
      case LocalOp::kLoadShared:
      case LocalOp::kStoreShared: return;
    }
  }

  void array(const Stmt& s) {
    switch (array_op(s.op)) {
      case ArrayOp::kLoad: {
        int64_t i = linear(s, s.args.size());
        const HostArray& a = *args_[s.param].array;
        return set(s, {i < 0 ? 0 : a.data[i], i < 0 || a.error.empty() ? 0 : a.error[i]});
      }
      case ArrayOp::kAtomicMax: {
        int64_t i = linear(s, s.args.size() - 1);
        if (i < 0) return;
        HostArray& a = *args_[s.param].array;
        a.data[i] = std::max(a.data[i], get(s.args.back()));  // integers: exact
        return;
      }
      case ArrayOp::kStore:
      case ArrayOp::kAtomicAdd: return store(s);
    }
  }
  // store and atomic_add: the element and its error bound.
  void store(const Stmt& s) {
    int64_t i = linear(s, s.args.size() - 1);
    if (i < 0) return;
    HostArray& a = *args_[s.param].array;
    double v = get(s.args.back()), ev = err(s.args.back());
    if (a.error.size() != a.data.size()) a.error.assign(a.data.size(), 0.0);
    if (s.op == Op::kStore) {
      a.data[i] = round_to(a.dtype, v);
      a.error[i] = ev;
      return;
    }
    double old = a.data[i], sum = round_to(a.dtype, old + v);
    a.error[i] = result_error(Op::kAdd, a.dtype, old, a.error[i], v, ev, sum);
    a.data[i] = sum;
  }

  void control(const Stmt& s) {
    switch (control_op(s.op)) {
      case ControlOp::kFor: return for_loop(s);
      case ControlOp::kBreak:
      case ControlOp::kContinue: jump_ = s.op; return;
      case ControlOp::kIf: return block(s.blocks[get(s.args[0]) != 0 ? 0 : 1]);
      case ControlOp::kWhile: return while_loop(s);
      case ControlOp::kBarrier: return;  // run() refuses kernels with one
      case ControlOp::kPrint: print(s, 0); return;
      case ControlOp::kAssert:
        if (get(s.args[0]) == 0) {
          print(s, 1);
          flag_ = flag_ ? flag_ : abi::kErrorAssert;
        }
        return;
    }
  }
  // The line the device's print would write (abi/print_records.h), in the reference's order:
  // tasks, iterations and statements one after another.
  void print(const Stmt& s, size_t first) {
    std::vector<int64_t> index;
    for (ValueId i : task_indices(*task_)) index.push_back(to_i64(get(i)));
    std::vector<std::string> values;
    for (size_t a = first; a < s.args.size(); ++a)
      values.push_back(abi::print_value(type_of(s.args[a]), get(s.args[a])));
    prints_.push_back(abi::print_prefix(k_.name, task_->name, index) +
                      abi::print_text(source_location(static_cast<uint32_t>(s.iimm)), values));
  }
  void for_loop(const Stmt& s) {
    int64_t b = to_i64(get(s.args[0])), end = to_i64(get(s.args[1]));
    for (int64_t i = b; i < end; ++i) {
      regs_[slot(s.result)] = static_cast<double>(i);
      block(s.blocks[0]);
      if (take_jump() == Op::kBreak) break;
    }
  }
  void while_loop(const Stmt& s) {
    for (int64_t i = 0;; ++i) {
      if (i == kMaxWhileTrips) {
        if (runaway_ == kNoValue) runaway_ = s.result;
        return;
      }
      regs_[slot(s.result)] = static_cast<double>(i);
      block(s.blocks[0]);
      if (get(s.args[0]) == 0) return;
      block(s.blocks[1]);
      if (take_jump() == Op::kBreak) return;
    }
  }

  void stack(const Stmt& s) {
    if (s.op == Op::kStackAlloc) {
      stacks_.push_back(Stack{s.type, size(s.cap), {}, {}, {}, {}});
      return set(s, {static_cast<double>(stacks_.size() - 1), 0});
    }
    Stack& st = stacks_[static_cast<size_t>(get(s.args[0]))];
    switch (stack_op(s.op)) {
      case StackOp::kStackAlloc: return;  // above: it makes the stack the others use
      case StackOp::kStackPush: return push(st, get(s.args[1]), err(s.args[1]));
      case StackOp::kStackPop:
        if (!st.primal.empty()) {
          st.primal.pop_back(), st.adj.pop_back();
          st.primal_err.pop_back(), st.adj_err.pop_back();
        }
        return;
      case StackOp::kStackTop: return set(s, top(st.primal, st.primal_err));
      case StackOp::kStackTopAdj: return set(s, top(st.adj, st.adj_err));
      case StackOp::kStackAccAdj: {
        if (st.adj.empty()) return;
        double old = st.adj.back(), v = get(s.args[1]), sum = round_to(st.type, old + v);
        st.adj_err.back() =
            result_error(Op::kAdd, st.type, old, st.adj_err.back(), v, err(s.args[1]), sum);
        st.adj.back() = sum;
        return;
      }
    }
  }
  void push(Stack& st, double v, double ev) {
    if (static_cast<int64_t>(st.primal.size()) >= st.cap) {
      flag_ = flag_ ? flag_ : kErrorAdstackOverflow;
      return;
    }
    st.primal.push_back(v);
    st.adj.push_back(0);
    st.primal_err.push_back(ev);
    st.adj_err.push_back(0);
  }
  static Bounded top(const std::vector<double>& v, const std::vector<double>& e) {
    return {v.empty() ? 0 : v.back(), v.empty() ? 0 : e.back()};
  }

  DType operand_type(const Stmt& s) const { return type_of(s.args[0]); }

  const Kernel& k_;
  std::span<const HostArg> args_;
  std::unordered_map<ValueId, uint32_t> slots_;
  std::vector<DType> slot_types_;
  const Task* task_ = nullptr;       // the task running
  std::vector<std::string> prints_;  // what its print statements wrote
  std::vector<uint32_t> direct_;
  bool dense_ = false;
  std::vector<double> regs_;
  std::vector<double> errs_;  // per register: the bound on |device - reference| (precision.h)
  std::vector<Stack> stacks_;
  uint32_t flag_ = 0;
  // A while loop that does not end would hang the reference: it stops after this many trips
  // and evaluate() reports the loop (an error, not a result).
  static constexpr int64_t kMaxWhileTrips = int64_t{1} << 24;
  ValueId runaway_ = kNoValue;
  Op jump_ = Op::kConst;  // kBreak / kContinue while unwinding to the loop; kConst: none
};

}  // namespace

Result<EvalResult> evaluate(const Kernel& k, std::span<const HostArg> args) {
  Evaluator e(k, args);
  return e.run();
}

}  // namespace vkad::codegen
