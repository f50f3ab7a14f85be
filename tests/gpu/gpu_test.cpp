#include "gpu/gpu_test.h"

#include <spirv-tools/libspirv.hpp>

#include <cstring>

namespace vkad::testing {

std::vector<uint32_t> assemble(const std::string& text) {
  spvtools::SpirvTools tools(SPV_ENV_VULKAN_1_2);
  std::string errors;
  tools.SetMessageConsumer([&](spv_message_level_t, const char*, const spv_position_t& pos,
                               const char* msg) {
    errors += "line " + std::to_string(pos.line) + ": " + msg + "\n";
  });
  std::vector<uint32_t> words;
  EXPECT_TRUE(tools.Assemble(text, &words)) << errors;
  EXPECT_TRUE(tools.Validate(words)) << errors;
  return words;
}

namespace {
constexpr const char* kHeader = R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main" %gid %in %out %pc
OpExecutionMode %main LocalSize 64 1 1
OpDecorate %gid BuiltIn GlobalInvocationId
OpDecorate %arr ArrayStride 4
OpMemberDecorate %Buf 0 Offset 0
OpDecorate %Buf Block
OpDecorate %in DescriptorSet 0
OpDecorate %in Binding 0
OpDecorate %out DescriptorSet 0
OpDecorate %out Binding 1
OpMemberDecorate %PC 0 Offset 0
OpMemberDecorate %PC 1 Offset 4
OpMemberDecorate %PC 2 Offset 8
OpDecorate %PC Block
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%v3uint = OpTypeVector %uint 3
%ptr_in_v3 = OpTypePointer Input %v3uint
%gid = OpVariable %ptr_in_v3 Input
%arr = OpTypeRuntimeArray %uint
%Buf = OpTypeStruct %arr
%ptr_sb_Buf = OpTypePointer StorageBuffer %Buf
%in = OpVariable %ptr_sb_Buf StorageBuffer
%out = OpVariable %ptr_sb_Buf StorageBuffer
%PC = OpTypeStruct %uint %uint %uint
%ptr_pc_PC = OpTypePointer PushConstant %PC
%pc = OpVariable %ptr_pc_PC PushConstant
%ptr_pc_uint = OpTypePointer PushConstant %uint
%ptr_sb_uint = OpTypePointer StorageBuffer %uint
%ptr_fn_uint = OpTypePointer Function %uint
%bool = OpTypeBool
%c0 = OpConstant %uint 0
%c1 = OpConstant %uint 1
%c2 = OpConstant %uint 2
)";

constexpr const char* kBody = R"(
%i = OpCompositeExtract %uint %g 0
%np = OpAccessChain %ptr_pc_uint %pc %c0
%n = OpLoad %uint %np
%inb = OpULessThan %bool %i %n
OpSelectionMerge %end None
OpBranchConditional %inb %body %end
%body = OpLabel
%ip = OpAccessChain %ptr_sb_uint %in %c0 %i
%x = OpLoad %uint %ip
%ap = OpAccessChain %ptr_pc_uint %pc %c1
%a = OpLoad %uint %ap
%x2 = OpIMul %uint %x %c2
%y0 = OpIAdd %uint %x2 %a
%y = OpIAdd %uint %y0 %extra
%op = OpAccessChain %ptr_sb_uint %out %c0 %i
OpStore %op %y
OpBranch %end
%end = OpLabel
OpReturn
OpFunctionEnd
)";

const std::string kScaleAdd = std::string(kHeader) + R"(
%main = OpFunction %void None %fn
%entry = OpLabel
%g = OpLoad %v3uint %gid
%extra = OpCopyObject %uint %c0
)" + kBody;

// The spin loop accumulates (k & 1) into `acc`, then adds acc*0 (always 0, but the compiler
// cannot drop the loop because acc depends on it... it can, so the store uses acc - acc + ...).
// To keep the loop, the result adds (acc ^ acc): still 0; drivers rarely fold loop-carried xor.
const std::string kSpin = std::string(kHeader) + R"(
%main = OpFunction %void None %fn
%entry = OpLabel
%k = OpVariable %ptr_fn_uint Function
%acc = OpVariable %ptr_fn_uint Function
%g = OpLoad %v3uint %gid
OpStore %k %c0
OpStore %acc %c0
%sp = OpAccessChain %ptr_pc_uint %pc %c2
%spin = OpLoad %uint %sp
OpBranch %head
%head = OpLabel
%kv = OpLoad %uint %k
%more = OpULessThan %bool %kv %spin
OpLoopMerge %after %cont None
OpBranchConditional %more %loop %after
%loop = OpLabel
%av = OpLoad %uint %acc
%mix = OpIMul %uint %av %c2
%bit = OpBitwiseAnd %uint %kv %c1
%nv = OpIAdd %uint %mix %bit
OpStore %acc %nv
OpBranch %cont
%cont = OpLabel
%kn = OpIAdd %uint %kv %c1
OpStore %k %kn
OpBranch %head
%after = OpLabel
%af = OpLoad %uint %acc
%extra = OpBitwiseXor %uint %af %af
)" + kBody;
}  // namespace

const char* kScaleAddSpirv = kScaleAdd.c_str();
const char* kSpinScaleAddSpirv = kSpin.c_str();

Result<std::unique_ptr<rhi::Device>> GpuTest::make_device(rhi::DeviceOptions options) {
  options.enable_validation = true;
  return rhi::Device::create(options);
}

void GpuTest::SetUp() {
  auto d = make_device();
  if (!d.ok() && d.status().code() == ErrorCode::kNoDevice) {
    GTEST_SKIP() << "SKIPPED: no Vulkan device (" << d.status().message() << ")";
  }
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  device_ = std::move(d).value();
}

void GpuTest::TearDown() {
  if (!device_) return;
  EXPECT_EQ(device_->validation_message_count(), 0u) << [&] {
    std::string all;
    for (const auto& m : device_->validation_messages()) all += m + "\n";
    return all;
  }();
}

rhi::Buffer upload_u32(rhi::Device& device, rhi::Stream& stream, const std::vector<uint32_t>& data,
                       const std::string& name) {
  uint64_t bytes = data.size() * 4;
  auto dst = device.create_buffer({bytes, rhi::MemoryUsage::kDeviceLocal, name});
  auto staging = device.create_buffer({bytes, rhi::MemoryUsage::kUpload, name + " staging"});
  EXPECT_TRUE(dst.ok() && staging.ok());
  std::memcpy(staging->mapped(), data.data(), bytes);
  auto list = stream.begin();
  EXPECT_TRUE(list.ok());
  list->copy(*staging, *dst, bytes);
  list->barrier(rhi::Barrier::kTransferToCompute);
  auto sem = stream.submit(*list);
  EXPECT_TRUE(sem.ok());
  EXPECT_TRUE(sem->wait());
  return std::move(dst).value();
}

std::vector<uint32_t> download_u32(rhi::Device& device, rhi::Stream& stream, rhi::Buffer& buffer) {
  auto rb = device.create_buffer({buffer.size(), rhi::MemoryUsage::kReadback, "readback"});
  EXPECT_TRUE(rb.ok());
  auto list = stream.begin();
  EXPECT_TRUE(list.ok()) << list.status().to_string();
  list->barrier(rhi::Barrier::kComputeToTransfer);
  list->copy(buffer, *rb, buffer.size());
  list->barrier(rhi::Barrier::kToHost);
  auto sem = stream.submit(*list);
  EXPECT_TRUE(sem.ok());
  EXPECT_TRUE(sem->wait());
  std::vector<uint32_t> out(buffer.size() / 4);
  std::memcpy(out.data(), rb->mapped(), buffer.size());
  return out;
}

}  // namespace vkad::testing
