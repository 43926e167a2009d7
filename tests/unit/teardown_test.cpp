// core::Teardown: steps run in order off the caller's thread, and a step stuck in the kernel
// (here: waiting on a latch) cannot hold the destructor longer than kGrace.
#include "core/teardown.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "support/log_capture.hpp"

namespace ferry::core {
namespace {

TEST(Teardown, RunsStepsInOrderOnAThreadOfItsOwn) {
  std::vector<int> order;
  std::thread::id ran_on;
  {
    Teardown t;
    for (int i = 0; i < 5; ++i)
      t.post("step " + std::to_string(i), [&order, i, &ran_on] {
        order.push_back(i);
        ran_on = std::this_thread::get_id();
      });
  }  // the destructor waits for them
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(Teardown, AStuckStepIsLeftToItsThreadAndTheRestRunWhenItReturns) {
  test::LogCapture log(LogLevel::kWarn);
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  auto later_ran = std::make_shared<std::atomic<bool>>(false);
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> all_done = done->get_future();
  auto started = std::chrono::steady_clock::now();
  {
    Teardown t;
    t.post("a step the wire holds", [released] { released.wait(); });
    t.post("a later step", [later_ran, done] {
      later_ran->store(true);
      done->set_value();
    });
    EXPECT_EQ(t.pending(), 2u);
  }
  // The destructor gave up after its grace instead of waiting for the stuck step.
  auto waited = std::chrono::steady_clock::now() - started;
  EXPECT_GE(waited, Teardown::kGrace);
  EXPECT_FALSE(later_ran->load());
  // The operator is told which step stalled, at warn.
  std::vector<test::LogCapture::Entry> stalled = log.containing("'a step the wire holds'");
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].level, LogLevel::kWarn);
  EXPECT_EQ(stalled[0].component, "teardown");
  EXPECT_NE(stalled[0].message.find("1 later teardown steps"), std::string::npos);
  release->set_value();
  // The abandoned thread still runs what was queued behind the stuck step.
  EXPECT_EQ(all_done.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(later_ran->load());
}

}  // namespace
}  // namespace ferry::core
