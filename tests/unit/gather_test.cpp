// When `ferry stream`'s receiver pauses between passes (tools/ferry/gather.hpp), on made-up
// times: no clock is read, so no assertion depends on the machine's speed.
#include "gather.hpp"

#include <gtest/gtest.h>

namespace ferry::cli {
namespace {

using namespace std::chrono_literals;
using Clock = Gathering::Clock;

// Passes of `per_pass` chunks every `every`, each `busy` long, `passes` times from `t`, each
// chunk marked ahead when `ahead`; the last pass's pause.
std::chrono::nanoseconds steady(Gathering& g, Clock::time_point& t, std::chrono::nanoseconds every,
                                uint64_t per_pass, int passes, bool ahead = true,
                                std::chrono::nanoseconds busy = 1us) {
  std::chrono::nanoseconds pause{};
  uint64_t in_a_row = 0;
  for (int i = 0; i < passes; ++i) {
    t += every;
    in_a_row = ahead ? in_a_row + per_pass : 0;
    pause = g.after_pass(t, per_pass, in_a_row, busy);
  }
  return pause;
}

TEST(Gathering, PausesForAboutTwelveChunksAtTheRateTheyCome) {
  Gathering g(10ms, 64);
  Clock::time_point t;
  EXPECT_EQ(g.after_pass(t, 1, 100, 1us), 0ns) << "no rate known yet";
  // One chunk every 19 us (a TCP stream of 64 KiB chunks on the VM).
  EXPECT_EQ(steady(g, t, 19us, 1, 20), 12 * 19us);
  EXPECT_NEAR(g.interval_ns(), 19'000, 1);
  // Passes of 12 chunks every 228 us are the same rate: the pause stays.
  EXPECT_EQ(steady(g, t, 228us, 12, 20), 12 * 19us);
}

TEST(Gathering, FollowsARateThatChanges) {
  Gathering g(100ms, 64);
  Clock::time_point t;
  steady(g, t, 1ms, 1, 10);
  EXPECT_NEAR(g.interval_ns(), 1e6, 1);
  steady(g, t, 100us, 1, 40);
  EXPECT_NEAR(g.interval_ns(), 1e5, 1e3) << "within a few dozen passes";
}

TEST(Gathering, NeverLongerThanTheLongestPause) {
  Gathering g(10ms, 64);
  Clock::time_point t;
  // One chunk per 1.1 ms (verbs in the emulated guest): 12 chunks' time would be 13.2 ms.
  EXPECT_EQ(steady(g, t, 1100us, 1, 20), 10ms);
}

TEST(Gathering, NoPauseWhileTheSourceSetsThePace) {
  Gathering g(10ms, 64);
  Clock::time_point t;
  EXPECT_EQ(steady(g, t, 19us, 1, 20, /*ahead=*/false), 0ns);
  EXPECT_EQ(g.after_pass(t + 19us, 1, 12, 1us), 12 * 19us) << "the rate was followed meanwhile";
}

TEST(Gathering, NoPauseForABurstShorterThanOnePauseGathers) {
  Gathering g(10ms, 64);
  Clock::time_point t;
  steady(g, t, 19us, 1, 20, /*ahead=*/false);
  for (uint64_t in_a_row = 1; in_a_row < 12; ++in_a_row)
    EXPECT_EQ(g.after_pass(t += 19us, 1, in_a_row, 1us), 0ns) << in_a_row << " ahead in a row";
  EXPECT_EQ(g.after_pass(t += 19us, 1, 12, 1us), 12 * 19us);
}

TEST(Gathering, NoPauseAfterAPassOfMoreThanHalfTheRing) {
  Gathering g(10ms, 64);
  Clock::time_point t;
  steady(g, t, 19us, 1, 20);
  EXPECT_EQ(g.after_pass(t + 33 * 19us, 33, 53, 1us), 0ns);
  EXPECT_GT(g.after_pass(t + 65 * 19us, 32, 85, 1us), 0ns);
}

TEST(Gathering, NoPauseWhileTheReceiverIsTheSlowestPart) {
  Gathering g(10ms, 64);
  Clock::time_point t;
  // Chunks every 19 us, each pass busy 10 us of them (a slow sink): the sink would idle.
  EXPECT_EQ(steady(g, t, 19us, 1, 20, /*ahead=*/true, /*busy=*/10us), 0ns);
  EXPECT_EQ(g.after_pass(t += 19us, 1, 21, 9us), 12 * 19us) << "busy less than half the time";
}

TEST(Gathering, AStalledSourceCountsNoLongerThanTheLongestPause) {
  Gathering g(10ms, 64);
  Clock::time_point t;
  steady(g, t, 19us, 1, 20);
  EXPECT_EQ(g.after_pass(t += 10s, 1, 21, 1us), 10ms) << "capped either way";
  EXPECT_NEAR(g.interval_ns(), 19'000 + 0.25 * (10e6 - 19'000), 1) << "the sample, at most 10 ms";
}

TEST(Gathering, AQuarterRingAtMostInSmallRings) {
  Gathering g(10ms, 16);
  Clock::time_point t;
  EXPECT_EQ(steady(g, t, 19us, 1, 20), 4 * 19us);
}

TEST(Gathering, NeverInRingsOfFewerThanEightSlotsOrWhenTurnedOff) {
  for (auto [longest, slots] : {std::pair{10ms, uint64_t{7}}, std::pair{0ms, uint64_t{64}}}) {
    Gathering g(longest, slots);
    Clock::time_point t;
    EXPECT_EQ(steady(g, t, 19us, 1, 20), 0ns) << slots << " slots";
  }
}

TEST(Gathering, PassesThatTookNothingChangeNothing) {
  Gathering g(10ms, 64);
  Clock::time_point t;
  steady(g, t, 19us, 1, 20);
  EXPECT_EQ(g.after_pass(t + 100ms, 0, 20, 1us), 0ns) << "a wait that timed out";
  EXPECT_NEAR(g.interval_ns(), 19'000, 1);
}

}  // namespace
}  // namespace ferry::cli
