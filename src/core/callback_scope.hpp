// Where a call that waits for the engine's own progress must not wait: inside a completion or
// immediate callback, which runs on the thread that completes operations (a progress thread, or
// a caller polling in wait()). Waiting there for operations to end stalls the thread that would
// end them. Such calls refuse there (Region::deregister) or hand their waiting to a thread of
// their own (Engine::shutdown, a Region or Engine dropped there).
#pragma once

#include <functional>

namespace ferry::core {

// Marks the current thread as running a callback for its lifetime.
class CallbackScope {
 public:
  CallbackScope() noexcept { ++depth_; }
  ~CallbackScope() { --depth_; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

  // True while this thread runs a callback.
  static bool inside() noexcept { return depth_ > 0; }

 private:
  static thread_local int depth_;
};

// Runs `work` on a thread of its own. Threads still running when the process exits are joined
// then (an std::atexit handler, with any they start meanwhile), so what they finish (an
// engine's shutdown, bounded by its own timeouts) is not cut off halfway. Throws
// std::system_error when no thread can be started.
void run_detached(std::function<void()> work);

}  // namespace ferry::core
