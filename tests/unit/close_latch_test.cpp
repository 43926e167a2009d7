// transport::CloseLatch: the one way every channel keeps its closing. Closing begins once, with
// the first reason; on_closed runs exactly once, with that reason, however many threads race.
#include "transport/close_latch.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace ferry::transport {
namespace {

TEST(CloseLatch, TheFirstReasonStandsAndOnClosedRunsOnce) {
  std::vector<Status> reported;
  CloseLatch latch([&](const Status& s) { reported.push_back(s); });
  EXPECT_FALSE(latch.closing());
  EXPECT_FALSE(latch.quiesced());
  int under_lock = 0;
  EXPECT_TRUE(latch.begin({ErrorCode::kPeerLost, "first"}, [&] { ++under_lock; }));
  EXPECT_FALSE(latch.begin({ErrorCode::kCancelled, "second"}, [&] { ++under_lock; }));
  EXPECT_EQ(under_lock, 1) << "only the call that began it runs its step";
  EXPECT_TRUE(latch.closing());
  EXPECT_FALSE(latch.quiesced());
  EXPECT_EQ(latch.reason().message(), "first");
  EXPECT_TRUE(latch.report());
  EXPECT_FALSE(latch.report());
  EXPECT_TRUE(latch.quiesced());
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].code(), ErrorCode::kPeerLost);
  EXPECT_EQ(reported[0].message(), "first");
}

TEST(CloseLatch, RacingClosersAndReportersAgreeOnOneOutcome) {
  std::atomic<int> reports{0};
  std::string reason;
  CloseLatch latch([&](const Status& s) {
    reports.fetch_add(1);
    reason = s.message();
  });
  std::atomic<int> began{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      if (latch.begin({ErrorCode::kPeerLost, "closer " + std::to_string(i)})) began.fetch_add(1);
      latch.report();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(began.load(), 1);
  EXPECT_EQ(reports.load(), 1);
  EXPECT_EQ(reason, latch.reason().message());
}

}  // namespace
}  // namespace ferry::transport
