#include "support/ad_fuzz.h"

#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "ir/builder.h"

namespace vkad::testing {

using namespace vkad::codegen;  // NOLINT: the builder's operators read best unqualified

uint32_t env_or(const char* name, uint32_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<uint32_t>(std::strtoul(v, nullptr, 10)) : fallback;
}

namespace {

constexpr uint32_t kThreads = 3;  // x, y
constexpr uint32_t kW = 5, kTable = 6, kY2 = 4;
constexpr int kMaxDepth = 3;

class AdGenerator {
 public:
  explicit AdGenerator(uint32_t seed) : rng_(seed) {}

  AdFuzzCase make(uint32_t seed) {
    KernelBuilder kb("ad_fuzz_" + std::to_string(seed));
    b_ = &kb;
    Scalar n = kb.scalar("n", DType::kI32);
    Scalar s = kb.scalar("s", DType::kF64);
    Array x = kb.ndarray("x", DType::kF64, 1, {.needs_grad = true});
    Array w = kb.ndarray("w", DType::kF64, 1, {.needs_grad = true, .read_only = true});
    Array tab = kb.ndarray("tab", DType::kI32, 1, {.read_only = true});
    Array y = kb.ndarray("y", DType::kF64, 1, {.needs_grad = true});
    Array y2 = kb.ndarray("y2", DType::kF64, 1, {.needs_grad = true});
    n_ = &n, s_ = &s, x_ = &x, w_ = &w, tab_ = &tab, y2_ = &y2;
    kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
      i_ = i;
      ints_ = {i};
      floats_ = {};
      int nf = uniform(2, 4), ni = uniform(1, 3);
      for (int f = 0; f < nf; ++f) fl_.push_back(kb.local(DType::kF64));
      for (int j = 0; j < ni; ++j) il_.push_back(kb.local(DType::kI32));
      acc_ = std::make_unique<Local>(kb.local(DType::kF64));
      il_[0].store(i);
      fl_[0].store(x(i));
      for (int j = 1; j < ni; ++j) il_[j].store(iexpr());
      for (int f = 1; f < nf; ++f) fl_[f].store(fleaf());
      block(0, uniform(4, 8));
      Value out = acc_->load();
      for (const Local& l : fl_) {
        if (uniform(0, 3) > 0) out = out + l.load() * cst(0.5);
      }
      y.store({i}, out);
    });
    AdFuzzCase c;
    c.kernel = kb.finish();
    b_ = nullptr;
    c.args.scalars = {3, 0.6, 0, 0, 0, 0, 0};
    c.args.arrays.resize(7);
    c.args.arrays[2] = values(DType::kF64, kThreads, -1, 1);
    c.args.arrays[3] = values(DType::kF64, kW, -1, 1);
    c.args.arrays[4] = values(DType::kI32, kTable, 0, 3);
    c.args.arrays[5] = HostArray(DType::kF64, {kThreads});
    c.args.arrays[6] = HostArray(DType::kF64, {kY2});
    return c;
  }

 private:
  // Integer draws only: the same sequence on every standard library.
  int uniform(int lo, int hi) {
    return lo + static_cast<int>(rng_() % static_cast<uint32_t>(hi - lo + 1));
  }
  // 32 random bits: argument values never sit exactly on a kink (abs at 0, floor at an
  // integer), where central differences are symmetric and cannot tell the kink is there.
  double real(double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(rng_()) + 0.5) / 4294967296.0;
  }
  template <typename T>
  const T& any(const std::vector<T>& pool) {
    return pool[static_cast<size_t>(uniform(0, static_cast<int>(pool.size()) - 1))];
  }

  HostArray values(DType t, uint32_t n, double lo, double hi) {
    HostArray a(t, {n});
    for (double& v : a.data)
      v = is_float(t) ? real(lo, hi) : uniform(static_cast<int>(lo), static_cast<int>(hi));
    return a;
  }

  Value cst(double v) { return b_->f64(v); }
  Value icst(int v) { return b_->i32(v); }

  // --- floats: every value returned has |v| <= 2.
  Value fleaf() {
    switch (uniform(0, 8)) {
      case 0:
      case 1:
        if (!floats_.empty()) return any(floats_);
        [[fallthrough]];
      case 2:
      case 3: return any(fl_).load();  // a fresh load: reads whatever was stored last
      case 4: return cst(real(-1.5, 1.5));
      case 5: return w_->load({idx(w_->dim(0))});
      case 6: return x_->load({idx(x_->dim(0))});
      case 7: return cast(mod(iexpr(), icst(16)), DType::kF64) * cst(0.125);
      default: return Value(*s_);
    }
  }

  Value fexpr(int depth) {
    auto arg = [&] { return depth > 0 && uniform(0, 2) == 0 ? fexpr(depth - 1) : fleaf(); };
    Value a = arg();
    switch (uniform(0, 23)) {
      case 0: return (a + arg()) * cst(0.5);
      case 1: return (a - arg()) * cst(0.5);
      case 2: return a * arg() * cst(0.5);
      case 3: return -a;
      case 4: return sin(a);
      case 5: return cos(a);
      case 6: return tan(a * cst(0.5));
      case 7: return tanh(a);
      case 8: return exp(a * cst(0.25));
      case 9: return log(a * a + cst(1));
      case 10: return sqrt(a * a * cst(0.25) + cst(0.5));
      case 11: return rsqrt(a * a + cst(0.5));
      case 12: return asin(a * cst(0.45));
      case 13: return acos(a * cst(0.45)) - cst(1.5);
      case 14: return abs(a);
      case 15: return floor(a) * cst(0.5);
      case 16: return ceil(a) * cst(0.5);
      case 17: {
        Value c = arg();
        return a / (c * c + cst(1));
      }
      case 18: return min(a, arg());
      case 19: return max(a, arg());
      case 20: return pow(a * a * cst(0.25) + cst(0.5), arg() * cst(0.5));
      case 21: return atan2(a, arg() + cst(2.5));
      case 22: {
        Value c = bexpr();
        return select(c, a, arg());
      }
      default: {
        Value f = cast(a, DType::kF32);
        return cast(f * f * b_->f32(0.5), DType::kF64);
      }
    }
  }

  // --- integers: every value returned lies in [0, 100).
  Value ileaf() {
    switch (uniform(0, 6)) {
      case 0:
      case 1: return any(ints_);
      case 2:
      case 3: return any(il_).load();
      case 4: return icst(uniform(0, 9));
      case 5: return tab_->load({idx(tab_->dim(0))});
      default: return i_;
    }
  }

  Value iexpr() {
    Value a = ileaf();
    Value m = icst(uniform(5, 97));
    switch (uniform(0, 6)) {
      case 0: return mod(a + ileaf(), m);
      case 1: {
        Value f = icst(uniform(2, 7));
        return mod(a * f + ileaf(), m);
      }
      case 2: return mod(a - ileaf(), m);  // mod rounds toward -inf: never negative
      case 3: return floordiv(a, icst(uniform(1, 3)));
      case 4: return min(a, ileaf());
      case 5: return max(a, ileaf());
      default:  // from a float: a jump wherever floor crosses an integer
        return mod(cast(floor(fleaf() * cst(2) + cst(4)), DType::kI32), m);
    }
  }

  // An index into an ndarray whose extent is `extent`: always in bounds.
  Value idx(Value extent) { return mod(iexpr(), extent); }

  Value bexpr() {
    switch (uniform(0, 5)) {
      case 0: {
        Value v = any(fl_).load();
        return v > cst(real(-0.5, 0.5));
      }                                                           // on a carried float
      case 1: return eq(mod(any(il_).load(), icst(2)), icst(0));  // on a carried integer
      case 2: {
        Value a = ileaf();
        return a < ileaf();
      }
      case 3: {
        Value a = fexpr(0);
        return a < fleaf();
      }
      case 4: {
        Value a = ileaf();
        Value c = a < icst(uniform(1, 40));
        return c && (fleaf() > cst(0));
      }
      default: return !(eq(mod(ileaf(), icst(3)), icst(1)));
    }
  }

  // --- statements
  void block(int depth, int count) {
    auto saved_f = floats_;
    auto saved_i = ints_;
    size_t locals = fl_.size();
    // Sometimes a local declared in this block (in a branch or a loop body), carried like the
    // others while the block lasts.
    if (depth > 0 && uniform(0, 3) == 0) {
      Value init = fexpr(1);
      fl_.push_back(b_->local(init));
    }
    for (int k = 0; k < count; ++k) stmt(depth);
    fl_.erase(fl_.begin() + static_cast<std::ptrdiff_t>(locals), fl_.end());
    floats_ = saved_f;  // values defined in this block are not visible after it
    ints_ = saved_i;
  }

  void stmt(int depth) {
    int kind = uniform(0, 14);
    if (depth >= kMaxDepth && kind >= 12) kind = uniform(0, 11);
    // Inside a loop body, sometimes a branch that ends in break or continue.
    if (loop_depth_ > 0 && kind == 9 && uniform(0, 1) == 0) {
      bool brk = uniform(0, 1) == 0;
      b_->if_(bexpr(), [&] {
        if (uniform(0, 1) == 0) block(depth + 1, uniform(1, 2));
        if (brk)
          b_->break_();
        else
          b_->continue_();
      });
      return;
    }
    switch (kind) {
      case 0:
      case 1: any(fl_).store(fexpr(2)); return;
      case 2: {  // a damped update of a carried float
        const Local& l = any(fl_);
        l.store((l.load() + fexpr(1)) * cst(0.5));
        return;
      }
      case 3: {  // swap two floats through a temporary (a read after a write)
        const Local& a = any(fl_);
        const Local& c = any(fl_);
        Value t = a.load();
        a.store(uniform(0, 1) ? c.load() : (c.load() + t) * cst(0.5));
        c.store(t);
        return;
      }
      case 4: {  // rotate every float local
        Value first = fl_[0].load();
        for (size_t j = 0; j + 1 < fl_.size(); ++j) fl_[j].store(fl_[j + 1].load());
        fl_.back().store(first);
        return;
      }
      case 5: any(il_).store(iexpr()); return;
      case 6: {  // swap two integer locals, one advancing
        const Local& a = any(il_);
        const Local& c = any(il_);
        Value t = a.load();
        a.store(c.load());
        Value step = icst(uniform(1, 5));
        c.store(mod(t + step, icst(uniform(5, 31))));
        return;
      }
      case 7:
        acc_->store(acc_->load() + fexpr(1));  // linear: needs no checkpoint
        return;
      case 8: {
        Value at = idx(y2_->dim(0));
        y2_->atomic_add({at}, fexpr(1));
        return;
      }
      case 9: floats_.push_back(fexpr(2)); return;
      case 10: ints_.push_back(iexpr()); return;
      case 11: {  // a float read through an index computed from carried integers
        const Local& l = any(fl_);
        Value wv = w_->load({idx(w_->dim(0))});
        Value xv = x_->load({idx(x_->dim(0))});
        l.store(sin(l.load() * wv + xv * cst(0.5)));
        return;
      }
      case 12:
      case 13: {
        Value c = bexpr();
        if (uniform(0, 1)) {
          b_->if_(c, [&] { block(depth + 1, uniform(1, 4)); });
        } else {
          b_->if_(
              c, [&] { block(depth + 1, uniform(1, 3)); },
              [&] { block(depth + 1, uniform(1, 3)); });
        }
        return;
      }
      default: loop(depth); return;
    }
  }

  void loop(int depth) {
    auto body = [&](Value k) {
      auto saved = indices_;
      indices_.push_back(k);
      ints_.push_back(k);
      ++loop_depth_;
      block(depth + 1, uniform(2, 5));
      --loop_depth_;
      ints_.pop_back();
      indices_ = saved;
    };
    int shape = uniform(0, 5);
    if ((shape == 2 || shape == 3) && indices_.empty()) shape = 0;
    if (shape == 5) {
      // A while loop: a carried counter below a bound read from the table (0..3), sometimes
      // also on a carried float, so trip counts differ per thread and move with x.
      Local count = b_->local(icst(0));
      Value lim = tab_->load({idx(tab_->dim(0))});
      bool on_float = uniform(0, 1) == 1;
      b_->while_(
          [&] {
            Value c = count.load() < lim;
            if (on_float) c = c && (any(fl_).load() > cst(real(-0.5, 0.5)));
            return c;
          },
          SizeExpr::constant(3),
          [&] {
            count.store(count.load() + icst(1));
            ++loop_depth_;
            block(depth + 1, uniform(2, 5));
            --loop_depth_;
          });
      return;
    }
    switch (shape) {
      case 0: b_->for_range(icst(0), icst(uniform(1, 3)), body); return;
      case 1: b_->for_range(icst(0), Value(*n_), body); return;
      case 2: b_->for_range(indices_.back(), icst(3), body); return;            // triangular
      case 3: b_->for_range(icst(0), indices_.back() + icst(1), body); return;  // triangular
      default:  // bounds from ndarray contents: the DSL states the bound
        b_->for_range(icst(0), tab_->load({idx(tab_->dim(0))}), SizeExpr::constant(3), body);
        return;
    }
  }

  std::mt19937 rng_;
  KernelBuilder* b_ = nullptr;
  Scalar* n_ = nullptr;
  Scalar* s_ = nullptr;
  Array *x_ = nullptr, *w_ = nullptr, *tab_ = nullptr, *y2_ = nullptr;
  Value i_;
  std::vector<Local> fl_, il_;
  std::unique_ptr<Local> acc_;
  std::vector<Value> floats_, ints_, indices_;
  int loop_depth_ = 0;  // loop bodies around the statement being generated (if bodies too)
};

}  // namespace

AdFuzzCase random_ad_kernel(uint32_t seed) {
  AdGenerator g(seed);
  return g.make(seed);
}

}  // namespace vkad::testing
