#include "ir/builder.h"

#include <cmath>
#include <utility>

#include "ir/rewriter.h"

namespace vkad::codegen {

Scalar::operator Value() const {
  Stmt s;
  s.op = Op::kArg;
  s.param = param_;
  s.type = b_->kernel().params[param_].dtype;
  return b_->emit(std::move(s));
}

Dim::operator Value() const {
  Stmt s;
  s.op = Op::kShape;
  s.param = param_;
  s.dim = dim_;
  s.type = DType::kI32;
  return b_->emit(std::move(s));
}

namespace {
Stmt access(Op op, uint32_t param, const std::vector<Value>& idx) {
  Stmt s;
  s.op = op;
  s.param = param;
  for (const Value& v : idx) s.args.push_back(v.id());
  return s;
}
}  // namespace

Value Array::load(std::initializer_list<Value> idx) const { return load(std::vector<Value>(idx)); }
void Array::store(std::initializer_list<Value> idx, Value v) const {
  store(std::vector<Value>(idx), v);
}
void Array::atomic_add(std::initializer_list<Value> idx, Value v) const {
  atomic_add(std::vector<Value>(idx), v);
}

Value Array::load(const std::vector<Value>& idx) const {
  Stmt s = access(Op::kLoad, param_, idx);
  s.type = b_->kernel().params[param_].dtype;
  return b_->emit(std::move(s));
}

void Array::store(const std::vector<Value>& idx, Value v) const {
  Stmt s = access(Op::kStore, param_, idx);
  s.args.push_back(v.id());
  b_->emit(std::move(s));
}

void Array::atomic_add(const std::vector<Value>& idx, Value v) const {
  Stmt s = access(Op::kAtomicAdd, param_, idx);
  s.args.push_back(v.id());
  b_->emit(std::move(s));
}

Element Array::operator[](std::initializer_list<Value> idx) const {
  return Element(*this, std::vector<Value>(idx));
}

std::vector<Value> Array::component_index(std::initializer_list<Value> idx, int c) const {
  std::vector<Value> r(idx);
  uint32_t rank = b_->kernel().params[param_].rank;
  if (r.size() + 1 == rank) {
    r.push_back(b_->i32(c));  // a trailing dimension of extent N
  } else if (r.size() == rank && c > 0) {
    r.back() = r.back() + static_cast<double>(c);  // consecutive along the last dimension
  }
  // Any other count is left as it is: verify() reports the rank mismatch on the load / store.
  return r;
}

const Element& Element::operator=(Value v) const {
  a_.store(idx_, v);
  return *this;
}
const Element& Element::operator=(double v) const {
  Value l = a_.builder()->constant(a_.builder()->kernel().params[a_.param()].dtype, v);
  return *this = l;
}
const Element& Element::operator+=(Value v) const { return *this = load() + v; }
const Element& Element::operator-=(Value v) const { return *this = load() - v; }
const Element& Element::operator*=(Value v) const { return *this = load() * v; }
const Element& Element::operator/=(Value v) const { return *this = load() / v; }
const Element& Element::operator+=(double v) const { return *this = load() + v; }
const Element& Element::operator-=(double v) const { return *this = load() - v; }
const Element& Element::operator*=(double v) const { return *this = load() * v; }
const Element& Element::operator/=(double v) const { return *this = load() / v; }

Value Local::load() const {
  Stmt s;
  s.op = Op::kLoadLocal;
  s.type = type_;
  s.args = {id_};
  return b_->emit(std::move(s));
}

void Local::store(Value v) const {
  Stmt s;
  s.op = Op::kStoreLocal;
  s.args = {id_, v.id()};
  b_->emit(std::move(s));
}

const Local& Local::operator+=(Value v) const {
  store(load() + v);
  return *this;
}
const Local& Local::operator-=(Value v) const {
  store(load() - v);
  return *this;
}
const Local& Local::operator*=(Value v) const {
  store(load() * v);
  return *this;
}
const Local& Local::operator/=(Value v) const {
  store(load() / v);
  return *this;
}
const Local& Local::operator+=(double v) const {
  store(load() + v);
  return *this;
}
const Local& Local::operator-=(double v) const {
  store(load() - v);
  return *this;
}
const Local& Local::operator*=(double v) const {
  store(load() * v);
  return *this;
}
const Local& Local::operator/=(double v) const {
  store(load() / v);
  return *this;
}

KernelBuilder::KernelBuilder(std::string name) { k_.name = std::move(name); }

Scalar KernelBuilder::scalar(const std::string& name, DType t, bool needs_grad) {
  k_.params.push_back({name, ParamKind::kScalar, t, 0, needs_grad, false});
  return Scalar(this, static_cast<uint32_t>(k_.params.size() - 1));
}

Array KernelBuilder::ndarray(const std::string& name, DType t, uint32_t rank, ArrayFlags flags) {
  k_.params.push_back({name, ParamKind::kNdArray, t, rank, flags.needs_grad, flags.read_only});
  return Array(this, static_cast<uint32_t>(k_.params.size() - 1));
}

void KernelBuilder::make_task(const std::string& name, const std::vector<Range>& ranges,
                              uint32_t local_size,
                              const std::function<void(const std::vector<Value>&)>& body) {
  Task t;
  t.name = name;
  t.local_size = local_size;
  if (ranges.size() == 1 && ranges[0].begin.leaf && ranges[0].end.leaf) {
    t.begin = ranges[0].begin.rb;
    t.end = ranges[0].end.rb;
    t.index = k_.fresh();
  } else {
    for (const Range& r : ranges) t.dims.push_back({r.begin.expr, r.end.expr, k_.fresh()});
    t.index = t.dims[0].index;
  }
  k_.tasks.push_back(std::move(t));
  Task& task = k_.tasks.back();
  std::vector<Value> idx;
  for (ValueId id : task_indices(task)) idx.emplace_back(this, id, DType::kI32);
  blocks_.push_back(&task.body);
  body(idx);
  blocks_.pop_back();
}

void KernelBuilder::parallel_for(const std::string& name, Bound begin, Bound end,
                                 const std::function<void(Value)>& body, uint32_t local_size) {
  make_task(name, {Range(std::move(begin), std::move(end))}, local_size,
            [&](const std::vector<Value>& i) { body(i[0]); });
}

void KernelBuilder::parallel_for(const std::string& name, Range r0, Range r1,
                                 const std::function<void(Value, Value)>& body,
                                 uint32_t local_size) {
  make_task(name, {std::move(r0), std::move(r1)}, local_size,
            [&](const std::vector<Value>& i) { body(i[0], i[1]); });
}

void KernelBuilder::parallel_for(const std::string& name, Range r0, Range r1, Range r2,
                                 const std::function<void(Value, Value, Value)>& body,
                                 uint32_t local_size) {
  make_task(name, {std::move(r0), std::move(r1), std::move(r2)}, local_size,
            [&](const std::vector<Value>& i) { body(i[0], i[1], i[2]); });
}

Bound::Bound(SizeExpr e) : expr(std::move(e)) {
  switch (expr.kind) {
    case SizeExpr::Kind::kConst: rb = RangeBound::constant(expr.value); break;
    case SizeExpr::Kind::kScalar: rb = RangeBound::scalar(expr.param); break;
    case SizeExpr::Kind::kDim: rb = RangeBound::array_dim(expr.param, expr.dim); break;
    case SizeExpr::Kind::kAdd:
    case SizeExpr::Kind::kMul:
    case SizeExpr::Kind::kMax:
    case SizeExpr::Kind::kDiv:
    case SizeExpr::Kind::kNegScalar: leaf = false; break;
  }
}

Bound Bound::max(const Bound& a, const Bound& b) {
  // Not SizeExpr::combine: it folds max(x, 0) to x, which holds for sizes but not for a
  // bound such as max(n - 5, 0).
  SizeExpr e;
  e.kind = SizeExpr::Kind::kMax;
  e.operands = {a.expr, b.expr};
  return Bound(std::move(e));
}
Bound operator+(const Bound& a, const Bound& b) {
  return Bound(SizeExpr::combine(SizeExpr::Kind::kAdd, a.expr, b.expr));
}
Bound operator-(const Bound& a, const Bound& b) {
  SizeExpr neg = SizeExpr::combine(SizeExpr::Kind::kMul, b.expr, SizeExpr::constant(-1));
  return Bound(SizeExpr::combine(SizeExpr::Kind::kAdd, a.expr, std::move(neg)));
}
Bound operator*(const Bound& a, const Bound& b) {
  return Bound(SizeExpr::combine(SizeExpr::Kind::kMul, a.expr, b.expr));
}

void KernelBuilder::serial_for(const std::string& name, Bound begin, Bound end,
                               const std::function<void(Value)>& body) {
  parallel_for(name, begin, end, body);
  k_.tasks.back().serial = true;
}

Block* KernelBuilder::current() {
  if (blocks_.empty()) {
    // Statements outside any task have nowhere to go; a hidden task makes the misuse visible
    // to the verifier (an unnamed extra task) instead of crashing here.
    parallel_for("<outside any task>", 0, 0, [](Value) {});
    blocks_.push_back(&k_.tasks.back().body);
  }
  return blocks_.back();
}

Value KernelBuilder::emit(Stmt s) {
  Block* b = current();  // may add a task: before the Rewriter borrows the kernel
  const DType type = s.type;
  Rewriter rw(k_);
  rw.set_location(loc_);
  return Value(this, rw.emit(b->stmts, std::move(s)), type);
}

void KernelBuilder::for_range(Value begin, Value end, const std::function<void(Value)>& body) {
  Stmt s;
  s.op = Op::kFor;
  s.type = DType::kI32;
  s.args = {begin.id(), end.id()};
  s.blocks.resize(1);
  Value index = emit(std::move(s));
  blocks_.push_back(&current()->stmts.back().blocks[0]);
  body(index);
  blocks_.pop_back();
}

void KernelBuilder::for_range(Value begin, Value end, const SizeExpr& max_trip,
                              const std::function<void(Value)>& body) {
  for_range(begin, end, body);
  // The loop is the last statement of the block that was current before the body ran.
  Block* b = current();
  for (auto it = b->stmts.rbegin(); it != b->stmts.rend(); ++it) {
    if (it->op == Op::kFor) {
      it->cap = max_trip;
      it->has_cap = true;
      break;
    }
  }
}

void KernelBuilder::while_(const std::function<Value()>& cond, const std::function<void()>& body) {
  Stmt s;
  s.op = Op::kWhile;
  s.type = DType::kI32;
  s.blocks.resize(2);
  emit(std::move(s));
  // Stable while the callbacks run: they append to the loop's own blocks only.
  Stmt* st = &current()->stmts.back();
  blocks_.push_back(&st->blocks[0]);
  Value c = cond();
  blocks_.pop_back();
  st->args = {c.id()};
  blocks_.push_back(&st->blocks[1]);
  body();
  blocks_.pop_back();
}

void KernelBuilder::while_(const std::function<Value()>& cond, const SizeExpr& max_trip,
                           const std::function<void()>& body) {
  while_(cond, body);
  Block* b = current();
  for (auto it = b->stmts.rbegin(); it != b->stmts.rend(); ++it) {
    if (it->op == Op::kWhile) {
      it->cap = max_trip;
      it->has_cap = true;
      break;
    }
  }
}

void KernelBuilder::break_() {
  Stmt s;
  s.op = Op::kBreak;
  emit(std::move(s));
}

void KernelBuilder::print(std::string_view format, const std::vector<Value>& values) {
  Stmt s;
  s.op = Op::kPrint;
  s.iimm = intern_source_location(format);
  for (const Value& v : values) s.args.push_back(v.id());
  emit(std::move(s));
}

void KernelBuilder::assert_(Value cond, std::string_view message,
                            const std::vector<Value>& values) {
  Stmt s;
  s.op = Op::kAssert;
  s.iimm = intern_source_location(message);
  s.args.push_back(cond.id());
  for (const Value& v : values) s.args.push_back(v.id());
  emit(std::move(s));
}

void KernelBuilder::continue_() {
  Stmt s;
  s.op = Op::kContinue;
  emit(std::move(s));
}

void KernelBuilder::if_(Value cond, const std::function<void()>& then_body,
                        const std::function<void()>& else_body) {
  Stmt s;
  s.op = Op::kIf;
  s.type = DType::kBool;
  s.args = {cond.id()};
  s.blocks.resize(2);
  emit(std::move(s));
  Stmt& st = current()->stmts.back();
  blocks_.push_back(&st.blocks[0]);
  then_body();
  blocks_.pop_back();
  if (else_body) {
    blocks_.push_back(&st.blocks[1]);
    else_body();
    blocks_.pop_back();
  }
}

Local KernelBuilder::local(DType t) {
  Stmt s;
  s.op = Op::kAlloca;
  s.type = t;
  Value v = emit(std::move(s));
  return Local(this, v.id(), t);
}

Local KernelBuilder::local(Value init) {
  Local l = local(init.type());
  l.store(init);
  return l;
}

Value KernelBuilder::constant(DType t, double v) {
  Stmt s;
  s.op = Op::kConst;
  s.type = t;
  if (is_float(t)) {
    s.fimm = t == DType::kF32 ? static_cast<float>(v) : v;
  } else {
    // Saturating, NaN -> 0: a number past int64 stays defined here and verify() reports it
    // out of range for the type.
    double c = std::isnan(v) ? 0 : v <= -0x1p63 ? -0x1p63 : v >= 0x1p63 ? 0x1p63 - 1024 : v;
    s.iimm = t == DType::kBool ? (v != 0) : static_cast<int64_t>(c);
    s.fimm = static_cast<double>(s.iimm);
  }
  return emit(std::move(s));
}

Value KernelBuilder::unary(Op op, Value a) {
  Stmt s;
  s.op = op;
  s.type = a.type();
  s.args = {a.id()};
  return emit(std::move(s));
}

Value KernelBuilder::binary(Op op, Value a, Value b) {
  Stmt s;
  s.op = op;
  s.type = op_info(op).family == OpFamily::kCompare ? DType::kBool : a.type();
  s.args = {a.id(), b.id()};
  return emit(std::move(s));
}

Value KernelBuilder::cast(Value a, DType to) {
  Stmt s;
  s.op = Op::kCast;
  s.type = to;
  s.args = {a.id()};
  return emit(std::move(s));
}

Value KernelBuilder::select(Value c, Value a, Value b) {
  Stmt s;
  s.op = Op::kSelect;
  s.type = a.type();
  s.args = {c.id(), a.id(), b.id()};
  return emit(std::move(s));
}

Kernel KernelBuilder::finish() {
  blocks_.clear();
  return std::exchange(k_, Kernel{});
}

// ---------------------------------------------------------------- operators

namespace {
KernelBuilder* pick(Value a, Value b) { return a.builder() ? a.builder() : b.builder(); }
// A constant of `like`'s type, unless the type cannot hold `v` exactly (2.5 or 1e30 for an
// integer, 2 for a bool): then an f64 constant, so verify() names the statement whose
// operand types differ instead of the literal being truncated here.
Value lit(Value like, double v) {
  DType t = like.type();
  bool exact = true;
  if (is_int(t)) {
    exact = std::isfinite(v) && std::trunc(v) == v && std::fabs(v) <= 0x1p63;
  } else if (t == DType::kBool) {
    exact = v == 0 || v == 1;
  }
  return like.builder()->constant(exact ? t : DType::kF64, v);
}
}  // namespace

Value operator+(Value a, Value b) { return pick(a, b)->binary(Op::kAdd, a, b); }
Value operator-(Value a, Value b) { return pick(a, b)->binary(Op::kSub, a, b); }
Value operator*(Value a, Value b) { return pick(a, b)->binary(Op::kMul, a, b); }
Value operator/(Value a, Value b) { return pick(a, b)->binary(Op::kDiv, a, b); }
Value operator+(Value a, double b) { return a + lit(a, b); }
Value operator-(Value a, double b) { return a - lit(a, b); }
Value operator*(Value a, double b) { return a * lit(a, b); }
Value operator/(Value a, double b) { return a / lit(a, b); }
Value operator+(double a, Value b) { return lit(b, a) + b; }
Value operator-(double a, Value b) { return lit(b, a) - b; }
Value operator*(double a, Value b) { return lit(b, a) * b; }
Value operator/(double a, Value b) { return lit(b, a) / b; }
Value operator-(Value a) { return a.builder()->unary(Op::kNeg, a); }
Value operator<(Value a, Value b) { return pick(a, b)->binary(Op::kLt, a, b); }
Value operator<=(Value a, Value b) { return pick(a, b)->binary(Op::kLe, a, b); }
Value operator>(Value a, Value b) { return pick(a, b)->binary(Op::kGt, a, b); }
Value operator>=(Value a, Value b) { return pick(a, b)->binary(Op::kGe, a, b); }
Value operator<(Value a, double b) { return a < lit(a, b); }
Value operator<=(Value a, double b) { return a <= lit(a, b); }
Value operator>(Value a, double b) { return a > lit(a, b); }
Value operator>=(Value a, double b) { return a >= lit(a, b); }
Value operator<(double a, Value b) { return lit(b, a) < b; }
Value operator<=(double a, Value b) { return lit(b, a) <= b; }
Value operator>(double a, Value b) { return lit(b, a) > b; }
Value operator>=(double a, Value b) { return lit(b, a) >= b; }
Value operator==(Value a, Value b) { return pick(a, b)->binary(Op::kEq, a, b); }
Value operator!=(Value a, Value b) { return pick(a, b)->binary(Op::kNe, a, b); }
Value operator==(Value a, double b) { return a == lit(a, b); }
Value operator!=(Value a, double b) { return a != lit(a, b); }
Value operator==(double a, Value b) { return lit(b, a) == b; }
Value operator!=(double a, Value b) { return lit(b, a) != b; }
Value operator&&(Value a, Value b) { return pick(a, b)->binary(Op::kAnd, a, b); }
Value operator||(Value a, Value b) { return pick(a, b)->binary(Op::kOr, a, b); }
Value operator!(Value a) { return a.builder()->unary(Op::kNot, a); }
Value eq(Value a, Value b) { return pick(a, b)->binary(Op::kEq, a, b); }
Value ne(Value a, Value b) { return pick(a, b)->binary(Op::kNe, a, b); }
Value sqrt(Value a) { return a.builder()->unary(Op::kSqrt, a); }
Value rsqrt(Value a) { return a.builder()->unary(Op::kRsqrt, a); }
Value exp(Value a) { return a.builder()->unary(Op::kExp, a); }
Value log(Value a) { return a.builder()->unary(Op::kLog, a); }
Value sin(Value a) { return a.builder()->unary(Op::kSin, a); }
Value cos(Value a) { return a.builder()->unary(Op::kCos, a); }
Value tan(Value a) { return a.builder()->unary(Op::kTan, a); }
Value tanh(Value a) { return a.builder()->unary(Op::kTanh, a); }
Value asin(Value a) { return a.builder()->unary(Op::kAsin, a); }
Value acos(Value a) { return a.builder()->unary(Op::kAcos, a); }
Value abs(Value a) { return a.builder()->unary(Op::kAbs, a); }
Value floor(Value a) { return a.builder()->unary(Op::kFloor, a); }
Value ceil(Value a) { return a.builder()->unary(Op::kCeil, a); }
Value pow(Value a, Value b) { return pick(a, b)->binary(Op::kPow, a, b); }
Value atan2(Value a, Value b) { return pick(a, b)->binary(Op::kAtan2, a, b); }
Value min(Value a, Value b) { return pick(a, b)->binary(Op::kMin, a, b); }
Value max(Value a, Value b) { return pick(a, b)->binary(Op::kMax, a, b); }
Value mod(Value a, Value b) { return pick(a, b)->binary(Op::kMod, a, b); }
Value floordiv(Value a, Value b) { return pick(a, b)->binary(Op::kFloorDiv, a, b); }
Value select(Value c, Value a, Value b) { return pick(a, b)->select(c, a, b); }
Value cast(Value a, DType to) { return a.builder()->cast(a, to); }

}  // namespace vkad::codegen
