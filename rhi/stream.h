// A stream is one VkQueue plus the machinery to know, without blocking, which of its
// submissions have finished.
//
// Contract:
//  - Each submit gets the next serial (last_submitted() + 1). Serials complete in order.
//  - Timeline mode: one timeline semaphore; submit signals it with the serial; completion is
//    read with vkGetSemaphoreCounterValue. Fence mode: a pooled VkFence per submission, read
//    with vkGetFenceStatus; for devices without timeline semaphores, and selectable anywhere so
//    both paths are tested. kAuto picks timeline where the device has it.
//  - One command list is recorded at a time; it carries serial pending() from begin() on.
//  - Nothing is created per submit that is not reused: command buffers, fences and descriptor
//    pools go back to free lists when their serial completes (recycle(), also run by begin()
//    and submit()).
//  - Waiting is per serial (StreamSemaphore::wait); the only whole-queue wait is wait_idle(),
//    which waits for this stream's last submission, never the device.
#pragma once

#include <vulkan/vulkan.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "rhi/command_list.h"
#include "rhi/descriptor_allocator.h"
#include "rhi/serial.h"
#include "rhi/serial_queue.h"

namespace vkad::rhi {

class Device;

enum class SyncMode : uint8_t { kAuto, kTimeline, kFence };
const char* sync_mode_name(SyncMode mode);

struct StreamOptions {
  SyncMode mode = SyncMode::kAuto;
  std::string name = "vkad stream";
  // Spin-then-block waits: a wait first polls completion (timeline counter: ~10 ns a query;
  // fence status: ~0.4 us) for up to this long, then blocks in the driver. Blocking waits on
  // NVIDIA cost ~35-45 us of wake-up latency for a tiny submission; polling sees completion
  // ~15 us after submit. The price is up to this much CPU time per wait, on the waiting thread.
  // -1 = automatic: the environment variable VKAD_WAIT_SPIN_NS if set, else kDefaultSpinNs on
  // GPUs and 0 on CPU devices (lavapipe's worker threads need the cores a spinning waiter
  // would take).
  int64_t spin_ns = -1;
  static constexpr int64_t kDefaultSpinNs = 50'000;
};

struct StreamCounters {
  uint64_t submits = 0;
  uint64_t command_buffers_created = 0;  // stays at the number ever in flight at once + 1
  uint64_t fences_created = 0;
  uint64_t completion_queries = 0;  // vkGetSemaphoreCounterValue / vkGetFenceStatus calls
  uint64_t waits = 0;               // waits that found the serial incomplete
  uint64_t spin_completions = 0;    // ... of which completed while spinning (no block)
};

class Stream final : public SerialTracker {
 public:
  // Use Device::create_stream.
  static Result<std::unique_ptr<Stream>> create(Device& device, const StreamOptions& options);
  // Waits for this stream's own last submission, then destroys its pools. Never throws.
  ~Stream() override;

  // Starts recording. kFailedPrecondition if another list of this stream is still open.
  Result<CommandList> begin();
  // Ends and submits `list` (which becomes empty whether or not this succeeds). The submission
  // starts only after every `waits` timeline semaphore reached its value (another stream's
  // timeline, or a host-signalled gate). On failure the serial is not consumed, the command
  // buffer returns to the pool, and the error names the call.
  struct TimelineWait {
    VkSemaphore semaphore = VK_NULL_HANDLE;
    uint64_t value = 0;
  };
  Result<StreamSemaphore> submit(CommandList& list, std::span<const TimelineWait> waits = {});
  // Starts recording a Bundle (a secondary command buffer to execute from this stream's lists,
  // command_list.h). Independent of begin(): a bundle may be recorded while a list is open.
  Result<CommandList> begin_bundle();
  // Ends a bundle's recording (`list` comes from begin_bundle and becomes empty).
  Result<Bundle> end_bundle(CommandList& list);
  // Bundles recorded by other threads (the runtime's capture run, runtime.h): each thread
  // records from a command pool of its own, a side pool, which Vulkan lets one thread use at a
  // time. The owner thread makes the pools (ensure_side_pools) and, before threads start
  // recording side bundles, waits for the side bundles released earlier to be freed
  // (settle_side_bundles); thread i alone then calls begin_side_bundle(i) / end_side_bundle
  // (no other Stream call) between side_threads(true) and side_threads(false). The owner may
  // execute and destroy the Bundles meanwhile: a side bundle whose last execution completed
  // while the threads record is not freed on the owner's thread (the pool is thread i's) but
  // handed to thread i, which frees it at its next begin_side_bundle; side_threads(false),
  // called after the threads stopped, frees what is left. Why: a driver keeps a side
  // bundle's memory until it is freed (NVIDIA: ~4 KiB a launch), so a capture that kept every
  // piece's bundle to its end held ~600 MiB for a 70,000-launch iteration. Side bundles are not
  // counted in the device's live objects (the recording threads touch no shared counter).
  Status ensure_side_pools(int count);
  Status settle_side_bundles();
  void side_threads(bool recording) noexcept;
  // Side bundles allocated and not freed yet (handed to a thread counts until it frees them),
  // and the most there were at once since the stream was made.
  int64_t side_bundles_live() const { return side_live_.load(); }
  int64_t side_bundles_peak() const { return side_peak_.load(); }
  Result<CommandList> begin_side_bundle(int pool);
  Result<Bundle> end_side_bundle(CommandList& list);
  // This stream's timeline semaphore (timeline mode only; null in fence mode).
  VkSemaphore timeline_semaphore() const { return timeline_; }
  // A new opaque POSIX fd of a timeline semaphore that every submit signals with its serial, as
  // timeline_semaphore() (the caller owns the fd). kUnsupported without
  // Capabilities::export_semaphore_fd or in fence mode.
  Result<int> export_timeline_fd();

  Serial last_submitted() const { return last_submitted_; }
  Serial pending() const { return last_submitted_.next(); }
  Serial completed_cached() const override { return completed_; }
  Serial refresh_completed() override;
  bool wait_for(Serial serial, uint64_t timeout_ns) override;
  // Waits for last_submitted() (this stream only). kTimeout / kDeviceLost on failure.
  Status wait_idle(uint64_t timeout_ns = UINT64_MAX);
  // Non-blocking: refresh completion, recycle command buffers, fences, descriptor pools and
  // destroy deferred garbage whose serial completed.
  void recycle();
  // Makes the primary command buffers (and, in fence mode, the fences) for `submissions` lists
  // recorded or in flight at once, so that a caller that bounds its submissions in flight (the
  // runtime's retirement depth) creates none later: without it the pool grows to the most
  // ever in flight, which a loaded machine reaches at a later, unpredictable iteration.
  Status reserve(size_t submissions);

  SyncMode mode() const { return mode_; }
  int index() const { return index_; }
  Device& device() { return device_; }
  VkQueue queue() const { return queue_; }
  const StreamCounters& counters() const { return counters_; }
  size_t live_descriptor_sets() const { return descriptors_.live_sets(); }
  size_t command_buffers_in_flight() const { return in_flight_cbs_.size(); }
  size_t bundles_retiring() const { return retiring_bundles_.size(); }
  int64_t spin_ns() const { return spin_ns_; }
  void set_spin_ns(int64_t ns) { spin_ns_ = ns < 0 ? 0 : ns; }

 private:
  friend class CommandList;
  Stream(Device& device, SyncMode mode, std::string name)
      : device_(device), mode_(mode), name_(std::move(name)), descriptors_(device) {}
  friend class Bundle;
  void abandon(VkCommandBuffer cb);  // an unsubmitted list went away
  // A bundle went away: freed once `last_use` completed (kNoSerial: never executed).
  // `side`: the side pool of a side bundle, -1 for the stream's own pool.
  void release_bundle(VkCommandBuffer cb, Serial last_use, int side) noexcept;
  void free_bundle(VkCommandBuffer cb, int side) noexcept;
  // A bundle's recording ends: the list's command buffer, dispatch count and uses (each once)
  // move into the Bundle, the list left empty (end_bundle / end_side_bundle end the buffer).
  Bundle seal(CommandList& list);
  // A side bundle whose recording failed, freed by the thread recording it.
  void free_side_now(VkCommandBuffer cb, int side) noexcept;
  Result<VkCommandBuffer> allocate_command_buffer(VkCommandBufferLevel level, const char* label);
  Result<VkFence> take_fence();  // a free one, else a new one (counted and named)
  // The driver wait itself, without the sticky device-lost short cut: also used at destruction,
  // where objects may be freed only once the queue is really done with them.
  VkResult wait_in_driver(Serial serial, uint64_t timeout_ns);

  Device& device_;
  SyncMode mode_;
  std::string name_;
  int index_ = -1;
  int64_t spin_ns_ = 0;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  std::vector<VkCommandPool> side_pools_;  // ensure_side_pools
  // Side bundles to free, by pool, while side_threads_ (side_threads): under side_mu_, freed
  // by the pool's thread at its next begin_side_bundle.
  std::mutex side_mu_;
  bool side_threads_ = false;
  std::vector<std::vector<VkCommandBuffer>> side_free_;
  std::atomic<int64_t> side_live_{0}, side_peak_{0};  // side_bundles_live / _peak
  void side_freed(size_t n) { side_live_ -= static_cast<int64_t>(n); }
  VkSemaphore timeline_ = VK_NULL_HANDLE;
  // Signalled with timeline_'s values where Capabilities::export_semaphore_fd: the one
  // export_timeline_fd hands out (stream.cpp says why it is not timeline_).
  VkSemaphore export_timeline_ = VK_NULL_HANDLE;
  Serial last_submitted_ = kNoSerial;
  Serial completed_ = kNoSerial;
  bool recording_ = false;
  std::vector<VkCommandBuffer> free_cbs_;
  size_t primaries_ = 0;  // primary command buffers made (free, recording or in flight)
  SerialQueue<VkCommandBuffer> in_flight_cbs_;
  struct RetiringBundle {
    VkCommandBuffer cb = VK_NULL_HANDLE;
    int side = -1;
  };
  SerialQueue<RetiringBundle> retiring_bundles_;  // released bundles, freed when complete
  size_t side_retiring_ = 0;                      // ... of which side bundles
  std::vector<VkFence> free_fences_;
  std::deque<std::pair<Serial, VkFence>> in_flight_fences_;
  DescriptorAllocator descriptors_;
  StreamCounters counters_;
};

}  // namespace vkad::rhi
