#include "transport/shm/shm_socket.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/sys.hpp"

namespace ferry::transport::shm {

Status send_with_files(int fd, std::span<const uint8_t> bytes, std::span<const int> files,
                       bool& full) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kControlSpaceFds * sizeof(int))];
  if (!files.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(files.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(files.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), files.data(), files.size() * sizeof(int));
  }
  full = false;
  ssize_t n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n == static_cast<ssize_t>(bytes.size())) return {};
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    full = true;
    return {};
  }
  if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
    return {ErrorCode::kPeerLost, "shm: the peer closed its socket"};
  }
  return core::sys_status("sendmsg (shm socket)");
}

Status receive_with_files(int fd, std::span<uint8_t> into, std::size_t& length, Files& files,
                          std::size_t& file_count) {
  iovec iov{into.data(), into.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(kControlSpaceFds * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);
  length = 0;
  file_count = 0;
  bool stray_control = false;
  for (cmsghdr* c = n >= 0 ? CMSG_FIRSTHDR(&msg) : nullptr; c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      stray_control = true;
      continue;
    }
    std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
      if (file_count < files.size()) {
        files[file_count++] = core::Fd(received);
      } else {
        ::close(received);
      }
    }
  }
  if (n == 0) return {ErrorCode::kPeerLost, "shm: the peer closed the connection"};
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    if (errno == ECONNRESET) return {ErrorCode::kPeerLost, "shm: the peer reset the connection"};
    return core::sys_status("recvmsg (shm socket)");
  }
  if (stray_control || (msg.msg_flags & MSG_CTRUNC) || static_cast<std::size_t>(n) > into.size()) {
    return {ErrorCode::kProtocol, "shm socket: a message of " + std::to_string(n) +
                                      " bytes or control data that does not belong"};
  }
  length = static_cast<std::size_t>(n);
  return {};
}

socklen_t abstract_address(const Nonce& name, sockaddr_un& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::memset(&out, 0, sizeof out);
  out.sun_family = AF_UNIX;
  std::string path = "ferry-shm-";
  for (uint8_t b : name) {
    path += kHex[b >> 4];
    path += kHex[b & 15];
  }
  std::memcpy(out.sun_path + 1, path.data(), path.size());  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
}

}  // namespace ferry::transport::shm
