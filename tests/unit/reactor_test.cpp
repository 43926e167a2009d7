// Progress threads' pollers: polled only while the loop busy-polls after work (or was asked to
// keep polling), told when that starts and ends, and removable from the loop's own thread.
#include "core/reactor.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace ferry::core {
namespace {

using namespace std::chrono_literals;

struct CountingPoller final : Reactor::Poller {
  void begin_polling() override {
    EXPECT_FALSE(polling.exchange(true));
    begins.fetch_add(1);
  }
  bool poll() override {
    EXPECT_TRUE(polling.load()) << "polled outside begin_polling/end_polling";
    polls.fetch_add(1);
    return work.exchange(false);
  }
  void end_polling() override {
    EXPECT_TRUE(polling.exchange(false));
    ends.fetch_add(1);
  }
  std::atomic<bool> polling{false}, work{false};
  std::atomic<int> begins{0}, polls{0}, ends{0};
};

// Runs `fn` on the loop's thread and waits for it.
template <typename Fn>
void on_loop(Reactor& r, Fn fn) {
  std::promise<void> done;
  r.post(0, [&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

// Waits (without a time limit on the outcome: only on how long to keep looking) until `pred`.
template <typename Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 2000 && !pred(); ++i) std::this_thread::sleep_for(1ms);
  return pred();
}

TEST(ReactorPollers, APollerIsPolledWhileTheLoopBusyPollsAndToldWhenItSleeps) {
  Reactor r(1, 2ms);
  CountingPoller p;
  on_loop(r, [&] { r.add_poller(0, &p); });  // the task was work: the loop busy-polls now
  ASSERT_TRUE(eventually([&] { return p.ends.load() >= 1; }));
  EXPECT_GE(p.begins.load(), 1);
  EXPECT_GE(p.polls.load(), 1);
  EXPECT_EQ(p.begins.load(), p.ends.load()) << "asleep: every begin was ended";

  // Work the poller found keeps the loop polling; once there is none it sleeps again.
  int ends = p.ends.load();
  on_loop(r, [&] { p.work = true; });
  ASSERT_TRUE(eventually([&] { return p.ends.load() > ends && !p.polling.load(); }));
  EXPECT_FALSE(p.work.load()) << "the work was polled";

  int polls = p.polls.load();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(p.polls.load(), polls) << "an idle loop polls nothing";
  on_loop(r, [&] { r.remove_poller(0, &p); });
  EXPECT_FALSE(p.polling.load());
  r.stop();
}

TEST(ReactorPollers, WithoutBusyPollingAPollerIsNeverPolled) {
  Reactor r(1, 0ns);
  CountingPoller p;
  on_loop(r, [&] { r.add_poller(0, &p); });
  on_loop(r, [] {});
  on_loop(r, [&] { r.remove_poller(0, &p); });
  r.stop();
  EXPECT_EQ(p.polls.load(), 0);
  EXPECT_EQ(p.begins.load(), 0);
}

// A transfer streaming through a poller keeps the loop polling without busy_poll, asked from
// any thread; once its period passed the loop sleeps again.
TEST(ReactorPollers, KeepPollingPollsForItsPeriodWithoutBusyPolling) {
  CountingPoller p, q;  // outlive the loops that poll them
  Reactor r(1, 0ns);
  on_loop(r, [&] { r.add_poller(0, &p); });
  r.keep_polling(0, 10s);  // from this thread; the loop takes it up when next woken
  on_loop(r, [] {});
  ASSERT_TRUE(eventually([&] { return p.polls.load() > 0; }));
  EXPECT_TRUE(p.polling.load());
  on_loop(r, [&] { r.remove_poller(0, &p); });
  r.stop();

  // A short period: asked again until the loop was seen polling (a preempted loop thread may
  // find a period over before it looked), after which it sleeps.
  Reactor short_one(1, 0ns);
  on_loop(short_one, [&] { short_one.add_poller(0, &q); });
  ASSERT_TRUE(eventually([&] {
    if (q.begins.load() == 0) on_loop(short_one, [&] { short_one.keep_polling(0, 1ms); });
    return q.ends.load() >= 1;
  })) << "asleep once the period passed";
  ASSERT_TRUE(eventually([&] { return !q.polling.load(); }));
  EXPECT_EQ(q.begins.load(), q.ends.load());
  EXPECT_GE(q.polls.load(), 1);
  on_loop(short_one, [&] { short_one.remove_poller(0, &q); });
  short_one.stop();
}

TEST(ReactorPollers, RemovingAPollerWhileTheLoopPollsEndsItsPolling) {
  Reactor r(1, 10s);  // polls long after the task below, however slow the machine
  CountingPoller p;
  on_loop(r, [&] { r.add_poller(0, &p); });
  ASSERT_TRUE(eventually([&] { return p.polls.load() > 0; }));
  on_loop(r, [&] {
    EXPECT_TRUE(p.polling.load());
    r.remove_poller(0, &p);
    EXPECT_FALSE(p.polling.load());
  });
  int polls = p.polls.load();
  on_loop(r, [] {});
  EXPECT_EQ(p.polls.load(), polls);
  r.stop();
}

// Polling for the next request: on while each request comes within the last window, off after
// RequestPolling::kMisses windows in a row ended first, tried again once every kRetry requests
// (a try that sees its next request in time turns it on, one that does not turns it off again).
// Times are given, not read: nothing here depends on the machine's speed.
TEST(RequestPolling, FollowsWhetherRequestsComeWithinTheWindow) {
  constexpr int64_t kWindow = 20'000;
  RequestPolling p;
  int64_t t = 1'000'000;
  EXPECT_TRUE(p.start(t, kWindow));  // the first request: nothing learned yet
  for (int i = 0; i < 100; ++i) {    // each within the last window
    t += kWindow / 2;
    EXPECT_TRUE(p.start(t, kWindow)) << i;
  }
  // Requests further apart than the window: polling goes on until kMisses windows ended first.
  for (int i = 1; i < RequestPolling::kMisses; ++i) {
    t += 3 * kWindow;
    EXPECT_TRUE(p.start(t, kWindow)) << i;
  }
  t += 3 * kWindow;
  EXPECT_FALSE(p.start(t, kWindow));
  auto skip_until_retry = [&] {
    for (int i = 2; i < RequestPolling::kRetry; ++i) {
      t += 3 * kWindow;
      EXPECT_FALSE(p.start(t, kWindow)) << i;
    }
    t += 3 * kWindow;
    EXPECT_TRUE(p.start(t, kWindow));  // the retry
  };
  skip_until_retry();
  t += 3 * kWindow;  // the retry's window ended first: off again at once
  EXPECT_FALSE(p.start(t, kWindow));
  skip_until_retry();
  t += kWindow / 2;  // the retry's window saw its request: on again, and it stays on
  EXPECT_TRUE(p.start(t, kWindow));
  for (int i = 1; i < RequestPolling::kMisses; ++i) {
    t += 3 * kWindow;
    EXPECT_TRUE(p.start(t, kWindow)) << i;
  }
}

}  // namespace
}  // namespace ferry::core
