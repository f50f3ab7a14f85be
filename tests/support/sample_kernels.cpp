// Hand-written SPIR-V used by rhi/runtime tests and benchmarks before codegen exists for them.
#include "support/sample_kernels.h"

#include <string>

namespace vkad::testing {

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

}  // namespace vkad::testing

#include "abi/spirv_tools.h"

namespace vkad::testing {

namespace {
constexpr const char* kAxpyTemplate = R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main" %gid %nwg %args %x %y %pc
OpExecutionMode %main LocalSize 64 1 1
OpDecorate %gid BuiltIn GlobalInvocationId
OpDecorate %nwg BuiltIn NumWorkgroups
OpMemberDecorate %Args 0 Offset 0
OpMemberDecorate %Args 1 Offset 4
OpMemberDecorate %Args 2 Offset 8
OpMemberDecorate %Args 3 Offset 12
OpDecorate %Args Block
OpDecorate %args DescriptorSet 0
OpDecorate %args Binding 0
OpDecorate %farr ArrayStride 4
OpMemberDecorate %FBuf 0 Offset 0
OpDecorate %FBuf Block
OpDecorate %x DescriptorSet 0
OpDecorate %x Binding 1
OpDecorate %y DescriptorSet 0
OpDecorate %y Binding 2
OpMemberDecorate %PC 0 Offset 0
OpMemberDecorate %PC 1 Offset 4
OpDecorate %PC Block
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%float = OpTypeFloat 32
%bool = OpTypeBool
%v3uint = OpTypeVector %uint 3
%ptr_in_v3 = OpTypePointer Input %v3uint
%gid = OpVariable %ptr_in_v3 Input
%nwg = OpVariable %ptr_in_v3 Input
%Args = OpTypeStruct %float %uint %uint %uint
%ptr_sb_Args = OpTypePointer StorageBuffer %Args
%args = OpVariable %ptr_sb_Args StorageBuffer
%farr = OpTypeRuntimeArray %float
%FBuf = OpTypeStruct %farr
%ptr_sb_FBuf = OpTypePointer StorageBuffer %FBuf
%x = OpVariable %ptr_sb_FBuf StorageBuffer
%y = OpVariable %ptr_sb_FBuf StorageBuffer
%PC = OpTypeStruct %uint %uint
%ptr_pc_PC = OpTypePointer PushConstant %PC
%pc = OpVariable %ptr_pc_PC PushConstant
%ptr_pc_uint = OpTypePointer PushConstant %uint
%ptr_sb_uint = OpTypePointer StorageBuffer %uint
%ptr_sb_float = OpTypePointer StorageBuffer %float
%ptr_fn_uint = OpTypePointer Function %uint
%c0 = OpConstant %uint 0
%c1 = OpConstant %uint 1
%c3 = OpConstant %uint 3
%c7 = OpConstant %uint 7
%c64 = OpConstant %uint 64
%f0 = OpConstant %float 0
%main = OpFunction %void None %fn
%entry = OpLabel
%i = OpVariable %ptr_fn_uint Function
%g = OpLoad %v3uint %gid
%g0 = OpCompositeExtract %uint %g 0
%w = OpLoad %v3uint %nwg
%w0 = OpCompositeExtract %uint %w 0
%stride = OpIMul %uint %w0 %c64
%bp = OpAccessChain %ptr_pc_uint %pc %c0
%begin = OpLoad %uint %bp
%ep = OpAccessChain %ptr_pc_uint %pc %c1
%end = OpLoad %uint %ep
%ap = OpAccessChain %ptr_sb_float %args %c0
%a = OpLoad %float %ap
%start = OpIAdd %uint %begin %g0
OpStore %i %start
OpBranch %head
%head = OpLabel
%iv = OpLoad %uint %i
%more = OpULessThan %bool %iv %end
OpLoopMerge %exit %cont None
OpBranchConditional %more %body %exit
%body = OpLabel
%xp = OpAccessChain %ptr_sb_float %x %c0 %iv
%xv = OpLoad %float %xp
%yp = OpAccessChain %ptr_sb_float %y %c0 %iv
%yv = OpLoad %float %yp
%ax = OpFMul %float %a %xv
%r = OP %float %ax %yv
OpStore %yp %r
%neg = OpFOrdLessThan %bool %xv %f0
OpSelectionMerge %flagged None
OpBranchConditional %neg %flag %flagged
%flag = OpLabel
%errp = OpAccessChain %ptr_sb_uint %args %c3
OpStore %errp %c7
OpBranch %flagged
%flagged = OpLabel
OpBranch %cont
%cont = OpLabel
%next = OpIAdd %uint %iv %stride
OpStore %i %next
OpBranch %head
%exit = OpLabel
OpReturn
OpFunctionEnd
)";
}  // namespace

runtime::CompiledKernel make_axpy_kernel(const std::string& name, const char* op) {
  std::string text = kAxpyTemplate;
  text.replace(text.find("OP %float"), 2, op);
  auto words = codegen::assemble_spirv(text);
  runtime::CompiledKernel k;
  k.name = name;
  k.params = {{"a", runtime::ParamKind::kScalar, runtime::DType::kF32, 0, false},
              {"x", runtime::ParamKind::kNdArray, runtime::DType::kF32, 1, false},
              {"y", runtime::ParamKind::kNdArray, runtime::DType::kF32, 1, true}};
  runtime::CompiledTask t;
  t.name = "axpy";
  t.spirv = words.ok() ? *words : std::vector<uint32_t>{};
  t.local_size = 64;
  t.begin = runtime::RangeBound::constant(0);
  t.end = runtime::RangeBound::array_dim(1, 0);
  k.tasks.push_back(std::move(t));
  return k;
}

// The raw copy: y[i] = x[i], hand-written, grid-stride, no bounds checks (the ABI of
// abi/kernel_abi.h: args at binding 0, x at 1, y at 2, push constants {begin, end}).
const char* kCopyU32Spirv = R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main" %gid %nwg %args %x %y %push
OpExecutionMode %main LocalSize 128 1 1
OpDecorate %gid BuiltIn GlobalInvocationId
OpDecorate %nwg BuiltIn NumWorkgroups
OpDecorate %rt ArrayStride 4
OpMemberDecorate %buf 0 Offset 0
OpDecorate %buf Block
OpMemberDecorate %pc 0 Offset 0
OpMemberDecorate %pc 1 Offset 4
OpDecorate %pc Block
OpDecorate %args DescriptorSet 0
OpDecorate %args Binding 0
OpDecorate %x DescriptorSet 0
OpDecorate %x Binding 1
OpDecorate %y DescriptorSet 0
OpDecorate %y Binding 2
%void = OpTypeVoid
%fn = OpTypeFunction %void
%u32 = OpTypeInt 32 0
%bool = OpTypeBool
%v3 = OpTypeVector %u32 3
%pin = OpTypePointer Input %v3
%gid = OpVariable %pin Input
%nwg = OpVariable %pin Input
%rt = OpTypeRuntimeArray %u32
%buf = OpTypeStruct %rt
%pbuf = OpTypePointer StorageBuffer %buf
%args = OpVariable %pbuf StorageBuffer
%x = OpVariable %pbuf StorageBuffer
%y = OpVariable %pbuf StorageBuffer
%pc = OpTypeStruct %u32 %u32
%ppc = OpTypePointer PushConstant %pc
%push = OpVariable %ppc PushConstant
%ppcu = OpTypePointer PushConstant %u32
%pu = OpTypePointer StorageBuffer %u32
%c0 = OpConstant %u32 0
%c1 = OpConstant %u32 1
%c128 = OpConstant %u32 128
%main = OpFunction %void None %fn
%entry = OpLabel
%g3 = OpLoad %v3 %gid
%g = OpCompositeExtract %u32 %g3 0
%n3 = OpLoad %v3 %nwg
%n = OpCompositeExtract %u32 %n3 0
%stride = OpIMul %u32 %n %c128
%pb = OpAccessChain %ppcu %push %c0
%b = OpLoad %u32 %pb
%pe = OpAccessChain %ppcu %push %c1
%e = OpLoad %u32 %pe
%start = OpIAdd %u32 %b %g
OpBranch %head
%head = OpLabel
%i = OpPhi %u32 %start %entry %next %cont
OpLoopMerge %exit %cont None
OpBranch %check
%check = OpLabel
%ok = OpULessThan %bool %i %e
OpBranchConditional %ok %body %exit
%body = OpLabel
%src = OpAccessChain %pu %x %c0 %i
%v = OpLoad %u32 %src
%dst = OpAccessChain %pu %y %c0 %i
OpStore %dst %v
OpBranch %cont
%cont = OpLabel
%next = OpIAdd %u32 %i %stride
OpBranch %head
%exit = OpLabel
OpReturn
OpFunctionEnd
)";

// kCopyU32Spirv with 16-byte accesses: the same module with the ndarrays viewed as uvec4
// (ArrayStride 16). One 4-byte load per thread keeps too few bytes in flight to saturate HBM
// (H200: 3155 GB/s scalar, 4050 GB/s uvec4).
static std::string copy_u32x4_spirv() {
  std::string t = kCopyU32Spirv;
  auto swap = [&](const std::string& from, const std::string& to) {
    t.replace(t.find(from), from.size(), to);
  };
  swap("OpDecorate %rt ArrayStride 4", "OpDecorate %rt ArrayStride 16");
  swap("%rt = OpTypeRuntimeArray %u32", "%v4 = OpTypeVector %u32 4\n%rt = OpTypeRuntimeArray %v4");
  swap("%pu = OpTypePointer StorageBuffer %u32", "%pu = OpTypePointer StorageBuffer %v4");
  swap("%v = OpLoad %u32 %src", "%v = OpLoad %v4 %src");
  return t;
}

runtime::CompiledKernel make_copy_u32x4_kernel() {
  runtime::CompiledKernel k;
  k.name = "copy_u32x4";
  k.params = {{"n4", runtime::ParamKind::kScalar, runtime::DType::kU32, 0, false},
              {"x", runtime::ParamKind::kNdArray, runtime::DType::kU32, 1, false},
              {"y", runtime::ParamKind::kNdArray, runtime::DType::kU32, 1, true}};
  auto words = codegen::assemble_spirv(copy_u32x4_spirv());
  k.tasks.push_back({"main",
                     words.ok() ? *words : std::vector<uint32_t>{},
                     128,
                     runtime::RangeBound::constant(0),
                     runtime::RangeBound::scalar(0),
                     false,
                     {}});
  return k;
}

}  // namespace vkad::testing
