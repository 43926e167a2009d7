// Sockets: address parsing, listening, connecting with a deadline, blocking I/O with a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::core {

using Deadline = std::chrono::steady_clock::time_point;

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;
};

// Accepts "host:port", "[v6addr]:port" and ":port" (any host).
Status parse_host_port(std::string_view text, HostPort& out);

// The hosts a peer can connect to when we listen on `listen_host`: itself, or for a wildcard
// ("", "0.0.0.0", "::") the address of every interface that is up (IPv6 ones only for "::";
// no link-local ones, which need a scope), other hosts' reach first and loopback last.
std::vector<std::string> reachable_hosts(const std::string& listen_host);

Status listen_tcp(const HostPort& where, Fd& out, uint16_t& bound_port);
// A blocking connection once connected. One of `wake` (descriptors, -1 ignored) becoming
// readable ends the wait for the connection with kCancelled.
Status connect_tcp(const HostPort& where, Deadline deadline, Fd& out,
                   std::span<const int> wake = {});
// Starts a non-blocking connect to the address and port the connected socket `like` reaches
// (whatever name resolved to it): `out` is non-blocking, and finish_connect() says how it ended
// once it polls writable.
Status start_connect_like(int like, Fd& out);
Status finish_connect(int fd, const std::string& where);
Status set_nonblocking(int fd, bool on);
// TCP_NODELAY, keepalive probes and TCP_USER_TIMEOUT so a silent peer is noticed in `timeout`.
void tune_socket(int fd, std::chrono::nanoseconds timeout);
// The remote end of a connected socket ("?" when it has none).
HostPort peer_host_port(int fd);

// Blocking transfers that give up at `deadline` (kTimeout) or on EOF (kPeerLost).
Status write_all(int fd, std::span<const uint8_t> data, Deadline deadline);
Status read_all(int fd, std::span<uint8_t> data, Deadline deadline);
// What arrives first, up to data.size() bytes: `got` 0 at EOF. One of `wake` becoming readable
// ends the wait with kCancelled.
Status read_some(int fd, std::span<uint8_t> data, Deadline deadline, std::size_t& got,
                 std::span<const int> wake = {});

}  // namespace ferry::core
