#include "base/status.h"

#include <cstdlib>

#include "base/log.h"

namespace vkad {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kFailedPrecondition: return "failed precondition";
    case ErrorCode::kOutOfDeviceMemory: return "out of device memory";
    case ErrorCode::kOutOfHostMemory: return "out of host memory";
    case ErrorCode::kDeviceLost: return "device lost";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kNoDevice: return "no Vulkan device";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kDeviceError: return "device-side error";
    case ErrorCode::kVulkan: return "Vulkan error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown";
}

const std::string& Status::message() const {
  static const std::string kNone;
  return rep_ ? rep_->message : kNone;
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(error_code_name(rep_->code)) + ": " + rep_->message;
}

namespace detail {
void value_of_failed_result(const Status& s) {
  log(LogLevel::kError, "value() of a failed Result (check ok() first): " + s.to_string());
  std::abort();
}
}  // namespace detail

}  // namespace vkad
