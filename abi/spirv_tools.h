// The one gate every SPIR-V module passes before a driver sees it: SPIRV-Tools' assembler and
// validator for the Vulkan 1.2 environment (SPIR-V 1.5). A failure carries the validator's
// message and the module's disassembly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace vkad::abi {

// Assembles SPIR-V text and validates the result. kInvalidArgument with line numbers on a
// syntax error; kInternal with the disassembly when the module does not validate.
Result<std::vector<uint32_t>> assemble_spirv(const std::string& text);
// Validates `words`; kInternal with message + disassembly on failure. Runs the validator every
// time and remembers modules that pass (by content hash; bounded; thread-safe).
Status validate_spirv(const std::vector<uint32_t>& words);
// Like validate_spirv, but a module that already passed in this process is not validated again
// (register_kernel uses it, so a module compile() produced is validated once).
Status validate_spirv_once(const std::vector<uint32_t>& words);
// Records `words` as validated without running the validator: for modules that passed
// validate_spirv in an earlier process and were read back intact (codegen::CompileCache's disk
// layer checks a checksum over them and a key naming this build's compiler).
void note_validated(const std::vector<uint32_t>& words);
std::string disassemble_spirv(const std::vector<uint32_t>& words);

}  // namespace vkad::abi

// Callers named these codegen:: before the abi/ floor.
namespace vkad::codegen {
using abi::assemble_spirv;
using abi::disassemble_spirv;
using abi::note_validated;
using abi::validate_spirv;
using abi::validate_spirv_once;
}  // namespace vkad::codegen
