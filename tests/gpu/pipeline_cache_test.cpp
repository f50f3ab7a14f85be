// The pipeline cache confirms a hash hit by content: with every kernel forced onto one hash, two
// different kernels still get their own pipelines, and the same kernel twice is still a hit.
#include <gtest/gtest.h>

#include <vector>

#include "api/device_target.h"
#include "ir/builder.h"
#include "runtime/runtime.h"
#include "spirv/compiler.h"

namespace vkad::testing {
namespace {

using codegen::Array;
using codegen::KernelBuilder;
using codegen::Value;
using runtime::Arg;
using runtime::DType;

runtime::CompiledKernel scale(const runtime::Runtime& rt, double by) {
  KernelBuilder kb("scale");  // same name and parameters: only the SPIR-V differs
  Array x = kb.ndarray("x", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { x.store({i}, x(i) * by); });
  auto ck = codegen::compile(kb.finish(), codegen::target_from_caps(rt.caps()));
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  return ck.ok() ? *ck : runtime::CompiledKernel{};
}

TEST(PipelineCache, AHashHitIsConfirmedByContent) {
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.pipeline_hash_for_testing = [](const runtime::CompiledKernel&) -> uint64_t { return 7; };
  auto r = runtime::Runtime::create(o);
  if (!r.ok() && r.status().code() == ErrorCode::kNoDevice)
    GTEST_SKIP() << "SKIPPED: no Vulkan device";
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  runtime::Runtime& rt = **r;
  auto k2 = rt.register_kernel(scale(rt, 2));
  auto k3 = rt.register_kernel(scale(rt, 3));
  auto k2again = rt.register_kernel(scale(rt, 2));
  ASSERT_TRUE(k2.ok() && k3.ok() && k2again.ok());
  EXPECT_EQ(rt.stats()->pipelines_cached, 2u);
  EXPECT_EQ(rt.stats()->pipeline_cache_hits, 1u);
  auto h = rt.create_ndarray(DType::kF32, {1000}, "x");
  ASSERT_TRUE(h.ok());
  std::vector<float> ones(1000, 1.0f), out(1000);
  ASSERT_TRUE(rt.upload(*h, ones.data(), 4000).ok());
  const Arg args[] = {Arg::ndarray(*h)};
  ASSERT_TRUE(rt.launch(*k2, args).ok());
  ASSERT_TRUE(rt.launch(*k3, args).ok());
  ASSERT_TRUE(rt.launch(*k2again, args).ok());
  ASSERT_TRUE(rt.download(*h, out.data(), 4000).ok());
  for (float v : out) ASSERT_EQ(v, 12.0f);  // 1 * 2 * 3 * 2: each kernel ran its own code
  EXPECT_EQ(rt.device().validation_message_count(), 0u);
}

TEST(PipelineCache, SamePipelinesComparesEveryDefiningField) {
  runtime::CompiledKernel a;
  a.params = {{"x", runtime::ParamKind::kNdArray, DType::kF32, 1, true}};
  a.tasks.resize(1);
  a.tasks[0].spirv = {1, 2, 3};
  runtime::CompiledKernel b = a;
  EXPECT_TRUE(abi::same_pipelines(a, b));
  b.name = "other";  // names do not define pipelines
  EXPECT_TRUE(abi::same_pipelines(a, b));
  b = a;
  b.tasks[0].spirv[2] = 4;
  EXPECT_FALSE(abi::same_pipelines(a, b));
  b = a;
  b.tasks[0].local_size = 128;
  EXPECT_FALSE(abi::same_pipelines(a, b));
  b = a;
  b.params[0].rank = 2;
  EXPECT_FALSE(abi::same_pipelines(a, b));
  b = a;
  b.tasks[0].serial = true;
  EXPECT_FALSE(abi::same_pipelines(a, b));
}

}  // namespace
}  // namespace vkad::testing
