// Steps that may block in the kernel for as long as a fault lasts, run off the threads that
// serve peers. Destroying a verbs queue pair waits until the network device gave back every
// packet that holds it: on a lossless wire whose far end froze, Soft-RoCE (Linux 6.1.129+) waits
// up to 50 s per queue pair. A progress thread doing that would stall every other peer of the
// engine (docs/architecture.md, "Closing a verbs peer").
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ferry::core {

class Teardown {
 public:
  // How long the destructor waits for steps still queued or running. A healthy wire gives a
  // queue pair back in well under a millisecond (rxe, measured by tests/rdma/two-guest.py).
  static constexpr std::chrono::milliseconds kGrace{1000};

  Teardown() = default;
  // Waits up to kGrace for the queued steps. One that has not returned by then is left to the
  // thread (detached), which runs it and those after it whenever the kernel returns, so the
  // steps must own what they touch; a warning in the log names it.
  ~Teardown();
  Teardown(const Teardown&) = delete;
  Teardown& operator=(const Teardown&) = delete;

  // Queues `step` (`what` names it in the warning); steps run one at a time, in order, on a
  // thread started by the first.
  void post(std::string what, std::function<void()> step);
  // Steps queued or running.
  std::size_t pending() const;

 private:
  struct State {
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<std::string, std::function<void()>>> steps;
    std::string running;  // empty while idle
    bool stopping = false;
  };
  static void run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace ferry::core
