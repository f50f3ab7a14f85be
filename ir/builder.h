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
// Values are typed SSA handles; arithmetic operators, comparisons and the math functions below
// append statements to the block being built. Mixing a Value with a C++ number makes a
// constant of the Value's type (a number that an integer or bool Value cannot hold exactly,
// such as `i < 2.5`, becomes an f64 constant so that verify() reports the mismatch instead of
// the builder silently truncating it). Locals (`kb.local`) are the only mutable state; they
// read as Values and take compound updates (`acc += v`), as do ndarray elements
// (`y.at(i) += v`: a load, the operation, a store). Vec2/Vec3/Vec4 are small float vectors
// lowered to one scalar per component. The builder never fails: mistakes (type mismatches, a
// value used outside its loop) are reported by verify(), which compile() runs, naming the
// statement.
#pragma once

#include <array>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "ir/ir.h"

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

class Element;
template <int N>
class Vec;
template <int N>
class VecLocal;

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
  Value load(const std::vector<Value>& idx) const;
  void store(const std::vector<Value>& idx, Value v) const;
  void atomic_add(const std::vector<Value>& idx, Value v) const;
  // One element as an lvalue: `x.at(i, j) = v`, `x[{i}] += v`; it reads as a Value (a load).
  template <typename... I>
  Element at(I... idx) const;
  Element operator[](std::initializer_list<Value> idx) const;
  // N components, from one of two layouts chosen by the index count:
  //   rank indices:     N consecutive elements along the last dimension, from the last index
  //                     on (x[.., k], x[.., k + 1], ..., x[.., k + N - 1]), e.g. xyz packed
  //                     in a rank-1 array at [3 * i];
  //   rank - 1 indices: a trailing dimension of extent N (x[.., 0] .. x[.., N - 1]).
  // Each component is an ordinary load / store, bounds-checked as usual.
  template <int N>
  Vec<N> load_vec(std::initializer_list<Value> idx) const;
  template <int N>
  void store_vec(std::initializer_list<Value> idx, const Vec<N>& v) const;
  Dim dim(uint32_t d) const { return Dim(b_, param_, d); }
  uint32_t param() const { return param_; }
  KernelBuilder* builder() const { return b_; }
  // The element indices of component c of a load_vec / store_vec at `idx`.
  std::vector<Value> component_index(std::initializer_list<Value> idx, int c) const;

 private:
  KernelBuilder* b_;
  uint32_t param_;
};

// An ndarray element named by its indices; each read is a load and each assignment a store.
// Compound updates are a load, the operation and a store (not atomic: use atomic_add when
// several invocations update one element).
class Element {
 public:
  Element(Array a, std::vector<Value> idx) : a_(a), idx_(std::move(idx)) {}
  Element(const Element&) = default;
  operator Value() const { return a_.load(idx_); }  // NOLINT: reads like the element
  Value load() const { return a_.load(idx_); }
  const Element& operator=(Value v) const;
  const Element& operator=(const Element& o) const { return *this = o.load(); }  // NOLINT
  const Element& operator=(double v) const;
  const Element& operator+=(Value v) const;
  const Element& operator-=(Value v) const;
  const Element& operator*=(Value v) const;
  const Element& operator/=(Value v) const;
  const Element& operator+=(double v) const;
  const Element& operator-=(double v) const;
  const Element& operator*=(double v) const;
  const Element& operator/=(double v) const;

 private:
  Array a_;
  std::vector<Value> idx_;
};

template <typename... I>
Element Array::at(I... idx) const {
  return Element(*this, std::vector<Value>{Value(idx)...});
}

class Local {
 public:
  Local() = default;
  Local(KernelBuilder* b, ValueId id, DType t) : b_(b), id_(id), type_(t) {}
  Value load() const;
  void store(Value v) const;
  ValueId id() const { return id_; }
  DType type() const { return type_; }
  operator Value() const { return load(); }  // NOLINT: reads like the value it holds
  // load, op, store; a number becomes a constant of the local's type.
  const Local& operator+=(Value v) const;
  const Local& operator-=(Value v) const;
  const Local& operator*=(Value v) const;
  const Local& operator/=(Value v) const;
  const Local& operator+=(double v) const;
  const Local& operator-=(double v) const;
  const Local& operator*=(double v) const;
  const Local& operator/=(double v) const;

 private:
  KernelBuilder* b_ = nullptr;
  ValueId id_ = kNoValue;
  DType type_ = DType::kF32;
};

// A task bound: an integer constant, a scalar parameter, an ndarray extent, or sums,
// differences and products of those, written from an explicit Bound so that they do not
// build Values: `Bound(x.dim(0)) - 1`, `Bound(n) * m` (max(a, b) as Bound::max).
struct Bound {
  Bound(int64_t c) : rb(RangeBound::constant(c)), expr(SizeExpr::constant(c)) {}  // NOLINT
  Bound(int c) : Bound(static_cast<int64_t>(c)) {}                                // NOLINT
  Bound(const Scalar& s)
      : rb(RangeBound::scalar(s.param())), expr(SizeExpr::scalar(s.param())) {}  // NOLINT
  Bound(const Dim& d)                                                            // NOLINT
      : rb(RangeBound::array_dim(d.param(), d.dim())),
        expr(SizeExpr::array_dim(d.param(), d.dim())) {}
  explicit Bound(SizeExpr e);
  static Bound max(const Bound& a, const Bound& b);
  RangeBound rb;  // when `leaf`
  SizeExpr expr;
  bool leaf = true;  // a constant, scalar or extent (a 1-d task keeps it as a RangeBound)
};
Bound operator+(const Bound& a, const Bound& b);
Bound operator-(const Bound& a, const Bound& b);
Bound operator*(const Bound& a, const Bound& b);

// One dimension's [begin, end) of an N-d task: `{0, x.dim(0)}`.
struct Range {
  Range(Bound b, Bound e) : begin(std::move(b)), end(std::move(e)) {}
  Bound begin, end;
};

struct ArrayFlags {
  bool needs_grad = false;
  bool read_only = false;
};

class KernelBuilder {
 public:
  explicit KernelBuilder(std::string name);

  // `needs_grad` (f32 / f64 only): the adjoint produces d loss / d scalar in `<name>_grad`.
  Scalar scalar(const std::string& name, DType t, bool needs_grad = false);
  Array ndarray(const std::string& name, DType t, uint32_t rank, ArrayFlags flags = {});

  // A parallel task over [begin, end); `body` receives the i32 index.
  void parallel_for(const std::string& name, Bound begin, Bound end,
                    const std::function<void(Value)>& body, uint32_t local_size = 0);
  // Parallel tasks over 2 or 3 dimensions (the product of the ranges; a body receives one i32
  // index per dimension): `kb.parallel_for("t", {0, n}, {1, Bound(x.dim(1)) - 1}, body)`.
  void parallel_for(const std::string& name, Range r0, Range r1,
                    const std::function<void(Value, Value)>& body, uint32_t local_size = 0);
  void parallel_for(const std::string& name, Range r0, Range r1, Range r2,
                    const std::function<void(Value, Value, Value)>& body, uint32_t local_size = 0);
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
  // Debugging (docs/debugging.md). print: a line of `format` with each `{}` replaced by the
  // next value, written by the host when the launch retires (Session::set_print_sink).
  // assert_: where `cond` is false, the launch reports a kDeviceError naming `message`, the
  // statement, the first failing invocation's index and `values`. At most 16 values.
  void print(std::string_view format, const std::vector<Value>& values = {});
  void assert_(Value cond, std::string_view message, const std::vector<Value>& values = {});

  Local local(DType t);
  Local local(Value init);
  // A vector local: one local per component, zero, or initialised from `init`.
  template <int N>
  VecLocal<N> local_vec(DType t);
  template <int N>
  VecLocal<N> local(const Vec<N>& init);
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

  // Where the statements appended from now on came from in the DSL's program ("sim.py:12:5";
  // Stmt::loc): errors about them and about what passes derive from them -- an adjoint's
  // out-of-bounds access, an adstack overflow -- name it. "" stops naming one.
  void set_location(std::string_view where) { loc_ = intern_source_location(where); }

  // The kernel built so far; the builder is left empty.
  Kernel finish();
  Kernel& kernel() { return k_; }

 private:
  Block* current();
  // Appends a task over `ranges` (an N-d task unless it is one range of plain bounds) and
  // builds its body with the index values.
  void make_task(const std::string& name, const std::vector<Range>& ranges, uint32_t local_size,
                 const std::function<void(const std::vector<Value>&)>& body);
  Kernel k_;
  std::vector<Block*> blocks_;
  uint32_t loc_ = 0;
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
Value operator<=(Value a, double b);
Value operator>(Value a, double b);
Value operator>=(Value a, double b);
Value operator<(double a, Value b);
Value operator<=(double a, Value b);
Value operator>(double a, Value b);
Value operator>=(double a, Value b);
// == and != build a bool Value (eq / ne), they do not compare handles.
Value operator==(Value a, Value b);
Value operator!=(Value a, Value b);
Value operator==(Value a, double b);
Value operator!=(Value a, double b);
Value operator==(double a, Value b);
Value operator!=(double a, Value b);
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

// ---------------------------------------------------------------- small vectors
// Vec<N> (Vec2, Vec3, Vec4): N Values of one float dtype, operated on component-wise. There is
// no vector type in the IR: every operation appends one scalar statement per component, so
// reverse mode, the verifier and the emitter see ordinary scalar code.
template <int N>
class Vec {
  static_assert(N >= 2 && N <= 4, "Vec has 2 to 4 components");

 public:
  Vec() = default;
  // N components: Values, Locals or ndarray Elements.
  template <typename... C>
  requires(sizeof...(C) == N) Vec(C... c) : c_{Value(c)...} {}  // NOLINT: Vec3 v = {a, b, c}
  explicit Vec(const std::array<Value, N>& c) : c_(c) {}
  static Vec splat(Value v) {
    std::array<Value, N> c;
    c.fill(v);
    return Vec(c);
  }
  Value operator[](int i) const { return c_[i]; }
  Value x() const { return c_[0]; }
  Value y() const { return c_[1]; }
  Value z() const requires(N >= 3) { return c_[2]; }
  Value w() const requires(N >= 4) { return c_[3]; }
  DType type() const { return c_[0].type(); }
  const std::array<Value, N>& components() const { return c_; }

  // f applied to each component (or pair of components).
  template <typename F>
  Vec map(F f) const {
    std::array<Value, N> r;
    for (int i = 0; i < N; ++i) r[i] = f(c_[i]);
    return Vec(r);
  }
  template <typename F>
  Vec zip(const Vec& o, F f) const {
    std::array<Value, N> r;
    for (int i = 0; i < N; ++i) r[i] = f(c_[i], o.c_[i]);
    return Vec(r);
  }

 private:
  std::array<Value, N> c_;
};
using Vec2 = Vec<2>;
using Vec3 = Vec<3>;
using Vec4 = Vec<4>;

template <int N>
Vec<N> operator+(const Vec<N>& a, const Vec<N>& b) {
  return a.zip(b, [](Value x, Value y) { return x + y; });
}
template <int N>
Vec<N> operator-(const Vec<N>& a, const Vec<N>& b) {
  return a.zip(b, [](Value x, Value y) { return x - y; });
}
template <int N>
Vec<N> operator*(const Vec<N>& a, const Vec<N>& b) {
  return a.zip(b, [](Value x, Value y) { return x * y; });
}
template <int N>
Vec<N> operator/(const Vec<N>& a, const Vec<N>& b) {
  return a.zip(b, [](Value x, Value y) { return x / y; });
}
template <int N>
Vec<N> operator-(const Vec<N>& a) {
  return a.map([](Value x) { return -x; });
}
// Scalar broadcast: a Value (of the components' dtype) or a C++ number on either side.
template <int N>
Vec<N> operator+(const Vec<N>& a, Value s) {
  return a.map([&](Value x) { return x + s; });
}
template <int N>
Vec<N> operator-(const Vec<N>& a, Value s) {
  return a.map([&](Value x) { return x - s; });
}
template <int N>
Vec<N> operator*(const Vec<N>& a, Value s) {
  return a.map([&](Value x) { return x * s; });
}
template <int N>
Vec<N> operator/(const Vec<N>& a, Value s) {
  return a.map([&](Value x) { return x / s; });
}
template <int N>
Vec<N> operator+(Value s, const Vec<N>& a) {
  return a.map([&](Value x) { return s + x; });
}
template <int N>
Vec<N> operator-(Value s, const Vec<N>& a) {
  return a.map([&](Value x) { return s - x; });
}
template <int N>
Vec<N> operator*(Value s, const Vec<N>& a) {
  return a.map([&](Value x) { return s * x; });
}
template <int N>
Vec<N> operator/(Value s, const Vec<N>& a) {
  return a.map([&](Value x) { return s / x; });
}
template <int N>
Vec<N> operator+(const Vec<N>& a, double s) {
  return a.map([&](Value x) { return x + s; });
}
template <int N>
Vec<N> operator-(const Vec<N>& a, double s) {
  return a.map([&](Value x) { return x - s; });
}
template <int N>
Vec<N> operator*(const Vec<N>& a, double s) {
  return a.map([&](Value x) { return x * s; });
}
template <int N>
Vec<N> operator/(const Vec<N>& a, double s) {
  return a.map([&](Value x) { return x / s; });
}
template <int N>
Vec<N> operator+(double s, const Vec<N>& a) {
  return a.map([&](Value x) { return s + x; });
}
template <int N>
Vec<N> operator-(double s, const Vec<N>& a) {
  return a.map([&](Value x) { return s - x; });
}
template <int N>
Vec<N> operator*(double s, const Vec<N>& a) {
  return a.map([&](Value x) { return s * x; });
}
template <int N>
Vec<N> operator/(double s, const Vec<N>& a) {
  return a.map([&](Value x) { return s / x; });
}

template <int N>
Value dot(const Vec<N>& a, const Vec<N>& b) {
  Value r = a[0] * b[0];
  for (int i = 1; i < N; ++i) r = r + a[i] * b[i];
  return r;
}
template <int N>
Value length(const Vec<N>& a) {
  return sqrt(dot(a, a));
}
// a / length(a); a zero vector gives NaN components (0 / 0), as in GLSL.
template <int N>
Vec<N> normalize(const Vec<N>& a) {
  return a / length(a);
}
inline Vec3 cross(const Vec3& a, const Vec3& b) {
  return Vec3(a.y() * b.z() - a.z() * b.y(), a.z() * b.x() - a.x() * b.z(),
              a.x() * b.y() - a.y() * b.x());
}

// A vector local: one Local per component (so reverse mode checkpoints each like any local).
template <int N>
class VecLocal {
 public:
  explicit VecLocal(const std::array<Local, N>& l) : l_(l) {}
  Vec<N> load() const {
    std::array<Value, N> c;
    for (int i = 0; i < N; ++i) c[i] = l_[i].load();
    return Vec<N>(c);
  }
  operator Vec<N>() const { return load(); }  // NOLINT
  void store(const Vec<N>& v) const {
    for (int i = 0; i < N; ++i) l_[i].store(v[i]);
  }
  const Local& operator[](int i) const { return l_[i]; }
  const VecLocal& operator+=(const Vec<N>& v) const {
    store(load() + v);
    return *this;
  }
  const VecLocal& operator-=(const Vec<N>& v) const {
    store(load() - v);
    return *this;
  }
  const VecLocal& operator*=(const Vec<N>& v) const {
    store(load() * v);
    return *this;
  }
  const VecLocal& operator/=(const Vec<N>& v) const {
    store(load() / v);
    return *this;
  }
  const VecLocal& operator*=(Value s) const {
    store(load() * s);
    return *this;
  }
  const VecLocal& operator/=(Value s) const {
    store(load() / s);
    return *this;
  }
  const VecLocal& operator*=(double s) const {
    store(load() * s);
    return *this;
  }
  const VecLocal& operator/=(double s) const {
    store(load() / s);
    return *this;
  }

 private:
  std::array<Local, N> l_;
};

template <int N>
VecLocal<N> KernelBuilder::local_vec(DType t) {
  std::array<Local, N> l;
  for (int i = 0; i < N; ++i) l[i] = local(t);
  return VecLocal<N>(l);
}
template <int N>
VecLocal<N> KernelBuilder::local(const Vec<N>& init) {
  std::array<Local, N> l;
  for (int i = 0; i < N; ++i) l[i] = local(init[i]);
  return VecLocal<N>(l);
}

template <int N>
Vec<N> Array::load_vec(std::initializer_list<Value> idx) const {
  std::array<Value, N> c;
  for (int i = 0; i < N; ++i) c[i] = load(component_index(idx, i));
  return Vec<N>(c);
}
template <int N>
void Array::store_vec(std::initializer_list<Value> idx, const Vec<N>& v) const {
  for (int i = 0; i < N; ++i) store(component_index(idx, i), v[i]);
}

}  // namespace vkad::codegen
