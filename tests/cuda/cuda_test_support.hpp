// What the CUDA tests share: the driver (the stand-in in make test, the real one in
// make test-gpu), device memory that frees itself, and the peer process (peer_main.cpp).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/cuda.hpp"
#include "support/pair.hpp"
#include "support/target_process.hpp"

namespace ferry::test {

namespace cuda = core::cuda;

// The driver, with device 0's primary context current on the calling thread.
inline const cuda::Driver& driver() {
  std::string why;
  const cuda::Driver* d = cuda::Driver::get(&why);
  if (d == nullptr) ADD_FAILURE() << "no CUDA driver: " << why;
  if (d == nullptr) std::abort();
  cuda::use_device(*d, 0);
  return *d;
}

// Whether the driver is the stand-in (tests/support/cuda_standin), whose own choices (how many
// devices, which misuse it detects beyond what the real driver documents) some cases check.
inline bool standin() {
  auto inv = cuda::inventory();
  return !inv.gpus.empty() && inv.gpus[0].name.rfind("Ferry CUDA stand-in", 0) == 0;
}

// Makes no context current (driver() does): a test of calls without one uses it too.
inline std::string error_name(cuda::CUresult r) {
  const char* name = nullptr;
  if (const cuda::Driver* d = cuda::Driver::get()) d->get_error_name(r, &name);
  return name != nullptr ? name : std::to_string(r);
}

#define FERRY_CU_OK(call) ASSERT_EQ(ferry::test::error_name(call), "CUDA_SUCCESS")

// Device memory of a region, to and from the host, through the driver.
inline void put(const Region& r, const std::vector<uint8_t>& bytes, std::size_t offset = 0) {
  FERRY_CU_OK(driver().memcpy(reinterpret_cast<cuda::CUdeviceptr>(r.data()) + offset,
                              reinterpret_cast<cuda::CUdeviceptr>(bytes.data()), bytes.size()));
}
inline std::vector<uint8_t> get(const Region& r, std::size_t offset, std::size_t length) {
  std::vector<uint8_t> out(length);
  EXPECT_EQ(driver().memcpy(reinterpret_cast<cuda::CUdeviceptr>(out.data()),
                            reinterpret_cast<cuda::CUdeviceptr>(r.data()) + offset, length),
            cuda::kSuccess);
  return out;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    EXPECT_EQ(driver().mem_alloc(&ptr_, n), cuda::kSuccess);
  }
  ~DeviceBuffer() {
    if (ptr_ != 0) driver().mem_free(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  cuda::CUdeviceptr get() const { return ptr_; }
  void* pointer() const { return reinterpret_cast<void*>(ptr_); }
  std::size_t size() const { return n_; }
  // Frees now (a test of what a freed allocation does).
  void free() {
    EXPECT_EQ(driver().mem_free(ptr_), cuda::kSuccess);
    ptr_ = 0;
  }
  void fill(const std::vector<uint8_t>& bytes, std::size_t offset = 0) const {
    EXPECT_EQ(driver().memcpy(ptr_ + offset, reinterpret_cast<cuda::CUdeviceptr>(bytes.data()),
                              bytes.size()),
              cuda::kSuccess);
  }
  std::vector<uint8_t> read(std::size_t offset, std::size_t length) const {
    std::vector<uint8_t> out(length);
    EXPECT_EQ(
        driver().memcpy(reinterpret_cast<cuda::CUdeviceptr>(out.data()), ptr_ + offset, length),
        cuda::kSuccess);
    return out;
  }

 private:
  cuda::CUdeviceptr ptr_ = 0;
  std::size_t n_;
};

inline std::vector<uint8_t> pattern(std::size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  fill_pattern(v, seed);
  return v;
}

// Posts `count` operations of `t`, writes and reads in turn, then closes the peer (or shuts
// the initiator down) while they run: each ends, done, cancelled or failed with its peer.
inline void post_then_end(Pair& p, const Transfer& t, int count, bool shutdown) {
  std::vector<Future> posted;
  for (int i = 0; i < count; ++i)
    posted.push_back(i % 2 == 0 ? p.peer.write({&t, 1}) : p.peer.read({&t, 1}));
  if (shutdown) {
    p.initiator.shutdown();
  } else {
    p.peer.close();
  }
  for (Future& f : posted) {
    Status s = f.wait(kWait);
    EXPECT_TRUE(s.ok() || s.code() == ErrorCode::kCancelled || s.code() == ErrorCode::kPeerLost)
        << s.to_string();
  }
}

inline std::string hex(const void* data, std::size_t n) {
  std::string out;
  const auto* p = static_cast<const uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", p[i]);
    out += b;
  }
  return out;
}

struct PeerResult {
  int status = -1;
  std::string output;
};

// Runs the peer process to its end.
inline PeerResult run_peer(const std::string& args) {
  PeerResult r;
  FILE* p = popen((std::string(FERRY_CUDA_PEER_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  std::size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  while (!r.output.empty() && r.output.back() == '\n') r.output.pop_back();
  return r;
}

// The peer holding a handle open until release() (or destruction).
class HeldPeer {
 public:
  explicit HeldPeer(const std::string& handle_hex) {
    std::string path = FERRY_CUDA_PEER_PATH;
    std::string verb = "open";
    std::string h = handle_hex;
    char* argv[] = {path.data(), verb.data(), h.data(), nullptr};
    PipedChild child = spawn_piped(path.c_str(), argv);
    pid_ = child.pid;
    stdin_ = child.to_stdin;
    char buf[64] = {};
    ssize_t n = ::read(child.from_stdout, buf, sizeof buf - 1);
    close(child.from_stdout);
    first_line_ = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
  }
  ~HeldPeer() { release(); }
  HeldPeer(const HeldPeer&) = delete;
  HeldPeer& operator=(const HeldPeer&) = delete;
  bool opened() const { return first_line_.rfind("opened", 0) == 0; }
  const std::string& said() const { return first_line_; }
  // Lets the peer close its mapping and exit; its exit status.
  int release() {
    if (pid_ <= 0) return -1;
    close(stdin_);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  std::string first_line_;
};

}  // namespace ferry::test
