// WritePathChooser on made-up times: which way writes go once each way's rate is known.
#include "transport/write_path.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace ferry::transport {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr int kRun = static_cast<int>(WritePathChooser::kProbeRun);

// Finishes `n` writes of `size` one after the other, each taking `bounce_ns` or `direct_ns`
// from the previous one's completion, routed as the chooser says; returns how many bounced.
// `clock` goes on.
int run(WritePathChooser& c, uint64_t size, int n, int64_t bounce_ns, int64_t direct_ns,
        int64_t& clock) {
  int bounced = 0;
  for (int i = 0; i < n; ++i) {
    bool b = c.bounce(size);
    bounced += b ? 1 : 0;
    int64_t posted = clock;
    clock += b ? bounce_ns : direct_ns;
    c.finished(size, b, posted, clock);
  }
  return bounced;
}

TEST(WritePathChooser, AlternatesInRunsUntilBothWaysAreMeasured) {
  WritePathChooser c;
  for (int i = 0; i < 3 * kRun; ++i) {
    EXPECT_EQ(c.bounce(kMiB), i / kRun % 2 == 0) << "write " << i;
  }
  EXPECT_EQ(c.rates(kMiB).bounce_ns_per_mib, 0);
  EXPECT_EQ(c.rates(kMiB).direct_ns_per_mib, 0);
}

TEST(WritePathChooser, SendsWritesTheFasterWayAndProbesTheOtherInRuns) {
  WritePathChooser c;
  int64_t clock = 1000;
  EXPECT_EQ(run(c, kMiB, 2 * kRun, 100'000, 50'000, clock), kRun);  // one run each way
  EXPECT_NEAR(c.rates(kMiB).bounce_ns_per_mib, 100'000, 1);
  EXPECT_NEAR(c.rates(kMiB).direct_ns_per_mib, 50'000, 1);
  // Writes 8-327: pulled, but for the probe runs at 128-131 and 256-259.
  EXPECT_EQ(run(c, kMiB, 320, 100'000, 50'000, clock), 2 * kRun);

  // The host changes: the rings become the faster way. The probe runs at 384 and 512 find it:
  // the rings' rate moves a quarter of the way with each of a run's writes after the first, and
  // drops below the pulls' at 513. Bounced: 384-387, 512-513, then all from 516 (514-515 are
  // now probes of the pulls).
  EXPECT_EQ(run(c, kMiB, 640 - 328, 20'000, 50'000, clock), kRun + 2 + (640 - 516));
  EXPECT_LT(c.rates(kMiB).bounce_ns_per_mib, 50'000);
  // Writes 640-739: through the rings, but for the probe run at 640-643.
  EXPECT_EQ(run(c, kMiB, 100, 20'000, 50'000, clock), 100 - kRun);
}

TEST(WritePathChooser, KeepsEachSizeClassApart) {
  WritePathChooser c;
  int64_t clock = 0;
  run(c, kMiB, 40, 100'000, 50'000, clock);          // 1 MiB: pulled is faster
  run(c, 16 * kMiB, 40, 800'000, 1'600'000, clock);  // 16 MiB: the rings are
  // Writes 40-59 of each class: no probe among them.
  EXPECT_EQ(run(c, kMiB, 20, 100'000, 50'000, clock), 0);
  EXPECT_EQ(run(c, 16 * kMiB, 20, 800'000, 1'600'000, clock), 20);
  EXPECT_EQ(WritePathChooser::size_class(256 << 10), 0);
  EXPECT_EQ(WritePathChooser::size_class((512 << 10) - 1), 0);
  EXPECT_EQ(WritePathChooser::size_class(kMiB), 2);
  EXPECT_EQ(WritePathChooser::size_class(1ull << 40), WritePathChooser::kClasses - 1);
  EXPECT_EQ(WritePathChooser::size_class(1), 0);
}

TEST(WritePathChooser, CountsEachWriteFromThePreviousCompletionWhenSeveralAreInFlight) {
  WritePathChooser c;
  // Eight bounced and then eight pulled, all posted at 0, finishing 100 us apart: each took
  // 100 us of the channel, not its 100-1600 us since posting.
  for (int i = 0; i < 16; ++i) c.finished(kMiB, i < 8, 0, (i + 1) * 100'000);
  EXPECT_NEAR(c.rates(kMiB).bounce_ns_per_mib, 100'000, 1);
  EXPECT_NEAR(c.rates(kMiB).direct_ns_per_mib, 100'000, 1);
  // A write that finished before the one counted last has no share of its own: not counted.
  c.finished(kMiB, false, 0, 50'000);
  EXPECT_NEAR(c.rates(kMiB).direct_ns_per_mib, 100'000, 1);
}

// Finishes writes of 1 MiB one after the other, each taking `ns` from the previous one.
void finish(WritePathChooser& c, bool bounced, int n, int64_t ns, int64_t& clock) {
  for (int i = 0; i < n; ++i) {
    c.finished(kMiB, bounced, clock, clock + ns);
    clock += ns;
  }
}

TEST(WritePathChooser, TheFirstWriteAfterTheOtherWayDoesNotCount) {
  WritePathChooser c;
  int64_t clock = 0;
  finish(c, true, 3, 100'000, clock);
  finish(c, false, 3, 100'000, clock);
  // A bounced write right after a pulled one: its time overlapped the pull, not counted.
  finish(c, true, 1, 10'000, clock);
  EXPECT_NEAR(c.rates(kMiB).bounce_ns_per_mib, 100'000, 1);
  // The next bounced one counts.
  finish(c, true, 1, 60'000, clock);
  EXPECT_NEAR(c.rates(kMiB).bounce_ns_per_mib, 90'000, 1);
}

TEST(WritePathChooser, OneSlowSampleMovesTheRateAQuarterOfTheWay) {
  WritePathChooser c;
  int64_t clock = 0;
  finish(c, false, 3, 100'000, clock);
  finish(c, false, 1, 500'000, clock);  // descheduled once
  EXPECT_NEAR(c.rates(kMiB).direct_ns_per_mib, 200'000, 1);
}

}  // namespace
}  // namespace ferry::transport
