// File: shared/status/status.h
//
// lede::Status and lede::StatusOr<T>: the error type of every LEDE API.
//
// In the full build they ARE absl::Status / absl::StatusOr<T> (type aliases),
// so status values cross into gRPC code unchanged. The engine-only build
// (-DLEDE_ENGINE_ONLY=ON) must compile on a machine that has a CUDA libtorch
// and nothing else, so there a small stand-in with the same API subset is
// used: ok(), code(), message(), ToString(), value(), operator*, operator->,
// and the *Error() constructors. Codes are absl's (= gRPC's) code values.
//
// Thread-safety: values; const methods are safe to call concurrently.
#ifndef LEDE_SHARED_STATUS_STATUS_H_
#define LEDE_SHARED_STATUS_STATUS_H_

#if LEDE_HAVE_ABSL

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lede {
using absl::Status;
using absl::StatusCode;
using absl::StatusOr;
using absl::AlreadyExistsError;
using absl::DataLossError;
using absl::DeadlineExceededError;
using absl::FailedPreconditionError;
using absl::InternalError;
using absl::InvalidArgumentError;
using absl::NotFoundError;
using absl::OkStatus;
using absl::OutOfRangeError;
using absl::ResourceExhaustedError;
using absl::UnavailableError;
using absl::UnimplementedError;
using absl::StatusCodeToString;  // "OK", "INVALID_ARGUMENT", ... (the gRPC names)
}  // namespace lede

#else  // engine-only stand-in

#include <cstdlib>
#include <iostream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace lede {

// Same numeric values as absl::StatusCode and grpc::StatusCode.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

std::string StatusCodeToString(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string_view message)
      : code_(code), message_(code == StatusCode::kOk ? "" : message) {}
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  std::string_view message() const { return message_; }
  std::string ToString() const {
    return ok() ? "OK" : StatusCodeToString(code_) + ": " + message_;
  }
  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline std::ostream& operator<<(std::ostream& os, const Status& s) {
  return os << s.ToString();
}

inline Status OkStatus() { return Status(); }
#define LEDE_DEFINE_ERROR_(Name, Code) \
  inline Status Name(std::string_view m) { return Status(StatusCode::Code, m); }
LEDE_DEFINE_ERROR_(AlreadyExistsError, kAlreadyExists)
LEDE_DEFINE_ERROR_(DataLossError, kDataLoss)
LEDE_DEFINE_ERROR_(DeadlineExceededError, kDeadlineExceeded)
LEDE_DEFINE_ERROR_(FailedPreconditionError, kFailedPrecondition)
LEDE_DEFINE_ERROR_(InternalError, kInternal)
LEDE_DEFINE_ERROR_(InvalidArgumentError, kInvalidArgument)
LEDE_DEFINE_ERROR_(NotFoundError, kNotFound)
LEDE_DEFINE_ERROR_(OutOfRangeError, kOutOfRange)
LEDE_DEFINE_ERROR_(ResourceExhaustedError, kResourceExhausted)
LEDE_DEFINE_ERROR_(UnavailableError, kUnavailable)
LEDE_DEFINE_ERROR_(UnimplementedError, kUnimplemented)
#undef LEDE_DEFINE_ERROR_

// Holds a T or a non-OK Status. Accessing value() of an error aborts with the
// status printed (as absl does), so check ok() first.
template <typename T>
class StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit
    if (status_.ok()) status_ = InternalError("OK status given to StatusOr");
  }
  StatusOr(const T& value) : value_(value) {}       // NOLINT: implicit
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT: implicit
  template <typename U, typename = std::enable_if_t<
                            std::is_constructible_v<T, U&&> &&
                            !std::is_same_v<std::decay_t<U>, Status> &&
                            !std::is_same_v<std::decay_t<U>, T>>>
  StatusOr(U&& value) : value_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& { Check(); return *value_; }
  T& value() & { Check(); return *value_; }
  T&& value() && { Check(); return std::move(*value_); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void Check() const {
    if (!status_.ok()) {
      std::cerr << "StatusOr::value() on error: " << status_ << "\n";
      std::abort();
    }
  }
  Status status_;
  std::optional<T> value_;
};

}  // namespace lede

#endif  // LEDE_HAVE_ABSL
#endif  // LEDE_SHARED_STATUS_STATUS_H_
