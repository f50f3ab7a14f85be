// Property test: randomly generated well-typed kernels (bounded size) are verified, compiled,
// validated and run on the device, and must match the CPU reference. Seeded and reproducible:
// VKAD_PROPERTY_SEED (default 1) and VKAD_PROPERTY_COUNT (default 300) pick the kernels; a
// failure prints the seed and the kernel's text.
//
// The generator keeps float computations well-conditioned so the reference's error bounds
// (reference/precision.h) stay meaningful: floats go only through continuous ops and are
// clamped to [-2, 2] after arithmetic; every discontinuity (branches, loop trip counts,
// indices, comparisons) is computed from integers, which must match exactly.
//
// It also reaches every input for which SPIR-V leaves an operation undefined and the IR
// defines it (docs/reference.md, "Operation semantics"), so an emitter/evaluator mismatch
// there fails on any driver: integer div/mod/floordiv by run-time divisors that are often 0
// or -1 with INT_MIN around (the integer input holds 0, -1, INT_MIN and INT_MAX at fixed
// places), wrapping products and sums, and float -> i32/u32 casts of exact floats scaled far
// out of range or negative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>

#include "gpu/kernel_harness.h"
#include "ir/builder.h"
#include "ir/text.h"
#include "ir/verifier.h"

namespace vkad::testing {
namespace {

using namespace vkad::codegen;  // NOLINT: the builder's operators read best unqualified

class Generator {
 public:
  explicit Generator(uint32_t seed) : rng_(seed) {}

  Kernel make(uint32_t seed) {
    KernelBuilder kb("random_" + std::to_string(seed));
    b_ = &kb;
    Scalar s = kb.scalar("s", DType::kF32);
    Scalar k = kb.scalar("k", DType::kI32);
    Array x = kb.ndarray("x", DType::kF32, 1, {.read_only = true});
    Array xi = kb.ndarray("xi", DType::kI32, 1, {.read_only = true});
    Array out = kb.ndarray("out", DType::kF32, 1);
    Array outi = kb.ndarray("outi", DType::kI32, 1);
    Array hist = kb.ndarray("hist", DType::kI32, 1);
    kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
      Value xv = x(i);
      floats_ = {xv, Value(s), kb.f32(pick(-1.5, 1.5))};
      exact_floats_ = {xv, Value(s)};
      ints_ = {i, Value(k), xi(i), kb.i32(static_cast<int>(pick(-5, 5))), kb.i32(edge_int())};
      bools_ = {};
      depth_ = 0;
      body(uniform(8, 20));
      out.store({i}, any(floats_));
      outi.store({i}, any(ints_));
      hist.atomic_add({mod(any(ints_), kb.i32(4))}, any(ints_));
    });
    b_ = nullptr;
    return kb.finish();
  }

 private:
  double pick(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  Value any(const std::vector<Value>& pool) {
    return pool[uniform(0, static_cast<int>(pool.size()) - 1)];
  }
  Value clamp(Value v) { return max(min(v, b_->f32(2)), b_->f32(-2)); }

  Value float_stmt() {
    Value a = any(floats_), c = any(floats_);
    switch (uniform(0, 11)) {
      case 0: return clamp(a + c);
      case 1: return clamp(a - c);
      case 2: return clamp(a * c);
      case 3: return min(a, c);
      case 4: return max(a, c);
      case 5: return -a;
      case 6: return abs(a);
      case 7: return sin(a);
      case 8: return cos(a);
      case 9: return tanh(a);
      case 10: return exp(tanh(a));
      default: return sqrt(abs(a) + 1.0);
    }
  }

  // 0, -1, 1, INT_MIN, INT_MAX: the divisors and dividends where SPIR-V is undefined.
  int64_t edge_int() {
    static constexpr int64_t kEdges[] = {0, -1, 1, INT32_MIN, INT32_MAX};
    return kEdges[uniform(0, 4)];
  }

  // A float that both sides hold exactly (an input or scalar times a power of two), so a
  // cast of it to an integer is exact too.
  Value exact_float() { return any(exact_floats_) * b_->f32(std::ldexp(1.0, uniform(-2, 40))); }

  Value int_stmt() {
    Value a = any(ints_), c = any(ints_);
    switch (uniform(0, 16)) {
      case 9: return a / c;  // run-time divisors: 0, -1 and INT_MIN / -1 come up
      case 10: return mod(a, c);
      case 11: return floordiv(a, c);
      case 12: return a * c;  // wraps
      case 13: return a / b_->i32(edge_int());
      case 14: return floordiv(a, b_->i32(edge_int()));
      case 15: return cast(exact_float(), DType::kI32);                     // saturates
      case 16: return cast(cast(exact_float(), DType::kU32), DType::kI32);  // negatives -> 0
      case 0: return a + c;
      case 1: return a - c;
      case 2: return mod(a * c, b_->i32(1000));
      case 3: return mod(a, b_->i32(uniform(1, 9)));
      case 4: return floordiv(a, b_->i32(uniform(1, 9) * (uniform(0, 1) ? 1 : -1)));
      case 5: return min(a, c);
      case 6: return max(a, c);
      case 7: return abs(a);
      default: return a / b_->i32(uniform(2, 5));
    }
  }

  Value bool_stmt() {
    Value a = any(ints_), c = any(ints_);
    switch (uniform(0, 4)) {
      case 0: return a < c;
      case 1: return a >= c;
      case 2: return eq(a, c);
      case 3: return bools_.empty() ? ne(a, c) : (any(bools_) && (a > c));
      default: return bools_.empty() ? a <= c : !any(bools_);
    }
  }

  void body(int n) {
    for (int s = 0; s < n; ++s) {
      int kind = uniform(0, 9);
      if (kind <= 3) {
        floats_.push_back(float_stmt());
      } else if (kind <= 5) {
        ints_.push_back(int_stmt());
      } else if (kind == 6) {
        bools_.push_back(bool_stmt());
      } else if (kind == 7 && !bools_.empty()) {
        floats_.push_back(select(any(bools_), any(floats_), any(floats_)));
      } else if (kind == 8 && depth_ < 2) {
        // A serial loop with an integer-derived trip count carrying a float and an int local.
        Local acc = b_->local(any(floats_));
        Local cnt = b_->local(any(ints_));
        Value trip = mod(abs(any(ints_)), b_->i32(5));
        Value c = any(floats_);
        ++depth_;
        auto saved_f = floats_;
        auto saved_i = ints_;
        auto saved_b = bools_;
        b_->for_range(b_->i32(0), trip, [&](Value j) {
          ints_.push_back(j);
          floats_.push_back(acc.load());
          body(uniform(1, 4));
          acc.store(clamp(acc.load() * 0.5 + any(floats_) * c));
          cnt.store(mod(cnt.load() + any(ints_), b_->i32(10007)));
        });
        floats_ = saved_f;
        ints_ = saved_i;
        bools_ = saved_b;
        --depth_;
        floats_.push_back(acc.load());
        ints_.push_back(cnt.load());
      } else if (kind == 9 && depth_ < 2) {
        Value cond = bools_.empty() ? bool_stmt() : any(bools_);
        Local r = b_->local(DType::kF32);
        ++depth_;
        auto saved_f = floats_;
        auto saved_i = ints_;
        auto saved_b = bools_;
        b_->if_(
            cond,
            [&] {
              body(uniform(1, 3));
              r.store(any(floats_));
            },
            [&] {
              floats_ = saved_f, ints_ = saved_i, bools_ = saved_b;
              body(uniform(0, 2));
              r.store(any(floats_));
            });
        floats_ = saved_f;
        ints_ = saved_i;
        bools_ = saved_b;
        --depth_;
        floats_.push_back(r.load());
      } else {
        floats_.push_back(float_stmt());
      }
    }
  }

  std::mt19937 rng_;
  KernelBuilder* b_ = nullptr;
  std::vector<Value> floats_, exact_floats_, ints_, bools_;
  int depth_ = 0;
};

uint32_t env_or(const char* name, uint32_t fallback) {
  const char* v = std::getenv(name);
  return v ? static_cast<uint32_t>(std::strtoul(v, nullptr, 10)) : fallback;
}

using CodegenProperty = KernelTest;

TEST_F(CodegenProperty, RandomKernelsMatchCpuReference) {
  uint32_t seed0 = env_or("VKAD_PROPERTY_SEED", 1), count = env_or("VKAD_PROPERTY_COUNT", 300);
  Target target = runner_->target();
  int failures = 0;
  for (uint32_t seed = seed0; seed < seed0 + count && failures < 3; ++seed) {
    Generator g(seed);
    Kernel k = g.make(seed);
    Status v = verify(k, target);
    ASSERT_TRUE(v.ok()) << "seed " << seed << ": " << v.to_string() << "\n" << print(k);
    uint32_t n = 64 + seed % 200;
    HostArgs device = make_args(k,
                                {ArgSpec::of(0.75), ArgSpec::of(3), ArgSpec::array({n}, -2, 2),
                                 ArgSpec::array({n}, -50, 50), ArgSpec::array({n}, 0, 0),
                                 ArgSpec::array({n}, 0, 0), ArgSpec::array({4}, 0, 0)},
                                seed);
    // The integer input holds the edge values at fixed places.
    const double edges[] = {0, -1, 1, -2147483648.0, 2147483647.0};
    for (size_t j = 0; j < n; j += 7) device.arrays[3].data[j] = edges[(j / 7) % 5];
    HostArgs cpu = device;
    auto view = cpu.view();
    auto ref = evaluate(k, view);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    Status st = runner_->run(k, device);
    ASSERT_TRUE(st.ok()) << "seed " << seed << ": " << st.to_string() << "\n" << print(k);
    for (size_t p = 4; p < 7; ++p) {
      std::string diff = compare_arrays(device.arrays[p], cpu.arrays[p]);
      if (!diff.empty()) {
        ++failures;
        ADD_FAILURE() << "seed " << seed << ", ndarray '" << k.params[p].name << "': " << diff
                      << "\n"
                      << print(k);
      }
    }
  }
}

}  // namespace
}  // namespace vkad::testing
