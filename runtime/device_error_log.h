// The device error log: what kernels flagged in their error words (abi/kernel_abi.h), found
// when their launches retire, merged per (kernel, task, error), and reported once as one
// kDeviceError by the next download / synchronize. Pure: it reads args buffers as bytes, so it
// is unit-tested without a device (tests/unit/device_error_log_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "abi/handles.h"
#include "abi/kernel_abi.h"
#include "base/status.h"

namespace vkad::runtime {

// An error the device flagged (adstack overflow, out-of-bounds access), as found when the
// launches that hit it retired. One entry per (kernel, task, error); `launches` lists the first
// of them in launch order (at most kMaxListedLaunches), `count` all of them.
struct DeviceError {
  static constexpr size_t kMaxListedLaunches = 16;
  std::string kernel;
  std::string task;
  uint32_t code = 0;    // kErrorOutOfBounds, kErrorAdstackOverflow, ... (abi/kernel_abi.h)
  std::string message;  // "kernel 'k', task 't': <what happened and what to do>"
  std::vector<LaunchId> launches;
  // Per listed launch: what the user wrote that made it ("launch 5 of graph 'step'"), or "".
  std::vector<std::string> wheres;
  uint64_t count = 0;
};

class DeviceErrorLog {
 public:
  // At most this many distinct errors are kept until reported; later distinct ones are dropped
  // (their launches still fail the same drain).
  static constexpr size_t kMaxErrors = 16;
  // Reads the error words of one retired launch of `kernel` from its args buffer `args`
  // (args_bytes() bytes, which still hold the launch's adstack capacities).
  // `where` (called only when the launch flagged an error) says what the user wrote that made
  // the launch, e.g. "launch 5 of graph 'step'"; the report puts it after the launch's number.
  void record(const abi::CompiledKernel& kernel, const std::byte* args, LaunchId launch,
              const std::function<std::string()>& where = {});
  // ok when nothing was recorded since the last call; otherwise one kDeviceError naming each
  // error with its launches ("in launch #2", "in launches #2, #5 (3 launches)", "in launch #7
  // (launch 5 of graph 'step')"), and reported()
  // then holds them. The log is empty afterwards (reported once).
  Status take();
  const std::vector<DeviceError>& reported() const { return reported_; }
  bool empty() const { return pending_.empty(); }

 private:
  std::vector<DeviceError> pending_;
  std::vector<DeviceError> reported_;
};

// What a task's error word means, in words: the error and what to do about it.
std::string describe_device_error(const abi::CompiledKernel& kernel, uint32_t task, uint32_t word,
                                  const std::byte* args);

}  // namespace vkad::runtime
