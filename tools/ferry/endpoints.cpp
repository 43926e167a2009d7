#include "endpoints.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace ferry::cli {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

std::atomic<bool> g_stop{false};

void on_stop_signal(int) { g_stop.store(true); }

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    throw std::runtime_error("unix:" + path + ": the path is longer than " +
                             std::to_string(sizeof a.sun_path - 1) + " bytes");
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

// Every address `a` names, for a socket of the given use.
addrinfo* resolve(const Address& a, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* list = nullptr;
  std::string port = std::to_string(a.port);
  if (int rc = ::getaddrinfo(a.host.c_str(), port.c_str(), &hints, &list); rc != 0) {
    throw std::runtime_error("getaddrinfo " + a.to_string() + ": " + ::gai_strerror(rc));
  }
  return list;
}

}  // namespace

OwnedFd& OwnedFd::operator=(OwnedFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

OwnedFd::~OwnedFd() {
  if (fd_ >= 0) ::close(fd_);
}

int OwnedFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

std::string Endpoint::to_string() const {
  switch (kind) {
    case Kind::kTcp:
      return "tcp:" + address.to_string();
    case Kind::kUnix:
      return "unix:" + path;
    case Kind::kFile:
      return "file:" + path;
    case Kind::kStdio:
      return "-";
    case Kind::kGenerator:
      return "gen";
    case Kind::kDiscard:
      return "discard";
  }
  return "?";
}

Endpoint endpoint_value(const std::string& flag, const std::string& text, Role role) {
  Endpoint e;
  const std::string what = role == Role::kSource ? "a source"
                           : role == Role::kSink ? "a sink"
                                                 : "a listening endpoint";
  auto starts = [&](const char* prefix) { return text.rfind(prefix, 0) == 0; };
  if (starts("tcp:")) {
    e.kind = Endpoint::Kind::kTcp;
    e.address = address_value(flag, text.substr(4), role == Role::kListen);
  } else if (starts("unix:")) {
    e.kind = Endpoint::Kind::kUnix;
    e.path = text.substr(5);
    if (e.path.empty()) throw CLI::ValidationError(flag, "'unix:' names no socket path");
  } else if (role == Role::kListen) {
    throw CLI::ValidationError(
        flag, "'" + text + "' is not " + what + " (use tcp:HOST:PORT or unix:PATH)");
  } else if (text == "-") {
    e.kind = Endpoint::Kind::kStdio;
  } else if (text == "gen" && role == Role::kSource) {
    e.kind = Endpoint::Kind::kGenerator;
  } else if (text == "discard" && role == Role::kSink) {
    e.kind = Endpoint::Kind::kDiscard;
  } else {
    e.kind = Endpoint::Kind::kFile;
    e.path = starts("file:") ? text.substr(5) : text;
    if (e.path.empty()) {
      throw CLI::ValidationError(flag, "'" + text + "' is not " + what +
                                           " (use tcp:HOST:PORT, unix:PATH, a file, -" +
                                           (role == Role::kSource ? ", or gen)" : ", or discard)"));
    }
  }
  return e;
}

OwnedFd open_endpoint(const Endpoint& e, bool for_writing) {
  switch (e.kind) {
    case Endpoint::Kind::kStdio:
      return OwnedFd(::dup(for_writing ? STDOUT_FILENO : STDIN_FILENO));
    case Endpoint::Kind::kFile: {
      int flags = for_writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY;
      OwnedFd fd(::open(e.path.c_str(), flags | O_CLOEXEC, 0644));
      if (fd.get() < 0) fail("open " + e.path);
      return fd;
    }
    case Endpoint::Kind::kUnix: {
      sockaddr_un a = unix_address(e.path);
      OwnedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (fd.get() < 0) fail("socket");
      if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
        fail("connect " + e.to_string());
      return fd;
    }
    case Endpoint::Kind::kTcp: {
      addrinfo* list = resolve(e.address, false);
      int err = 0;
      for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
        OwnedFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (fd.get() >= 0 && ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) {
          ::freeaddrinfo(list);
          int one = 1;
          ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          return fd;
        }
        err = errno;
      }
      ::freeaddrinfo(list);
      errno = err;
      fail("connect " + e.to_string());
    }
    case Endpoint::Kind::kGenerator:
    case Endpoint::Kind::kDiscard:
      break;
  }
  throw std::logic_error("open_endpoint: " + e.to_string() + " has no file descriptor");
}

OwnedFd listen_endpoint(const Endpoint& e, Endpoint& bound) {
  bound = e;
  if (e.kind == Endpoint::Kind::kUnix) {
    sockaddr_un a = unix_address(e.path);
    OwnedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) fail("socket");
    ::unlink(e.path.c_str());  // a socket file left by an earlier run
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      fail("bind " + e.to_string());
    if (::listen(fd.get(), 1) != 0) fail("listen " + e.to_string());
    return fd;
  }
  addrinfo* list = resolve(e.address, true);
  int err = 0;
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    OwnedFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    int one = 1;
    if (fd.get() >= 0) ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd.get() >= 0 && ::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::listen(fd.get(), 1) == 0) {
      ::freeaddrinfo(list);
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
      bound.address.port =
          ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      return fd;
    }
    err = errno;
  }
  ::freeaddrinfo(list);
  errno = err;
  fail("listen " + e.to_string());
}

OwnedFd accept_one(int listener, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    pollfd p{listener, POLLIN, 0};
    int n = ::poll(&p, 1, 100);
    if (n < 0 && errno != EINTR) fail("poll");
    if (n <= 0) continue;
    OwnedFd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() >= 0) {
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one,
                   sizeof one);  // fails on unix: no matter
      return fd;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) fail("accept");
  }
  return OwnedFd();
}

uint64_t write_all(int fd, const uint8_t* data, std::size_t n, const std::atomic<bool>& stop) {
  uint64_t waited = 0;
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w > 0) {
      data += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN) fail("write");
    if (stop.load()) return waited;
    auto from = std::chrono::steady_clock::now();
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 100);
    waited += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now() - from)
                                        .count());
  }
  return waited;
}

const std::atomic<bool>& stop_on_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return g_stop;
}

}  // namespace ferry::cli
