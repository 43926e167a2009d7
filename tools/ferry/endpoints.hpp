// Where the bytes of `ferry emulate` and `ferry stream` come from and go: sockets, files,
// standard input and output, the built-in generator, nowhere.
#pragma once

#include <atomic>
#include <string>

#include "options.hpp"

namespace ferry::cli {

struct Endpoint {
  enum class Kind { kTcp, kUnix, kFile, kStdio, kGenerator, kDiscard };
  Kind kind = Kind::kStdio;
  Address address;                // kTcp
  std::string path;               // kUnix, kFile
  std::string to_string() const;  // as endpoint_value reads it
};

// "tcp:HOST:PORT", "unix:PATH", "file:PATH" or a bare path, "-" (standard input or output);
// sources also take "gen", sinks "discard". A listening endpoint is tcp or unix and may take
// port 0. Throws CLI::ValidationError naming `flag`.
enum class Role { kSource, kSink, kListen };
Endpoint endpoint_value(const std::string& flag, const std::string& text, Role role);

// A file descriptor that closes itself.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& o) noexcept : fd_(o.release()) {}
  OwnedFd& operator=(OwnedFd&& o) noexcept;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd();
  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// Connects to a socket or opens a file (a sink's is created or truncated); standard input or
// output for "-". Throws std::runtime_error naming the call: "connect tcp:127.0.0.1:9000:
// Connection refused".
OwnedFd open_endpoint(const Endpoint& e, bool for_writing);
// Listens on a tcp or unix endpoint; `bound` is the address taken (port 0: the real one).
OwnedFd listen_endpoint(const Endpoint& e, Endpoint& bound);
// The first connection to `listener`, or an invalid OwnedFd once `stop` is set.
OwnedFd accept_one(int listener, const std::atomic<bool>& stop);

// Writes all of `n` bytes, waiting while the reader is slow; returns the nanoseconds it waited
// for room, or throws std::runtime_error ("write: Broken pipe") when the reader went away.
uint64_t write_all(int fd, const uint8_t* data, std::size_t n, const std::atomic<bool>& stop);

// SIGINT and SIGTERM set the returned flag instead of ending the process; SIGPIPE is ignored
// (a reader that went away shows as an error of the write).
const std::atomic<bool>& stop_on_signals();

}  // namespace ferry::cli
