// A function run every period on a thread of its own: a timer that nothing else can delay (the
// engine's liveness checks run on one, apart from the listener, whom a flood of connections
// keeps busy).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace ferry::core {

class Periodic {
 public:
  // Starts the thread; the first run is one `period` from now.
  Periodic(std::chrono::steady_clock::duration period, std::function<void()> run);
  // stop().
  ~Periodic();
  Periodic(const Periodic&) = delete;
  Periodic& operator=(const Periodic&) = delete;

  // Wakes the thread at once, waits for a run under way, and joins. Idempotent; never from a
  // run (the engine stops its liveness timer in shutdown(), on the caller's thread).
  void stop();

 private:
  void loop();

  const std::chrono::steady_clock::duration period_;
  const std::function<void()> run_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // under mu_
  std::thread thread_;
};

}  // namespace ferry::core
