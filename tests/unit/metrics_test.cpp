// The metrics' building blocks: latency buckets, the cycle clock, the channel meter's counts
// from several threads, and the Prometheus text.
#include "ferry/metrics.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/cycle_clock.hpp"
#include "transport/meter.hpp"

namespace ferry {
namespace {

TEST(Metrics, LatencyBucketsDoubleFromOneMicrosecond) {
  EXPECT_EQ(latency_bucket(0), 0);
  EXPECT_EQ(latency_bucket(1023), 0);
  EXPECT_EQ(latency_bucket(1024), 1);
  EXPECT_EQ(latency_bucket(2047), 1);
  EXPECT_EQ(latency_bucket(2048), 2);
  for (int b = 0; b + 1 < kLatencyBuckets; ++b) {
    EXPECT_EQ(latency_bucket(latency_bucket_bound_ns(b) - 1), b);
    EXPECT_EQ(latency_bucket(latency_bucket_bound_ns(b)), b + 1);
  }
  EXPECT_EQ(latency_bucket(UINT64_MAX), kLatencyBuckets - 1);
}

TEST(Metrics, TheCycleClockMeasuresWhatSteadyClockMeasures) {
  core::CycleClock::calibrate();
  auto t0 = std::chrono::steady_clock::now();
  uint64_t c0 = core::CycleClock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  uint64_t c1 = core::CycleClock::now();
  auto t1 = std::chrono::steady_clock::now();
  double steady = std::chrono::duration<double, std::nano>(t1 - t0).count();
  double cycles = static_cast<double>(core::CycleClock::to_ns(c1 - c0));
  // The cycle interval lies inside the steady one (a preemption between the readings widens the
  // steady one only); 2 % for the rate's calibration.
  EXPECT_LE(cycles, steady * 1.02);
  EXPECT_GE(cycles, 200e6 * 0.98);
}

TEST(Metrics, ConcurrentCompletionsAreAllCounted) {
  auto meter = std::make_unique<transport::ChannelMeter>();
  // More threads at once than there are owned stripes: the later ones share the last. Then as
  // many again, which take the stripes the first ones gave back when they ended.
  constexpr int kThreads = 2 * transport::MeterStripe::kOwnedStripes, kEach = 20000, kRounds = 2;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&meter, t] {
        for (int i = 0; i < kEach; ++i) {
          meter->posted(OperationKind::kWrite);
          ErrorCode code = i % 100 == 0 ? ErrorCode::kTimeout : ErrorCode::kOk;
          meter->completed(OperationKind::kWrite, code, 8, static_cast<uint64_t>(t) * 1000, true);
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  TransportMetrics m;
  meter->read(m);
  const OperationMetrics& w = m.operation(OperationKind::kWrite);
  constexpr uint64_t kAll = uint64_t{kRounds} * kThreads * kEach;
  EXPECT_EQ(w.failed, kAll / 100);
  EXPECT_EQ(w.succeeded, kAll - w.failed);
  EXPECT_EQ(w.bytes, 8 * w.succeeded);
  EXPECT_EQ(w.in_flight, 0u);
  uint64_t counted = 0;
  for (uint64_t n : w.latency) counted += n;
  EXPECT_EQ(counted, kAll);
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_EQ(m.errors[0].first, ErrorCode::kTimeout);
  EXPECT_EQ(m.errors[0].second, w.failed);
  EXPECT_EQ(m.operation(OperationKind::kRead).succeeded, 0u);
}

TEST(Metrics, PrometheusTextEscapesLabelsAndCountsBucketsCumulatively) {
  EngineMetrics m;
  PeerMetrics p;
  p.engine_id = 0xabc;
  p.address = "host\"with\\odd\nname:1";
  TransportMetrics t;
  t.transport = TransportKind::kTcp;
  OperationMetrics& w = t.operations[static_cast<int>(OperationKind::kWrite)];
  w.succeeded = 3;
  w.bytes = 300;
  w.latency[0] = 1;
  w.latency[2] = 2;
  w.latency_sum_ns = 5000;
  p.transports.push_back(t);
  m.peers.push_back(p);
  std::string text = m.prometheus();
  std::string labels =
      "peer=\"0000000000000abc\",address=\"host\\\"with\\\\odd\\nname:1\",transport=\"tcp\","
      "kind=\"write\"";
  EXPECT_NE(text.find("ferry_bytes_total{" + labels + "} 300\n"), std::string::npos) << text;
  EXPECT_NE(
      text.find("ferry_operation_latency_seconds_bucket{" + labels + ",le=\"1.024e-06\"} 1\n"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find("ferry_operation_latency_seconds_bucket{" + labels + ",le=\"2.048e-06\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find("ferry_operation_latency_seconds_bucket{" + labels + ",le=\"4.096e-06\"} 3\n"),
      std::string::npos);
  EXPECT_NE(text.find("ferry_operation_latency_seconds_bucket{" + labels + ",le=\"+Inf\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("ferry_operation_latency_seconds_sum{" + labels + "} 5e-06\n"),
            std::string::npos);
  // Kinds never used are left out.
  EXPECT_EQ(text.find("kind=\"read\""), std::string::npos);
  EXPECT_NE(text.find("ferry_peers 1\n"), std::string::npos);
}

}  // namespace
}  // namespace ferry
