#include "rhi/pipeline.h"

#include <volk.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "rhi/device.h"

namespace vkad::rhi {

ComputePipeline::ComputePipeline(ComputePipeline&& o) noexcept { *this = std::move(o); }

ComputePipeline& ComputePipeline::operator=(ComputePipeline&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = o.device_;
    pipeline_ = std::exchange(o.pipeline_, VK_NULL_HANDLE);
    layout_ = std::exchange(o.layout_, VK_NULL_HANDLE);
    set_layout_ = std::exchange(o.set_layout_, VK_NULL_HANDLE);
    storage_buffer_count_ = o.storage_buffer_count_;
    push_constant_bytes_ = o.push_constant_bytes_;
    push_descriptors_ = o.push_descriptors_;
    name_ = std::move(o.name_);
    use_ = o.use_;
  }
  return *this;
}

void ComputePipeline::reset() {
  if (pipeline_ == VK_NULL_HANDLE) return;
  device_->release(use_, {VK_OBJECT_TYPE_PIPELINE, reinterpret_cast<uint64_t>(pipeline_), {}});
  device_->release(use_, {VK_OBJECT_TYPE_PIPELINE_LAYOUT, reinterpret_cast<uint64_t>(layout_), {}});
  device_->release(
      use_, {VK_OBJECT_TYPE_DESCRIPTOR_SET_LAYOUT, reinterpret_cast<uint64_t>(set_layout_), {}});
  pipeline_ = VK_NULL_HANDLE;
  layout_ = VK_NULL_HANDLE;
  set_layout_ = VK_NULL_HANDLE;
  use_ = {};
}

Status Device::create_pipeline_layouts(const ComputePipelineDesc& desc, bool push_descriptors,
                                       VkDescriptorSetLayout* set_layout,
                                       VkPipelineLayout* layout) {
  std::vector<VkDescriptorSetLayoutBinding> bindings(desc.storage_buffer_count);
  for (uint32_t i = 0; i < desc.storage_buffer_count; ++i) {
    bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  VkDescriptorSetLayoutCreateInfo dslci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  dslci.bindingCount = desc.storage_buffer_count;
  if (push_descriptors) dslci.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  dslci.pBindings = bindings.data();
  VKAD_TRY(vk("vkCreateDescriptorSetLayout", [&] {
    return fn_->vkCreateDescriptorSetLayout(device_, &dslci, nullptr, set_layout);
  }));
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, desc.push_constant_bytes};
  VkPipelineLayoutCreateInfo plci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  plci.setLayoutCount = 1;
  plci.pSetLayouts = set_layout;
  plci.pushConstantRangeCount = desc.push_constant_bytes > 0 ? 1 : 0;
  plci.pPushConstantRanges = &range;
  return vk("vkCreatePipelineLayout",
            [&] { return fn_->vkCreatePipelineLayout(device_, &plci, nullptr, layout); });
}

Status Device::create_pipeline_object(const ComputePipelineDesc& desc, VkShaderModule module,
                                      VkPipelineLayout layout, VkPipeline* pipeline) {
  std::vector<VkSpecializationMapEntry> entries;
  std::vector<uint32_t> data;
  for (const auto& sc : desc.specialization) {
    entries.push_back({sc.id, static_cast<uint32_t>(data.size() * 4), 4});
    data.push_back(sc.value);
  }
  VkSpecializationInfo spec{static_cast<uint32_t>(entries.size()), entries.data(), data.size() * 4,
                            data.data()};
  VkComputePipelineCreateInfo cpci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  cpci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  cpci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  cpci.stage.module = module;
  cpci.stage.pName = desc.entry_point.c_str();
  cpci.stage.pSpecializationInfo = entries.empty() ? nullptr : &spec;
  cpci.layout = layout;
  if (pipeline_stats_) cpci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  VKAD_TRY(vk("vkCreateComputePipelines", [&] {
    return fn_->vkCreateComputePipelines(device_, pipeline_cache_, 1, &cpci, nullptr, pipeline);
  }));
  if (pipeline_stats_) print_pipeline_stats(desc.name, *pipeline);
  return {};
}

void Device::print_pipeline_stats(const std::string& name, VkPipeline pipeline) const {
  VkPipelineExecutableInfoKHR exe{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
  exe.pipeline = pipeline;
  exe.executableIndex = 0;
  uint32_t n = 0;
  if (fn_->vkGetPipelineExecutableStatisticsKHR(device_, &exe, &n, nullptr) != VK_SUCCESS) return;
  std::vector<VkPipelineExecutableStatisticKHR> stats(
      n, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
  if (fn_->vkGetPipelineExecutableStatisticsKHR(device_, &exe, &n, stats.data()) != VK_SUCCESS) {
    return;
  }
  std::string line = "vkad pipeline '" + name + "':";
  for (const VkPipelineExecutableStatisticKHR& st : stats) {
    line += std::string(" ") + st.name + "=";
    switch (st.format) {
      case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
        line += st.value.b32 ? "true" : "false";
        break;
      case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
        line += std::to_string(st.value.i64);
        break;
      case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
        line += std::to_string(st.value.u64);
        break;
      case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR:
        line += std::to_string(st.value.f64);
        break;
      default: line += "?";
    }
    line += ";";
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

Result<ComputePipeline> Device::create_compute_pipeline(const ComputePipelineDesc& desc,
                                                        bool counted) {
  VKAD_TRY(status());
  if (desc.spirv.empty() || desc.spirv[0] != 0x07230203) {
    return make_error(ErrorCode::kInvalidArgument,
                      "pipeline '" + desc.name + "': SPIR-V is empty or lacks the magic number");
  }
  if (desc.push_constant_bytes > caps_.max_push_constants_size) {
    return make_error(ErrorCode::kInvalidArgument,
                      "pipeline '" + desc.name + "': " + std::to_string(desc.push_constant_bytes) +
                          " bytes of push constants exceed the device limit of " +
                          std::to_string(caps_.max_push_constants_size));
  }
  ComputePipeline p;
  p.device_ = this;
  p.name_ = desc.name;
  p.storage_buffer_count_ = desc.storage_buffer_count;
  p.push_constant_bytes_ = desc.push_constant_bytes;
  p.push_descriptors_ = caps_.push_descriptor && desc.storage_buffer_count > 0 &&
                        desc.storage_buffer_count <= caps_.max_push_descriptors;

  // Build in local handles and hand them over only at the end, so every failure path
  // destroys exactly what was created (nothing was used by a submission yet).
  VkShaderModule module = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  auto cleanup = [&] {
    if (pipeline) fn_->vkDestroyPipeline(device_, pipeline, nullptr);
    if (layout) fn_->vkDestroyPipelineLayout(device_, layout, nullptr);
    if (set_layout) fn_->vkDestroyDescriptorSetLayout(device_, set_layout, nullptr);
    if (module) fn_->vkDestroyShaderModule(device_, module, nullptr);
  };

  VkShaderModuleCreateInfo smci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  smci.codeSize = desc.spirv.size() * sizeof(uint32_t);
  smci.pCode = desc.spirv.data();
  Status s = vk("vkCreateShaderModule",
                [&] { return fn_->vkCreateShaderModule(device_, &smci, nullptr, &module); });
  if (s.ok()) s = create_pipeline_layouts(desc, p.push_descriptors_, &set_layout, &layout);
  if (s.ok()) s = create_pipeline_object(desc, module, layout, &pipeline);
  if (!s.ok()) {
    cleanup();
    return make_error(s.code(), "pipeline '" + desc.name + "': " + s.message());
  }
  // The module is only needed to create the pipeline.
  fn_->vkDestroyShaderModule(device_, module, nullptr);
  std::string name = desc.name.empty() ? "vkad pipeline" : desc.name;
  set_name(VK_OBJECT_TYPE_PIPELINE, reinterpret_cast<uint64_t>(pipeline), name);
  set_name(VK_OBJECT_TYPE_PIPELINE_LAYOUT, reinterpret_cast<uint64_t>(layout), name + " layout");
  set_name(VK_OBJECT_TYPE_DESCRIPTOR_SET_LAYOUT, reinterpret_cast<uint64_t>(set_layout),
           name + " set layout");
  p.pipeline_ = pipeline;
  p.layout_ = layout;
  p.set_layout_ = set_layout;
  if (counted) count_pipeline();
  return p;
}

void QueryPool::Release::operator()(VkQueryPool pool) noexcept {
  device->release(use, {VK_OBJECT_TYPE_QUERY_POOL, reinterpret_cast<uint64_t>(pool), {}});
}

void QueryPool::reset() {
  pool_.reset();
  pool_.deleter().use = {};
}

Status QueryPool::read(uint32_t first, uint32_t n, uint64_t* out) const {
  return device_->vk("vkGetQueryPoolResults", [&] {
    return device_->fn().vkGetQueryPoolResults(device_->handle(), pool_.get(), first, n,
                                               n * sizeof(uint64_t), out, sizeof(uint64_t),
                                               VK_QUERY_RESULT_64_BIT);
  });
}

Result<QueryPool> Device::create_query_pool(uint32_t count, const std::string& name) {
  VKAD_TRY(status());
  if (!caps_.timestamps) {
    return make_error(ErrorCode::kUnsupported,
                      "device '" + caps_.device_name + "' has no timestamp queries");
  }
  VkQueryPoolCreateInfo info{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
  info.queryType = VK_QUERY_TYPE_TIMESTAMP;
  info.queryCount = count;
  QueryPool q;
  VkQueryPool pool = VK_NULL_HANDLE;
  VKAD_TRY(vk("vkCreateQueryPool",
              [&] { return fn_->vkCreateQueryPool(device_, &info, nullptr, &pool); }));
  q.device_ = this;
  q.pool_ = {pool, QueryPool::Release{this, {}}};
  q.count_ = count;
  set_name(VK_OBJECT_TYPE_QUERY_POOL, reinterpret_cast<uint64_t>(pool), name);
  ++live_.query_pools;
  ++live_.created;
  return q;
}

}  // namespace vkad::rhi
