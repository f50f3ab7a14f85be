// Destroys objects only after every submission that may use them has completed.
//
// Each tracked object carries a ResourceUse: for each stream, the serial of the last submission
// that recorded it. On release the object is queued on the first stream whose serial has not
// completed, in a SerialQueue; when that serial completes the remaining streams are checked and
// the object moves on or is destroyed. Nothing blocks. Pure logic over SerialTracker, so it is
// unit-tested with a fake clock.
#pragma once

#include <array>
#include <utility>
#include <vector>

#include "rhi/serial.h"
#include "rhi/serial_queue.h"

namespace vkad::rhi {

inline constexpr int kMaxStreams = 4;

struct ResourceUse {
  std::array<Serial, kMaxStreams> last{};  // kNoSerial: never used on that stream
  void mark(int stream, Serial serial) {
    if (last[stream] < serial) last[stream] = serial;
  }
};

template <typename T>
class DeferredDeleter {
 public:
  // `trackers[i]` is stream i's progress, or null where no stream i exists (borrowed).
  void set_tracker(int stream, SerialTracker* tracker) { trackers_[stream] = tracker; }

  // Destroys `obj` through `destroy` now when every use has completed (cached values; no
  // device query), otherwise queues it. The queue key is clamped to the queue's newest serial
  // so the queue stays ordered; that can only delay a release, never advance it.
  template <typename Fn>
  void release(const ResourceUse& use, T obj, Fn&& destroy) {
    int s = first_incomplete(use);
    if (s < 0) {
      destroy(std::move(obj));
      return;
    }
    enqueue(s, use, std::move(obj));
  }

  // Non-blocking: destroys every queued object whose uses have all completed as of each
  // tracker's cached completed serial. Returns how many were destroyed.
  template <typename Fn>
  size_t collect(Fn&& destroy) {
    size_t destroyed = 0;
    for (int s = 0; s < kMaxStreams; ++s) {
      if (trackers_[s] == nullptr) continue;
      Serial done = trackers_[s]->completed_cached();
      std::vector<std::pair<ResourceUse, T>> moved_on;
      queues_[s].retire_up_to(done, [&](std::pair<ResourceUse, T>&& e) {
        if (first_incomplete(e.first) < 0) {
          destroy(std::move(e.second));
          ++destroyed;
        } else {
          moved_on.push_back(std::move(e));
        }
      });
      for (auto& e : moved_on) enqueue(first_incomplete(e.first), e.first, std::move(e.second));
    }
    return destroyed;
  }

  // Destroys everything queued. Only valid when the caller knows the device is idle (shutdown).
  template <typename Fn>
  size_t destroy_all(Fn&& destroy) {
    size_t n = 0;
    for (auto& q : queues_) {
      n += q.retire_all([&](std::pair<ResourceUse, T>&& e) { destroy(std::move(e.second)); });
    }
    return n;
  }

  size_t pending() const {
    size_t n = 0;
    for (const auto& q : queues_) n += q.size();
    return n;
  }

 private:
  int first_incomplete(const ResourceUse& use) const {
    for (int s = 0; s < kMaxStreams; ++s) {
      if (use.last[s] == kNoSerial || trackers_[s] == nullptr) continue;
      if (use.last[s] > trackers_[s]->completed_cached()) return s;
    }
    return -1;
  }
  void enqueue(int s, const ResourceUse& use, T obj) {
    Serial key = use.last[s];
    if (!queues_[s].empty() && queues_[s].back_serial() > key) key = queues_[s].back_serial();
    queues_[s].push(key, {use, std::move(obj)});
  }

  std::array<SerialTracker*, kMaxStreams> trackers_{};
  std::array<SerialQueue<std::pair<ResourceUse, T>>, kMaxStreams> queues_;
};

}  // namespace vkad::rhi
