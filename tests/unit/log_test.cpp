// Logging (core/log.hpp, ferry/log.hpp): levels filter before anything is formatted, the sink
// gets each record once, and a limiter turns a flood into a burst plus counts.
#include "core/log.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "support/log_capture.hpp"

namespace ferry::core {
namespace {

using namespace std::chrono_literals;

TEST(Log, LevelsAreNamedAndParsed) {
  for (LogLevel l : {LogLevel::kOff, LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo,
                     LogLevel::kDebug, LogLevel::kTrace}) {
    ASSERT_EQ(log_level_named(to_string(l)), l);
  }
  EXPECT_EQ(log_level_named("warning"), LogLevel::kWarn);
  EXPECT_EQ(log_level_named("loud"), std::nullopt);
  EXPECT_EQ(log_level_named(""), std::nullopt);
}

TEST(Log, ARecordBelowTheLevelIsNeitherMadeNorWritten) {
  test::LogCapture log(LogLevel::kWarn);
  int made = 0;
  auto make = [&] {
    ++made;
    return std::string("text ") + std::to_string(made);
  };
  core::log(LogLevel::kInfo, "test", make);
  core::log(LogLevel::kDebug, "test", make);
  EXPECT_EQ(made, 0);
  core::log(LogLevel::kWarn, "test", make);
  core::log(LogLevel::kError, "test", make);
  EXPECT_EQ(made, 2);
  auto entries = log.entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].level, LogLevel::kWarn);
  EXPECT_EQ(entries[0].component, "test");
  EXPECT_EQ(entries[0].message, "text 1");
  EXPECT_EQ(entries[1].level, LogLevel::kError);
}

TEST(Log, OffLogsNothingAndTraceEverything) {
  {
    test::LogCapture log(LogLevel::kOff);
    core::log(LogLevel::kError, "test", [] { return std::string("x"); });
    EXPECT_TRUE(log.entries().empty());
    EXPECT_FALSE(log_enabled(LogLevel::kError));
  }
  test::LogCapture log(LogLevel::kTrace);
  for (LogLevel l :
       {LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo, LogLevel::kDebug, LogLevel::kTrace}) {
    core::log(l, "test", [] { return std::string("x"); });
  }
  EXPECT_EQ(log.entries().size(), 5u);
  // A record of level "off" is never written, whatever the level.
  core::log(LogLevel::kOff, "test", [] { return std::string("never"); });
  EXPECT_TRUE(log.containing("never").empty());
}

TEST(Log, TheLevelSetIsTheLevelRead) {
  LogLevel before = log_level();
  set_log_level(LogLevel::kDebug);
  EXPECT_EQ(log_level(), LogLevel::kDebug);
  EXPECT_TRUE(log_enabled(LogLevel::kDebug));
  EXPECT_FALSE(log_enabled(LogLevel::kTrace));
  set_log_level(before);
}

TEST(LogLimiter, LetsABurstThroughThenOnePerPeriodAndCountsTheRest) {
  LogLimiter limiter(3, 1s);
  auto t0 = LogLimiter::Clock::time_point{} + 100s;
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limiter.allow(t0, suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(limiter.allow(t0 + 10ms, suppressed));
  // One period later one more gets through, and says how many did not.
  ASSERT_TRUE(limiter.allow(t0 + 1s, suppressed));
  EXPECT_EQ(suppressed, 50u);
  EXPECT_FALSE(limiter.allow(t0 + 1500ms, suppressed));
  // A long quiet time refills the burst, no more.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(limiter.allow(t0 + 1h, suppressed));
  EXPECT_EQ(suppressed, 0u);  // the one at 1.5 s was reported by the first of these
  EXPECT_FALSE(limiter.allow(t0 + 1h, suppressed));
}

TEST(LogLimiter, LimitedLogSaysHowManyWereNotLogged) {
  test::LogCapture log(LogLevel::kWarn);
  // A period no test run reaches: only the burst gets through.
  LogLimiter limiter(2, 24h);
  for (int i = 0; i < 100; ++i) {
    log_limited(limiter, LogLevel::kWarn, "test", [&] { return "refused " + std::to_string(i); });
  }
  auto entries = log.entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].message, "refused 0");
  EXPECT_EQ(entries[1].message, "refused 1");
  // Below the level the limiter is not even asked: nothing is counted.
  LogLimiter quiet(1, 24h);
  for (int i = 0; i < 10; ++i) {
    log_limited(quiet, LogLevel::kDebug, "test", [] { return std::string("hidden"); });
  }
  uint64_t suppressed = 0;
  EXPECT_TRUE(quiet.allow(LogLimiter::Clock::now(), suppressed));
  EXPECT_EQ(suppressed, 0u);
}

}  // namespace
}  // namespace ferry::core
