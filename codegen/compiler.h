// compile(): a verified kernel in, the CompiledKernel that runtime/ registers out.
//
//   verify -> emit one SPIR-V module per task -> [spirv-opt] -> validate (the one gate)
//
// A module that fails validation after a successful verify is a compiler bug: the error is
// kInternal and carries the validator's message and the disassembly.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "codegen/ir.h"
#include "codegen/target.h"
#include "base/status.h"
#include "abi/kernel_abi.h"

namespace vkad::codegen {

struct CompileOptions {
  // Run spirv-opt's performance passes (docs/benchmarks.md has what it costs and buys).
  bool optimize = false;
  // Use SPV_EXT_shader_atomic_float_add where the target has it; false forces the
  // compare-and-swap loop (tests use this to cover both lowerings on one device).
  bool native_float_atomics = true;
  bool bounds_checks = true;
  uint32_t default_local_size = 128;  // parallel tasks that do not set one
  // Elements per main-loop iteration of straight-line parallel tasks whose written arrays are
  // accessed only at the task index (more loads in flight; EmitOptions::unroll). 1: off.
  uint32_t unroll = 4;
};

// Errors: those of verify() (kInvalidArgument / kUnsupported naming the statement), kInternal
// when an emitted module does not validate.
Result<abi::CompiledKernel> compile(const Kernel& k, const Target& target,
                                        const CompileOptions& options = {});

// Runs spirv-opt's performance passes on a valid module; kInternal if the optimizer fails.
Result<std::vector<uint32_t>> optimize_spirv(const std::vector<uint32_t>& words);

// Content-keyed cache: compiling the same kernel (same text form, target and options) twice
// returns the first result. Thread-safe. Entries live as long as the cache.
class CompileCache {
 public:
  Result<std::shared_ptr<const abi::CompiledKernel>> compile(const Kernel& k, const Target& target,
                                                                 const CompileOptions& options = {});
  // Read under the cache's mutex: compile() on other threads updates them.
  uint64_t hits() const;
  uint64_t misses() const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const abi::CompiledKernel>> entries_;
  uint64_t hits_ = 0, misses_ = 0;  // guarded by mu_
};

}  // namespace vkad::codegen
