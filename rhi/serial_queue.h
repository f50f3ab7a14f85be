// A FIFO of values keyed by a non-decreasing serial: push(serial, value), then hand back every
// value whose serial has completed. The building block of every deferred release in vkad.
#pragma once

#include <cassert>
#include <cstddef>
#include <deque>
#include <utility>

#include "rhi/serial.h"

namespace vkad::rhi {

template <typename T>
class SerialQueue {
 public:
  // `serial` must be >= the serial of the last push (checked in debug builds).
  void push(Serial serial, T value) {
    assert(entries_.empty() || entries_.back().first <= serial);
    entries_.emplace_back(serial, std::move(value));
  }

  // Calls `fn(T&&)` for each front entry with serial <= completed, in order, and removes it.
  // Returns how many were retired.
  template <typename Fn>
  std::size_t retire_up_to(Serial completed, Fn&& fn) {
    std::size_t n = 0;
    while (!entries_.empty() && entries_.front().first <= completed) {
      T value = std::move(entries_.front().second);
      entries_.pop_front();
      fn(std::move(value));
      ++n;
    }
    return n;
  }

  // Retires everything regardless of serial (used only after a wait made everything complete).
  template <typename Fn>
  std::size_t retire_all(Fn&& fn) {
    return retire_up_to(Serial(UINT64_MAX), std::forward<Fn>(fn));
  }

  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  Serial front_serial() const { return entries_.front().first; }
  Serial back_serial() const { return entries_.back().first; }

 private:
  std::deque<std::pair<Serial, T>> entries_;
};

}  // namespace vkad::rhi
