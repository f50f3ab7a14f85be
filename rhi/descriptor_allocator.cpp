#include "rhi/descriptor_allocator.h"

#include <volk.h>

#include "rhi/device.h"

namespace vkad::rhi {

DescriptorAllocator::~DescriptorAllocator() {
  auto destroy = [this](Pool&& p) {
    device_.fn().vkDestroyDescriptorPool(device_.handle(), p.pool, nullptr);
    --device_.live_mut().descriptor_pools;
  };
  if (current_.pool) destroy(std::move(current_));
  for (auto& p : free_) destroy(std::move(p));
  retired_.retire_all(destroy);
}

Result<DescriptorAllocator::Pool> DescriptorAllocator::take_pool() {
  if (!free_.empty()) {
    Pool p = free_.back();
    free_.pop_back();
    return p;
  }
  VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kBuffersPerPool};
  VkDescriptorPoolCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  info.maxSets = kSetsPerPool;
  info.poolSizeCount = 1;
  info.pPoolSizes = &size;
  Pool p;
  VKAD_TRY(device_.vk("vkCreateDescriptorPool", [&] {
    return device_.fn().vkCreateDescriptorPool(device_.handle(), &info, nullptr, &p.pool);
  }));
  device_.set_name(VK_OBJECT_TYPE_DESCRIPTOR_POOL, reinterpret_cast<uint64_t>(p.pool),
                   "vkad descriptor pool " + std::to_string(pool_count_));
  ++pool_count_;
  ++device_.live_mut().descriptor_pools;
  ++device_.live_mut().created;
  return p;
}

Result<VkDescriptorSet> DescriptorAllocator::allocate(VkDescriptorSetLayout layout,
                                                      uint32_t buffer_count, Serial serial) {
  if (buffer_count > kBuffersPerPool) {
    return make_error(ErrorCode::kInvalidArgument, std::to_string(buffer_count) +
                                                       " storage buffers in one set exceed " +
                                                       std::to_string(kBuffersPerPool));
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (current_.pool == VK_NULL_HANDLE) {
      VKAD_ASSIGN_OR_RETURN(current_, take_pool());
    }
    VkDescriptorSetAllocateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    info.descriptorPool = current_.pool;
    info.descriptorSetCount = 1;
    info.pSetLayouts = &layout;
    VkDescriptorSet set = VK_NULL_HANDLE;
    // Count sets ourselves: some drivers (lavapipe) let a pool exceed maxSets, and we want one
    // recycling behaviour everywhere.
    VkResult r = current_.sets >= kSetsPerPool
                     ? VK_ERROR_OUT_OF_POOL_MEMORY
                     : device_.fn().vkAllocateDescriptorSets(device_.handle(), &info, &set);
    if (r == VK_SUCCESS) {
      ++current_.sets;
      ++live_sets_;
      if (current_.last_use < serial) current_.last_use = serial;
      return set;
    }
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) {
      return check_vk(r, "vkAllocateDescriptorSets");
    }
    // The pool is full: retire it until its last user completes, then retry on a fresh one.
    if (current_.sets == 0) return check_vk(r, "vkAllocateDescriptorSets");
    Serial key = current_.last_use;
    if (!retired_.empty() && retired_.back_serial() > key) key = retired_.back_serial();
    retired_.push(key, current_);
    current_ = Pool{};
  }
  return make_error(ErrorCode::kInternal, "descriptor allocation failed on a fresh pool");
}

void DescriptorAllocator::recycle(Serial completed) {
  retired_.retire_up_to(completed, [this](Pool&& p) {
    device_.fn().vkResetDescriptorPool(device_.handle(), p.pool, 0);
    live_sets_ -= p.sets;
    p.sets = 0;
    p.last_use = kNoSerial;
    free_.push_back(p);
  });
  // An idle current pool whose sets are all done can be reset in place, so a steady stream of
  // launches cycles through one pool instead of filling it and switching.
  if (current_.pool && current_.sets > 0 && current_.last_use <= completed) {
    device_.fn().vkResetDescriptorPool(device_.handle(), current_.pool, 0);
    live_sets_ -= current_.sets;
    current_.sets = 0;
  }
}

}  // namespace vkad::rhi
