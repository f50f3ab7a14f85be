// UniqueHandle: sole ownership of one Vulkan handle (or any null-comparable handle type), so
// that classes holding one get their move operations from `= default` instead of writing them.
//
// `Deleter` is a small copyable struct carrying whatever releasing needs (the owner pointer
// and, for deferred destruction, the resource's use record) with
// `void operator()(Handle) noexcept`. The deleter travels with the handle: a move steals both
// and leaves the source null; a move assignment first releases what the target held, with
// the target's own deleter. The destructor releases a non-null handle and never throws.
#pragma once

#include <utility>

namespace vkad::rhi {

template <typename Handle, typename Deleter>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  UniqueHandle(Handle handle, Deleter deleter) : handle_(handle), deleter_(std::move(deleter)) {}
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  UniqueHandle(UniqueHandle&& other) noexcept
      : handle_(std::exchange(other.handle_, Handle{})), deleter_(other.deleter_) {}
  UniqueHandle& operator=(UniqueHandle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, Handle{});
      deleter_ = other.deleter_;
    }
    return *this;
  }
  ~UniqueHandle() { reset(); }

  // Releases the handle (if any) through the deleter and leaves this null; the deleter's state
  // stays (it is the owner's, not the handle's). Safe to call twice.
  void reset() noexcept {
    if (handle_ != Handle{}) deleter_(std::exchange(handle_, Handle{}));
  }
  // Gives up ownership without releasing: the caller now owns the returned handle.
  [[nodiscard]] Handle release() noexcept { return std::exchange(handle_, Handle{}); }

  Handle get() const { return handle_; }
  explicit operator bool() const { return handle_ != Handle{}; }
  Deleter& deleter() { return deleter_; }
  const Deleter& deleter() const { return deleter_; }

 private:
  Handle handle_{};
  Deleter deleter_{};
};

}  // namespace vkad::rhi
