// The pipeline cache: the compute pipelines of registered kernels, shared by every kernel with
// the same content, kept (up to a capacity) after their last kernel is unregistered so that
// re-registering is free, and evicted least-recently-registered first. Keys are content hashes;
// a hit is confirmed by comparing the content (abi::same_pipelines), and a colliding kernel
// probes to the next key, so a 64-bit hash match is never taken as proof. Private-tier variants
// (adstack/adstack_layout.h, "Storage tiers") are made on first use and live with the entry.
// Destruction of evicted pipelines is deferred by the rhi deleter to the last submission that
// bound them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "abi/kernel_abi.h"
#include "base/status.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "runtime/launch_plan.h"

namespace vkad::runtime {

class PipelineCache {
 public:
  struct Entry {
    std::vector<rhi::ComputePipeline> tasks;  // one per task (the heap tier)
    // Per task, the private-tier variants made so far, one per private lengths bucket.
    std::vector<std::map<PrivateLengths, rhi::ComputePipeline>> private_variants;
    std::shared_ptr<const abi::CompiledKernel> content;  // what they were built from
    uint32_t refs = 0;
    uint64_t last_used = 0;  // acquisition tick, for LRU eviction
  };
  using HashFn = uint64_t (*)(const abi::CompiledKernel&);

  // `hash`: nullptr for CompiledKernel::content_hash (a test seam replaces it).
  PipelineCache(size_t capacity, HashFn hash) : capacity_(capacity), hash_(hash) {}

  // The key of `kernel`'s pipelines, created on a miss (after `validate` passes: drivers trust
  // their input, so every module is checked before one reaches the driver), with one more
  // reference. *hit tells which.
  Result<uint64_t> acquire(rhi::Device& device, const abi::CompiledKernel& kernel,
                           const std::function<Status()>& validate, bool* hit);
  // Drops one reference; then evicts unreferenced entries past the capacity.
  void release(uint64_t key);
  Entry& at(uint64_t key) { return entries_.at(key); }
  // The pipeline of `task` in the private tier with `len` (made on first use).
  Result<rhi::ComputePipeline*> private_variant(rhi::Device& device, uint64_t key, uint32_t task,
                                                const PrivateLengths& len);
  size_t size() const { return entries_.size(); }
  uint64_t private_variant_count() const;
  void clear() { entries_.clear(); }

 private:
  void evict_unreferenced();
  size_t capacity_;
  HashFn hash_;
  uint64_t tick_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace vkad::runtime
