#include <cerrno>
#include <charconv>
#include <cstring>

#include "core/sys.hpp"
#include "ferry/error.hpp"
#include "ferry/metrics.hpp"
#include "ferry/types.hpp"

namespace ferry {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInProgress:
      return "in_progress";
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kOutOfBounds:
      return "out_of_bounds";
    case ErrorCode::kPermissionDenied:
      return "permission_denied";
    case ErrorCode::kUnknownRegion:
      return "unknown_region";
    case ErrorCode::kRevoked:
      return "revoked";
    case ErrorCode::kWrongKey:
      return "wrong_key";
    case ErrorCode::kStaleIncarnation:
      return "stale_incarnation";
    case ErrorCode::kWrongPeer:
      return "wrong_peer";
    case ErrorCode::kPeerLost:
      return "peer_lost";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kProtocol:
      return "protocol";
    case ErrorCode::kVersionMismatch:
      return "version_mismatch";
    case ErrorCode::kAuthFailed:
      return "auth_failed";
    case ErrorCode::kTruncated:
      return "truncated";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kConnectFailed:
      return "connect_failed";
    case ErrorCode::kSystem:
      return "system";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kAlreadyExists:
      return "already_exists";
  }
  return "unknown";
}

std::string Status::to_string() const {
  std::string s = ferry::to_string(code_);
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

const char* to_string(OperationKind kind) noexcept {
  switch (kind) {
    case OperationKind::kWrite:
      return "write";
    case OperationKind::kRead:
      return "read";
    case OperationKind::kWriteWithImm:
      return "write_with_imm";
    case OperationKind::kSend:
      return "send";
    case OperationKind::kRecv:
      return "recv";
  }
  return "unknown";
}

std::string_view to_string(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

std::string to_string(const Memory& memory) {
  std::string out(to_string(memory.kind));
  if (memory.kind == MemoryKind::kCuda) out += ":" + std::to_string(memory.device);
  return out;
}

Memory parse_memory(std::string_view text) {
  if (text == "host") return Memory::host();
  if (text == "cuda") return Memory::cuda(0);
  constexpr std::string_view kCudaPrefix = "cuda:";
  if (text.starts_with(kCudaPrefix)) {
    std::string_view digits = text.substr(kCudaPrefix.size());
    int device = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), device);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() && device >= 0)
      return Memory::cuda(device);
  }
  throw Error(ErrorCode::kInvalidArgument,
              "memory '" + std::string(text) + "': expected host, cuda or cuda:N");
}

namespace core {

Status sys_status(std::string_view call, int err, ErrorCode code) {
  std::string msg(call);
  msg += ": ";
  msg += std::strerror(err);
  return {code, std::move(msg)};
}

Status sys_status(std::string_view call) { return sys_status(call, errno, ErrorCode::kSystem); }

}  // namespace core
}  // namespace ferry
