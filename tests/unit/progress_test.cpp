// Callers polling channels instead of sleeping: OpPool::spin_any (Engine::next_imm's spin), the
// progress sources it watches, and the channels' polling rights.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/polling_right.hpp"
#include "transport/op.hpp"

namespace ferry::transport {
namespace {

using std::chrono::milliseconds;

// Counts what a caller does to it; `on_poll` runs in each look, as a channel's completions do.
class CountingSource final : public ProgressSource,
                             public std::enable_shared_from_this<CountingSource> {
 public:
  void progress() override { ++unwatched_polls; }
  std::shared_ptr<void> watch_begin() override {
    if (going) return nullptr;
    ++begun;
    return shared_from_this();
  }
  void watch_poll(bool messages) override {
    EXPECT_EQ(begun, ended + 1) << "polled while not watched";
    EXPECT_TRUE(messages);
    ++polls;
    if (on_poll) on_poll();
  }
  void watch_end() override { ++ended; }

  bool going = false;  // its watch_begin refuses, as a channel being destroyed does
  int begun = 0, ended = 0, polls = 0, unwatched_polls = 0;
  std::function<void()> on_poll;
};

struct Pools {
  explicit Pools(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      owned.push_back(std::make_shared<OpPool>());
      sources.push_back(std::make_shared<CountingSource>());
      raw.push_back(owned.back().get());
    }
  }
  std::vector<std::shared_ptr<OpPool>> owned;
  std::vector<std::shared_ptr<CountingSource>> sources;
  std::vector<OpPool*> raw;
};

TEST(Progress, SpinAnyPollsEveryWatchableSourceUntilOneDelivers) {
  Pools p(4);
  p.owned[0]->set_progress(p.sources[0].get());
  p.owned[1]->set_progress(p.sources[1].get());
  p.owned[2]->set_progress(p.sources[2].get());
  p.sources[2]->going = true;
  // Pool 3 has no source (a TCP peer's): skipped.
  std::atomic<bool> done{false};
  p.sources[1]->on_poll = [&] {
    if (p.sources[1]->polls == 100) done = true;
  };
  OpPool::spin_any(p.raw, done, std::chrono::hours(1), true);
  EXPECT_TRUE(done.load());
  EXPECT_EQ(p.sources[1]->polls, 100);
  EXPECT_EQ(p.sources[0]->polls, 100) << "every watched source is looked at in each turn";
  for (int i : {0, 1}) {
    EXPECT_EQ(p.sources[i]->begun, 1) << i;
    EXPECT_EQ(p.sources[i]->ended, 1) << i;
  }
  EXPECT_EQ(p.sources[2]->polls, 0) << "a source refusing to be watched is not polled";
  EXPECT_EQ(p.sources[2]->ended, 0);
  EXPECT_TRUE(p.owned[0]->pollable());
  EXPECT_FALSE(p.owned[3]->pollable());
}

TEST(Progress, SpinAnyEndsEveryWatchWhenItsBudgetRunsOut) {
  Pools p(2);
  p.owned[0]->set_progress(p.sources[0].get());
  p.owned[1]->set_progress(p.sources[1].get());
  std::atomic<bool> never{false};
  OpPool::spin_any(p.raw, never, milliseconds(2), true);
  for (int i : {0, 1}) {
    EXPECT_GT(p.sources[i]->polls, 0) << i;
    EXPECT_EQ(p.sources[i]->begun, 1) << i;
    EXPECT_EQ(p.sources[i]->ended, 1) << i;
  }
  // Nothing to poll: it spins on the flag alone, and returns.
  OpPool::spin_any({}, never, milliseconds(2), true);
}

TEST(Progress, SpinAnyPollsNoMoreThanItsLimit) {
  Pools p(OpPool::kMaxSpinPools + 1);
  for (std::size_t i = 0; i < p.raw.size(); ++i) p.owned[i]->set_progress(p.sources[i].get());
  std::atomic<bool> never{false};
  OpPool::spin_any(p.raw, never, milliseconds(1), true);
  EXPECT_GT(p.sources[OpPool::kMaxSpinPools - 1]->polls, 0);
  EXPECT_EQ(p.sources[OpPool::kMaxSpinPools]->begun, 0);
}

// A completion callback run by one pool's poll closes another peer that this thread also
// watches (its channel clears itself as that pool's source): the clearing must not wait for
// this thread. With only the innermost pool remembered per thread, the nested case hung.
TEST(Progress, ClosingAnotherWatchedPoolsSourceFromAPollDoesNotWaitForItself) {
  Pools p(2);
  p.owned[0]->set_progress(p.sources[0].get());
  p.owned[1]->set_progress(p.sources[1].get());
  std::atomic<bool> done{false};
  p.sources[1]->on_poll = [&] {
    p.owned[0]->clear_progress(p.sources[0].get());
    done = true;
  };
  OpPool::spin_any(p.raw, done, std::chrono::hours(1), true);
  EXPECT_TRUE(done.load());
  EXPECT_FALSE(p.owned[0]->pollable());
  EXPECT_EQ(p.sources[0]->ended, 1) << "the watch still ends: the spin held the source";

  // Nested: a callback of pool 0's poll waits on pool 1 (Future::wait in a completion
  // callback), and pool 1's poll closes pool 0's peer.
  Pools q(2);
  q.owned[0]->set_progress(q.sources[0].get());
  q.owned[1]->set_progress(q.sources[1].get());
  std::atomic<bool> outer{false}, inner{false};
  q.sources[1]->on_poll = [&] {
    q.owned[0]->clear_progress(q.sources[0].get());
    inner = true;
  };
  q.sources[0]->on_poll = [&] {
    if (inner) return;
    OpPool::spin_any({&q.raw[1], 1}, inner, std::chrono::hours(1), true);
    outer = true;
  };
  OpPool::spin_any({&q.raw[0], 1}, outer, std::chrono::hours(1), true);
  EXPECT_TRUE(outer.load());
  EXPECT_FALSE(q.owned[0]->pollable());
}

// A thread holding one channel's polling right (a callback runs inside its poll) polls another
// channel: releasing the inner right leaves the outer one held. When the thread kept only its
// innermost right, the outer channel's own code then thought nobody held it and waited for
// itself.
TEST(PollingRight, NestedRightsAreEachHeldUntilTheirOwnRelease) {
  core::PollingRight a, b;
  ASSERT_TRUE(a.try_lock());
  ASSERT_TRUE(b.try_lock());
  EXPECT_TRUE(a.held_here());
  EXPECT_TRUE(b.held_here());
  EXPECT_FALSE(a.try_lock()) << "one holder at a time";
  b.unlock();
  EXPECT_TRUE(a.held_here()) << "releasing the inner right released the outer one";
  EXPECT_FALSE(b.held_here());
  std::thread other([&] {
    EXPECT_FALSE(a.held_here()) << "held on another thread";
    EXPECT_FALSE(a.try_lock());
    EXPECT_TRUE(b.try_lock());
    b.unlock();
  });
  other.join();
  // Released out of order, each leaves the chain where it is.
  ASSERT_TRUE(b.try_lock());
  a.unlock();
  EXPECT_FALSE(a.held_here());
  EXPECT_TRUE(b.held_here());
  b.unlock();
  EXPECT_FALSE(b.held_here());
  EXPECT_TRUE(a.try_lock());
  a.unlock();
}

}  // namespace
}  // namespace ferry::transport
