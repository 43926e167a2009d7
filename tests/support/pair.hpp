// Two engines in one process connected over loopback, with registered buffers on each side.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::test {

using namespace std::chrono_literals;
constexpr Duration kWait = 20s;  // generous: sanitizer builds on 2 cores are slow

inline Config test_config() {
  Config c;
  c.listen_host = "127.0.0.1";
  // A verbs connect of 20 queue pairs under TSan in the emulated guest, beside two CPU hogs
  // (make test-loaded), took over 5 s, and that test's first write then failed once; tests
  // that want a connect to time out, or a silent peer found, set their own.
  c.peer_timeout = 10s;
  c.connect_timeout = kWait;
  c.busy_poll = 0us;  // sanitizer runs share 2 cores; spinning only slows them down
  c.wait_spin = 0us;
  // A FERRY_TRANSPORTS or FERRY_TCP_STREAMS set in the shell running the tests changes none of
  // them.
  c.transports_from_environment = false;
  c.settings_from_environment = false;
  // The network transports, which most tests were written for: engines of one test process
  // would otherwise meet over the same-host transport, which its own cases cover (the
  // conformance suite, multiprocess_test.cpp) and which a test names where it wants it.
  c.transports = {TransportKind::kVerbs, TransportKind::kTcp};
  return c;
}

// File descriptors this process holds now.
inline int open_descriptors() {
  int n = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (::readdir(dir) != nullptr) ++n;
  ::closedir(dir);
  return n;
}

// A process's mappings of engines' memory files (Engine::allocate), and how many are writable.
struct MemoryFiles {
  int all = 0;
  int writable = 0;
};
inline MemoryFiles memory_files(pid_t pid = ::getpid()) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  MemoryFiles n;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:ferry-region") == std::string::npos) continue;
    ++n.all;
    n.writable += line.find(" rw") != std::string::npos;
  }
  return n;
}

// Sets an environment variable for the scope (for the process: tests that use it start no
// engine in another thread meanwhile).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A path of the test's own under the temporary directory, removed with the scope (as a file).
class ScratchPath {
 public:
  explicit ScratchPath(const std::string& name)
      : path_(::testing::TempDir() + "ferry-" + std::to_string(::getpid()) + "-" + name) {
    ::unlink(path_.c_str());
  }
  ~ScratchPath() { ::unlink(path_.c_str()); }
  ScratchPath(const ScratchPath&) = delete;
  ScratchPath& operator=(const ScratchPath&) = delete;
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

// Pseudo-random bytes, four at a time (sanitizer builds make byte loops slow).
inline void fill_pattern(uint8_t* p, std::size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    std::memcpy(p + i, &x, 4);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(x >> (8 * (i % 4)));
}
inline void fill_pattern(std::vector<uint8_t>& v, uint32_t seed) {
  fill_pattern(v.data(), v.size(), seed);
}

// A patterned buffer registered with an engine.
struct Buffer {
  Buffer(Engine& e, std::size_t n, Access access, uint32_t seed) : bytes(n) {
    fill_pattern(bytes, seed);
    region = e.register_memory(bytes.data(), n, access);
  }
  std::vector<uint8_t> bytes;
  Region region;
};

struct Pair {
  explicit Pair(Config target_config = test_config(), Config initiator_config = test_config())
      : target(target_config), initiator(initiator_config) {
    peer = initiator.connect(target.address());
    auto accepted = target.accept(kWait);
    if (!accepted) throw Error(ErrorCode::kTimeout, "target did not accept");
    target_peer = *accepted;
  }
  Engine target;
  Engine initiator;
  Peer peer;         // initiator -> target
  Peer target_peer;  // target -> initiator
};

}  // namespace ferry::test
