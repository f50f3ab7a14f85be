// An i64 kernel using every integer operation, casts to and from every type, an i64 scalar,
// i64 ndarrays and an i64 atomic add; shared by the unit test (validation) and the GPU test
// (device against the CPU reference). Values stay within 2^53, where the reference is exact.
#pragma once

namespace vkad::codegen::testing {

inline const char* kI64Kernel =
    R"(kernel wide(s: i64, a: ndarray<i64, 1> readonly, b: ndarray<i64, 1> readonly, f: ndarray<f64, 1> readonly, out: ndarray<i64, 2>, fo: ndarray<f64, 1>, sum: ndarray<i64, 1>) {
  task main parallel %i in [0, shape(a, 0)) {
    %x = load a[%i] : i64
    %y = load b[%i] : i64
    %s = arg s : i64
    %c0 = const 0 : i32
    %c1 = const 1 : i32
    %c2 = const 2 : i32
    %c3 = const 3 : i32
    %c4 = const 4 : i32
    %c5 = const 5 : i32
    %c6 = const 6 : i32
    %c7 = const 7 : i32
    %c8 = const 8 : i32
    %c9 = const 9 : i32
    %add = add %x, %s : i64
    store out[%i, %c0], %add
    %sub = sub %x, %y : i64
    store out[%i, %c1], %sub
    %big = const 3000000 : i64
    %m0 = mod %x, %big : i64
    %mul = mul %m0, %y : i64
    store out[%i, %c2], %mul
    %div = div %x, %y : i64
    store out[%i, %c3], %div
    %mod = mod %x, %y : i64
    store out[%i, %c4], %mod
    %fdv = floordiv %x, %y : i64
    store out[%i, %c5], %fdv
    %mn = min %x, %y : i64
    %mx = max %x, %y : i64
    %ng = neg %mn : i64
    %ab = abs %ng : i64
    %lt = lt %x, %y : bool
    %pk = select %lt, %ab, %mx : i64
    store out[%i, %c6], %pk
    %fv = load f[%i] : f64
    %fi = cast %fv : i64
    %i32 = cast %x : i32
    %back = cast %i32 : i64
    %u32 = cast %y : u32
    %uback = cast %u32 : i64
    %iw = cast %i : i64
    %t1 = add %fi, %back : i64
    %t2 = add %t1, %uback : i64
    %t3 = add %t2, %iw : i64
    store out[%i, %c7], %t3
    %eq = eq %x, %y : bool
    %ne = ne %x, %s : bool
    %both = and %eq, %ne : bool
    %bw = cast %both : i64
    %ge = ge %x, %s : bool
    %gw = cast %ge : i64
    %bg = add %bw, %gw : i64
    store out[%i, %c8], %bg
    %xf = cast %x : f64
    store fo[%i], %xf
    %xf32 = cast %x : f32
    %x32 = cast %xf32 : i64
    store out[%i, %c9], %x32
    atomic_add sum[%c0], %mod
  }
})";

}  // namespace vkad::codegen::testing
