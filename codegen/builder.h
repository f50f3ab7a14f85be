// KernelBuilder: the C++ API a DSL drives to build IR without knowing SPIR-V. Code written with
// it reads like the kernel it builds:
//
//   KernelBuilder kb("saxpy");
//   Scalar a = kb.scalar("a", DType::kF32);
//   Array x = kb.ndarray("x", DType::kF32, 1);
//   Array y = kb.ndarray("y", DType::kF32, 1);
//   kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
//     y.store({i}, a * x(i) + y(i));
//   });
//   Kernel k = kb.finish();
//
// Values are typed SSA handles; arithmetic operators and the math functions below append
// statements to the block being built. Mixing a Value with a C++ number makes a constant of
// the Value's type. Locals (`kb.local`) are the only mutable state. The builder never fails:
// mistakes (type mismatches, a value used outside its loop) are reported by verify(), which
// compile() runs, naming the statement.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "codegen/ir.h"

namespace vkad::codegen {

class KernelBuilder;

class Value {
 public:
  Value() = default;
  Value(KernelBuilder* b, ValueId id, DType t) : b_(b), id_(id), type_(t) {}
  ValueId id() const { return id_; }
  DType type() const { return type_; }
  KernelBuilder* builder() const { return b_; }

 private:
  KernelBuilder* b_ = nullptr;
  ValueId id_ = kNoValue;
  DType type_ = DType::kF32;
};

// A scalar parameter: reads as a Value (an `arg` statement where it is used), bounds a task.
class Scalar {
 public:
  Scalar(KernelBuilder* b, uint32_t p) : b_(b), param_(p) {}
  operator Value() const;  // NOLINT: reads like the parameter it is
  uint32_t param() const { return param_; }

 private:
  KernelBuilder* b_;
  uint32_t param_;
};

// One extent of an ndarray parameter: a task bound, or an i32 Value inside a body.
class Dim {
 public:
  Dim(KernelBuilder* b, uint32_t p, uint32_t d) : b_(b), param_(p), dim_(d) {}
  operator Value() const;  // NOLINT
  uint32_t param() const { return param_; }
  uint32_t dim() const { return dim_; }

 private:
  KernelBuilder* b_;
  uint32_t param_, dim_;
};

class Array {
 public:
  Array(KernelBuilder* b, uint32_t p) : b_(b), param_(p) {}
  template <typename... I>
  Value operator()(I... idx) const {
    return load({Value(idx)...});
  }
  Value load(std::initializer_list<Value> idx) const;
  void store(std::initializer_list<Value> idx, Value v) const;
  void atomic_add(std::initializer_list<Value> idx, Value v) const;
  Dim dim(uint32_t d) const { return Dim(b_, param_, d); }
  uint32_t param() const { return param_; }

 private:
  KernelBuilder* b_;
  uint32_t param_;
};

class Local {
 public:
  Local(KernelBuilder* b, ValueId id, DType t) : b_(b), id_(id), type_(t) {}
  Value load() const;
  void store(Value v) const;
  ValueId id() const { return id_; }

 private:
  KernelBuilder* b_;
  ValueId id_;
  DType type_;
};

// A task bound: an integer constant, a scalar parameter, or an ndarray extent.
struct Bound {
  Bound(int64_t c) : rb(RangeBound::constant(c)) {}                  // NOLINT
  Bound(int c) : rb(RangeBound::constant(c)) {}                      // NOLINT
  Bound(const Scalar& s) : rb(RangeBound::scalar(s.param())) {}      // NOLINT
  Bound(const Dim& d) : rb(RangeBound::array_dim(d.param(), d.dim())) {}  // NOLINT
  RangeBound rb;
};

struct ArrayFlags {
  bool needs_grad = false;
  bool read_only = false;
};

class KernelBuilder {
 public:
  explicit KernelBuilder(std::string name);

  Scalar scalar(const std::string& name, DType t);
  Array ndarray(const std::string& name, DType t, uint32_t rank, ArrayFlags flags = {});

  // A parallel task over [begin, end); `body` receives the i32 index.
  void parallel_for(const std::string& name, Bound begin, Bound end,
                    const std::function<void(Value)>& body, uint32_t local_size = 0);
  // A serial task: one invocation runs [begin, end) in order.
  void serial_for(const std::string& name, Bound begin, Bound end,
                  const std::function<void(Value)>& body);

  // A serial loop inside a body; bounds are i32 values (may depend on enclosing indices).
  void for_range(Value begin, Value end, const std::function<void(Value)>& body);
  // The same, stating the loop's maximum trip count for reverse mode (needed when the bounds
  // depend on ndarray contents; a launch that exceeds it reports an adstack overflow).
  void for_range(Value begin, Value end, const SizeExpr& max_trip,
                 const std::function<void(Value)>& body);
  void if_(Value cond, const std::function<void()>& then_body,
           const std::function<void()>& else_body = {});
  // `while (cond()) body();`: `cond` builds the test before every iteration and returns its
  // bool; it may read (ndarrays, locals) and compute but not store (the verifier says so).
  // Reverse mode needs a bound on the trip count: the max_trip overload states one (a launch
  // that exceeds it reports an adstack overflow); without it, make_adjoint_counted counts the
  // trips on the device (reverse_mode.h).
  void while_(const std::function<Value()>& cond, const std::function<void()>& body);
  void while_(const std::function<Value()>& cond, const SizeExpr& max_trip,
              const std::function<void()>& body);
  // Leave / go to the next iteration of the innermost loop. Each must end its block (e.g. the
  // body of an if_): verify() rejects statements after it.
  void break_();
  void continue_();

  Local local(DType t);
  Local local(Value init);
  Value constant(DType t, double v);
  Value f32(double v) { return constant(DType::kF32, v); }
  Value f64(double v) { return constant(DType::kF64, v); }
  Value i32(int64_t v) { return constant(DType::kI32, static_cast<double>(v)); }
  Value u32(int64_t v) { return constant(DType::kU32, static_cast<double>(v)); }
  Value boolean(bool v) { return constant(DType::kBool, v ? 1 : 0); }

  // Appends `s` (its result id assigned here) to the current block.
  Value emit(Stmt s);
  Value unary(Op op, Value a);
  Value binary(Op op, Value a, Value b);
  Value cast(Value a, DType to);
  Value select(Value c, Value a, Value b);

  // The kernel built so far; the builder is left empty.
  Kernel finish();
  Kernel& kernel() { return k_; }

 private:
  Block* current();
  Kernel k_;
  std::vector<Block*> blocks_;
};

// Arithmetic and math on Values; a C++ number on either side becomes a constant of the
// Value's type.
Value operator+(Value a, Value b);
Value operator-(Value a, Value b);
Value operator*(Value a, Value b);
Value operator/(Value a, Value b);
Value operator+(Value a, double b);
Value operator-(Value a, double b);
Value operator*(Value a, double b);
Value operator/(Value a, double b);
Value operator+(double a, Value b);
Value operator-(double a, Value b);
Value operator*(double a, Value b);
Value operator/(double a, Value b);
Value operator-(Value a);
Value operator<(Value a, Value b);
Value operator<=(Value a, Value b);
Value operator>(Value a, Value b);
Value operator>=(Value a, Value b);
Value operator<(Value a, double b);
Value operator>(Value a, double b);
Value operator&&(Value a, Value b);
Value operator||(Value a, Value b);
Value operator!(Value a);
Value eq(Value a, Value b);
Value ne(Value a, Value b);
Value sqrt(Value a);
Value rsqrt(Value a);
Value exp(Value a);
Value log(Value a);
Value sin(Value a);
Value cos(Value a);
Value tan(Value a);
Value tanh(Value a);
Value asin(Value a);
Value acos(Value a);
Value abs(Value a);
Value floor(Value a);
Value ceil(Value a);
Value pow(Value a, Value b);
Value atan2(Value a, Value b);
Value min(Value a, Value b);
Value max(Value a, Value b);
Value mod(Value a, Value b);
Value floordiv(Value a, Value b);
Value select(Value c, Value a, Value b);
Value cast(Value a, DType to);

}  // namespace vkad::codegen
