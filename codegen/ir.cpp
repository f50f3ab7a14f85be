#include "codegen/ir.h"

#include <algorithm>
#include <array>
#include <string_view>

namespace vkad::codegen {

namespace {
// Indexed by Op; the order must match the enum.
constexpr std::array<OpInfo, static_cast<size_t>(Op::kBarrier) + 1> kOps = {{
    {"const", OpClass::kLeaf, true},          {"arg", OpClass::kLeaf, true},
    {"shape", OpClass::kLeaf, true},          {"neg", OpClass::kUnary, true},
    {"not", OpClass::kUnary, true},           {"sqrt", OpClass::kUnary, true},
    {"rsqrt", OpClass::kUnary, true},         {"exp", OpClass::kUnary, true},
    {"log", OpClass::kUnary, true},           {"sin", OpClass::kUnary, true},
    {"cos", OpClass::kUnary, true},           {"tan", OpClass::kUnary, true},
    {"tanh", OpClass::kUnary, true},          {"asin", OpClass::kUnary, true},
    {"acos", OpClass::kUnary, true},          {"abs", OpClass::kUnary, true},
    {"floor", OpClass::kUnary, true},         {"ceil", OpClass::kUnary, true},
    {"add", OpClass::kBinary, true},          {"sub", OpClass::kBinary, true},
    {"mul", OpClass::kBinary, true},          {"div", OpClass::kBinary, true},
    {"mod", OpClass::kBinary, true},          {"floordiv", OpClass::kBinary, true},
    {"min", OpClass::kBinary, true},          {"max", OpClass::kBinary, true},
    {"pow", OpClass::kBinary, true},          {"atan2", OpClass::kBinary, true},
    {"and", OpClass::kBinary, true},          {"or", OpClass::kBinary, true},
    {"lt", OpClass::kCompare, true},          {"le", OpClass::kCompare, true},
    {"gt", OpClass::kCompare, true},          {"ge", OpClass::kCompare, true},
    {"eq", OpClass::kCompare, true},          {"ne", OpClass::kCompare, true},
    {"select", OpClass::kOther, true},        {"cast", OpClass::kOther, true},
    {"alloca", OpClass::kOther, true},        {"load_local", OpClass::kOther, true},
    {"store_local", OpClass::kOther, false},  {"load", OpClass::kOther, true},
    {"store", OpClass::kOther, false},        {"atomic_add", OpClass::kOther, false},
    {"for", OpClass::kOther, true},           {"if", OpClass::kOther, false},
    {"while", OpClass::kOther, true},         {"break", OpClass::kOther, false},
    {"continue", OpClass::kOther, false},     {"atomic_max", OpClass::kOther, false},
    {"stack_alloc", OpClass::kOther, true},   {"stack_push", OpClass::kOther, false},
    {"stack_pop", OpClass::kOther, false},    {"stack_top", OpClass::kOther, true},
    {"stack_top_adj", OpClass::kOther, true}, {"stack_acc_adj", OpClass::kOther, false},
    {"barrier", OpClass::kOther, false},
}};
}  // namespace

const OpInfo& op_info(Op op) { return kOps[static_cast<size_t>(op)]; }

bool contains_op(const Block& b, Op op) {
  for (const Stmt& s : b.stmts) {
    if (s.op == op) return true;
    for (const Block& c : s.blocks) {
      if (contains_op(c, op)) return true;
    }
  }
  return false;
}

bool op_from_name(const std::string& name, Op* out) {
  for (size_t i = 0; i < kOps.size(); ++i) {
    if (name == kOps[i].name) {
      *out = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF64; }
adstack::Heap stack_heap(DType t) {
  return t == DType::kF32 ? adstack::Heap::kF32 : t == DType::kF64 ? adstack::Heap::kF64 : adstack::Heap::kInt;
}

bool is_int(DType t) { return t == DType::kI32 || t == DType::kU32 || t == DType::kI64; }

bool is_float_math(Op op) {
  switch (op) {
    case Op::kSqrt: case Op::kRsqrt: case Op::kExp: case Op::kLog: case Op::kSin:
    case Op::kCos: case Op::kTan: case Op::kTanh: case Op::kAsin: case Op::kAcos:
    case Op::kFloor: case Op::kCeil: case Op::kPow: case Op::kAtan2:
      return true;
    default:
      return false;
  }
}

std::vector<ValueId> task_indices(const Task& t) {
  if (t.dims.empty()) return {t.index};
  std::vector<ValueId> r;
  for (const TaskDim& d : t.dims) r.push_back(d.index);
  return r;
}

SizeExpr bound_expr(const RangeBound& b) {
  switch (b.kind) {
    case RangeBound::Kind::kConstant: return SizeExpr::constant(b.value);
    case RangeBound::Kind::kScalarParam: return SizeExpr::scalar(b.param);
    case RangeBound::Kind::kArrayDim: return SizeExpr::array_dim(b.param, b.dim);
  }
  return SizeExpr::constant(0);
}

bool task_index_bounds(const Task& t, ValueId v, int64_t* lo, SizeExpr* up) {
  const SizeExpr* begin = nullptr;
  SizeExpr b, e;
  if (t.dims.empty()) {
    if (v != t.index) return false;
    b = bound_expr(t.begin), e = bound_expr(t.end);
  } else {
    auto it = std::find_if(t.dims.begin(), t.dims.end(), [&](const TaskDim& d) { return d.index == v; });
    if (it == t.dims.end()) return false;
    b = it->begin, e = it->end;
  }
  begin = &b;
  // The runtime refuses a negative begin, so 0 bounds every index from below.
  *lo = begin->kind == SizeExpr::Kind::kConst ? std::max<int64_t>(begin->value, 0) : 0;
  *up = SizeExpr::combine(SizeExpr::Kind::kAdd, e, SizeExpr::constant(-1));
  return true;
}

int Kernel::find_param(const std::string& n) const {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == n) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace vkad::codegen
