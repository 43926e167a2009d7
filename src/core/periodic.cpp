#include "core/periodic.hpp"

#include <utility>

namespace ferry::core {

Periodic::Periodic(std::chrono::steady_clock::duration period, std::function<void()> run)
    : period_(period), run_(std::move(run)), thread_([this] { loop(); }) {}

Periodic::~Periodic() { stop(); }

void Periodic::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Periodic::loop() {
  auto next = std::chrono::steady_clock::now() + period_;
  std::unique_lock lock(mu_);
  while (!cv_.wait_until(lock, next, [this] { return stopping_; })) {
    lock.unlock();
    run_();
    lock.lock();
    // From the end of this run: a run that overran its period does not make the next one late
    // twice, nor run back to back.
    next = std::chrono::steady_clock::now() + period_;
  }
}

}  // namespace ferry::core
