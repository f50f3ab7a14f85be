// SPIR-V emission without a device: every module of every test kernel passes the validator
// (compile() runs the gate), in both atomic lowerings, with and without spirv-opt, and the
// output is deterministic.
#include <gtest/gtest.h>

#include "codegen/compiler.h"
#include "codegen/spirv_tools.h"
#include "codegen/text.h"
#include "unit/codegen_kernels.h"

namespace vkad::codegen {
namespace {

Kernel parsed(const std::string& text) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : Kernel{};
}

TEST(CodegenEmit, EveryStatementKindValidates) {
  Kernel k = parsed(testing::kEveryStatementKernel);
  for (bool native : {true, false}) {
    for (bool opt : {false, true}) {
      CompileOptions o;
      o.native_float_atomics = native;
      o.optimize = opt;
      auto c = compile(k, Target{}, o);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      ASSERT_EQ(c->tasks.size(), 2u);
      for (const auto& t : c->tasks) EXPECT_TRUE(validate_spirv(t.spirv).ok());
      std::string dis = disassemble_spirv(c->tasks[0].spirv);
      if (!opt) {
        // The two lowerings of a float atomic add.
        EXPECT_EQ(dis.find("OpAtomicFAddEXT") != std::string::npos, native) << dis;
        EXPECT_EQ(dis.find("OpAtomicCompareExchange %uint") != std::string::npos, true);
      }
    }
  }
}

TEST(CodegenEmit, Deterministic) {
  Kernel k = parsed(testing::kEveryStatementKernel);
  auto a = compile(k, Target{});
  auto b = compile(parsed(print(k)), Target{});
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t t = 0; t < a->tasks.size(); ++t) EXPECT_EQ(a->tasks[t].spirv, b->tasks[t].spirv);
  EXPECT_EQ(a->content_hash(), b->content_hash());
}

TEST(CodegenEmit, TargetWithoutF64IsRejectedNotMiscompiled) {
  Target t;
  t.float64 = false;
  t.device_name = "tiny";
  auto c = compile(parsed(testing::kEveryStatementKernel), t);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(c.status().message().find("f64 is not supported on this device (tiny"), std::string::npos)
      << c.status().message();
}

TEST(CodegenEmit, CacheHitsOnContent) {
  CompileCache cache;
  Kernel k = parsed(testing::kEveryStatementKernel);
  auto a = cache.compile(k, Target{});
  ASSERT_TRUE(a.ok());
  auto b = cache.compile(parsed(print(k)), Target{});  // same content, different object
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(cache.hits(), 1u);
  k.tasks[0].local_size = 16;  // different content
  auto c = cache.compile(k, Target{});
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->get(), c->get());
  EXPECT_EQ(cache.misses(), 2u);
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace vkad::codegen
