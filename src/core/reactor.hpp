// Progress threads: each runs an epoll loop over the file descriptors assigned to it, plus a
// queue of tasks posted from other threads. After doing work a loop busy-polls for a while
// before sleeping in epoll_wait, so back-to-back small operations avoid a thread wake-up;
// while it does, it also polls its pollers (shared-memory rings), which then need no wake-up.
// A poller with a transfer streaming through it asks the loop to keep polling (keep_polling).
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

// Whether a loop polls for the next request after serving one (Reactor::poll_for_requests):
// yes while requests come within the window; no once kMisses windows in a row ended before
// their next request (requests further apart: a ping-pong whose peer answers later, sparse
// traffic), where polling only takes CPU from the threads with work; then one request in
// kRetry tries again. Ping-pong over TCP on a 2-core VM, both applications spinning too, took
// 25-30 us p50 without polling, 50-62 us polling after every request, 29-41 us with these
// (docs/performance.md, "Small operations and wake-ups"). Any thread; relaxed atomics: racing
// callers may miscount a window, which only delays the switch.
class RequestPolling {
 public:
  static constexpr int kMisses = 16;
  static constexpr int kRetry = 16;
  // A request was served at `now_ns`: true when the loop should poll until now_ns + period_ns.
  bool start(int64_t now_ns, int64_t period_ns);

 private:
  std::atomic<int64_t> until_{0};  // the end of the last window (0: none)
  std::atomic<int> misses_{0};     // windows in a row that ended before the next request
  std::atomic<int> skipped_{0};    // requests served without polling since
};

class Reactor {
 public:
  class Handler {
   public:
    virtual void on_event(uint32_t epoll_events) = 0;

   protected:
    ~Handler() = default;
  };

  // Work found without a file descriptor: polled while the loop busy-polls or keeps polling.
  class Poller {
   public:
    // The loop starts polling: whatever feeds the poller need not wake the loop meanwhile.
    virtual void begin_polling() = 0;
    // Handles what is ready without blocking; true when there was something.
    virtual bool poll() = 0;
    // The loop is about to sleep: what arrives from now on (or arrived unseen) must wake it
    // through a file descriptor.
    virtual void end_polling() = 0;

   protected:
    ~Poller() = default;
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
  // On the loop's thread (or once the reactor stopped): polled while the loop busy-polls.
  // Removal ends its polling if the loop was polling.
  void add_poller(int loop, Poller* poller);
  void remove_poller(int loop, Poller* poller);
  // Any thread: a transfer streams through one of the loop's pollers, so the loop keeps
  // polling for at least `period` from now before it sleeps, whatever busy_poll. A sleeping
  // loop takes it up when next woken.
  void keep_polling(int loop, std::chrono::nanoseconds period);
  // Any thread: a request was served; keep polling for `period` for the next one while
  // RequestPolling says so. 0 does nothing.
  void poll_for_requests(int loop, std::chrono::nanoseconds period);
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
    std::vector<Poller*> pollers;                // touched only by the loop's thread
    bool polling = false;                        // between begin_ and end_polling
    std::atomic<int64_t> polling_until{0};       // keep_polling's, steady clock nanoseconds
    RequestPolling request_polling;
    std::thread thread;
    std::thread::id id;
  };
  void run(Loop& loop);
  void set_polling(Loop& loop, bool on);

  std::vector<std::unique_ptr<Loop>> loops_;
  std::chrono::nanoseconds busy_poll_;
  std::atomic<bool> stopping_{false};
  std::atomic<unsigned> next_{0};
};

}  // namespace ferry::core
