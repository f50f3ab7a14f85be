// Submission serials and the two-method view of GPU progress that waiting code depends on.
#pragma once

#include <compare>
#include <cstdint>

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
  virtual ~SerialTracker() = default;
  // Last value observed, without asking the device. Never decreases.
  virtual Serial completed_cached() const = 0;
  // Non-blocking: asks the device (timeline counter / fence status) and returns the new value.
  virtual Serial refresh_completed() = 0;
  // Blocks until `serial` is complete or `timeout_ns` passes; waits for that serial only.
  // Returns false on timeout; device loss is reported by the owning stream's status.
  virtual bool wait_for(Serial serial, uint64_t timeout_ns) = 0;
};

// A (tracker, serial) pair: "this submission". Small and copyable.
class StreamSemaphore {
 public:
  StreamSemaphore() = default;
  StreamSemaphore(SerialTracker* tracker, Serial serial) : tracker_(tracker), serial_(serial) {}

  Serial serial() const { return serial_; }
  // Non-blocking. One cached compare on the fast path; otherwise one counter/fence query.
  bool is_signaled() const {
    if (tracker_ == nullptr || serial_ <= tracker_->completed_cached()) return true;
    return serial_ <= tracker_->refresh_completed();
  }
  // Waits for this serial only (never the whole device). False on timeout.
  bool wait(uint64_t timeout_ns = UINT64_MAX) const {
    if (is_signaled()) return true;
    return tracker_->wait_for(serial_, timeout_ns);
  }

 private:
  SerialTracker* tracker_ = nullptr;  // borrowed; the stream outlives its semaphores' use
  Serial serial_ = kNoSerial;
};

}  // namespace vkad::rhi
