// A CompiledKernel as bytes, for the on-disk kernel cache (codegen::CompileCache): every field,
// SPIR-V words included, in a fixed little-endian layout. The bytes are only read back by the
// same build (the cache key carries the compiler's fingerprint), but the reader still trusts
// nothing: any truncation, count past what the bytes hold, unknown enum value or size
// expression nested past kMaxSerializedSizeDepth is kInvalidArgument, never a crash.
#pragma once

#include <string>
#include <string_view>

#include "abi/kernel_abi.h"
#include "base/status.h"

namespace vkad::abi {

inline constexpr uint32_t kMaxSerializedSizeDepth = 256;

// kInvalidArgument when a size expression nests deeper than kMaxSerializedSizeDepth (such a
// kernel is simply not cached).
Result<std::string> serialize_compiled_kernel(const CompiledKernel& k);
Result<CompiledKernel> deserialize_compiled_kernel(std::string_view bytes);

}  // namespace vkad::abi
