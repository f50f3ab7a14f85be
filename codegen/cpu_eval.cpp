#include "codegen/cpu_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>


namespace vkad::codegen {

HostArray::HostArray(DType t, std::vector<uint32_t> s) : dtype(t), shape(std::move(s)) {
  size_t n = 1;
  for (uint32_t d : shape) n *= d;
  data.assign(n, 0.0);
}

double round_to(DType t, double v) {
  switch (t) {
    case DType::kF32: return static_cast<double>(static_cast<float>(v));
    case DType::kF64: return v;
    case DType::kI32: {
      if (!std::isfinite(v)) return 0;
      return static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(std::fmod(v, 4294967296.0)))));
    }
    case DType::kU32: {
      if (!std::isfinite(v)) return 0;
      int64_t i = static_cast<int64_t>(std::fmod(v, 4294967296.0));
      return static_cast<double>(static_cast<uint32_t>(i));
    }
    case DType::kI64: return v;
    case DType::kBool: return v != 0 ? 1 : 0;
  }
  return v;
}

namespace {

using runtime::kErrorAdstackOverflow;
using runtime::kErrorOutOfBounds;

// Transcendentals are computed in f32 for f64 too, as the emitter does.
double math1(Op op, double x) {
  float f = static_cast<float>(x);
  switch (op) {
    case Op::kExp: return std::exp(f);
    case Op::kLog: return std::log(f);
    case Op::kSin: return std::sin(f);
    case Op::kCos: return std::cos(f);
    case Op::kTan: return std::tan(f);
    case Op::kTanh: return std::tanh(f);
    case Op::kAsin: return std::asin(f);
    case Op::kAcos: return std::acos(f);
    default: return x;
  }
}

double float_to_int(DType to, double v) {
  if (std::isnan(v)) return 0;
  v = std::trunc(v);
  double lo = to == DType::kU32 ? 0.0 : -2147483648.0;
  double hi = to == DType::kU32 ? 4294967295.0 : 2147483647.0;
  return std::min(std::max(v, lo), hi);
}

struct Stack {
  DType type;
  int64_t cap = 0;
  std::vector<double> primal, adj;
};

class Evaluator {
 public:
  Evaluator(const Kernel& k, std::span<const HostArg> args) : k_(k), args_(args) {}

  Result<EvalResult> run() {
    VKAD_TRY(check_args());
    for (const Task& t : k_.tasks) number(t.index, DType::kI32), number_block(t.body);
    densify();
    regs_.assign(slot_types_.size(), 0.0);
    EvalResult r;
    for (const Task& t : k_.tasks) {
      flag_ = 0;
      int64_t b = bound(t.begin), e = bound(t.end);
      for (int64_t i = b; i < e; ++i) {
        stacks_.clear();
        regs_[slot(t.index)] = static_cast<double>(static_cast<int32_t>(i));
        block(t.body);
      }
      r.error_flags.push_back(flag_);
    }
    return r;
  }

 private:
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
    if (slots_.emplace(id, static_cast<uint32_t>(slot_types_.size())).second) slot_types_.push_back(t);
  }
  void number_block(const Block& b) {
    for (const Stmt& s : b.stmts) {
      if (s.result != kNoValue) number(s.result, s.type);
      for (const Block& c : s.blocks) number_block(c);
    }
  }
  void densify() {
    if (k_.next_id > (1u << 22)) return;
    direct_.assign(k_.next_id + 1, 0);
    for (const auto& [id, sl] : slots_) {
      if (id < direct_.size()) direct_[id] = sl;
    }
    dense_ = slots_.size() == 0 || std::all_of(slots_.begin(), slots_.end(), [&](const auto& kv) { return kv.first < direct_.size(); });
  }
  uint32_t slot(ValueId id) const { return dense_ ? direct_[id] : slots_.at(id); }
  double get(ValueId id) const { return regs_[slot(id)]; }

  int64_t bound(const RangeBound& b) const {
    switch (b.kind) {
      case RangeBound::Kind::kConstant: return b.value;
      case RangeBound::Kind::kScalarParam: return static_cast<int64_t>(args_[b.param].scalar);
      case RangeBound::Kind::kArrayDim: return args_[b.param].array->shape[b.dim];
    }
    return 0;
  }

  int64_t size(const SizeExpr& e) const {
    adstack::SizeInputs in{
        [&](uint32_t p) { return static_cast<int64_t>(args_[p].scalar); },
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
    switch (s.op) {
      case Op::kNeg: return -x;
      case Op::kNot: return x != 0 ? 0 : 1;
      case Op::kSqrt: return std::sqrt(x);
      case Op::kRsqrt: return 1.0 / std::sqrt(x);
      case Op::kExp: case Op::kLog: case Op::kSin: case Op::kCos: case Op::kTan:
      case Op::kTanh: case Op::kAsin: case Op::kAcos:
        return math1(s.op, x);
      case Op::kAbs: return std::fabs(x);
      case Op::kFloor: return std::floor(x);
      case Op::kCeil: return std::ceil(x);
      default: return 0;
    }
  }

  double binary(const Stmt& s, DType t, double a, double b) const {
    bool f = is_float(t);
    switch (s.op) {
      case Op::kAdd: return a + b;
      case Op::kSub: return a - b;
      case Op::kMul:
        if (!f) {  // exact wrap of a 32x32-bit product
          uint64_t p = static_cast<uint64_t>(static_cast<int64_t>(a)) * static_cast<uint64_t>(static_cast<int64_t>(b));
          return static_cast<double>(static_cast<uint32_t>(p));
        }
        return a * b;
      case Op::kDiv:
      case Op::kMod:
      case Op::kFloorDiv: {
        if (f) return a / b;
        int64_t x = static_cast<int64_t>(a), y = static_cast<int64_t>(b);
        if (y == 0) return 0;
        int64_t q = x / y, r = x % y;
        if (s.op == Op::kDiv) return static_cast<double>(q);
        bool adjust = r != 0 && ((r < 0) != (y < 0));
        if (s.op == Op::kMod) return static_cast<double>(adjust ? r + y : r);
        return static_cast<double>(adjust ? q - 1 : q);
      }
      case Op::kMin: return a < b ? a : b;
      case Op::kMax: return a > b ? a : b;
      case Op::kPow: return static_cast<double>(std::pow(static_cast<float>(a), static_cast<float>(b)));
      case Op::kAtan2: return static_cast<double>(std::atan2(static_cast<float>(a), static_cast<float>(b)));
      case Op::kAnd: return (a != 0 && b != 0) ? 1 : 0;
      case Op::kOr: return (a != 0 || b != 0) ? 1 : 0;
      case Op::kLt: return a < b;
      case Op::kLe: return a <= b;
      case Op::kGt: return a > b;
      case Op::kGe: return a >= b;
      case Op::kEq: return a == b;
      case Op::kNe: return a != b;
      default: return 0;
    }
  }

  double cast(DType from, DType to, double v) const {
    if (to == DType::kBool) return v != 0;
    if (is_float(from) && (to == DType::kI32 || to == DType::kU32)) return float_to_int(to, v);
    return round_to(to, v);  // int<->int wraps (a bitcast), int->float and f32<->f64 round
  }

  void block(const Block& b) {
    for (const Stmt& s : b.stmts) stmt(s);
  }

  DType type_of(ValueId id) const { return slot_types_[slot(id)]; }

  void stmt(const Stmt& s) {
    double r = 0;
    const OpInfo& info = op_info(s.op);
    switch (info.cls) {
      case OpClass::kLeaf:
        if (s.op == Op::kConst) r = is_float(s.type) ? s.fimm : static_cast<double>(s.iimm);
        else if (s.op == Op::kArg) r = args_[s.param].scalar;
        else r = args_[s.param].array->shape[s.dim];
        break;
      case OpClass::kUnary: r = unary(s, get(s.args[0])); break;
      case OpClass::kBinary:
      case OpClass::kCompare:
        r = binary(s, operand_type(s), get(s.args[0]), get(s.args[1]));
        break;
      case OpClass::kOther:
        switch (s.op) {
          case Op::kSelect: r = get(s.args[0]) != 0 ? get(s.args[1]) : get(s.args[2]); break;
          case Op::kCast: r = cast(type_of(s.args[0]), s.type, get(s.args[0])); break;
          case Op::kAlloca: r = 0; break;
          case Op::kLoadLocal: r = get(s.args[0]); break;
          case Op::kStoreLocal: regs_[slot(s.args[0])] = get(s.args[1]); return;
          case Op::kLoad: {
            int64_t i = linear(s, s.args.size());
            r = i < 0 ? 0 : args_[s.param].array->data[i];
            break;
          }
          case Op::kStore:
          case Op::kAtomicAdd: {
            int64_t i = linear(s, s.args.size() - 1);
            if (i < 0) return;
            HostArray& a = *args_[s.param].array;
            double v = get(s.args.back());
            a.data[i] = round_to(a.dtype, s.op == Op::kStore ? v : a.data[i] + v);
            return;
          }
          case Op::kFor: {
            int64_t b = static_cast<int64_t>(get(s.args[0])), e = static_cast<int64_t>(get(s.args[1]));
            for (int64_t i = b; i < e; ++i) {
              regs_[slot(s.result)] = static_cast<double>(i);
              block(s.blocks[0]);
            }
            return;
          }
          case Op::kIf: block(s.blocks[get(s.args[0]) != 0 ? 0 : 1]); return;
          case Op::kStackAlloc: {
            Stack st{s.type, size(s.cap), {}, {}};
            stacks_.push_back(std::move(st));
            r = static_cast<double>(stacks_.size() - 1);
            break;
          }
          case Op::kStackPush: {
            Stack& st = stacks_[static_cast<size_t>(get(s.args[0]))];
            if (static_cast<int64_t>(st.primal.size()) >= st.cap) {
              flag_ = flag_ ? flag_ : kErrorAdstackOverflow;
              return;
            }
            st.primal.push_back(get(s.args[1]));
            st.adj.push_back(0);
            return;
          }
          case Op::kStackPop: {
            Stack& st = stacks_[static_cast<size_t>(get(s.args[0]))];
            if (!st.primal.empty()) st.primal.pop_back(), st.adj.pop_back();
            return;
          }
          case Op::kStackTop:
          case Op::kStackTopAdj: {
            Stack& st = stacks_[static_cast<size_t>(get(s.args[0]))];
            const auto& v = s.op == Op::kStackTop ? st.primal : st.adj;
            r = v.empty() ? 0 : v.back();
            break;
          }
          case Op::kStackAccAdj: {
            Stack& st = stacks_[static_cast<size_t>(get(s.args[0]))];
            if (!st.adj.empty()) st.adj.back() = round_to(st.type, st.adj.back() + get(s.args[1]));
            return;
          }
          default: return;
        }
        break;
    }
    if (s.result == kNoValue) return;
    regs_[slot(s.result)] =
        (s.op == Op::kStackAlloc || s.op == Op::kAlloca) ? r : round_to(s.type, r);
  }

  DType operand_type(const Stmt& s) const { return type_of(s.args[0]); }

  const Kernel& k_;
  std::span<const HostArg> args_;
  std::unordered_map<ValueId, uint32_t> slots_;
  std::vector<DType> slot_types_;
  std::vector<uint32_t> direct_;
  bool dense_ = false;
  std::vector<double> regs_;
  std::vector<Stack> stacks_;
  uint32_t flag_ = 0;
};

}  // namespace

Result<EvalResult> evaluate(const Kernel& k, std::span<const HostArg> args) {
  Evaluator e(k, args);
  return e.run();
}

}  // namespace vkad::codegen
