// A compute pipeline with its layout: one descriptor set (set 0) of storage buffers, an
// optional push-constant range, specialization constants. Move-only; destruction goes through
// the deferred deleter like buffers, so a queued submission never loses its pipeline.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "rhi/deferred_deleter.h"
#include "rhi/unique_handle.h"

namespace vkad::rhi {

class Device;

struct SpecConstant {
  uint32_t id = 0;
  uint32_t value = 0;  // 32-bit constants (int, uint, float bits, bool as 0/1)
};

struct ComputePipelineDesc {
  std::vector<uint32_t> spirv;
  std::string entry_point = "main";
  uint32_t storage_buffer_count = 0;  // bindings 0..n-1 of set 0, all storage buffers
  uint32_t push_constant_bytes = 0;
  std::vector<SpecConstant> specialization;
  std::string name;
};

class ComputePipeline {
 public:
  ComputePipeline() = default;
  ComputePipeline(ComputePipeline&& other) noexcept;
  ComputePipeline& operator=(ComputePipeline&& other) noexcept;
  ~ComputePipeline() { reset(); }
  void reset();  // deferred destruction (see class comment)

  bool valid() const { return pipeline_ != VK_NULL_HANDLE; }
  VkPipeline handle() const { return pipeline_; }
  VkPipelineLayout layout() const { return layout_; }
  VkDescriptorSetLayout set_layout() const { return set_layout_; }
  uint32_t storage_buffer_count() const { return storage_buffer_count_; }
  uint32_t push_constant_bytes() const { return push_constant_bytes_; }
  // Buffers are bound with vkCmdPushDescriptorSetKHR (no descriptor set to allocate).
  bool push_descriptors() const { return push_descriptors_; }
  const std::string& name() const { return name_; }
  ResourceUse& use() { return use_; }

 private:
  friend class Device;
  Device* device_ = nullptr;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  uint32_t storage_buffer_count_ = 0;
  uint32_t push_constant_bytes_ = 0;
  bool push_descriptors_ = false;
  std::string name_;
  ResourceUse use_;
};

// Timestamp queries. Results are read after the submission that wrote them completed.
class QueryPool {
 public:
  QueryPool() = default;
  QueryPool(QueryPool&& other) noexcept = default;
  QueryPool& operator=(QueryPool&& other) noexcept = default;
  ~QueryPool() { reset(); }
  void reset();

  VkQueryPool handle() const { return pool_.get(); }
  uint32_t count() const { return count_; }
  ResourceUse& use() { return pool_.deleter().use; }
  // Reads `n` timestamps starting at `first` (in ticks; multiply by timestamp_period_ns).
  Status read(uint32_t first, uint32_t n, uint64_t* out) const;

 private:
  friend class Device;
  // Hands the pool to the device's deferred deleter with the submissions that used it.
  struct Release {
    Device* device = nullptr;
    ResourceUse use;
    void operator()(VkQueryPool pool) noexcept;
  };

  Device* device_ = nullptr;
  UniqueHandle<VkQueryPool, Release> pool_;
  uint32_t count_ = 0;
};

}  // namespace vkad::rhi
