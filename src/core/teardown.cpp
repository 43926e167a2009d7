#include "core/teardown.hpp"

#include <string>

#include "core/log.hpp"

namespace ferry::core {

void Teardown::post(std::string what, std::function<void()> step) {
  std::lock_guard lock(state_->mu);
  state_->steps.emplace_back(std::move(what), std::move(step));
  if (!thread_.joinable()) thread_ = std::thread([state = state_] { run(state); });
  state_->cv.notify_all();
}

std::size_t Teardown::pending() const {
  std::lock_guard lock(state_->mu);
  return state_->steps.size() + (state_->running.empty() ? 0 : 1);
}

void Teardown::run(const std::shared_ptr<State>& state) {
  std::unique_lock lock(state->mu);
  for (;;) {
    state->cv.wait(lock, [&] { return !state->steps.empty() || state->stopping; });
    if (state->steps.empty()) return;
    auto [what, step] = std::move(state->steps.front());
    state->steps.pop_front();
    state->running = what;
    lock.unlock();
    step();
    step = nullptr;  // what it owned goes here, off the lock
    lock.lock();
    state->running.clear();
    state->cv.notify_all();
  }
}

Teardown::~Teardown() {
  if (!thread_.joinable()) return;
  std::unique_lock lock(state_->mu);
  state_->stopping = true;
  state_->cv.notify_all();
  bool idle = state_->cv.wait_for(lock, kGrace,
                                  [&] { return state_->steps.empty() && state_->running.empty(); });
  if (idle) {
    lock.unlock();
    thread_.join();
    return;
  }
  log(LogLevel::kWarn, "teardown", [&] {
    return "'" + state_->running + "' has not returned after " + std::to_string(kGrace.count()) +
           " ms (the wire still holds its packets?); leaving it and " +
           std::to_string(state_->steps.size()) + " later teardown steps to a background thread";
  });
  lock.unlock();
  thread_.detach();
}

}  // namespace ferry::core
