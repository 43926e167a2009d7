// Vocabulary types shared by every layer: error codes, Status and the Error exception.
// This header depends on nothing in Ferry, so core utilities and transports may use it too.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "ferry/export.hpp"

namespace ferry {

enum class ErrorCode : uint16_t {
  kOk = 0,
  kInProgress,         // the operation has not completed yet
  kInvalidArgument,    // a malformed call: null pointer, zero-length region, bad address
  kOutOfBounds,        // offset + length beyond a region
  kPermissionDenied,   // the region does not grant the requested remote access
  kUnknownRegion,      // no region with that id at the target
  kRevoked,            // the region was deregistered
  kWrongKey,           // the key does not match the region
  kStaleIncarnation,   // the descriptor belongs to an earlier incarnation of the peer
  kWrongPeer,          // the descriptor belongs to another engine than this peer
  kPeerLost,           // the peer died or disconnected
  kTimeout,            // a wait or a connection attempt ran out of time
  kCancelled,          // the engine shut down while the operation was in flight
  kProtocol,           // a malformed or unexpected frame
  kVersionMismatch,    // the peer speaks another protocol version
  kAuthFailed,         // shared-secret authentication failed
  kTruncated,          // a message was larger than the receive buffer
  kResourceExhausted,  // a configured limit was reached
  kConnectFailed,      // the peer could not be reached
  kSystem,             // a system call failed
  kUnsupported,        // the transport or feature is not available
  kNotFound,           // no entry under that name in the directory (Config::etcd)
  kAlreadyExists,      // the name is held by another engine
};
// The last code: frames carrying a larger one are malformed.
inline constexpr ErrorCode kLastErrorCode = ErrorCode::kAlreadyExists;

// Stable lower-case name of a code ("out_of_bounds").
FERRY_API const char* to_string(ErrorCode code) noexcept;

// The outcome of a call: a code and, for failures, a message naming the failed call.
class FERRY_API Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const noexcept { return code_ == ErrorCode::kOk; }
  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "out_of_bounds: write: remote offset 4096 + 8 exceeds region length 4096"
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// Thrown by set-up calls (engine creation, registration, connect). Data-path calls never
// throw: their failures arrive in the Future's Status.
class FERRY_API Error : public std::runtime_error {
 public:
  explicit Error(Status status)
      : std::runtime_error(status.to_string()), status_(std::move(status)) {}
  Error(ErrorCode code, std::string message) : Error(Status(code, std::move(message))) {}
  ErrorCode code() const noexcept { return status_.code(); }
  const Status& status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace ferry
