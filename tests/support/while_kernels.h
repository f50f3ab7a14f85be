// While-loop kernels in text form, shared by the CPU (tests/unit/while_loop_test.cpp) and device
// (tests/gpu/while_loop_test.cpp) tests: data-dependent trip counts that differ per thread,
// while inside for, for inside while, while inside a branch and inside a while; break and
// continue in for and while loops.
#pragma once

#include <string>
#include <vector>

#include "support/ad_check.h"

namespace vkad::testing {

// "while v^2 > eps: acc += v sin v; v *= 0.5": the trip count grows with |x[i]|.
inline const char* kHalveUntilSmall =
    R"(kernel halve(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %acc = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %half = const 0.5 : f64
    %eps = const 0.01 : f64
    while %k (%c) max_trip(64) {
      %a = load_local %v : f64
      %a2 = mul %a, %a : f64
      %c = gt %a2, %eps : bool
    } do {
      %b = load_local %v : f64
      %s = sin %b : f64
      %bs = mul %b, %s : f64
      %t = load_local %acc : f64
      %t2 = add %t, %bs : f64
      store_local %acc, %t2
      %h = mul %b, %half : f64
      store_local %v, %h
    }
    %o = load_local %acc : f64
    %ov = load_local %v : f64
    %r = add %o, %ov : f64
    %r2 = mul %r, %o : f64
    store y[%i], %r2
  }
})";

// Newton's iteration for sqrt(x[i]) from 1, until |g^2 - x| <= 1e-12 x (or 50 trips).
inline const char* kNewtonSqrt =
    R"(kernel newton(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %g = alloca : f64
    %a = load x[%i] : f64
    %one = const 1.0 : f64
    %half = const 0.5 : f64
    %tol = const 1e-12 : f64
    %fifty = const 50 : i32
    store_local %g, %one
    while %k (%c) max_trip(50) {
      %gv = load_local %g : f64
      %sq = mul %gv, %gv : f64
      %d = sub %sq, %a : f64
      %ad = abs %d : f64
      %r = mul %tol, %a : f64
      %big = gt %ad, %r : bool
      %lim = lt %k, %fifty : bool
      %c = and %big, %lim : bool
    } do {
      %gw = load_local %g : f64
      %q = div %a, %gw : f64
      %s = add %gw, %q : f64
      %n = mul %s, %half : f64
      store_local %g, %n
    }
    %out = load_local %g : f64
    store y[%i], %out
  }
})";

// A while loop inside a for loop: v shrinks below 0.2 each outer iteration, then regrows.
inline const char* kWhileInFor =
    R"(kernel while_in_for(n: i32, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %acc = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %n = arg n : i32
    %f = const 0.7 : f64
    %lim = const 0.2 : f64
    %grow = const 2.5 : f64
    for %j in [%zero, %n) {
      while %k (%c) max_trip(20) {
        %a = load_local %v : f64
        %c = gt %a, %lim : bool
      } do {
        %b = load_local %v : f64
        %b2 = mul %b, %f : f64
        store_local %v, %b2
        %t = load_local %acc : f64
        %cb = cos %b2 : f64
        %t2 = add %t, %cb : f64
        store_local %acc, %t2
      }
      %e = load_local %v : f64
      %jf = cast %j : f64
      %e2 = mul %e, %grow : f64
      %e3 = add %e2, %jf : f64
      store_local %v, %e3
    }
    %o = load_local %acc : f64
    %ov = load_local %v : f64
    %r = mul %o, %ov : f64
    store y[%i], %r
  }
})";

// A for loop inside a while loop whose test reads what the for loop computes.
inline const char* kForInWhile =
    R"(kernel for_in_while(x: ndarray<f64, 1> grad, w: ndarray<f64, 1> grad readonly, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %acc = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %three = const 3 : i32
    %m = shape w 0 : i32
    %half = const 0.5 : f64
    %c06 = const 0.6 : f64
    %two = const 2.5 : f64
    while %k (%c) max_trip(30) {
      %a = load_local %acc : f64
      %c = lt %a, %two : bool
    } do {
      for %j in [%zero, %three) {
        %b = load_local %v : f64
        %s = sin %b : f64
        %h = mul %s, %half : f64
        %jk = add %j, %k : i32
        %wi = mod %jk, %m : i32
        %wv = load w[%wi] : f64
        %hw = mul %h, %wv : f64
        %b2 = add %hw, %c06 : f64
        store_local %v, %b2
      }
      %e = load_local %v : f64
      %t = load_local %acc : f64
      %e2 = mul %e, %e : f64
      %t2 = add %t, %e2 : f64
      store_local %acc, %t2
    }
    %o = load_local %acc : f64
    %ov = load_local %v : f64
    %r = mul %o, %ov : f64
    store y[%i], %r
  }
})";

// A while loop inside a branch (its trip count lives in a local hoisted to the frame's top) and
// a while loop nested in a while loop.
inline const char* kWhileInBranchAndWhile =
    R"(kernel while_nested(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %u = alloca : f64
    %acc = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zf = const 0.0 : f64
    %lim = const 0.15 : f64
    %f = const 0.6 : f64
    %pos = gt %x, %zf : bool
    if %pos {
      while %k (%c) max_trip(16) {
        %a = load_local %v : f64
        %c = gt %a, %lim : bool
      } do {
        %b = load_local %v : f64
        store_local %u, %b
        while %q (%d) max_trip(16) {
          %ua = load_local %u : f64
          %uh = mul %ua, %ua : f64
          %d = gt %uh, %lim : bool
        } do {
          %ub = load_local %u : f64
          %us = sin %ub : f64
          %t = load_local %acc : f64
          %t2 = add %t, %us : f64
          store_local %acc, %t2
          %un = mul %ub, %f : f64
          store_local %u, %un
        }
        %b2 = mul %b, %f : f64
        %ue = load_local %u : f64
        %b3 = add %b2, %ue : f64
        %b4 = mul %b3, %lim : f64
        store_local %v, %b4
      }
    } else {
      %nx = neg %x : f64
      %ex = exp %nx : f64
      store_local %acc, %ex
    }
    %o = load_local %acc : f64
    %ov = load_local %v : f64
    %r = mul %o, %ov : f64
    %r2 = add %r, %o : f64
    store y[%i], %r2
  }
})";

// break and continue: a for loop that stops once the running sum passes a threshold, skipping
// (continue) the elements of w below a cutoff; a while loop that continues on odd trips and
// breaks when v turns small; an inner for loop with a break inside an outer for loop with a
// continue.
inline const char* kBreakContinue =
    R"(kernel jumps(x: ndarray<f64, 1> grad, w: ndarray<f64, 1> grad readonly, y: ndarray<f64, 1> grad, y2: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %acc = alloca : f64
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %m = shape w 0 : i32
    %cut = const -0.3 : f64
    %lim = const 1.6 : f64
    %zf = const 0.0 : f64
    for %k in [%zero, %m) {
      %wv = load w[%k] : f64
      %low = lt %wv, %cut : bool
      if %low {
        continue
      }
      %a = load_local %v : f64
      %p = mul %a, %wv : f64
      %s = sin %p : f64
      %t = load_local %acc : f64
      %t2 = add %t, %s : f64
      store_local %acc, %t2
      %b = add %a, %s : f64
      store_local %v, %b
      %big = gt %t2, %lim : bool
      if %big {
        %h = const 0.5 : f64
        %vh = mul %b, %h : f64
        store_local %v, %vh
        break
      }
    }
    %o = load_local %acc : f64
    %ov = load_local %v : f64
    %r = mul %o, %ov : f64
    store y[%i], %r
    %u = alloca : f64
    store_local %u, %x
    %two = const 2 : i32
    %one = const 1 : i32
    %eps = const 0.05 : f64
    %f = const 0.7 : f64
    while %q (%go) max_trip(40) {
      %go = const true : bool
    } do {
      %ua = load_local %u : f64
      %un = mul %ua, %f : f64
      store_local %u, %un
      %odd = mod %q, %two : i32
      %isodd = eq %odd, %one : bool
      if %isodd {
        continue
      }
      %ab = abs %un : f64
      %small = lt %ab, %eps : bool
      if %small {
        break
      } else {
        %cu = cos %un : f64
        %tenth = const 0.1 : f64
        %cs = mul %cu, %tenth : f64
        %onef = const 1.0 : f64
        %fac = add %cs, %onef : f64
        %uq = mul %un, %fac : f64
        store_local %u, %uq
      }
    }
    for %j in [%zero, %two) {
      %jodd = eq %j, %one : bool
      if %jodd {
        continue
      }
      for %l in [%zero, %m) {
        %wl = load w[%l] : f64
        %neg = lt %wl, %zf : bool
        if %neg {
          break
        }
        %ub = load_local %u : f64
        %e = mul %ub, %wl : f64
        %te = tanh %e : f64
        store_local %u, %te
      }
    }
    %uo = load_local %u : f64
    store y2[%i], %uo
  }
})";

// Counting under break and continue (integers only: tests/unit/while_loop_test.cpp checks the
// counts against the same loops in C++), with a branch whose both sides jump (its merge block
// is unreachable in SPIR-V).
inline const char* kJumpCounts =
    R"(kernel j(x: ndarray<f64, 1>, y: ndarray<i32, 1>, z: ndarray<i32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %n = alloca : i32
    %m = alloca : i32
    %x = load x[%i] : f64
    %zero = const 0 : i32
    %one = const 1 : i32
    %two = const 2 : i32
    %ten = const 10 : i32
    %three = const 3.0 : f64
    for %k in [%zero, %ten) {
      %kf = cast %k : f64
      %p = mul %kf, %x : f64
      %stop = ge %p, %three : bool
      if %stop {
        break
      }
      %odd = mod %k, %two : i32
      %isodd = eq %odd, %one : bool
      if %isodd {
        continue
      }
      %a = load_local %n : i32
      %a1 = add %a, %one : i32
      store_local %n, %a1
    }
    while %q (%c) {
      %c = lt %q, %ten : bool
    } do {
      %qf = cast %q : f64
      %p2 = mul %qf, %x : f64
      %stop2 = ge %p2, %three : bool
      if %stop2 {
        break
      } else {
        %odd2 = mod %q, %two : i32
        %isodd2 = eq %odd2, %one : bool
        if %isodd2 {
          continue
        }
      }
      %b = load_local %m : i32
      %b1 = add %b, %one : i32
      store_local %m, %b1
    }
    for %r in [%zero, %two) {
      %rz = eq %r, %zero : bool
      if %rz {
        continue
      } else {
        break
      }
    }
    %nv = load_local %n : i32
    store y[%i], %nv
    %mv = load_local %m : i32
    store z[%i], %mv
  }
})";

// Three tasks, three counted loops without max_trip (make_adjoint_counted's counting forward:
// tests/unit/counted_sizing_test.cpp, tests/gpu/while_loop_test.cpp): a while loop writing y; a
// task with no counted loop that reads y and writes z (the counter drops it, the counting forward
// must keep it: the third task reads z); a while loop nested in a for loop bounded by n[i] (two
// counted loops in one task).
inline const char* kThreeTasks =
    R"(kernel staged(n: ndarray<i32, 1>, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad, z: ndarray<f64, 1> grad, w: ndarray<f64, 1> grad) {
  task halve parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %acc = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %half = const 0.5 : f64
    %eps = const 0.01 : f64
    while %k (%c) {
      %a = load_local %v : f64
      %a2 = mul %a, %a : f64
      %c = gt %a2, %eps : bool
    } do {
      %b = load_local %v : f64
      %s = sin %b : f64
      %t = load_local %acc : f64
      %t2 = add %t, %s : f64
      store_local %acc, %t2
      %h = mul %b, %half : f64
      store_local %v, %h
    }
    %o = load_local %acc : f64
    store y[%i], %o
  }
  task square parallel %i2 in [0, shape(x, 0)) {
    %y = load y[%i2] : f64
    %y2 = mul %y, %y : f64
    store z[%i2], %y2
  }
  task nested parallel %i3 in [0, shape(x, 0)) {
    %u = alloca : f64
    %z = load z[%i3] : f64
    store_local %u, %z
    %zero = const 0 : i32
    %m = load n[%i3] : i32
    %g = const 0.9 : f64
    for %j in [%zero, %m) {
      while %q (%d) {
        %d = le %q, %j : bool
      } do {
        %e = load_local %u : f64
        %se = sin %e : f64
        %e2 = mul %se, %g : f64
        %e3 = add %e2, %z : f64
        store_local %u, %e3
      }
    }
    %ov = load_local %u : f64
    store w[%i3], %ov
  }
})";

inline HostValues three_tasks_args() {
  HostValues v;
  v.arrays = {
      codegen::HostArray(codegen::DType::kI32, {5}), codegen::HostArray(codegen::DType::kF64, {5}),
      codegen::HostArray(codegen::DType::kF64, {5}), codegen::HostArray(codegen::DType::kF64, {5}),
      codegen::HostArray(codegen::DType::kF64, {5})};
  v.arrays[0].data = {3, 0, 5, 2, 1};
  v.arrays[1].data = {0.33, -0.71, 1.37, 2.9, 0.05};
  v.scalars = {0, 0, 0, 0, 0};
  return v;
}

struct WhileCase {
  std::string name;
  const char* text;
  HostValues (*args)();
  int min_checked;
};

inline codegen::HostArray while_array(std::vector<double> v) {
  codegen::HostArray a(codegen::DType::kF64, {static_cast<uint32_t>(v.size())});
  a.data = std::move(v);
  return a;
}

inline std::vector<WhileCase> while_cases() {
  return {
      {"halve_until_small", kHalveUntilSmall,
       [] {
         HostValues v;
         v.arrays = {while_array({0.33, -0.71, 1.37, 2.9, 5.3, -11.0, 0.05}),
                     codegen::HostArray(codegen::DType::kF64, {7})};
         v.scalars = {0, 0};
         return v;
       },
       6},
      {"newton_sqrt", kNewtonSqrt,
       [] {
         HostValues v;
         v.arrays = {while_array({0.3, 1.7, 4.2, 9.6, 31.0}),
                     codegen::HostArray(codegen::DType::kF64, {5})};
         v.scalars = {0, 0};
         return v;
       },
       4},
      {"while_in_for", kWhileInFor,
       [] {
         HostValues v;
         v.arrays = {codegen::HostArray{}, while_array({0.33, 0.71, 1.37, 1.9, 0.53, 1.1}),
                     codegen::HostArray(codegen::DType::kF64, {6})};
         v.scalars = {3, 0, 0};
         return v;
       },
       5},
      {"for_in_while", kForInWhile,
       [] {
         HostValues v;
         v.arrays = {while_array({0.33, -0.71, 1.37, 0.9, -0.2}), while_array({0.9, 1.3, 0.7, 1.1}),
                     codegen::HostArray(codegen::DType::kF64, {5})};
         v.scalars = {0, 0, 0};
         return v;
       },
       7},
      {"break_continue", kBreakContinue,
       [] {
         HostValues v;
         v.arrays = {while_array({0.33, -0.71, 1.37, 0.9, -0.2, 2.3}),
                     while_array({0.9, -0.5, 1.3, 0.7, -0.1, 1.1, 0.6}),
                     codegen::HostArray(codegen::DType::kF64, {6}),
                     codegen::HostArray(codegen::DType::kF64, {6})};
         v.scalars = {0, 0, 0, 0};
         return v;
       },
       12},
      {"while_in_branch_and_while", kWhileInBranchAndWhile,
       [] {
         HostValues v;
         v.arrays = {while_array({0.33, -0.71, 1.37, 0.9, -0.2, 2.3}),
                     codegen::HostArray(codegen::DType::kF64, {6})};
         v.scalars = {0, 0};
         return v;
       },
       5},
  };
}

}  // namespace vkad::testing
