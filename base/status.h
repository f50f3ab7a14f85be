// Errors as values, the floor every layer stands on. Nothing in vkad throws: fallible calls
// return Status or Result<T>; VKAD_TRY / VKAD_ASSIGN_OR_RETURN propagate them, the _CTX forms
// prefix what the caller was doing ("registering kernel 'k': <inner message>").
//
// Misuse -- reading value() of a failed Result -- is a programming error, not an error value:
// it stops the process with a message naming the error (base/check.h), never an exception.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>

namespace vkad {

enum class ErrorCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // caller passed something wrong (bad IR, wrong arg types/shapes, ...)
  kNotFound,            // unknown handle / kernel / device
  kFailedPrecondition,  // call not valid in the current state (e.g. a list already open)
  kOutOfDeviceMemory,
  kOutOfHostMemory,
  kDeviceLost,   // sticky: every later device call reports it
  kUnsupported,  // device lacks a required feature / extension / layer
  kNoDevice,     // no Vulkan device at all (tests skip on this)
  kTimeout,
  kDeviceError,  // an error flag raised by a kernel on the device (e.g. adstack overflow)
  kVulkan,       // any other VkResult failure
  kInternal,     // a bug in vkad (e.g. emitted SPIR-V failed validation)
};

const char* error_code_name(ErrorCode code);

// An ok Status is one null pointer: it is made, moved, copied and tested on every call of the
// launch path (VKAD_TRY), so that costs no string. An error holds its code and message on the
// heap.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message)
      : rep_(std::make_unique<Rep>(Rep{code, std::move(message)})) {}
  Status(const Status& other) : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}
  Status(Status&& other) noexcept = default;
  Status& operator=(const Status& other) {
    if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
    return *this;
  }
  Status& operator=(Status&& other) noexcept = default;
  ~Status() = default;
  static Status ok_status() { return {}; }

  bool ok() const { return !rep_ || rep_->code == ErrorCode::kOk; }
  ErrorCode code() const { return rep_ ? rep_->code : ErrorCode::kOk; }
  const std::string& message() const;
  // "<code name>: <message>", for logs and test failure output.
  std::string to_string() const;
  // The same error with `context` in front of its message ("context: message"); ok stays ok.
  Status with_context(const std::string& context) const {
    return ok() ? Status() : Status(rep_->code, context + ": " + rep_->message);
  }

 private:
  struct Rep {
    ErrorCode code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

inline Status make_error(ErrorCode code, std::string message) {
  return Status(code, std::move(message));
}

namespace detail {
// Stops the process: "vkad: value() of a failed Result: <error>" (base/check.h).
[[noreturn]] void value_of_failed_result(const Status& s);
}  // namespace detail

// A value or the error that prevented it. Access value() only when ok().
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) {}

  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<1>(v_);
  }
  // Only when ok(): otherwise the process stops with the error's message (misuse, see above).
  T& value() & {
    check_ok();
    return *std::get_if<0>(&v_);
  }
  const T& value() const& {
    check_ok();
    return *std::get_if<0>(&v_);
  }
  T&& value() && {
    check_ok();
    return std::move(*std::get_if<0>(&v_));
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  void check_ok() const {
    if (!ok()) detail::value_of_failed_result(*std::get_if<1>(&v_));
  }
  std::variant<T, Status> v_;
};

namespace detail {
inline Status to_status(Status s) { return s; }
template <typename T>
Status to_status(const Result<T>& r) {
  return r.status();
}
}  // namespace detail

}  // namespace vkad

#define VKAD_CONCAT_INNER(a, b) a##b
#define VKAD_CONCAT(a, b) VKAD_CONCAT_INNER(a, b)

#define VKAD_TRY(expr)                                                 \
  do {                                                                 \
    ::vkad::Status vkad_try_status_ = ::vkad::detail::to_status(expr); \
    if (!vkad_try_status_.ok()) return vkad_try_status_;               \
  } while (0)

// `lhs` is a declaration (`Type name`) and `tmp` a generated name: neither can be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define VKAD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#define VKAD_ASSIGN_OR_RETURN(lhs, expr) \
  VKAD_ASSIGN_OR_RETURN_IMPL(VKAD_CONCAT(vkad_result_, __LINE__), lhs, expr)

// As VKAD_TRY / VKAD_ASSIGN_OR_RETURN, with `context` (a std::string expression, evaluated
// only on the error path) in front of the error's message.
#define VKAD_TRY_CTX(expr, context)                                            \
  do {                                                                         \
    ::vkad::Status vkad_try_status_ = ::vkad::detail::to_status(expr);         \
    if (!vkad_try_status_.ok()) return vkad_try_status_.with_context(context); \
  } while (0)

#define VKAD_ASSIGN_OR_RETURN_CTX_IMPL(tmp, lhs, expr, context) \
  auto tmp = (expr);                                            \
  if (!tmp.ok()) return tmp.status().with_context(context);     \
  lhs = std::move(tmp).value()

#define VKAD_ASSIGN_OR_RETURN_CTX(lhs, expr, context) \
  VKAD_ASSIGN_OR_RETURN_CTX_IMPL(VKAD_CONCAT(vkad_result_, __LINE__), lhs, expr, context)
// NOLINTEND(bugprone-macro-parentheses)
