// Reverse-mode regression kernels in text form, shared by the CPU (tests/unit) and device
// (tests/gpu) gradient tests. Each one once got a wrong gradient without an error.
#pragma once

namespace vkad::testing {

// Issue 12: `t = q; q = p + q; p = t; acc += sin(q)`. The reverse sweep recomputes an iteration
// from its checkpoint; the q read after `q = p + q` needs p's value at the iteration start.
inline const char* kSwappedFloatLocals =
    R"(kernel swapped_float_locals(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %p = alloca : f64
    %q = alloca : f64
    %acc = alloca : f64
    %quarter = const 0.25 : f64
    store_local %p, %quarter
    %x = load x[%i] : f64
    store_local %q, %x
    %zero = const 0 : i32
    %five = const 5 : i32
    for %k in [%zero, %five) {
      %t = load_local %q : f64
      %pv = load_local %p : f64
      %qv = load_local %q : f64
      %s = add %pv, %qv : f64
      store_local %q, %s
      store_local %p, %t
      %q2 = load_local %q : f64
      %sn = sin %q2 : f64
      %a = load_local %acc : f64
      %a2 = add %a, %sn : f64
      store_local %acc, %a2
    }
    %out = load_local %acc : f64
    store y[%i], %out
  }
})";

// Issue 12, integer variant: i32 locals ja, jb swap (jb advancing by 3 mod m) every iteration
// and ja indexes the read-only differentiable array w after the swap.
inline const char* kSwappedIntegerIndexLocals =
    R"(kernel swapped_integer_index_locals(x: ndarray<f64, 1> grad, w: ndarray<f64, 1> grad readonly, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %ja = alloca : i32
    %jb = alloca : i32
    %m = shape w 0 : i32
    %one = const 1 : i32
    %three = const 3 : i32
    %a0 = mod %i, %m : i32
    store_local %ja, %a0
    %i1 = add %i, %one : i32
    %b0 = mod %i1, %m : i32
    store_local %jb, %b0
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %five = const 5 : i32
    for %k in [%zero, %five) {
      %t = load_local %ja : i32
      %jbv = load_local %jb : i32
      store_local %ja, %jbv
      %t3 = add %t, %three : i32
      %nb = mod %t3, %m : i32
      store_local %jb, %nb
      %j = load_local %ja : i32
      %wv = load w[%j] : f64
      %vv = load_local %v : f64
      %pr = mul %vv, %wv : f64
      %sn = sin %pr : f64
      store_local %v, %sn
    }
    %out = load_local %v : f64
    store y[%i], %out
  }
})";

// The training example's shape (examples/diffsim): position x moves linearly with velocity u,
// u nonlinearly (u <- u + (-u*u - x) * dt, x <- x + u * dt). The reverse sweep of an iteration
// reads only u (d(u*u)); x is needed only to recompute the u that the task's replay pushes at
// each iteration start, and that replay runs from the task's start, so x needs no checkpoint.
// One stack (u), not two; gradients into both inputs.
inline const char* kLinearlyCarriedPosition =
    R"(kernel linearly_carried_position(n: i32, dt: f64, a: ndarray<f64, 1> grad, v: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(a, 0)) {
    %x = alloca : f64
    %u = alloca : f64
    %a0 = load a[%i] : f64
    store_local %x, %a0
    %v0 = load v[%i] : f64
    store_local %u, %v0
    %dt = arg dt : f64
    %zero = const 0 : i32
    %n = arg n : i32
    for %k in [%zero, %n) {
      %xv = load_local %x : f64
      %uv = load_local %u : f64
      %sq = mul %uv, %uv : f64
      %nsq = neg %sq : f64
      %f = sub %nsq, %xv : f64
      %fdt = mul %f, %dt : f64
      %nu = add %uv, %fdt : f64
      store_local %u, %nu
      %step = mul %nu, %dt : f64
      %nx = add %xv, %step : f64
      store_local %x, %nx
    }
    %out = load_local %x : f64
    store y[%i], %out
  }
})";

}  // namespace vkad::testing
