// Threads that split one large copy into parts copied at once: at 64 MiB two process_vm_readv
// streams move more than one, and two memcpy threads more than one (docs/performance.md,
// "Settings and the measurements behind them"), as each part's page walk and copy runs on its
// own core. The caller copies one part itself and waits for the rest; a part no helper took yet
// it takes back, so a busy pool never makes it wait behind other channels' copies. Helpers start
// on first use and sleep when idle, after a short spin (kCopySpin).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::transport::shm {

// The least a part holds: below it, waking a helper costs more than it saves. With parts from
// 256 KiB, 512 KiB reads (two parts) were slower than unsplit ones, one at a time and 8 in
// flight (docs/performance-history.md, "Real bytes on both sides, and mid-size writes through
// the rings"). From 512 KiB (1 MiB pulls in two parts), once helpers spin between parts (kCopySpin)
// and large ops' waiters yield (OpPool::kYieldingSpinFrom), 1 MiB reads one at a time and 1 MiB
// writes 8 in flight were faster (docs/performance.md, "Each transfer the faster way"). memcpy
// is several times faster than a process_vm_readv stream, and a split slowed 1 MiB mapped
// writes, so memcpy splits only from 8 MiB up, where split copies beat one memcpy thread
// (docs/performance-history.md, "Mapped regions, copy threads, and the comparison with memcpy
// and UCX").
constexpr std::size_t kMinPartBytes = 512 << 10;
constexpr std::size_t kMinMemcpyPartBytes = 4 << 20;
// The most helpers an engine may ask for (ShmConfig::copy_threads).
constexpr int kMaxCopyThreads = 16;
// How long a helper that finished a part spins for the next before sleeping, and a caller that
// finished its own part spins for the helpers' before sleeping. A large pull's records come one
// after the other, each split anew, and waking a sleeping thread twice a record cost a visible
// share of the record's copy. With the spin, 64 MiB writes one at a time moved more; reads,
// mapped 64 MiB copies and 1 MiB x8 writes did not change (docs/performance-history.md, "Copy
// threads spin between a pull's records, and the host's ceiling"). The spin costs a helper at
// most this much CPU after each part of at least 1 MiB, which takes longer than that to copy.
constexpr std::chrono::microseconds kCopySpin{50};

// One process_vm_readv of `n` pieces from `pid`, pairwise of equal lengths, `total` bytes.
Status pull_once(pid_t pid, const iovec* local, const iovec* remote, std::size_t n, uint64_t total);

class CopyPool {
 public:
  // How a helper thread starts: std::thread, or in tests one that fails as the system can.
  using StartThread = std::thread (*)(std::function<void()> body);
  static std::thread start_thread(std::function<void()> body) {
    return std::thread(std::move(body));
  }

  explicit CopyPool(int helpers, StartThread start = start_thread)
      : helpers_(helpers), start_(start) {}
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  // pull_once, split into up to (helpers that started) + 1 parts of at least kMinPartBytes. Any
  // thread; the first failure is returned (a failed part's bytes are not all there).
  Status pull(pid_t pid, const iovec* local, const iovec* remote, std::size_t n, uint64_t total);
  // memcpy of `n` bytes within this process (a mapped region), split the same way.
  void copy(void* dst, const void* src, std::size_t n);

 private:
  // The most pieces one part holds: a whole request (256) plus the cut ones.
  static constexpr std::size_t kMaxPieces = 256 + kMaxCopyThreads + 1;
  struct Call;
  struct Part {
    Call* call = nullptr;  // null: a free slot
    bool taken = false;    // a thread copies it
    pid_t pid = 0;         // 0: memcpy within this process
    std::size_t n = 0;
    uint64_t bytes = 0;
    std::array<iovec, kMaxPieces> local{};
    std::array<iovec, kMaxPieces> remote{};
  };
  struct Call {
    std::atomic<int> left{0};  // parts not finished, changed under mu_ (spinners read it)
    Status failed;
  };
  Status split(pid_t pid, const iovec* local, const iovec* remote, std::size_t n, uint64_t total,
               std::size_t min_part);
  // Never throws: a helper's exception would end the process, and a caller's would leave its
  // other parts pointing at a Call gone from its stack.
  static Status run_part(const Part& part) noexcept;
  void start_locked();
  void run();
  void copy(Part& part);  // then marks it done and frees the slot

  const int helpers_;
  const StartThread start_;
  std::mutex mu_;
  std::condition_variable work_;  // helpers: a part was queued, or stop
  std::condition_variable done_;  // callers: a part finished
  std::vector<Part> parts_;       // slots, sized on start: helpers that started x 2
  std::atomic<int> untaken_{0};   // parts queued that no thread took yet, changed under mu_
  bool started_ = false;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ferry::transport::shm
