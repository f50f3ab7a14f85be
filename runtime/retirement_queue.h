// The retirement queue: per-flush payloads (ctx buffers) paired with the semaphore of the
// submission that used them, released as soon as that submission is known complete.
//
// Policy (the design's contract):
//   push(sem, payload)  append; then pop every FRONT entry whose is_signaled() is true
//                       (non-blocking, per entry, in order); then, while more than `depth`
//                       entries remain, wait for the OLDEST entry only and pop it — a forced
//                       wait, counted with the time it blocked.
//   poll()              the non-blocking part alone.
//   drain_all()         wait for the newest entry (so every entry is complete) and pop all.
// Pure logic over StreamSemaphore/SerialTracker, so it is unit-tested with a fake semaphore.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "base/status.h"
#include "rhi/serial.h"

namespace vkad::runtime {

struct RetirementCounters {
  uint64_t pushed = 0;
  uint64_t retired_by_polling = 0;
  uint64_t retired_by_forced_wait = 0;
  uint64_t retired_by_drain = 0;
  uint64_t forced_waits = 0;
  double forced_wait_us = 0;  // total host time blocked in forced waits
  uint64_t entries = 0;       // held now
  uint64_t bytes = 0;         // held now
  uint64_t high_water_entries = 0;
  uint64_t high_water_bytes = 0;
};

// kPerEntryPolling is vkad's policy. The other two exist as baselines for the benchmark:
//   kHoldUntilSync     never poll, never wait; release only at drain_all() (Quadrants today);
//   kFullDrainWhenFull never poll; when more than `depth` entries are held, wait for the NEWEST
//                      and release everything (the rejected proposal).
enum class RetirementPolicy : uint8_t { kPerEntryPolling, kHoldUntilSync, kFullDrainWhenFull };

template <typename Payload>
class RetirementQueue {
 public:
  explicit RetirementQueue(size_t depth,
                           RetirementPolicy policy = RetirementPolicy::kPerEntryPolling)
      : depth_(depth), policy_(policy) {}
  // The payloads retired (their submissions complete) since the last call, oldest first, for
  // the owner to read (e.g. device-written error flags) and then destroy. The queue never calls
  // back into its owner: every call that can retire (push, poll, drain_all, set_depth) is
  // followed by the owner taking what it retired.
  std::vector<Payload> take_retired() { return std::exchange(retired_, {}); }
  // The same into `out` (cleared first), trading buffers so neither side allocates per call:
  // for the runtime's flush path.
  void take_retired(std::vector<Payload>& out) {
    out.clear();
    std::swap(out, retired_);
  }

  size_t depth() const { return depth_; }
  RetirementPolicy policy() const { return policy_; }
  // Lowering the depth retires down to it (forced waits on the oldest entries as needed).
  Status set_depth(size_t depth) {
    depth_ = depth;
    poll();
    return enforce_depth();
  }

  Status push(rhi::StreamSemaphore sem, Payload payload, uint64_t bytes) {
    entries_.push_back({sem, std::move(payload), bytes});
    ++c_.pushed;
    ++c_.entries;
    c_.bytes += bytes;
    if (c_.entries > c_.high_water_entries) c_.high_water_entries = c_.entries;
    if (c_.bytes > c_.high_water_bytes) c_.high_water_bytes = c_.bytes;
    poll();
    return enforce_depth();
  }

  // Non-blocking; returns how many entries were retired.
  size_t poll() {
    if (policy_ != RetirementPolicy::kPerEntryPolling) return 0;
    size_t n = 0;
    while (!entries_.empty() && entries_.front().sem.is_signaled()) {
      pop_front();
      ++c_.retired_by_polling;
      ++n;
    }
    return n;
  }

  // Waits for the newest entry, then retires everything. On a failed wait (device lost) the
  // entries stay held and the error is returned.
  Status drain_all() {
    if (entries_.empty()) return {};
    if (!entries_.back().sem.wait()) return wait_failed();
    while (!entries_.empty()) {
      pop_front();
      ++c_.retired_by_drain;
    }
    return {};
  }

  // Drops every entry (and every retired payload not taken) without waiting. Only for shutdown
  // after a lost device (nothing will complete; Vulkan allows destroying a lost device's
  // objects).
  void abandon_all() {
    while (!entries_.empty()) pop_front();
    retired_.clear();
  }

  const RetirementCounters& counters() const { return c_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    rhi::StreamSemaphore sem;
    Payload payload;
    uint64_t bytes;
  };
  Status enforce_depth() {
    if (policy_ == RetirementPolicy::kHoldUntilSync) return {};
    if (policy_ == RetirementPolicy::kFullDrainWhenFull) {
      if (entries_.size() <= depth_) return {};
      if (!forced_wait(entries_.back().sem)) return wait_failed();
      while (!entries_.empty()) {
        pop_front();
        ++c_.retired_by_forced_wait;
      }
      return {};
    }
    while (entries_.size() > depth_) {
      if (!forced_wait(entries_.front().sem)) return wait_failed();
      pop_front();
      ++c_.retired_by_forced_wait;
    }
    return {};
  }
  // Blocks on one semaphore, counting it as a forced wait with the time it took.
  bool forced_wait(const rhi::StreamSemaphore& sem) {
    auto t0 = std::chrono::steady_clock::now();
    bool ok = sem.wait();
    c_.forced_wait_us +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    ++c_.forced_waits;
    return ok;
  }
  void pop_front() {
    c_.bytes -= entries_.front().bytes;
    --c_.entries;
    retired_.push_back(std::move(entries_.front().payload));
    entries_.pop_front();
  }
  Status wait_failed() {
    return make_error(ErrorCode::kDeviceLost,
                      "waiting for a submission in the retirement queue failed (device lost)");
  }

  size_t depth_;
  RetirementPolicy policy_;
  std::deque<Entry> entries_;
  std::vector<Payload> retired_;  // until take_retired()
  RetirementCounters c_;
};

}  // namespace vkad::runtime
