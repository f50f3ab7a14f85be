#include "rhi/stream.h"

#include <volk.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <utility>

#include "rhi/device.h"

namespace vkad::rhi {

const char* sync_mode_name(SyncMode mode) {
  switch (mode) {
    case SyncMode::kAuto: return "auto";
    case SyncMode::kTimeline: return "timeline";
    case SyncMode::kFence: return "fence";
  }
  return "?";
}

Result<std::unique_ptr<Stream>> Device::create_stream(const StreamOptions& options) {
  VKAD_TRY(status());
  return Stream::create(*this, options);
}

Result<std::unique_ptr<Stream>> Stream::create(Device& device, const StreamOptions& options) {
  SyncMode mode = options.mode;
  if (mode == SyncMode::kAuto) {
    mode = device.caps().timeline_semaphore ? SyncMode::kTimeline : SyncMode::kFence;
  }
  if (mode == SyncMode::kTimeline && !device.caps().timeline_semaphore) {
    return make_error(ErrorCode::kUnsupported, "stream '" + options.name + "': device '" +
                                                   device.caps().device_name +
                                                   "' lacks timeline semaphores; use fence mode");
  }
  std::unique_ptr<Stream> s(new Stream(device, mode, options.name));
  int64_t spin = options.spin_ns;
  if (spin < 0 && std::getenv("VKAD_WAIT_SPIN_NS") != nullptr) {
    // Clamped: strtoll saturates, and a spin past a second would overflow the deadline math.
    spin = std::min<int64_t>(std::strtoll(std::getenv("VKAD_WAIT_SPIN_NS"), nullptr, 10),
                             1'000'000'000);
  }
  if (spin < 0) spin = device.caps().kind == DeviceKind::kCpu ? 0 : StreamOptions::kDefaultSpinNs;
  s->set_spin_ns(spin);
  s->index_ = device.attach_stream(s.get());
  if (s->index_ < 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "at most " + std::to_string(kMaxStreams) + " streams per device");
  }
  // Streams share queues round-robin when the family has fewer queues than streams.
  device.fn().vkGetDeviceQueue(
      device.handle(), device.queue_family(),
      device.first_queue() + static_cast<uint32_t>(s->index_) % device.queue_count(), &s->queue_);
  VkCommandPoolCreateInfo cpci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cpci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  cpci.queueFamilyIndex = device.queue_family();
  VKAD_TRY(device.vk("vkCreateCommandPool", [&] {
    return device.fn().vkCreateCommandPool(device.handle(), &cpci, nullptr, &s->command_pool_);
  }));
  device.set_name(VK_OBJECT_TYPE_COMMAND_POOL, reinterpret_cast<uint64_t>(s->command_pool_),
                  options.name + " command pool");
  if (mode == SyncMode::kTimeline) {
    VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    type.initialValue = 0;
    VkSemaphoreCreateInfo sci{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    sci.pNext = &type;
    VKAD_TRY(device.vk("vkCreateSemaphore", [&] {
      return device.fn().vkCreateSemaphore(device.handle(), &sci, nullptr, &s->timeline_);
    }));
    device.set_name(VK_OBJECT_TYPE_SEMAPHORE, reinterpret_cast<uint64_t>(s->timeline_),
                    options.name + " timeline");
    if (device.caps().export_semaphore_fd) {
      // A second timeline, signalled with the same values, is what CUDA imports (to order its
      // streams after ours). vkad's own waits stay on timeline_: once a semaphore is exported
      // the validation layer no longer knows who may signal it and stops retiring the
      // submissions it observes through it, then reports every recycled command buffer as
      // still in use. Made now, not at the first export: it must carry every serial.
      VkExportSemaphoreCreateInfo export_info{VK_STRUCTURE_TYPE_EXPORT_SEMAPHORE_CREATE_INFO};
      export_info.handleTypes = VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT;
      type.pNext = &export_info;
      VKAD_TRY(device.vk("vkCreateSemaphore", [&] {
        return device.fn().vkCreateSemaphore(device.handle(), &sci, nullptr, &s->export_timeline_);
      }));
      device.set_name(VK_OBJECT_TYPE_SEMAPHORE, reinterpret_cast<uint64_t>(s->export_timeline_),
                      options.name + " exported timeline");
    }
  }
  return s;
}

Result<int> Stream::export_timeline_fd() {
  if (export_timeline_ == VK_NULL_HANDLE) {
    return make_error(ErrorCode::kUnsupported,
                      "export of the timeline semaphore: not exportable on '" +
                          device_.caps().device_name + "' (Capabilities::export_semaphore_fd)");
  }
  VkSemaphoreGetFdInfoKHR info{VK_STRUCTURE_TYPE_SEMAPHORE_GET_FD_INFO_KHR};
  info.semaphore = export_timeline_;
  info.handleType = VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT;
  int fd = -1;
  VKAD_TRY(device_.vk("vkGetSemaphoreFdKHR", [&] {
    return device_.fn().vkGetSemaphoreFdKHR(device_.handle(), &info, &fd);
  }));
  return fd;
}

Stream::~Stream() {
  if (recording_) {
    // A CommandList outlived its stream's destruction start; nothing to do but not hang.
    recording_ = false;
  }
  if (last_submitted_ > completed_) {
    // Waits in the driver even when the device was already reported lost: a loss may have been
    // reported (or injected) while work is still running, and the pools below must not be
    // freed under it. A really lost device returns VK_ERROR_DEVICE_LOST from the wait, after
    // which Vulkan allows destroying its objects.
    if (wait_in_driver(last_submitted_, UINT64_MAX) == VK_SUCCESS) refresh_completed();
    completed_ = last_submitted_;
  }
  VkDevice d = device_.handle();
  descriptors_.recycle(completed_);
  device_.detach_stream(index_);
  in_flight_cbs_.retire_all([&](VkCommandBuffer cb) { free_cbs_.push_back(cb); });
  device_.live_mut().command_buffers -= static_cast<int64_t>(free_cbs_.size());
  // The pool frees the bundles' buffers too (a bundle outliving its stream is a caller bug).
  device_.live_mut().command_buffers -=
      static_cast<int64_t>(retiring_bundles_.size() - side_retiring_);
  retiring_bundles_.retire_all([](const RetiringBundle&) {});
  side_retiring_ = 0;
  if (command_pool_)
    device_.fn().vkDestroyCommandPool(d, command_pool_, nullptr);  // frees its buffers
  for (VkCommandPool pool : side_pools_) device_.fn().vkDestroyCommandPool(d, pool, nullptr);
  for (auto& [serial, fence] : in_flight_fences_) free_fences_.push_back(fence);
  for (VkFence f : free_fences_) device_.fn().vkDestroyFence(d, f, nullptr);
  device_.live_mut().fences -= static_cast<int64_t>(free_fences_.size());
  if (timeline_) device_.fn().vkDestroySemaphore(d, timeline_, nullptr);
  if (export_timeline_) device_.fn().vkDestroySemaphore(d, export_timeline_, nullptr);
}

Serial Stream::refresh_completed() {
  ++counters_.completion_queries;
  if (mode_ == SyncMode::kTimeline) {
    uint64_t value = 0;
    VkResult r = device_.fn().vkGetSemaphoreCounterValue(device_.handle(), timeline_, &value);
    if (r == VK_ERROR_DEVICE_LOST) device_.mark_lost();
    if (r == VK_SUCCESS && value > completed_.value()) completed_ = Serial(value);
    return completed_;
  }
  // Fence mode: the completed serial is the longest prefix of signalled fences.
  while (!in_flight_fences_.empty()) {
    VkResult r = device_.fn().vkGetFenceStatus(device_.handle(), in_flight_fences_.front().second);
    if (r == VK_ERROR_DEVICE_LOST) device_.mark_lost();
    if (r != VK_SUCCESS) break;
    completed_ = in_flight_fences_.front().first;
    VkFence f = in_flight_fences_.front().second;
    in_flight_fences_.pop_front();
    device_.fn().vkResetFences(device_.handle(), 1, &f);
    free_fences_.push_back(f);
  }
  return completed_;
}

bool Stream::wait_for(Serial serial, uint64_t timeout_ns) {
  if (serial <= completed_) return true;
  if (serial > last_submitted_) return false;  // never submitted: would wait forever
  if (!device_.status().ok()) return false;
  ++counters_.waits;
  if (spin_ns_ > 0 && timeout_ns > 0) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto budget =
        std::chrono::nanoseconds(std::min<uint64_t>(static_cast<uint64_t>(spin_ns_), timeout_ns));
    do {
      if (serial <= refresh_completed()) {
        ++counters_.spin_completions;
        return true;
      }
      if (!device_.status().ok()) return false;
    } while (Clock::now() - start < budget);
    uint64_t spent = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    timeout_ns = timeout_ns == UINT64_MAX ? UINT64_MAX : timeout_ns - std::min(timeout_ns, spent);
  }
  VkResult r = wait_in_driver(serial, timeout_ns);
  if (r == VK_ERROR_DEVICE_LOST) device_.mark_lost();
  if (r != VK_SUCCESS) return false;
  refresh_completed();
  return serial <= completed_;
}

VkResult Stream::wait_in_driver(Serial serial, uint64_t timeout_ns) {
  if (mode_ == SyncMode::kTimeline) {
    uint64_t value = serial.value();
    VkSemaphoreWaitInfo info{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    info.semaphoreCount = 1;
    info.pSemaphores = &timeline_;
    info.pValues = &value;
    return device_.fn().vkWaitSemaphores(device_.handle(), &info, timeout_ns);
  }
  std::vector<VkFence> fences;
  for (const auto& [s, f] : in_flight_fences_) {
    if (s > serial) break;
    fences.push_back(f);
  }
  if (fences.empty()) return VK_SUCCESS;
  return device_.fn().vkWaitForFences(device_.handle(), static_cast<uint32_t>(fences.size()),
                                      fences.data(), VK_TRUE, timeout_ns);
}

Status Stream::wait_idle(uint64_t timeout_ns) {
  if (wait_for(last_submitted_, timeout_ns)) return {};
  VKAD_TRY(device_.status());
  return make_error(ErrorCode::kTimeout, "stream '" + name_ + "': serial " +
                                             std::to_string(last_submitted_.value()) +
                                             " did not complete in time");
}

void Stream::recycle() {
  Serial done = refresh_completed();
  in_flight_cbs_.retire_up_to(done, [this](VkCommandBuffer cb) { free_cbs_.push_back(cb); });
  retiring_bundles_.retire_up_to(done, [this](const RetiringBundle& b) {
    side_retiring_ -= b.side >= 0;
    free_bundle(b.cb, b.side);
  });
  descriptors_.recycle(done);
  device_.collect_garbage();
}

// One command buffer from this stream's pool, counted (stream counters, live objects) and named.
Result<VkCommandBuffer> Stream::allocate_command_buffer(VkCommandBufferLevel level,
                                                        const char* label) {
  VkCommandBufferAllocateInfo info{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  info.commandPool = command_pool_;
  info.level = level;
  info.commandBufferCount = 1;
  VkCommandBuffer cb = VK_NULL_HANDLE;
  VKAD_TRY(device_.vk("vkAllocateCommandBuffers", [&] {
    return device_.fn().vkAllocateCommandBuffers(device_.handle(), &info, &cb);
  }));
  ++counters_.command_buffers_created;
  ++device_.live_mut().command_buffers;
  ++device_.live_mut().created;
  device_.set_name(VK_OBJECT_TYPE_COMMAND_BUFFER, reinterpret_cast<uint64_t>(cb),
                   name_ + label + std::to_string(counters_.command_buffers_created));
  return cb;
}

Status Stream::reserve(size_t submissions) {
  VKAD_TRY(device_.status());
  while (primaries_ < submissions) {
    VKAD_ASSIGN_OR_RETURN(VkCommandBuffer cb,
                          allocate_command_buffer(VK_COMMAND_BUFFER_LEVEL_PRIMARY, " cmd "));
    free_cbs_.push_back(cb);
    ++primaries_;
  }
  if (mode_ != SyncMode::kFence) return {};
  // take_fence makes a new one while none is free: the free ones are set aside meanwhile.
  std::vector<VkFence> free = std::exchange(free_fences_, {});
  Status st;
  while (st.ok() && counters_.fences_created < submissions) {
    Result<VkFence> f = take_fence();
    if (f.ok()) {
      free.push_back(*f);
    } else {
      st = f.status();
    }
  }
  free_fences_ = std::move(free);
  return st;
}

Result<CommandList> Stream::begin() {
  VKAD_TRY(device_.status());
  if (recording_) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "stream '" + name_ + "' already has a command list being recorded");
  }
  recycle();
  VkCommandBuffer cb = VK_NULL_HANDLE;
  if (!free_cbs_.empty()) {
    cb = free_cbs_.back();
    free_cbs_.pop_back();
  } else {
    VKAD_ASSIGN_OR_RETURN(cb, allocate_command_buffer(VK_COMMAND_BUFFER_LEVEL_PRIMARY, " cmd "));
    ++primaries_;
  }
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  Status s = device_.vk("vkBeginCommandBuffer",
                        [&] { return device_.fn().vkBeginCommandBuffer(cb, &bi); });
  if (!s.ok()) {
    free_cbs_.push_back(cb);
    return s;
  }
  recording_ = true;
  return CommandList(this, cb, pending());
}

Result<CommandList> Stream::begin_bundle() {
  VKAD_TRY(device_.status());
  recycle();
  VKAD_ASSIGN_OR_RETURN(VkCommandBuffer cb,
                        allocate_command_buffer(VK_COMMAND_BUFFER_LEVEL_SECONDARY, " bundle "));
  VkCommandBufferInheritanceInfo inherit{VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO};
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  // Executed by every later list that replays it, possibly while earlier ones are in flight.
  bi.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;
  bi.pInheritanceInfo = &inherit;
  Status s = device_.vk("vkBeginCommandBuffer (bundle)",
                        [&] { return device_.fn().vkBeginCommandBuffer(cb, &bi); });
  if (!s.ok()) {
    free_bundle(cb, -1);
    return s;
  }
  return CommandList(this, cb, kNoSerial, /*bundle=*/true);
}

Result<Bundle> Stream::end_bundle(CommandList& list) {
  if (!list.recording() || !list.is_bundle()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "stream '" + name_ + "': end_bundle of a list that is not a bundle");
  }
  Bundle b = seal(list);
  VkCommandBuffer cb = b.cb_;
  VKAD_TRY(device_.vk("vkEndCommandBuffer (bundle)",
                      [&] { return device_.fn().vkEndCommandBuffer(cb); }));
  return b;
}

Bundle Stream::seal(CommandList& list) {
  Bundle b;
  b.stream_ = this;
  b.cb_ = list.cb_.release();
  b.side_ = list.side_;
  b.dispatches_ = list.dispatches_;
  b.uses_ = std::move(list.uses_);
  std::sort(b.uses_.begin(), b.uses_.end());
  b.uses_.erase(std::unique(b.uses_.begin(), b.uses_.end()), b.uses_.end());
  list = CommandList();
  return b;
}

void Stream::release_bundle(VkCommandBuffer cb, Serial last_use, int side) noexcept {
  if (last_use <= completed_) {
    free_bundle(cb, side);
    return;
  }
  // Kept in serial order: a key later than the last use only delays the free.
  if (!retiring_bundles_.empty() && last_use < retiring_bundles_.back_serial()) {
    last_use = retiring_bundles_.back_serial();
  }
  retiring_bundles_.push(last_use, RetiringBundle{cb, side});
  side_retiring_ += side >= 0;
}

void Stream::free_bundle(VkCommandBuffer cb, int side) noexcept {
  if (side >= 0) {
    {
      std::lock_guard<std::mutex> l(side_mu_);
      if (side_threads_) {  // thread `side` records from the pool: it frees the buffer
        try {
          side_free_[side].push_back(cb);
          return;
        } catch (const std::bad_alloc&) {
          // Kept until the pool is destroyed: a leak of one buffer, not a race.
          return;
        }
      }
    }
    device_.fn().vkFreeCommandBuffers(device_.handle(), side_pools_[side], 1, &cb);
    side_freed(1);
    return;
  }
  device_.fn().vkFreeCommandBuffers(device_.handle(), command_pool_, 1, &cb);
  --device_.live_mut().command_buffers;
}

void Stream::free_side_now(VkCommandBuffer cb, int side) noexcept {
  device_.fn().vkEndCommandBuffer(cb);  // may fail on a lost device: freed all the same
  device_.fn().vkFreeCommandBuffers(device_.handle(), side_pools_[side], 1, &cb);
  side_freed(1);
}

void Stream::side_threads(bool recording) noexcept {
  std::vector<std::vector<VkCommandBuffer>> left;
  {
    std::lock_guard<std::mutex> l(side_mu_);
    side_threads_ = recording;
    if (!recording) left.swap(side_free_);
  }
  for (size_t i = 0; i < left.size(); ++i) {
    if (left[i].empty()) continue;
    device_.fn().vkFreeCommandBuffers(device_.handle(), side_pools_[i],
                                      static_cast<uint32_t>(left[i].size()), left[i].data());
    side_freed(left[i].size());
  }
}

Status Stream::ensure_side_pools(int count) {
  while (static_cast<int>(side_pools_.size()) < count) {
    VkCommandPoolCreateInfo cpci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    cpci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    cpci.queueFamilyIndex = device_.queue_family();
    VkCommandPool pool = VK_NULL_HANDLE;
    VKAD_TRY(device_.vk("vkCreateCommandPool (side bundles)", [&] {
      return device_.fn().vkCreateCommandPool(device_.handle(), &cpci, nullptr, &pool);
    }));
    device_.set_name(VK_OBJECT_TYPE_COMMAND_POOL, reinterpret_cast<uint64_t>(pool),
                     name_ + " side bundle pool " + std::to_string(side_pools_.size()));
    side_pools_.push_back(pool);
  }
  std::lock_guard<std::mutex> l(side_mu_);
  if (side_free_.size() < side_pools_.size()) side_free_.resize(side_pools_.size());
  return {};
}

Status Stream::settle_side_bundles() {
  recycle();
  if (side_retiring_ == 0 || retiring_bundles_.empty()) return {};
  // Freeing them takes the side pools, which the next recording threads will hold.
  if (!wait_for(retiring_bundles_.back_serial(), UINT64_MAX)) VKAD_TRY(device_.status());
  recycle();
  if (side_retiring_ != 0) {
    return make_error(ErrorCode::kInternal,
                      "stream '" + name_ + "': side bundles still in flight after a wait");
  }
  return {};
}

// The two below run on the recording thread: vk_call, not device_.vk (which marks the device
// lost, shared state); the owner marks it when the recording's error reaches it.
Result<CommandList> Stream::begin_side_bundle(int pool) {
  std::vector<VkCommandBuffer> done;  // side bundles the owner released: this pool is ours
  {
    std::lock_guard<std::mutex> l(side_mu_);
    done.swap(side_free_[pool]);
  }
  if (!done.empty()) {
    device_.fn().vkFreeCommandBuffers(device_.handle(), side_pools_[pool],
                                      static_cast<uint32_t>(done.size()), done.data());
    side_freed(done.size());
  }
  VkCommandBufferAllocateInfo info{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  info.commandPool = side_pools_[pool];
  info.level = VK_COMMAND_BUFFER_LEVEL_SECONDARY;
  info.commandBufferCount = 1;
  VkCommandBuffer cb = VK_NULL_HANDLE;
  VKAD_TRY(vk_call("vkAllocateCommandBuffers (side bundle)", [&] {
    return device_.fn().vkAllocateCommandBuffers(device_.handle(), &info, &cb);
  }));
  const int64_t live = ++side_live_;
  for (int64_t peak = side_peak_.load();
       live > peak && !side_peak_.compare_exchange_weak(peak, live);) {
  }
  VkCommandBufferInheritanceInfo inherit{VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO};
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  bi.pInheritanceInfo = &inherit;
  Status s = vk_call("vkBeginCommandBuffer (side bundle)",
                     [&] { return device_.fn().vkBeginCommandBuffer(cb, &bi); });
  if (!s.ok()) {
    device_.fn().vkFreeCommandBuffers(device_.handle(), side_pools_[pool], 1, &cb);
    side_freed(1);
    return s;
  }
  return CommandList(this, cb, kNoSerial, /*bundle=*/true, pool);
}

Result<Bundle> Stream::end_side_bundle(CommandList& list) {
  if (!list.recording() || list.side_ < 0) {
    return make_error(
        ErrorCode::kFailedPrecondition,
        "stream '" + name_ + "': end_side_bundle of a list that is not a side bundle");
  }
  Bundle b = seal(list);
  VkCommandBuffer cb = b.cb_;
  Status s = vk_call("vkEndCommandBuffer (side bundle)",
                     [&] { return device_.fn().vkEndCommandBuffer(cb); });
  if (!s.ok()) {
    b.cb_ = VK_NULL_HANDLE;
    device_.fn().vkFreeCommandBuffers(device_.handle(), side_pools_[b.side_], 1, &cb);
    side_freed(1);
    return s;
  }
  return b;
}

void Stream::abandon(VkCommandBuffer cb) {
  device_.fn().vkEndCommandBuffer(cb);
  free_cbs_.push_back(cb);
  recording_ = false;
}

Result<VkFence> Stream::take_fence() {
  if (!free_fences_.empty()) {
    VkFence f = free_fences_.back();
    free_fences_.pop_back();
    return f;
  }
  VkFenceCreateInfo info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  VkFence f = VK_NULL_HANDLE;
  VKAD_TRY(device_.vk("vkCreateFence", [&] {
    return device_.fn().vkCreateFence(device_.handle(), &info, nullptr, &f);
  }));
  ++counters_.fences_created;
  ++device_.live_mut().fences;
  ++device_.live_mut().created;
  device_.set_name(VK_OBJECT_TYPE_FENCE, reinterpret_cast<uint64_t>(f),
                   name_ + " fence " + std::to_string(counters_.fences_created));
  return f;
}

Result<StreamSemaphore> Stream::submit(CommandList& list, std::span<const TimelineWait> waits) {
  if (list.stream_ != this || !list.recording()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "stream '" + name_ + "': submit of a list that is not open on this stream");
  }
  VkCommandBuffer cb = list.cb_.release();
  recording_ = false;
  Status s = device_.status();
  if (s.ok())
    s = device_.vk("vkEndCommandBuffer", [&] { return device_.fn().vkEndCommandBuffer(cb); });
  Serial serial = pending();
  VkFence fence = VK_NULL_HANDLE;
  if (s.ok() && mode_ == SyncMode::kFence) {
    Result<VkFence> f = take_fence();
    if (f.ok())
      fence = *f;
    else
      s = f.status();
  }
  if (s.ok()) {
    const uint64_t signal[2] = {serial.value(), serial.value()};
    const VkSemaphore signalled[2] = {timeline_, export_timeline_};
    VkTimelineSemaphoreSubmitInfo tsi{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    if (mode_ == SyncMode::kTimeline) {
      const uint32_t n = export_timeline_ ? 2 : 1;
      tsi.signalSemaphoreValueCount = n;
      tsi.pSignalSemaphoreValues = signal;
      si.signalSemaphoreCount = n;
      si.pSignalSemaphores = signalled;
    }
    std::vector<VkSemaphore> wait_sems;
    std::vector<uint64_t> wait_values;
    std::vector<VkPipelineStageFlags> wait_stages;
    for (const TimelineWait& w : waits) {
      wait_sems.push_back(w.semaphore);
      wait_values.push_back(w.value);
      wait_stages.push_back(VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
    }
    if (!waits.empty()) {
      tsi.waitSemaphoreValueCount = static_cast<uint32_t>(wait_values.size());
      tsi.pWaitSemaphoreValues = wait_values.data();
      si.waitSemaphoreCount = static_cast<uint32_t>(wait_sems.size());
      si.pWaitSemaphores = wait_sems.data();
      si.pWaitDstStageMask = wait_stages.data();
    }
    if (mode_ == SyncMode::kTimeline || !waits.empty()) si.pNext = &tsi;
    s = device_.vk("vkQueueSubmit",
                   [&] { return device_.fn().vkQueueSubmit(queue_, 1, &si, fence); });
  }
  if (!s.ok()) {
    // Nothing reached the queue: the serial is not consumed and the pooled objects go back.
    if (fence) free_fences_.push_back(fence);
    free_cbs_.push_back(cb);
    return s;
  }
  last_submitted_ = serial;
  ++counters_.submits;
  in_flight_cbs_.push(serial, cb);
  if (fence) in_flight_fences_.emplace_back(serial, fence);
  return StreamSemaphore(this, serial);
}

}  // namespace vkad::rhi
