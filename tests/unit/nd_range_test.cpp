// N-d parallel tasks on the CPU reference: every point of the box exactly once, the same
// values as the flattened 1-d kernel, the text form round trip, bad bounds rejected with a
// clear error, ownership of [i, j], and a stencil's gradients against finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "support/ad_check.h"
#include "support/nd_kernels.h"

namespace vkad::testing {
namespace {

using namespace codegen;  // NOLINT

TEST(NdRange, TwoDimensionsVisitEveryPointOnce) {
  Kernel k = nd2_kernel();
  ASSERT_TRUE(verify(k).ok()) << verify(k).to_string();
  const uint32_t rows = 7, cols = 5;  // odd extents; j runs to cols - 1
  HostValues v;
  v.scalars = {6, 0, 0, 0};
  v.arrays = {HostArray{}, HostArray(DType::kF32, {rows, cols}),
              HostArray(DType::kF32, {rows, cols}), HostArray(DType::kI32, {rows, cols})};
  for (size_t e = 0; e < rows * cols; ++e) v.arrays[1].data[e] = 0.25 * static_cast<double>(e % 4);
  auto view = v.view();
  auto r = evaluate(k, view);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->error_flags, std::vector<uint32_t>{0});
  for (uint32_t i = 0; i < rows; ++i) {
    for (uint32_t j = 0; j < cols; ++j) {
      bool inside = i >= 1 && i < 6 && j < cols - 1;
      size_t e = i * cols + j;
      EXPECT_EQ(v.arrays[3].data[e], inside ? 1 : 0) << i << "," << j;
      EXPECT_EQ(v.arrays[2].data[e], inside ? 1000.0 * i + j + v.arrays[1].data[e] : 0)
          << i << "," << j;
    }
  }
}

TEST(NdRange, ThreeDimensionsMatchTheFlattenedKernel) {
  Kernel a = nd3_kernel(false), b = nd3_kernel(true);
  ASSERT_TRUE(verify(a).ok()) << verify(a).to_string();
  ASSERT_TRUE(verify(b).ok()) << verify(b).to_string();
  HostArray x(DType::kF32, {3, 5, 7}), ya(DType::kF32, {3, 5, 7});
  for (size_t e = 0; e < x.size(); ++e) x.data[e] = static_cast<double>(e % 11) - 4.5;
  HostArray yb = ya;
  std::vector<HostArg> aa = {HostArg::of(x), HostArg::of(ya)},
                       ab = {HostArg::of(x), HostArg::of(yb)};
  ASSERT_TRUE(evaluate(a, aa).ok());
  ASSERT_TRUE(evaluate(b, ab).ok());
  EXPECT_EQ(ya.data, yb.data);
  EXPECT_NE(ya.data[x.size() - 1], 0.0);
}

TEST(NdRange, TextRoundTrip) {
  for (const Kernel& k : {nd2_kernel(), nd3_kernel(false), stencil_kernel()}) {
    std::string text = print(k);
    auto back = parse(text);
    ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
    EXPECT_EQ(print(*back), text);
    ASSERT_TRUE(verify(*back).ok());
  }
  EXPECT_NE(print(nd2_kernel()).find("parallel %0 in [1, n), %1 in [0, add(shape(x, 1), -1))"),
            std::string::npos)
      << print(nd2_kernel());
  // One dimension with an expression bound stays an N-d task; with plain bounds it is 1-d.
  const char* one = R"(kernel one(n: i32, m: i32, y: ndarray<f32, 1>) {
  task t parallel %i in [0, mul(n, max(m, 2))) {
    %f = const 1.0 : f32
    store y[%i], %f
  }
})";
  auto k = parse(one);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_EQ(k->tasks[0].dims.size(), 1u);
  EXPECT_NE(print(*k).find(" in [0, mul(n, max(m, 2))) {"), std::string::npos) << print(*k);
  EXPECT_EQ(parse(print(*k))->tasks[0].dims.size(), 1u);
  auto plain = parse(R"(kernel p(n: i32, y: ndarray<f32, 1>) {
  task t parallel %i in [0, n) {
    %f = const 1.0 : f32
    store y[%i], %f
  }
})");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->tasks[0].dims.empty());
}

Status verify_text(const std::string& text) {
  auto k = parse(text);
  if (!k.ok()) return k.status();
  return verify(*k);
}

TEST(NdRange, BadBoundsAreRejectedNamingTheTaskAndDimension) {
  auto with = [](const std::string& ranges) {
    return "kernel bad(a: f32, n: i32, x: ndarray<f32, 2>) {\n  task t parallel " + ranges +
           " {\n    %f = const 1.0 : f32\n    store x[%i, %j], %f\n  }\n}\n";
  };
  struct Case {
    std::string ranges, message;
  };
  const Case cases[] = {
      {"%i in [0, n), %j in [0, add(a, 1))",
       "task 't': dimension 1 end uses 'a', which is not an i32 or u32 scalar"},
      {"%i in [0, n), %j in [0, shape(x, 2))",
       "task 't': dimension 1 end uses shape(x, 2), which does not exist"},
      {"%i in [-1, n), %j in [0, n)", "task 't': dimension 0 begin is negative (-1)"},
      {"%i in [0, 4294967296), %j in [0, n)",
       "dimension 0 end: constant 4294967296 is out of range for i32"},
      {"%i in [0, n), %j in [0, n), %k in [0, n), %l in [0, n)", "a task has at most 3 dimensions"},
  };
  for (const Case& c : cases) {
    Status st = verify_text(with(c.ranges));
    ASSERT_FALSE(st.ok()) << c.ranges;
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st.to_string();
  }
  // The reference refuses what a launch would: a begin that evaluates negative.
  auto k = parse(with("%i in [0, n), %j in [add(n, -5), n)"));
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(verify(*k).ok());
  HostArray x(DType::kF32, {4, 4});
  std::vector<HostArg> args = {HostArg::of(0.5), HostArg::of(3), HostArg::of(x)};
  auto r = evaluate(*k, args);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("task 't': dimension 1's range is out of bounds"),
            std::string::npos)
      << r.status().to_string();
}

TEST(NdRange, OwnsElementsIndexedByItsIndicesInOrder) {
  Kernel k = stencil_kernel();
  std::vector<bool> owned = owned_ndarrays(k, k.tasks[0]);
  EXPECT_EQ(owned, (std::vector<bool>{false, true, true}));  // u has neighbours, c and out [i, j]
  KernelBuilder kb("swap");
  Array x = kb.ndarray("x", DType::kF32, 2);
  Array y = kb.ndarray("y", DType::kF32, 2);
  kb.parallel_for("t", {0, 4}, {0, 4}, [&](Value i, Value j) { y.at(i, j) = x(j, i); });
  Kernel s = kb.finish();
  EXPECT_EQ(owned_ndarrays(s, s.tasks[0]), (std::vector<bool>{false, true}));
}

TEST(NdRange, StencilGradientsMatchFiniteDifferences) {
  Kernel k = stencil_kernel();
  ASSERT_TRUE(verify(k).ok());
  auto adj = make_adjoint(k);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  EXPECT_EQ(adj->tasks[0].dims.size(), 2u);
  HostValues v;
  v.scalars = {0, 0, 0};
  v.arrays = {HostArray(DType::kF64, {5, 6}), HostArray(DType::kF64, {5, 6}),
              HostArray(DType::kF64, {5, 6})};
  for (size_t e = 0; e < 30; ++e) {
    v.arrays[0].data[e] = std::sin(0.7 * static_cast<double>(e));
    v.arrays[1].data[e] = std::cos(1.3 * static_cast<double>(e));
  }
  auto r = check_gradients_cpu(k, v, 4);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->failure, "");
  EXPECT_GE(r->checked, 56);
}

}  // namespace
}  // namespace vkad::testing
