// Checks a task module that register_kernel is about to hand to the driver: it must be valid
// SPIR-V (the SPIRV-Tools gate of abi/spirv_tools.h) and its interface must match the kernel
// ABI of abi/kernel_abi.h as the CompiledKernel declares it. Drivers do not validate modules
// (a truncated one crashed lavapipe) and mismatched bindings are undefined behaviour, so both
// are errors here, before any driver call.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"

namespace vkad::runtime {

struct ModuleInterface {
  std::string entry_point = "main";   // the one GLCompute entry point
  uint32_t storage_buffer_count = 0;  // set 0, bindings [0, count): storage buffers only
  uint32_t push_constant_bytes = 0;   // the push-constant block must fit in this many bytes
  uint32_t local_size = 0;            // LocalSize must be (local_size, 1, 1)
};

// kInvalidArgument saying what is wrong (the validator's message, or which binding / block /
// execution mode disagrees with `expected`). `where` prefixes every message.
Status check_module(const std::vector<uint32_t>& words, const ModuleInterface& expected,
                    const std::string& where);

// Whether the module decorates a specialization constant with SpecId `spec_id` (the module is
// assumed valid: check_module passed).
bool declares_spec_id(const std::vector<uint32_t>& words, uint32_t spec_id);
// Every SpecId the module decorates, in one pass (registration checks several).
std::set<uint32_t> declared_spec_ids(const std::vector<uint32_t>& words);

}  // namespace vkad::runtime
