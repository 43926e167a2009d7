#include "engine/handshake_io.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "core/sys.hpp"

namespace ferry::detail {

namespace {
// Bytes read per recv(): a control frame body is at most core::kMaxControlPayload.
constexpr std::size_t kReadChunk = 1024;
}  // namespace

Status HandshakeIo::read(bool& progressed, core::FrameHeader& header, std::vector<uint8_t>& frame) {
  progressed = false;
  frame.clear();
  std::size_t want = core::kFrameHeaderSize;
  if (in_.size() >= core::kFrameHeaderSize) {
    if (Status s = core::decode_header(in_.data(), header); !s.ok()) return s;
    want += header.length;
  }
  if (in_.size() < want) {
    uint8_t chunk[kReadChunk];
    std::size_t ask = std::min(want - in_.size(), sizeof chunk);
    ssize_t n = ::recv(sock_, chunk, ask, MSG_DONTWAIT);
    if (n == 0) return {ErrorCode::kPeerLost, "connection closed during the handshake"};
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return {};
      return core::sys_status("recv during the handshake", errno, ErrorCode::kPeerLost);
    }
    in_.insert(in_.end(), chunk, chunk + n);
    progressed = true;
    if (in_.size() == core::kFrameHeaderSize) {
      if (Status s = core::decode_header(in_.data(), header); !s.ok()) return s;
      if (!core::is_control(header.type)) {
        return {ErrorCode::kProtocol, "expected a control frame, got type " +
                                          std::to_string(static_cast<int>(header.type))};
      }
      want += header.length;
    }
    if (in_.size() < want) return {};
  }
  frame = std::move(in_);
  in_.clear();
  return {};
}

Status HandshakeIo::queue(std::span<const uint8_t> frame) {
  out_.insert(out_.end(), frame.begin(), frame.end());
  return flush();
}

Status HandshakeIo::flush() {
  while (done_ < out_.size()) {
    ssize_t n =
        ::send(sock_, out_.data() + done_, out_.size() - done_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return core::sys_status("send during the handshake", errno, ErrorCode::kPeerLost);
      }
      break;
    }
    done_ += static_cast<std::size_t>(n);
  }
  if (done_ == out_.size()) {
    out_.clear();
    done_ = 0;
  }
  return {};
}

}  // namespace ferry::detail
