// PathChooser on made-up times: which way transfers go once each way's rate is known.
#include "transport/shm/path_chooser.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace ferry::transport::shm {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr int kRun = static_cast<int>(PathChooser::kRun);
constexpr int kPeriod = static_cast<int>(PathChooser::kProbePeriod);

// Finishes `n` transfers of `size` one after the other, each taking `bounce_ns` or `direct_ns`
// from the previous one's completion, routed as the chooser says; returns how many bounced.
// `clock` goes on.
int run(PathChooser& c, uint64_t size, int n, int64_t bounce_ns, int64_t direct_ns,
        int64_t& clock) {
  int bounced = 0;
  for (int i = 0; i < n; ++i) {
    bool b = c.bounce(size);
    bounced += b ? 1 : 0;
    int64_t routed = clock;
    clock += b ? bounce_ns : direct_ns;
    c.finished(size, b, routed, clock);
  }
  return bounced;
}

// Finishes `n` transfers of 1 MiB one way, one after the other, each taking `ns`.
void finish(PathChooser& c, bool bounced, int n, int64_t ns, int64_t& clock) {
  for (int i = 0; i < n; ++i) {
    c.finished(kMiB, bounced, clock, clock + ns);
    clock += ns;
  }
}

TEST(PathChooser, AlternatesInRunsUntilBothWaysAreTimed) {
  PathChooser c;
  for (int i = 0; i < 3 * kRun; ++i) EXPECT_EQ(c.bounce(kMiB), i / kRun % 2 == 0) << i;
  EXPECT_EQ(c.state_for(kMiB).bounce_ns_per_mib, 0);
  EXPECT_EQ(c.state_for(kMiB).direct_ns_per_mib, 0);
}

TEST(PathChooser, SendsTransfersTheFasterWayAndProbesTheOtherInRuns) {
  PathChooser c;
  int64_t clock = 1000;
  EXPECT_EQ(run(c, kMiB, 2 * kRun, 100'000, 50'000, clock), kRun);  // one run each way
  EXPECT_NEAR(c.state_for(kMiB).bounce_ns_per_mib, 100'000, 1);
  EXPECT_NEAR(c.state_for(kMiB).direct_ns_per_mib, 50'000, 1);
  // Transfers 16-511: pulled, but for the probe run at 256-263.
  EXPECT_EQ(run(c, kMiB, 2 * kPeriod - 2 * kRun, 100'000, 50'000, clock), kRun);
  PathChooser::ClassState s = c.state_for(kMiB);
  EXPECT_EQ(s.bounced, 2u * kRun);
  EXPECT_EQ(s.direct, 2u * kPeriod - 2u * kRun);

  // The host changes: the rings become the faster way. Each probe run moves their rate a
  // quarter of the way, 100 -> 80 -> 65 -> 53.75 -> 45.3 us per MiB: the fourth, at 1280-1287,
  // drops it below the pulls'.
  run(c, kMiB, 5 * kPeriod + kRun - 2 * kPeriod, 20'000, 50'000, clock);
  EXPECT_NEAR(c.state_for(kMiB).bounce_ns_per_mib, 45'312.5, 1);
  // Transfers 1288-1535: through the rings, up to the next probe run.
  EXPECT_EQ(run(c, kMiB, 6 * kPeriod - (5 * kPeriod + kRun), 20'000, 50'000, clock),
            kPeriod - kRun);
}

TEST(PathChooser, KeepsEachSizeClassApart) {
  PathChooser c;
  int64_t clock = 0;
  run(c, kMiB, 40, 100'000, 50'000, clock);          // 1 MiB: pulled is faster
  run(c, 16 * kMiB, 40, 800'000, 1'600'000, clock);  // 16 MiB: the rings are
  // Transfers 40-59 of each class: no probe among them.
  EXPECT_EQ(run(c, kMiB, 20, 100'000, 50'000, clock), 0);
  EXPECT_EQ(run(c, 16 * kMiB, 20, 800'000, 1'600'000, clock), 20);
  EXPECT_EQ(PathChooser::size_class(256 << 10), 0);
  EXPECT_EQ(PathChooser::size_class((512 << 10) - 1), 0);
  EXPECT_EQ(PathChooser::size_class(kMiB), 2);
  EXPECT_EQ(PathChooser::class_floor(2), kMiB);
  EXPECT_EQ(PathChooser::size_class(1ull << 40), PathChooser::kClasses - 1);
  EXPECT_EQ(PathChooser::size_class(1), 0);
}

TEST(PathChooser, TimesEachRunFromThePreviousCompletionWhenSeveralAreInFlight) {
  PathChooser c;
  // A run bounced and then one pulled, all routed at 0, finishing 100 us apart: each took
  // 100 us of the channel, not its 100-1600 us since routing.
  for (int i = 0; i < 2 * kRun; ++i) c.finished(kMiB, i < kRun, 0, (i + 1) * 100'000);
  EXPECT_NEAR(c.state_for(kMiB).bounce_ns_per_mib, 100'000, 1);
  EXPECT_NEAR(c.state_for(kMiB).direct_ns_per_mib, 100'000, 1);
}

TEST(PathChooser, CompletionsThatComeInBurstsAreTimedWhole) {
  PathChooser c;
  // A run whose answers came half at 400 us and half at 800 us: 100 us each.
  for (int i = 0; i < kRun; ++i) c.finished(kMiB, true, 0, i < kRun / 2 ? 400'000 : 800'000);
  EXPECT_NEAR(c.state_for(kMiB).bounce_ns_per_mib, 100'000, 1);
}

TEST(PathChooser, ARunCutShortByTheOtherWayIsNotTimed) {
  PathChooser c;
  int64_t clock = 0;
  finish(c, true, kRun, 100'000, clock);
  finish(c, false, kRun - 1, 10'000, clock);  // cut short
  finish(c, true, kRun, 50'000, clock);
  PathChooser::ClassState s = c.state_for(kMiB);
  EXPECT_EQ(s.direct_ns_per_mib, 0);
  EXPECT_NEAR(s.bounce_ns_per_mib, 87'500, 1);
  EXPECT_EQ(s.direct, static_cast<uint64_t>(kRun - 1)) << "counted, though not timed";
  EXPECT_EQ(s.bounced, 2u * kRun);
}

TEST(PathChooser, OneSlowRunMovesTheRateUpAQuarterAtMost) {
  PathChooser c;
  int64_t clock = 0;
  finish(c, false, kRun, 100'000, clock);
  finish(c, false, kRun - 1, 100'000, clock);
  finish(c, false, 1, 4'000'000, clock);  // descheduled once: the run took 5.9x
  EXPECT_NEAR(c.state_for(kMiB).direct_ns_per_mib, 125'000, 1) << "counted as 2x";
  finish(c, false, kRun, 50'000, clock);  // faster runs count whole
  EXPECT_NEAR(c.state_for(kMiB).direct_ns_per_mib, 106'250, 1);
}

}  // namespace
}  // namespace ferry::transport::shm
