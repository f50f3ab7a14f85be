// Submission serials and the two-method view of GPU progress that waiting code depends on.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>

namespace vkad::rhi {

// A submission serial: increases by one per submit on a stream. Not a bare integer so that
// it cannot be mixed up with counts, sizes or indices.
//
// Named values on a stream (see Stream):
//   last_submitted()  serial of the newest submit; kNoSerial before the first.
//   completed()       every submission with serial <= this has finished on the device.
//   pending()         last_submitted() + 1: the serial that work being recorded now will get.
class Serial {
 public:
  constexpr Serial() = default;
  constexpr explicit Serial(uint64_t value) : value_(value) {}
  constexpr uint64_t value() const { return value_; }
  constexpr Serial next() const { return Serial(value_ + 1); }
  constexpr auto operator<=>(const Serial&) const = default;

 private:
  uint64_t value_ = 0;
};

// "Never submitted / never used": always complete.
inline constexpr Serial kNoSerial{0};

// Read-only view of a stream's progress. Retirement logic depends on this, not on Vulkan, so
// it runs in unit tests against a fake.
class SerialTracker {
 public:
  SerialTracker() : link_(std::make_shared<SerialTracker*>(this)) {}
  // Cuts the link semaphores hold (see StreamSemaphore). A stream waits for all of its own
  // work before it is destroyed, so every serial it handed out is complete by then.
  virtual ~SerialTracker() { *link_ = nullptr; }
  SerialTracker(const SerialTracker&) = delete;
  SerialTracker& operator=(const SerialTracker&) = delete;
  // Last value observed, without asking the device. Never decreases.
  virtual Serial completed_cached() const = 0;
  // Non-blocking: asks the device (timeline counter / fence status) and returns the new value.
  virtual Serial refresh_completed() = 0;
  // Blocks until `serial` is complete or `timeout_ns` passes; waits for that serial only.
  // Returns false on timeout; device loss is reported by the owning stream's status.
  virtual bool wait_for(Serial serial, uint64_t timeout_ns) = 0;

  // Shared with every StreamSemaphore of this tracker; null once the tracker is destroyed.
  const std::shared_ptr<SerialTracker*>& link() const { return link_; }

 private:
  std::shared_ptr<SerialTracker*> link_;
};

// A (tracker, serial) pair: "this submission". Small and copyable.
//
// It may outlive its stream (and the runtime that owned the stream): it holds the tracker's
// shared link, not a raw pointer, and once the stream is gone it reports signaled, because a
// stream waits for all of its own work (or for the device to be reported lost) before it is
// destroyed. Used from the stream's thread only, like the stream itself.
class StreamSemaphore {
 public:
  StreamSemaphore() = default;
  StreamSemaphore(SerialTracker* tracker, Serial serial)
      : link_(tracker ? tracker->link() : nullptr), serial_(serial) {}

  Serial serial() const { return serial_; }
  // Non-blocking. One cached compare on the fast path; otherwise one counter/fence query.
  bool is_signaled() const {
    SerialTracker* t = tracker();
    if (t == nullptr || serial_ <= t->completed_cached()) return true;
    return serial_ <= t->refresh_completed();
  }
  // Waits for this serial only (never the whole device). False on timeout.
  bool wait(uint64_t timeout_ns = UINT64_MAX) const {
    if (is_signaled()) return true;
    SerialTracker* t = tracker();
    return t == nullptr || t->wait_for(serial_, timeout_ns);
  }

 private:
  SerialTracker* tracker() const { return link_ ? *link_ : nullptr; }
  std::shared_ptr<SerialTracker*> link_;
  Serial serial_ = kNoSerial;
};

}  // namespace vkad::rhi
