// The builder's newer features on a device against the CPU reference (validation on): i64
// arithmetic and casts, and a Vec3 kernel (lowered to scalars) built with the conveniences.
#include <gtest/gtest.h>

#include "gpu/kernel_harness.h"
#include "ir/builder.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "unit/codegen_i64_kernel.h"

namespace vkad::testing {
namespace {

using namespace codegen;  // NOLINT: kernels read like kernels

using BuilderFeatures = KernelTest;

TEST_F(BuilderFeatures, I64MatchesTheReference) {
  Target t = runner_->target();
  if (!t.int64) GTEST_SKIP() << "device without shaderInt64";
  auto k = parse(codegen::testing::kI64Kernel);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(verify(*k, t).ok()) << verify(*k, t).to_string();
  const uint32_t n = 301;
  HostArgs dev = make_args(
      *k,
      {ArgSpec::of(5e12), ArgSpec::array({n}, -1e13, 1e13), ArgSpec::array({n}, -1e6, 1e6),
       ArgSpec::array({n}, -1e12, 1e12), ArgSpec::array({n, 10}, 0, 0), ArgSpec::array({n}, 0, 0),
       ArgSpec::array({1}, 0, 0)},
      11);
  // Edges: a zero divisor, INT32 boundaries through the i32 / u32 casts, equal operands.
  dev.arrays[2].data[0] = 0;
  dev.arrays[1].data[1] = 2147483648.0, dev.arrays[2].data[1] = -1;
  dev.arrays[1].data[2] = -4294967297.0, dev.arrays[2].data[2] = dev.arrays[1].data[2];
  dev.arrays[1].data[3] = 5e12;
  HostArgs cpu = dev;
  auto view = cpu.view();
  auto ref = evaluate(*k, view);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_TRUE(runner_->run(*k, dev).ok());
  for (size_t p : {4, 5, 6})
    EXPECT_EQ(compare_arrays_exact(dev.arrays[p], cpu.arrays[p]), "") << k->params[p].name;
}

TEST_F(BuilderFeatures, VectorKernelMatchesTheReference) {
  KernelBuilder kb("vec");
  Array p = kb.ndarray("p", DType::kF32, 2, {.read_only = true});
  Array w = kb.ndarray("w", DType::kF32, 1, {.read_only = true});
  Array out = kb.ndarray("out", DType::kF32, 2);
  kb.parallel_for("main", 0, p.dim(0), [&](Value i) {
    Vec3 a = p.load_vec<3>({i});
    Vec3 b = w.load_vec<3>({i * 3});
    VecLocal<3> acc = kb.local_vec<3>(DType::kF32);
    kb.for_range(kb.i32(0), kb.i32(3), [&](Value j) {
      acc += normalize(a + 2.0) * dot(a, b) - cross(a, b) / (length(b) + 1.0);
      kb.if_(j == 1, [&] { acc *= 0.5; });
    });
    out.store_vec<3>({i}, acc.load());
    out.at(i, kb.i32(3)) = length(acc.load());
    out.at(i, kb.i32(3)) += 1;
  });
  Kernel k = kb.finish();
  ASSERT_TRUE(verify(k).ok()) << verify(k).to_string();
  const uint32_t n = 97;
  HostArgs dev = make_args(
      k, {ArgSpec::array({n, 3}), ArgSpec::array({3 * n}), ArgSpec::array({n, 4}, 0, 0)}, 5);
  HostArgs cpu = dev;
  auto view = cpu.view();
  ASSERT_TRUE(evaluate(k, view).ok());
  ASSERT_TRUE(runner_->run(k, dev).ok());
  EXPECT_EQ(compare_arrays(dev.arrays[2], cpu.arrays[2]), "");
}

}  // namespace
}  // namespace vkad::testing
