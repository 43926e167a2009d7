// A lock for sections of a few hundred instructions on the data path (a queue pair's send
// state): one exchange to take, a plain store to give back, where std::mutex costs two atomic
// read-modify-writes and two library calls. A waiter yields, so a holder that is descheduled
// (or inside a system call, as Soft-RoCE's post is) does not starve it.
#pragma once

#include <atomic>
#include <thread>

namespace ferry::core {

class SpinLock {
 public:
  void lock() noexcept {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  bool try_lock() noexcept { return !held_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

}  // namespace ferry::core
