// How a channel closes, kept one way by every transport (Channel::close, closed, quiesced): it
// begins closing once, the first reason standing, and when nothing of it touches user memory
// any more it reports that once, through the `on_closed` the engine gave it.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <utility>

#include "ferry/error.hpp"

namespace ferry::transport {

class CloseLatch {
 public:
  explicit CloseLatch(std::function<void(const Status&)> on_closed)
      : on_closed_(std::move(on_closed)) {}
  CloseLatch(const CloseLatch&) = delete;
  CloseLatch& operator=(const CloseLatch&) = delete;

  // Begins closing with `reason`, unless it already has (the first reason stands): then false.
  // `then` runs under the latch's lock when this call begins it, so that a set-up step taken
  // under lock() (attaching a stream, entering the reactor) sees the close or is seen by it.
  template <typename Then>
  bool begin(const Status& reason, Then&& then) {
    std::lock_guard guard(mu_);
    if (closing_.exchange(true)) return false;
    reason_ = reason;
    std::forward<Then>(then)();
    return true;
  }
  bool begin(const Status& reason) {
    return begin(reason, [] {});
  }
  bool closing() const { return closing_.load(); }
  // Closed, and on_closed has run (or is running): nothing of the channel runs any more.
  bool quiesced() const { return quiesced_.load(); }
  // Why it closed (empty until it began).
  Status reason() {
    std::lock_guard guard(mu_);
    return reason_;
  }
  // The lock begin() holds, for the set-up steps that must not race a close.
  std::mutex& lock() { return mu_; }

  // Nothing of the channel touches user memory any more: runs on_closed with the reason, once.
  // False when it had already run.
  bool report() {
    if (quiesced_.exchange(true)) return false;
    if (on_closed_) on_closed_(reason());
    return true;
  }

 private:
  std::mutex mu_;
  std::atomic<bool> closing_{false};
  std::atomic<bool> quiesced_{false};
  Status reason_;
  std::function<void(const Status&)> on_closed_;
};

}  // namespace ferry::transport
