// Progress threads: each runs an epoll loop over the file descriptors assigned to it, plus a
// queue of tasks posted from other threads. After doing work a loop busy-polls for a while
// before sleeping in epoll_wait, so back-to-back small operations avoid a thread wake-up.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/net.hpp"
#include "ferry/error.hpp"

namespace ferry::core {

class Reactor {
 public:
  class Handler {
   public:
    virtual void on_event(uint32_t epoll_events) = 0;

   protected:
    ~Handler() = default;
  };

  Reactor(int threads, std::chrono::nanoseconds busy_poll);
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  // Joins the threads; tasks still queued are dropped. Idempotent.
  void stop();

  int loop_count() const { return static_cast<int>(loops_.size()); }
  // Spreads work: returns loops in turn.
  int pick_loop();
  bool on_loop_thread(int loop) const;

  Status add(int loop, int fd, uint32_t events, Handler* handler);
  Status modify(int loop, int fd, uint32_t events, Handler* handler);
  void remove(int loop, int fd);
  // Runs `task` on the loop's thread.
  void post(int loop, std::function<void()> task);
  // Called on the loop's thread after remove(): keeps `handler_owner` alive until the events
  // already fetched in this round have been dispatched, so none reaches a freed handler.
  void retire(int loop, std::shared_ptr<void> handler_owner);

 private:
  struct Loop {
    Fd epoll;
    Fd wake;  // eventfd
    std::mutex mu;
    std::vector<std::function<void()>> tasks;
    std::vector<std::shared_ptr<void>> retired;  // touched only by the loop's thread
    std::thread thread;
    std::thread::id id;
  };
  void run(Loop& loop);

  std::vector<std::unique_ptr<Loop>> loops_;
  std::chrono::nanoseconds busy_poll_;
  std::atomic<bool> stopping_{false};
  std::atomic<unsigned> next_{0};
};

}  // namespace ferry::core
