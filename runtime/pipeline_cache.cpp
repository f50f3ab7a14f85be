#include "runtime/pipeline_cache.h"

#include <algorithm>

namespace vkad::runtime {

Result<uint64_t> PipelineCache::acquire(rhi::Device& device, const abi::CompiledKernel& kernel,
                                        const std::function<Status()>& validate, bool* hit) {
  uint64_t key = hash_ ? hash_(kernel) : kernel.content_hash();
  auto it = entries_.find(key);
  while (it != entries_.end() && !abi::same_pipelines(*it->second.content, kernel)) {
    it = entries_.find(++key);
  }
  *hit = it != entries_.end();
  if (!*hit) {
    VKAD_TRY(validate());
    Entry e;
    e.content = std::make_shared<const abi::CompiledKernel>(kernel);
    for (const abi::CompiledTask& t : kernel.tasks) {
      rhi::ComputePipelineDesc desc;
      desc.spirv = t.spirv;
      desc.storage_buffer_count = kernel.binding_count();
      desc.push_constant_bytes = 8;
      desc.name = kernel.name + "." + t.name;
      VKAD_ASSIGN_OR_RETURN(rhi::ComputePipeline pipeline, device.create_compute_pipeline(desc));
      e.tasks.push_back(std::move(pipeline));
    }
    it = entries_.emplace(key, std::move(e)).first;
  }
  ++it->second.refs;
  it->second.last_used = ++tick_;
  if (it->second.private_variants.size() < kernel.tasks.size()) {
    it->second.private_variants.resize(kernel.tasks.size());
  }
  evict_unreferenced();
  return key;
}

void PipelineCache::release(uint64_t key) {
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.refs > 0) --it->second.refs;
  evict_unreferenced();
}

Result<rhi::ComputePipeline*> PipelineCache::private_variant(rhi::Device& device, uint64_t key,
                                                             uint32_t task,
                                                             const PrivateLengths& len) {
  Entry& e = entries_.at(key);
  auto& variants = e.private_variants.at(task);
  auto it = variants.find(len);
  if (it != variants.end()) return &it->second;
  const abi::CompiledKernel& k = *e.content;
  const abi::CompiledTask& t = k.tasks[task];
  rhi::ComputePipelineDesc desc;
  desc.spirv = t.spirv;
  desc.storage_buffer_count = k.binding_count();
  desc.push_constant_bytes = 8;
  desc.name = k.name + "." + t.name + " (private adstacks)";
  desc.specialization.push_back({adstack::kPrivateTierSpecId, 1});
  for (uint32_t h = 0; h < adstack::kHeapCount; ++h) {
    // Only the heaps the task uses have a length constant (Vulkan would ignore the others).
    if (std::any_of(t.adstacks.begin(), t.adstacks.end(),
                    [&](const adstack::StackDesc& s) { return static_cast<uint32_t>(s.heap) == h; })) {
      desc.specialization.push_back(
          {adstack::private_length_spec_id(static_cast<adstack::Heap>(h)), len[h]});
    }
  }
  VKAD_ASSIGN_OR_RETURN(rhi::ComputePipeline pipeline, device.create_compute_pipeline(desc));
  return &variants.emplace(len, std::move(pipeline)).first->second;
}

uint64_t PipelineCache::private_variant_count() const {
  uint64_t n = 0;
  for (const auto& [key, e] : entries_) {
    for (const auto& v : e.private_variants) n += v.size();
  }
  return n;
}

void PipelineCache::evict_unreferenced() {
  while (entries_.size() > capacity_) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.refs == 0 &&
          (victim == entries_.end() || it->second.last_used < victim->second.last_used)) {
        victim = it;
      }
    }
    if (victim == entries_.end()) return;  // everything is referenced
    entries_.erase(victim);
  }
}

}  // namespace vkad::runtime
