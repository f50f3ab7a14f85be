// A SerialTracker whose "device" progress the test sets by hand.
#pragma once

#include "rhi/serial.h"

namespace vkad::testing {

class FakeTracker : public rhi::SerialTracker {
 public:
  rhi::Serial completed_cached() const override { return cached_; }
  rhi::Serial refresh_completed() override {
    ++queries;
    cached_ = device_;
    return cached_;
  }
  // Waiting makes the fake device finish exactly up to `s` (not further).
  bool wait_for(rhi::Serial s, uint64_t) override {
    ++waits;
    last_wait = s;
    if (s > device_) device_ = s;
    cached_ = device_;
    return !fail_waits;
  }
  void advance_device(rhi::Serial s) { device_ = s; }
  int queries = 0;
  int waits = 0;
  rhi::Serial last_wait{0};
  bool fail_waits = false;

 private:
  rhi::Serial cached_{0};
  rhi::Serial device_{0};
};

}  // namespace vkad::testing
