// Detects two threads inside one externally synchronised object at the same time.
//
// vkad's thread model: a Runtime (like a VkQueue) is externally synchronised: one thread at a
// time may call it; distinct runtimes may be used on distinct threads freely. Calls from two
// threads that overlap are a misuse that used to corrupt state silently (use-after-free, double
// free). Every public Runtime call enters a UseGuard first; an overlapping call from a second
// thread gets kFailedPrecondition and touches nothing, in every build type (the check is one
// compare-and-swap, ~10 ns, next to a launch's microseconds). Re-entry from the owning thread
// (download -> flush) is allowed. It detects, it does not serialise: a program that needs one
// runtime on several threads must hold its own lock around the calls.
#pragma once

#include <atomic>
#include <sstream>
#include <string>
#include <thread>

#include "base/status.h"

namespace vkad::runtime {

class UseGuard {
 public:
  class Scope {
   public:
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      if (owner_ != nullptr) owner_->store(std::thread::id(), std::memory_order_release);
    }
    const Status& status() const { return status_; }
    bool ok() const { return status_.ok(); }

   private:
    friend class UseGuard;
    Scope(std::atomic<std::thread::id>* owner, Status status)
        : owner_(owner), status_(std::move(status)) {}
    std::atomic<std::thread::id>* owner_;  // set when this scope must release on exit
    Status status_;
  };

  // `what` names the call for the error ("launch", "download", ...).
  Scope enter(const char* what) const {
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id expected{};
    if (owner_.compare_exchange_strong(expected, me, std::memory_order_acquire)) {
      return Scope(&owner_, {});
    }
    if (expected == me) return Scope(nullptr, {});  // re-entry on the owning thread
    std::ostringstream msg;
    msg << "Runtime::" << what << " called on thread " << me << " while thread " << expected
        << " is inside the same Runtime; a Runtime is externally synchronised (one thread at a "
           "time): serialise the calls with a lock, or give each thread its own Runtime";
    return Scope(nullptr, make_error(ErrorCode::kFailedPrecondition, msg.str()));
  }

 private:
  mutable std::atomic<std::thread::id> owner_{};
};

}  // namespace vkad::runtime

// First line of every public Runtime call: returns the misuse error when another thread is
// inside this runtime.
#define VKAD_EXCLUSIVE_USE(what)                 \
  auto vkad_use_scope_ = use_guard_.enter(what); \
  if (!vkad_use_scope_.ok()) return vkad_use_scope_.status()
