// split_in_place (autodiff/in_place.h): which arrays updated in place it splits -- the reads
// before the writes, one invocation per element -- and the rewrite (the loads moved to a copy
// parameter appended last). The gradients of the split kernels on a device, through a tape,
// are tests/gpu/in_place_tape_test.cpp's.
#include "autodiff/in_place.h"

#include <gtest/gtest.h>

#include <string>

#include "ir/text.h"
#include "ir/verifier.h"
#include "ir/walk.h"

namespace vkad::testing {
namespace {

using codegen::Kernel;

// The split of `body` inside `kernel k(x: ndarray<f32, 1> grad, y: ...) { task ... }`.
codegen::InPlaceSplit split(const std::string& text) {
  auto k = codegen::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return {};
  EXPECT_TRUE(codegen::verify(*k).ok());
  return codegen::split_in_place(*k);
}

size_t loads_of(const Kernel& k, uint32_t p) {
  size_t n = 0;
  codegen::for_each_stmt(
      k, [&](const codegen::Stmt& s) { n += s.op == codegen::Op::kLoad && s.param == p; });
  return n;
}

TEST(InPlace, AnOwnedUpdateIsSplitIntoACopyParameter) {
  auto r = split(R"(
kernel k(x: ndarray<f32, 1> grad, w: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = load w[%0] : f32
    %3 = mul %1, %2 : f32
    store x[%0], %3
  }
}
)");
  ASSERT_EQ(r.arrays.size(), 1u);
  EXPECT_EQ(r.arrays[0].param, 0u);
  EXPECT_EQ(r.arrays[0].before, 2u);
  ASSERT_EQ(r.kernel.params.size(), 3u);
  EXPECT_EQ(r.kernel.params[2].name, "x_before");
  EXPECT_TRUE(r.kernel.params[2].needs_grad);
  EXPECT_TRUE(r.kernel.params[2].read_only);
  EXPECT_EQ(loads_of(r.kernel, 0), 0u);
  EXPECT_EQ(loads_of(r.kernel, 2), 1u);
  EXPECT_EQ(loads_of(r.kernel, 1), 1u);  // w is not updated: untouched
  EXPECT_TRUE(codegen::verify(r.kernel).ok());
}

// taichi#2505's x[None] (a one-element array, as the Python builder writes a rank-0 one).
TEST(InPlace, AnUpdateInATaskOfOneIterationIsSplit) {
  auto r = split(R"(
kernel k(theta: ndarray<f32, 1> grad, x: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, 1) {
    %1 = const 0 : i32
    %2 = load theta[%1] : f32
    %3 = cos %2 : f32
    %4 = load x[%1] : f32
    %5 = mul %3, %4 : f32
    store x[%1], %5
  }
}
)");
  ASSERT_EQ(r.arrays.size(), 1u);
  EXPECT_EQ(r.arrays[0].param, 1u);
  EXPECT_EQ(loads_of(r.kernel, 1), 0u);
  EXPECT_EQ(loads_of(r.kernel, 2), 1u);
}

// An array of 2-vectors updated a component at a time, x[i, 0] and x[i, 1]: each invocation's
// own row (the task index, then constants), split; a row chosen by the thread's neighbour is not.
TEST(InPlace, ARowOfComponentsIsSplitANeighboursRowIsNot) {
  auto r = split(R"(
kernel k(x: ndarray<f32, 2> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = const 0 : i32
    %2 = const 1 : i32
    %3 = load x[%0, %1] : f32
    %4 = load x[%0, %2] : f32
    %5 = mul %3, %4 : f32
    store x[%0, %1], %5
  }
}
)");
  ASSERT_EQ(r.arrays.size(), 1u);
  EXPECT_EQ(loads_of(r.kernel, 0), 0u);
  auto n = split(R"(
kernel k(x: ndarray<f32, 2> grad) {
  task main parallel %0 in [0, 4) {
    %1 = const 0 : i32
    %2 = const 1 : i32
    %3 = add %0, %2 : i32
    %4 = load x[%3, %1] : f32
    store x[%0, %1], %4
  }
}
)");
  EXPECT_TRUE(n.arrays.empty());
}

// Each form breaks one condition; the kernel is left alone (reverse mode refuses it).
TEST(InPlace, WhatMayReadAStoredValueOrAnotherInvocationsElementIsNotSplit) {
  const char* forms[] = {
      // a load after the store
      R"(kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    store x[%0], %1
    %2 = load x[%0] : f32
    store y[%0], %2
  }
})",
      // a neighbour's element (not owned)
      R"(kernel k(x: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, 8) {
    %1 = const 1 : i32
    %2 = add %0, %1 : i32
    %3 = load x[%2] : f32
    store x[%0], %3
  }
})",
      // a serial task of several iterations
      R"(kernel k(x: ndarray<f32, 1> grad) {
  task main serial %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    store x[%0], %1
  }
})",
      // an atomic add besides the store
      R"(kernel k(x: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    store x[%0], %1
    atomic_add x[%0], %1
  }
})",
      // read in one task, written in another
      R"(kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task a parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    store y[%0], %1
  }
  task b parallel %2 in [0, shape(x, 0)) {
    %3 = load y[%2] : f32
    store x[%2], %3
  }
})",
      // no gradient
      R"(kernel k(x: ndarray<f32, 1>) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    store x[%0], %1
  }
})",
  };
  for (const char* text : forms) {
    auto r = split(text);
    EXPECT_TRUE(r.arrays.empty()) << text;
  }
}

TEST(InPlace, ALoopHoldingALoadAndAStoreIsNotSplit) {
  auto r = split(R"(
kernel k(x: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, 1) {
    %1 = const 0 : i32
    %2 = const 3 : i32
    for %3 in [%1, %2) {
      %4 = load x[%1] : f32
      %5 = sin %4 : f32
      store x[%1], %5
    }
  }
}
)");
  EXPECT_TRUE(r.arrays.empty());
}

}  // namespace
}  // namespace vkad::testing
