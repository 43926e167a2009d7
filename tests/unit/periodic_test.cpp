// core::Periodic: runs again and again until stopped, and stop() does not wait out a period.
#include "core/periodic.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ferry::core {
namespace {

TEST(Periodic, RunsUntilStoppedAndNeverAfter) {
  std::atomic<int> runs{0};
  Periodic p(std::chrono::milliseconds(1), [&] { runs.fetch_add(1); });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (runs.load() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(runs.load(), 3);
  p.stop();
  int stopped_at = runs.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(runs.load(), stopped_at) << "a run after stop()";
  p.stop();  // idempotent
}

TEST(Periodic, StopWakesTheThreadInsteadOfWaitingOutTheNextPeriod) {
  std::atomic<int> runs{0};
  auto started = std::chrono::steady_clock::now();
  {
    Periodic p(std::chrono::hours(1), [&] { runs.fetch_add(1); });
  }  // destroyed: stop() must not wait an hour
  EXPECT_EQ(runs.load(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::minutes(10));
}

}  // namespace
}  // namespace ferry::core
