// The right to poll one channel (its ring, its completion queues), held by one thread at a
// time. A completion callback run inside a poll may poll other channels (a nested wait, a
// next_imm spin over several peers), so each thread keeps the rights it holds as a chain: a
// channel can tell whether this thread holds its right however deeply it is nested, and an
// inner right's release gives the outer ones back.
#pragma once

#include <atomic>
#include <thread>

namespace ferry::core {

class PollingRight {
 public:
  bool try_lock() {
    if (held_.exchange(true, std::memory_order_acquire)) return false;
    outer_ = innermost_;
    innermost_ = this;
    return true;
  }
  void lock() {
    while (!try_lock()) std::this_thread::yield();  // a holder's poll is short
  }
  void unlock() {
    if (innermost_ == this) {
      innermost_ = outer_;
    } else {  // released out of order: take it out of the chain where it is
      for (PollingRight* r = innermost_; r != nullptr; r = r->outer_) {
        if (r->outer_ == this) {
          r->outer_ = outer_;
          break;
        }
      }
    }
    held_.store(false, std::memory_order_release);
  }
  // Whether this thread holds it, at any depth.
  bool held_here() const {
    for (const PollingRight* r = innermost_; r != nullptr; r = r->outer_) {
      if (r == this) return true;
    }
    return false;
  }

 private:
  std::atomic<bool> held_{false};
  PollingRight* outer_ = nullptr;  // the right this thread held before; its holder's alone
  static inline thread_local PollingRight* innermost_ = nullptr;
};

}  // namespace ferry::core
