#include "core/net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <limits>
#include <memory>
#include <vector>

#include "core/sys.hpp"

namespace ferry::core {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string HostPort::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Status parse_host_port(std::string_view text, HostPort& out) {
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return {ErrorCode::kInvalidArgument,
              "bad address '" + std::string(text) + "': want [v6]:port"};
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return {ErrorCode::kInvalidArgument,
              "bad address '" + std::string(text) + "': want host:port"};
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || ptr != port.data() + port.size() || value > 65535) {
    return {ErrorCode::kInvalidArgument, "bad port in '" + std::string(text) + "'"};
  }
  out.host = host.empty() ? "0.0.0.0" : std::string(host);
  out.port = static_cast<uint16_t>(value);
  return {};
}

namespace {
struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Status resolve(const HostPort& where, bool passive, AddrInfoPtr& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string port = std::to_string(where.port);
  int rc = getaddrinfo(where.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return {ErrorCode::kConnectFailed, "getaddrinfo " + where.host + ": " + gai_strerror(rc)};
  }
  out.reset(res);
  return {};
}

int remaining_ms(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  // Deadline::max() waits for ever (poll's -1).
  if (left.count() > std::numeric_limits<int>::max()) return -1;
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// Also returns, kCancelled, once one of `wake` (descriptors; -1 ignored) is readable.
Status wait_fd(int fd, short events, Deadline deadline, const char* what,
               std::span<const int> wake = {}) {
  std::vector<pollfd> polled{{fd, events, 0}};
  for (int w : wake) polled.push_back({w, POLLIN, 0});
  for (;;) {
    int rc = ::poll(polled.data(), polled.size(), remaining_ms(deadline));
    for (std::size_t i = 1; rc > 0 && i < polled.size(); ++i) {
      if (polled[i].revents != 0) return {ErrorCode::kCancelled, std::string(what) + ": stopped"};
    }
    if (rc > 0) return {};
    if (rc == 0) return {ErrorCode::kTimeout, std::string(what) + ": timed out"};
    if (errno != EINTR) return sys_status("poll");
  }
}
}  // namespace

std::vector<std::string> reachable_hosts(const std::string& listen_host) {
  bool any_v4 = listen_host.empty() || listen_host == "0.0.0.0";
  bool any_v6 = listen_host == "::";
  if (!any_v4 && !any_v6) return {listen_host};
  std::vector<std::string> remote, loopback;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || !(a->ifa_flags & IFF_UP)) continue;
      int family = a->ifa_addr->sa_family;
      if (family != AF_INET && !(family == AF_INET6 && any_v6)) continue;
      if (family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr))
        continue;
      char host[NI_MAXHOST];
      socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      if (::getnameinfo(a->ifa_addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
        continue;
      ((a->ifa_flags & IFF_LOOPBACK) ? loopback : remote).emplace_back(host);
    }
    ::freeifaddrs(list);
  }
  if (loopback.empty()) loopback.emplace_back(any_v6 ? "::1" : "127.0.0.1");
  remote.insert(remote.end(), loopback.begin(), loopback.end());
  return remote;
}

Status listen_tcp(const HostPort& where, Fd& out, uint16_t& bound_port) {
  AddrInfoPtr ai;
  if (Status s = resolve(where, true, ai); !s.ok()) return s;
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return sys_status("socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    return sys_status("bind " + where.to_string());
  }
  if (::listen(fd.get(), 1024) != 0) return sys_status("listen");
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return sys_status("getsockname");
  }
  bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  out = std::move(fd);
  return {};
}

Status connect_tcp(const HostPort& where, Deadline deadline, Fd& out, std::span<const int> wake) {
  AddrInfoPtr ai;
  if (Status s = resolve(where, false, ai); !s.ok()) return s;
  Status last{ErrorCode::kConnectFailed, "connect " + where.to_string() + ": no address"};
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return sys_status("socket");
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = sys_status("connect " + where.to_string(), errno, ErrorCode::kConnectFailed);
        continue;
      }
      if (Status s = wait_fd(fd.get(), POLLOUT, deadline, "connect", wake); !s.ok()) return s;
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = sys_status("connect " + where.to_string(), err, ErrorCode::kConnectFailed);
        continue;
      }
    }
    if (Status s = set_nonblocking(fd.get(), false); !s.ok()) return s;
    out = std::move(fd);
    return {};
  }
  return last;
}

Status start_connect_like(int like, Fd& out) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(like, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return sys_status("getpeername", errno, ErrorCode::kPeerLost);
  }
  Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return sys_status("socket");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
    return sys_status("connect " + peer_host_port(like).to_string(), errno,
                      ErrorCode::kConnectFailed);
  }
  out = std::move(fd);
  return {};
}

Status finish_connect(int fd, const std::string& where) {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  return err == 0 ? Status() : sys_status("connect " + where, err, ErrorCode::kConnectFailed);
}

Status set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return sys_status("fcntl F_GETFL");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) != 0) return sys_status("fcntl F_SETFL");
  return {};
}

void tune_socket(int fd, std::chrono::nanoseconds timeout) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int secs = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
  if (secs < 3) secs = 3;
  int idle = secs / 3, interval = secs / 3 > 0 ? secs / 3 : 1, count = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  unsigned user_timeout_ms =
      static_cast<unsigned>(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

HostPort peer_host_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return {"?", 0};
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  }
  return HostPort{host, port};
}

Status write_all(int fd, std::span<const uint8_t> data, Deadline deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    if (Status s = wait_fd(fd, POLLOUT, deadline, "send"); !s.ok()) return s;
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return sys_status("send", errno, ErrorCode::kPeerLost);
    }
    done += static_cast<std::size_t>(n);
  }
  return {};
}

Status read_all(int fd, std::span<uint8_t> data, Deadline deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    if (Status s = wait_fd(fd, POLLIN, deadline, "recv"); !s.ok()) return s;
    ssize_t n = ::recv(fd, data.data() + done, data.size() - done, MSG_DONTWAIT);
    if (n == 0) return {ErrorCode::kPeerLost, "recv: connection closed by peer"};
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return sys_status("recv", errno, ErrorCode::kPeerLost);
    }
    done += static_cast<std::size_t>(n);
  }
  return {};
}

Status read_some(int fd, std::span<uint8_t> data, Deadline deadline, std::size_t& got,
                 std::span<const int> wake) {
  for (;;) {
    if (Status s = wait_fd(fd, POLLIN, deadline, "recv", wake); !s.ok()) return s;
    ssize_t n = ::recv(fd, data.data(), data.size(), MSG_DONTWAIT);
    if (n >= 0) {
      got = static_cast<std::size_t>(n);
      return {};
    }
    if (errno != EAGAIN && errno != EINTR) return sys_status("recv", errno, ErrorCode::kPeerLost);
  }
}

}  // namespace ferry::core
