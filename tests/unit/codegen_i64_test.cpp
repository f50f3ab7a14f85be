// i64 in codegen: accepted where the target has shaderInt64 (the module validates, every
// operation included), rejected with kUnsupported naming the statement where it has not.
#include <gtest/gtest.h>

#include "ir/text.h"
#include "ir/verifier.h"
#include "spirv/compiler.h"
#include "unit/codegen_i64_kernel.h"

namespace vkad::codegen {
namespace {

TEST(CodegenI64, EveryOperationValidates) {
  auto k = parse(testing::kI64Kernel);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool opt : {false, true}) {
    CompileOptions o;
    o.optimize = opt;
    auto c = compile(*k, Target::host(), o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
  }
}

TEST(CodegenI64, TargetWithoutInt64IsRejectedNamingTheStatement) {
  Target t = Target::host();
  t.int64 = false;
  t.device_name = "tiny";
  auto k = parse(testing::kI64Kernel);
  ASSERT_TRUE(k.ok());
  Status st = verify(*k, t);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("parameter 's'"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("tiny lacks shaderInt64"), std::string::npos) << st.to_string();

  // Without i64 parameters: the first statement yielding or using an i64 is named.
  auto k2 = parse(R"(kernel c(x: ndarray<i32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : i32
    %w = cast %v : i64
    %b = cast %w : i32
    store x[%i], %b
  }
})");
  ASSERT_TRUE(k2.ok()) << k2.status().to_string();
  st = verify(*k2, t);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("statement `%"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find(" = cast %"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find(" : i64`: dtype i64 is not supported"), std::string::npos)
      << st.to_string();
  EXPECT_TRUE(verify(*k2).ok());
}

TEST(CodegenI64, AtomicAddNeedsInt64Atomics) {
  Target t = Target::host();
  t.atomic_int64 = false;
  auto k = parse(R"(kernel a(x: ndarray<i64, 1>) {
  task main parallel %i in [0, 4) {
    %z = const 0 : i32
    %one = const 1 : i64
    atomic_add x[%z], %one
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  Status st = verify(*k, t);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("atomic_add on i64 needs shaderBufferInt64Atomics"),
            std::string::npos)
      << st.to_string();
}

}  // namespace
}  // namespace vkad::codegen
