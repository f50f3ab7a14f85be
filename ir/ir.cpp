#include "ir/ir.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <deque>
#include <mutex>
#include <string_view>
#include <unordered_map>

namespace vkad::codegen {

namespace {
// Indexed by Op, in ops.def's order; `index` is filled in below.
constexpr std::array<OpInfo, kNumOps> kRows = {{
#define VKAD_OP(family, name, text, has_result, operands, blocks, rule) \
  {text, OpFamily::k##family, 0, has_result, Operands::operands, blocks},
#include "ir/ops.def"
}};

// Each op's position among the earlier rows of its family: the family enums list their
// members in the same order (ir.h), so this is the member's value.
constexpr std::array<OpInfo, kNumOps> with_family_indices(std::array<OpInfo, kNumOps> rows) {
  std::array<uint8_t, static_cast<size_t>(OpFamily::kStack) + 1> next{};
  for (OpInfo& r : rows) r.index = next[static_cast<size_t>(r.family)]++;
  return rows;
}
constexpr std::array<OpInfo, kNumOps> kOps = with_family_indices(kRows);

template <class FamilyOp>
FamilyOp member(Op op, [[maybe_unused]] OpFamily family) {
  const OpInfo& info = kOps[static_cast<size_t>(op)];
  assert(info.family == family);
  return static_cast<FamilyOp>(info.index);
}
}  // namespace

LeafOp leaf_op(Op op) { return member<LeafOp>(op, OpFamily::kLeaf); }
UnaryOp unary_op(Op op) { return member<UnaryOp>(op, OpFamily::kUnary); }
BinaryOp binary_op(Op op) { return member<BinaryOp>(op, OpFamily::kBinary); }
CompareOp compare_op(Op op) { return member<CompareOp>(op, OpFamily::kCompare); }
LocalOp local_op(Op op) { return member<LocalOp>(op, OpFamily::kLocal); }
ArrayOp array_op(Op op) { return member<ArrayOp>(op, OpFamily::kArray); }
ControlOp control_op(Op op) { return member<ControlOp>(op, OpFamily::kControl); }
StackOp stack_op(Op op) { return member<StackOp>(op, OpFamily::kStack); }

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
  return t == DType::kF32   ? adstack::Heap::kF32
         : t == DType::kF64 ? adstack::Heap::kF64
                            : adstack::Heap::kInt;
}

bool is_int(DType t) { return t == DType::kI32 || t == DType::kU32 || t == DType::kI64; }

bool is_float_math(Op op) { return op_info(op).operands == Operands::kFloat; }

bool is_pure_value(Op op) {
  switch (op_info(op).family) {
    case OpFamily::kLeaf:
    case OpFamily::kUnary:
    case OpFamily::kBinary:
    case OpFamily::kCompare:
    case OpFamily::kSelect:
    case OpFamily::kCast: return true;
    case OpFamily::kLocal:
    case OpFamily::kArray:
    case OpFamily::kControl:
    case OpFamily::kStack: return false;
  }
  return false;
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
    auto it =
        std::find_if(t.dims.begin(), t.dims.end(), [&](const TaskDim& d) { return d.index == v; });
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

namespace {
// Append-only: a deque keeps each text where it is while later ones are added.
struct LocationTable {
  std::mutex mu;
  std::deque<std::string> texts;  // id - 1
  std::unordered_map<std::string, uint32_t> ids;
};
LocationTable& locations() {
  static LocationTable* t = new LocationTable;  // never destroyed: errors may be built at exit
  return *t;
}
}  // namespace

uint32_t intern_source_location(std::string_view text) {
  if (text.empty()) return 0;
  std::string clean(text);
  for (char& c : clean) {
    if (c == '"' || c == '\\') c = '\'';
    if (c == '\n' || c == '\r') c = ' ';
  }
  LocationTable& t = locations();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.ids.find(clean);
  if (it != t.ids.end()) return it->second;
  t.texts.push_back(clean);
  const auto id = static_cast<uint32_t>(t.texts.size());
  t.ids.emplace(std::move(clean), id);
  return id;
}

std::string source_location(uint32_t id) {
  if (id == 0) return {};
  LocationTable& t = locations();
  std::lock_guard<std::mutex> lock(t.mu);
  return id <= t.texts.size() ? t.texts[id - 1] : std::string();
}

}  // namespace vkad::codegen
