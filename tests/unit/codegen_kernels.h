// Kernels in text form shared by the codegen unit tests.
#pragma once

namespace vkad::codegen::testing {

// Uses every statement kind (and every op of the table) at least once.
inline const char* kEveryStatementKernel =
    R"(kernel every(a: f32, n: i32, u: u32, b: bool, d: f64, x: ndarray<f32, 2> grad, y: ndarray<f32, 1>, iy: ndarray<i32, 1>, z: ndarray<u32, 1> readonly) {
  task main parallel %0 in [0, shape(x, 0)) local_size 32 {
    %1 = const 1.5 : f32
    %2 = arg a : f32
    %3 = shape x 1 : i32
    %4 = const 0 : i32
    %5 = load x[%0, %4] : f32
    %6 = neg %5 : f32
    %7 = sqrt %6 : f32
    %8 = rsqrt %7 : f32
    %9 = exp %8 : f32
    %10 = log %9 : f32
    %11 = sin %10 : f32
    %12 = cos %11 : f32
    %13 = tan %12 : f32
    %14 = tanh %13 : f32
    %15 = asin %14 : f32
    %16 = acos %15 : f32
    %17 = abs %16 : f32
    %18 = floor %17 : f32
    %19 = ceil %18 : f32
    %20 = add %19, %1 : f32
    %21 = sub %20, %2 : f32
    %22 = mul %21, %2 : f32
    %23 = div %22, %1 : f32
    %24 = const 3 : i32
    %25 = mod %0, %24 : i32
    %26 = floordiv %0, %24 : i32
    %27 = min %20, %21 : f32
    %28 = max %20, %21 : f32
    %29 = pow %27, %28 : f32
    %30 = atan2 %27, %28 : f32
    %31 = lt %27, %28 : bool
    %32 = le %27, %28 : bool
    %33 = gt %25, %26 : bool
    %34 = ge %25, %26 : bool
    %35 = eq %31, %32 : bool
    %36 = ne %33, %34 : bool
    %37 = and %35, %36 : bool
    %38 = or %37, %31 : bool
    %39 = not %38 : bool
    %40 = select %39, %29, %30 : f32
    %41 = cast %40 : f64
    %42 = alloca : f32
    store_local %42, %40
    %43 = load_local %42 : f32
    store y[%0], %43
    atomic_add y[%4], %1
    %44 = arg n : i32
    for %45 in [%4, %44) {
      for %46 in [%4, %45) {
        %47 = load_local %42 : f32
        %48 = add %47, %1 : f32
        store_local %42, %48
      }
    }
    if %31 {
      %49 = const -2.25e-07 : f32
      store y[%0], %49
    } else {
      store y[%0], %1
    }
    if %32 {
      store y[%0], %2
    }
    %50 = stack_alloc cap(mul(n, add(shape(x, 1), 2))) : f32
    stack_push %50, %43
    %51 = stack_top %50 : f32
    %52 = stack_top_adj %50 : f32
    stack_acc_adj %50, %51
    stack_pop %50
    %53 = arg u : u32
    %54 = arg b : bool
    %55 = arg d : f64
    %56 = load z[%53] : u32
    %57 = load iy[%0] : i32
    atomic_add iy[%0], %57
  }
  task tail serial %58 in [n, 10) {
    %59 = const true : bool
  }
}
)";

}  // namespace vkad::codegen::testing
