// Reverse mode on the device (validation on, zero messages): every adjoint is checked against
// central finite differences of the forward kernel run on the same device, in f64 (lavapipe
// has it). The loss is L = sum(w * outputs) with random seeds w, so the adjoint's gradient of
// an input element must equal (L(x + h) - L(x - h)) / 2h. f64 transcendentals are computed in
// f64 (spirv/f64_math.h, within 4 ulp), so with h = 1e-4 what remains is the differences'
// truncation error: a relative tolerance of 1e-5 (the amplifying data-dependent loop needs
// 1.2e-6; 2e-3 while f64 transcendentals went through f32), 1e-6 where stated. Closed forms
// are checked where they exist, and the device adjoint is compared to the CPU reference's.
#include "autodiff/reverse_mode.h"

#include <gtest/gtest.h>

#include <cmath>

#include "gpu/kernel_harness.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "support/ad_regressions.h"

namespace vkad::testing {
namespace {

using codegen::HostArray;
using codegen::Kernel;

struct AdCase {
  std::string name;
  std::string text;
  std::vector<ArgSpec> args;
  double tol = 1e-5;
  double h = 1e-4;
};

ArgSpec A(std::vector<uint32_t> s, double lo = -1, double hi = 1) {
  return ArgSpec::array(std::move(s), lo, hi);
}
ArgSpec S(double v) { return ArgSpec::of(v); }

// One kernel per differentiable op: a nonlinear recurrence v <- v/2 + op(v)/4 (a contraction
// for the input ranges used, so finite differences stay well-conditioned) that applies the op
// to the loop-carried value, so the reverse sweep needs every iteration's value back.
AdCase op_case(const std::string& op, const std::string& update, double lo = -0.5,
               double hi = 0.5) {
  std::string text =
      R"(kernel rec_)" + op +
      R"((n: i32, x: ndarray<f64, 1> grad, z: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    %z = load z[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %n = arg n : i32
    %c = const 0.5 : f64
    %half = const 0.5 : f64
    %one = const 1.0 : f64
    %quarter = const 0.25 : f64
    for %k in [%zero, %n) {
      %a = load_local %v : f64
)" + update +
      R"(
      %keep = mul %a, %c : f64
      %uq = mul %u, %quarter : f64
      %nv = add %keep, %uq : f64
      store_local %v, %nv
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})";
  return {"op_" + op, text, {S(6), A({64}, lo, hi), A({64}, 0.2, 0.8), A({64})}};
}

// One ndarray read and written by one kernel, in the forms reverse mode accepts.
// A differentiable intermediate written by one task and read by a later one.
const char* kGradIntermediate =
    R"(kernel gi(x: ndarray<f64, 1> grad, t: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task first parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f64
    %s = sin %v : f64
    store t[%i], %s
  }
  task second parallel %j in [0, shape(x, 0)) {
    %n = shape x 0 : i32
    %one = const 1 : i32
    %a = add %j, %one : i32
    %nb = mod %a, %n : i32
    %p = load t[%j] : f64
    %q = load t[%nb] : f64
    %m = mul %p, %q : f64
    %xv = load x[%j] : f64
    %r = add %m, %xv : f64
    store y[%j], %r
  }
})";
// An index table without gradient, filled by one task and read by a later one.
const char* kIndexTable =
    R"(kernel it(idx: ndarray<i32, 1>, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task fill parallel %i in [0, shape(x, 0)) {
    %n = shape x 0 : i32
    %three = const 3 : i32
    %a = add %i, %three : i32
    %m = mod %a, %n : i32
    store idx[%i], %m
  }
  task use parallel %k in [0, shape(x, 0)) {
    %j = load idx[%k] : i32
    %v = load x[%j] : f64
    %s = sin %v : f64
    %w = load x[%k] : f64
    %p = mul %s, %w : f64
    store y[%k], %p
  }
})";
// Scratch without gradient, read and rewritten in the same task; the reverse sweep needs none
// of its values.
const char* kScratchSameTask =
    R"(kernel st(s: ndarray<i32, 1>, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %c = load s[%i] : i32
    %one = const 1 : i32
    %c1 = add %c, %one : i32
    store s[%i], %c1
    %v = load x[%i] : f64
    %e = exp %v : f64
    %p = mul %e, %v : f64
    store y[%i], %p
  }
})";

std::vector<AdCase> cases() {
  std::vector<AdCase> c;
  c.push_back(
      {"read_write_grad_intermediate_later_task", kGradIntermediate, {A({64}), A({64}), A({64})}});
  c.push_back(
      {"read_write_index_table_later_task", kIndexTable, {A({64}, 0, 0), A({64}), A({64})}});
  c.push_back(
      {"read_write_scratch_same_task", kScratchSameTask, {A({64}, 0, 5), A({64}), A({64})}});
  // Every differentiable op on a loop-varying operand.
  c.push_back(op_case("sin", "      %u = sin %a : f64"));
  c.push_back(op_case("cos", "      %u = cos %a : f64"));
  c.push_back(op_case("tan", "      %u = tan %a : f64"));
  c.push_back(op_case("tanh", "      %u = tanh %a : f64"));
  c.push_back(op_case("asin", "      %s = mul %a, %half : f64\n      %u = asin %s : f64"));
  c.push_back(op_case("acos", "      %s = mul %a, %half : f64\n      %u = acos %s : f64"));
  c.push_back(op_case("exp", "      %s = mul %a, %half : f64\n      %u = exp %s : f64"));
  c.push_back(op_case(
      "log",
      "      %s = mul %a, %a : f64\n      %t = add %s, %one : f64\n      %u = log %t : f64"));
  c.push_back(op_case(
      "sqrt",
      "      %s = mul %a, %a : f64\n      %t = add %s, %one : f64\n      %u = sqrt %t : f64"));
  c.push_back(op_case(
      "rsqrt",
      "      %s = mul %a, %a : f64\n      %t = add %s, %one : f64\n      %u = rsqrt %t : f64"));
  c.push_back(op_case(
      "pow",
      "      %s = mul %a, %a : f64\n      %t = add %s, %one : f64\n      %u = pow %t, %z : f64"));
  c.push_back(op_case(
      "pow_base_const",
      "      %s = mul %a, %a : f64\n      %t = add %s, %one : f64\n      %u = pow %z, %t : f64"));
  c.push_back(op_case("atan2", "      %u = atan2 %a, %z : f64"));
  c.push_back(op_case("abs", "      %s = sub %a, %z : f64\n      %u = abs %s : f64"));
  c.push_back(op_case("min", "      %u = min %a, %z : f64"));
  c.push_back(op_case("max", "      %u = max %a, %z : f64"));
  c.push_back(op_case("select",
                      "      %p = gt %a, %z : bool\n      %s = mul %a, %a : f64\n      %u = select "
                      "%p, %s, %z : f64"));
  c.push_back(op_case(
      "div",
      "      %s = mul %a, %a : f64\n      %t = add %s, %one : f64\n      %u = div %z, %t : f64"));
  c.push_back(op_case("mul", "      %u = mul %a, %z : f64"));
  c.push_back(
      op_case("cast_f32",
              "      %s = cast %a : f32\n      %q = mul %s, %s : f32\n      %u = cast %q : f64"));
  c.back().tol = 2e-2;  // the f32 round trip limits what finite differences can resolve
  c.back().h = 1e-3;

  c.push_back({"linear_recurrence_constant_loop",
               R"(kernel lin(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %ten = const 10 : i32
    %c = const 0.9 : f64
    for %k in [%zero, %ten) {
      %a = load_local %v : f64
      %b = mul %a, %c : f64
      %kf = cast %k : f64
      %d = add %b, %kf : f64
      store_local %v, %d
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
               {A({100}), A({100})},
               1e-6,
               1e-3});
  c.push_back(
      {"accumulate_argument_loop",
       R"(kernel acc(n: i32, x: ndarray<f64, 2> grad, w: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %acc = alloca : f64
    %zero = const 0 : i32
    %n = arg n : i32
    for %k in [%zero, %n) {
      %xv = load x[%i, %k] : f64
      %wv = load w[%k] : f64
      %p = mul %xv, %wv : f64
      %a = load_local %acc : f64
      %s = add %a, %p : f64
      store_local %acc, %s
    }
    %out = load_local %acc : f64
    store y[%i], %out
  }
})",
       {S(12), A({20, 12}), A({12}), A({20})},
       1e-6,
       1e-3});
  c.push_back({"many_stacks_per_thread",
               R"(kernel ms(n: i32, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %p = alloca : f64
    %q = alloca : f64
    %r = alloca : f64
    %x = load x[%i] : f64
    store_local %p, %x
    %h = const 0.3 : f64
    store_local %q, %h
    store_local %r, %x
    %zero = const 0 : i32
    %n = arg n : i32
    for %k in [%zero, %n) {
      %pv = load_local %p : f64
      %qv = load_local %q : f64
      %rv = load_local %r : f64
      %a = mul %pv, %qv : f64
      %b = sin %rv : f64
      %cc = mul %qv, %rv : f64
      %np = add %a, %b : f64
      %nq = tanh %cc : f64
      %nr = add %rv, %a : f64
      store_local %p, %np
      store_local %q, %nq
      store_local %r, %nr
    }
    %pv2 = load_local %p : f64
    %rv2 = load_local %r : f64
    %out = add %pv2, %rv2 : f64
    store y[%i], %out
  }
})",
               {S(5), A({64}), A({64})}});
  c.push_back(
      {"carried_int_as_index",
       R"(kernel ci(n: i32, x: ndarray<f64, 1> grad, t: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %j = alloca : i32
    %x = load x[%i] : f64
    store_local %v, %x
    %m = shape t 0 : i32
    %j0 = mod %i, %m : i32
    store_local %j, %j0
    %zero = const 0 : i32
    %n = arg n : i32
    %three = const 3 : i32
    for %k in [%zero, %n) {
      %jv = load_local %j : i32
      %tv = load t[%jv] : f64
      %a = load_local %v : f64
      %p = mul %a, %tv : f64
      %s = sin %p : f64
      store_local %v, %s
      %j2 = add %jv, %three : i32
      %j3 = mod %j2, %m : i32
      store_local %j, %j3
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
       {S(7), A({50}), A({11}), A({50})}});
  c.push_back({"branch_on_carried_value",
               R"(kernel bc(n: i32, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %n = arg n : i32
    %zf = const 0.0 : f64
    %c = const 0.7 : f64
    for %k in [%zero, %n) {
      %a = load_local %v : f64
      %pos = gt %a, %zf : bool
      if %pos {
        %s = sin %a : f64
        %t = mul %s, %c : f64
        %u = sub %t, %c : f64
        store_local %v, %u
      } else {
        %sq = mul %a, %a : f64
        %w = add %sq, %c : f64
        store_local %v, %w
      }
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
               {S(6), A({64}), A({64})}});
  c.push_back({"nested_loops",
               R"(kernel nl(n: i32, m: i32, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %n = arg n : i32
    %m = arg m : i32
    %c = const 0.8 : f64
    for %k in [%zero, %n) {
      for %l in [%zero, %m) {
        %a = load_local %v : f64
        %s = sin %a : f64
        %t = mul %a, %c : f64
        %u = add %s, %t : f64
        store_local %v, %u
      }
      %b = load_local %v : f64
      %bb = mul %b, %b : f64
      %w = tanh %bb : f64
      store_local %v, %w
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
               {S(3), S(4), A({64}), A({64})}});
  c.push_back({"triangular_loops",
               R"(kernel tl(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %eight = const 8 : i32
    %c = const 0.9 : f64
    %m = mod %i, %eight : i32
    for %k in [%zero, %m) {
      for %l in [%k, %m) {
        %a = load_local %v : f64
        %s = cos %a : f64
        %t = mul %s, %c : f64
        store_local %v, %t
      }
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
               {A({64}), A({64})}});
  c.push_back({"sibling_loops",
               R"(kernel sl(n: i32, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %n = arg n : i32
    %c = const 1.1 : f64
    for %k in [%zero, %n) {
      %a = load_local %v : f64
      %s = sin %a : f64
      %t = mul %s, %c : f64
      store_local %v, %t
    }
    %mid = load_local %v : f64
    %sq = mul %mid, %x : f64
    store_local %v, %sq
    for %l in [%zero, %n) {
      %b = load_local %v : f64
      %e = mul %b, %b : f64
      %f = add %e, %b : f64
      %g = tanh %f : f64
      store_local %v, %g
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
               {S(5), A({64}), A({64})}});
  c.push_back(
      {"two_tasks",
       R"(kernel tt(n: i32, x: ndarray<f64, 1> grad, z: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad, y2: ndarray<f64, 1> grad) {
  task first parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %n = arg n : i32
    for %k in [%zero, %n) {
      %a = load_local %v : f64
      %s = sin %a : f64
      %t = add %s, %a : f64
      store_local %v, %t
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
  task second parallel %j in [0, shape(z, 0)) {
    %zv = load z[%j] : f64
    %xv = load x[%j] : f64
    %p = mul %zv, %xv : f64
    %e = exp %p : f64
    store y2[%j], %e
  }
})",
       {S(4), A({40}), A({40}), A({40}), A({40})}});
  c.push_back({"gated_loop_few_threads",
               R"(kernel gl(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %seven = const 7 : i32
    %zero = const 0 : i32
    %r = mod %i, %seven : i32
    %gate = eq %r, %zero : bool
    if %gate {
      %twenty = const 20 : i32
      for %k in [%zero, %twenty) {
        %a = load_local %v : f64
        %s = sin %a : f64
        %h = const 0.5 : f64
        %t = add %s, %h : f64
        store_local %v, %t
      }
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
               {A({100}), A({100})}});
  c.push_back(
      {"data_dependent_trip_with_max_trip",
       R"(kernel dd(cnt: ndarray<i32, 1>, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %c = load cnt[%i] : i32
    for %k in [%zero, %c) max_trip(9) {
      %a = load_local %v : f64
      %s = sin %a : f64
      %t = mul %s, %a : f64
      %u = add %t, %a : f64
      store_local %v, %u
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
       {A({60}, 0, 9), A({60}), A({60})}});
  c.push_back({"atomic_output_accumulation",
               R"(kernel ao(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %x = load x[%i] : f64
    %four = const 4 : i32
    %b = mod %i, %four : i32
    %s = sin %x : f64
    %p = mul %s, %x : f64
    atomic_add y[%b], %p
  }
})",
               {A({64}), A({4})}});
  c.push_back({"rank2_arrays_and_shapes",
               R"(kernel r2(a: ndarray<f64, 2> grad, y: ndarray<f64, 2> grad) {
  task main parallel %i in [0, shape(a, 0)) {
    %zero = const 0 : i32
    %n = shape a 1 : i32
    %v = alloca : f64
    for %j in [%zero, %n) {
      %e = load a[%i, %j] : f64
      %pv = load_local %v : f64
      %q = mul %pv, %e : f64
      %r = add %q, %e : f64
      store_local %v, %r
      store y[%i, %j], %r
    }
  }
})",
               {A({10, 6}), A({10, 6})},
               1e-6,
               1e-3});
  c.push_back({"f32_kernel",
               R"(kernel f3(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %zero = const 0 : i32
    %n = arg n : i32
    %c = const 0.5 : f32
    for %k in [%zero, %n) {
      %a = load_local %v : f32
      %s = sin %a : f32
      %t = mul %a, %c : f32
      %u = add %s, %t : f32
      store_local %v, %u
    }
    %out = load_local %v : f32
    store y[%i], %out
  }
})",
               {S(5), A({64}), A({64})},
               3e-2,
               1e-2});
  // Owned and not owned in one kernel (owned_ndarrays): x is read at [%i] only, before and in
  // the loop (several load-add-stores per thread into x_grad[i]); w is gathered at (3i + k) mod m
  // by every thread (atomic adds from many threads into one element).
  c.push_back(
      {"owned_and_gathered_inputs",
       R"(kernel og(n: i32, x: ndarray<f64, 1> grad, w: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x0 = load x[%i] : f64
    store_local %v, %x0
    %zero = const 0 : i32
    %n = arg n : i32
    %three = const 3 : i32
    %m = shape w 0 : i32
    %half = const 0.5 : f64
    %i3 = mul %i, %three : i32
    for %k in [%zero, %n) {
      %a = load_local %v : f64
      %xv = load x[%i] : f64
      %jk = add %i3, %k : i32
      %j = mod %jk, %m : i32
      %wv = load w[%j] : f64
      %s = sin %a : f64
      %p = mul %s, %wv : f64
      %q = mul %xv, %half : f64
      %u = add %p, %q : f64
      store_local %v, %u
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})",
       {S(5), A({256}), A({7}), A({256})}});
  // Regressions (tests/support/ad_regressions.h; the unit tier checks them on the CPU too).
  c.push_back({"swapped_float_locals_regression", kSwappedFloatLocals, {A({64}), A({64})}});
  c.push_back({"swapped_integer_index_locals_regression",
               kSwappedIntegerIndexLocals,
               {A({64}), A({7}), A({64})}});
  c.push_back({"linearly_carried_position",
               kLinearlyCarriedPosition,
               {S(6), S(0.1), A({64}), A({64}), A({64})}});
  return c;
}

// Every case runs once per adstack layout.
class ReverseMode : public KernelTest,
                    public ::testing::WithParamInterface<std::tuple<size_t, adstack::Layout>> {};

double loss(const Kernel& k, const HostArgs& out, const std::vector<HostArray>& w) {
  double l = 0;
  for (size_t p = 0; p < k.params.size(); ++p) {
    if (w[p].data.empty()) continue;
    for (size_t e = 0; e < w[p].size(); ++e) l += w[p].data[e] * out.arrays[p].data[e];
  }
  return l;
}

bool writes(const Kernel& k, uint32_t p) {
  std::string text = codegen::print(k);
  return text.find("store " + k.params[p].name + "[") != std::string::npos ||
         text.find("atomic_add " + k.params[p].name + "[") != std::string::npos;
}

TEST_P(ReverseMode, GradientsMatchFiniteDifferences) {
  const AdCase c = cases()[std::get<0>(GetParam())];
  runner_->set_adstack_layout(std::get<1>(GetParam()));
  auto fk = codegen::parse(c.text);
  ASSERT_TRUE(fk.ok()) << fk.status().to_string();
  codegen::Target target = runner_->target();
  ASSERT_TRUE(codegen::verify(*fk, target).ok()) << codegen::verify(*fk, target).to_string();
  auto ak = codegen::make_adjoint(*fk, target);
  ASSERT_TRUE(ak.ok()) << ak.status().to_string();
  ASSERT_TRUE(codegen::verify(*ak, target).ok())
      << codegen::verify(*ak, target).to_string() << codegen::print(*ak);
  auto fwd = codegen::compile(*fk, target);
  auto adj = codegen::compile(*ak, target);
  ASSERT_TRUE(fwd.ok()) << fwd.status().to_string();
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();

  const Kernel& k = *fk;
  HostArgs base = make_args(k, c.args, 99);
  // Seeds: random weights on every differentiable output.
  std::vector<HostArray> w(k.params.size());
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  for (uint32_t p = 0; p < k.params.size(); ++p) {
    if (!k.params[p].needs_grad || !writes(k, p)) continue;
    w[p] = HostArray(k.params[p].dtype, base.arrays[p].shape);
    for (double& x : w[p].data) x = codegen::round_to(k.params[p].dtype, u(rng));
  }
  // The adjoint runs after the forward, on the arrays as the forward left them (an array the
  // kernel writes and later reads holds what the forward wrote), then gradients (seeds for
  // outputs, zeros for inputs).
  HostArgs adj_args = base;
  ASSERT_TRUE(runner_->run_compiled(*fwd, adj_args).ok());
  for (uint32_t p = 0; p < k.params.size(); ++p) {
    if (!k.params[p].needs_grad) continue;
    HostArray g = w[p].data.empty() ? HostArray(k.params[p].dtype, base.arrays[p].shape) : w[p];
    adj_args.arrays.push_back(g);
    adj_args.scalars.push_back(0);
  }
  HostArgs cpu_adj = adj_args;
  Status st = runner_->run_compiled(*adj, adj_args);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto view = cpu_adj.view();
  auto ref = codegen::evaluate(*ak, view);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();

  size_t grad_index = k.params.size();
  int checked = 0;
  for (uint32_t p = 0; p < k.params.size(); ++p) {
    if (!k.params[p].needs_grad) continue;
    const HostArray& g = adj_args.arrays[grad_index];
    EXPECT_EQ(compare_arrays(g, cpu_adj.arrays[grad_index]), "")
        << "device vs CPU adjoint of " << k.params[p].name;
    ++grad_index;
    if (writes(k, p)) continue;  // an output: its gradient array held the seed
    // Central differences on a few elements of this input.
    for (size_t e : {size_t{0}, g.size() / 3, g.size() / 2, g.size() - 1}) {
      HostArgs plus = base, minus = base;
      double x0 = base.arrays[p].data[e];
      double h = c.h * std::max(1.0, std::fabs(x0));
      plus.arrays[p].data[e] = codegen::round_to(k.params[p].dtype, x0 + h);
      minus.arrays[p].data[e] = codegen::round_to(k.params[p].dtype, x0 - h);
      double span = plus.arrays[p].data[e] - minus.arrays[p].data[e];
      ASSERT_TRUE(runner_->run_compiled(*fwd, plus).ok());
      ASSERT_TRUE(runner_->run_compiled(*fwd, minus).ok());
      double fd = (loss(k, plus, w) - loss(k, minus, w)) / span;
      EXPECT_NEAR(g.data[e], fd, c.tol * std::max(1.0, std::fabs(fd)))
          << c.name << ": d loss / d " << k.params[p].name << "[" << e << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Kernels, ReverseMode,
                         ::testing::Combine(::testing::Range<size_t>(0, cases().size()),
                                            ::testing::ValuesIn(kAdstackLayouts)),
                         [](const auto& info) {
                           return cases()[std::get<0>(info.param)].name + "_" +
                                  layout_suffix(std::get<1>(info.param));
                         });

TEST(ReverseModeCorpus, AtLeastThirtyKernels) { EXPECT_GE(cases().size(), 30u); }

}  // namespace
}  // namespace vkad::testing

namespace vkad::testing {
namespace {

// The forward kernels that read and write one ndarray, on the device against the CPU evaluator
// (every array, the read-and-written one included).
class ReadAndWrite : public KernelTest {};

TEST_F(ReadAndWrite, ForwardKernelsMatchTheCpuEvaluator) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  for (const char* text : {kGradIntermediate, kIndexTable, kScratchSameTask}) {
    auto k = codegen::parse(text);
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    std::vector<ArgSpec> specs = {A({64}, 0, 5), A({64}), A({64})};
    HostArgs dev = make_args(*k, specs, 7), cpu = dev;
    ASSERT_TRUE(runner_->run(*k, dev).ok()) << k->name;
    auto view = cpu.view();
    ASSERT_TRUE(codegen::evaluate(*k, view).ok()) << k->name;
    for (size_t p = 0; p < k->params.size(); ++p) {
      EXPECT_EQ(compare_arrays(dev.arrays[p], cpu.arrays[p]), "")
          << k->name << " parameter " << k->params[p].name;
    }
  }
}

}  // namespace
}  // namespace vkad::testing
