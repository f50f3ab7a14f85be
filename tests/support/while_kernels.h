// While-loop kernels in text form, shared by the CPU (tests/unit/while_loop_test.cpp) and device
// (tests/gpu/while_loop_test.cpp) tests: data-dependent trip counts that differ per thread,
// while inside for, for inside while, while inside a branch and inside a while.
#pragma once

#include <string>
#include <vector>

#include "support/ad_check.h"

namespace vkad::testing {

// "while v^2 > eps: acc += v sin v; v *= 0.5": the trip count grows with |x[i]|.
inline const char* kHalveUntilSmall = R"(kernel halve(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
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
inline const char* kNewtonSqrt = R"(kernel newton(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
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
inline const char* kWhileInFor = R"(kernel while_in_for(n: i32, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
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
inline const char* kForInWhile = R"(kernel for_in_while(x: ndarray<f64, 1> grad, w: ndarray<f64, 1> grad readonly, y: ndarray<f64, 1> grad) {
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
inline const char* kWhileInBranchAndWhile = R"(kernel while_nested(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
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
         v.arrays = {while_array({0.33, -0.71, 1.37, 2.9, 5.3, -11.0, 0.05}), codegen::HostArray(codegen::DType::kF64, {7})};
         v.scalars = {0, 0};
         return v;
       },
       6},
      {"newton_sqrt", kNewtonSqrt,
       [] {
         HostValues v;
         v.arrays = {while_array({0.3, 1.7, 4.2, 9.6, 31.0}), codegen::HostArray(codegen::DType::kF64, {5})};
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
      {"while_in_branch_and_while", kWhileInBranchAndWhile,
       [] {
         HostValues v;
         v.arrays = {while_array({0.33, -0.71, 1.37, 0.9, -0.2, 2.3}), codegen::HostArray(codegen::DType::kF64, {6})};
         v.scalars = {0, 0};
         return v;
       },
       5},
  };
}

}  // namespace vkad::testing
