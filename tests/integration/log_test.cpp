// What an operator sees in the log (ferry/log.hpp): the transport each peer took and why, a
// transport unusable here, a peer lost or closed, refused handshakes and admission limits
// (rate-limited), configuration warnings; each at its level. FERRY_LOG and FERRY_LOG_FILE are
// read by a fresh process: cli_test.cpp runs `ferry` with them.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/log_capture.hpp"
#include "support/pair.hpp"
#include "support/raw_client.hpp"
#include "support/target_process.hpp"
#include "transport/loopback/loopback.hpp"

namespace ferry::test {
namespace {

Config tcp_only() {
  Config c = test_config();
  c.transports = {TransportKind::kTcp};
  return c;
}

TEST(Log, EachSideLogsTheTransportsItsPeerTookAndWhyAtInfo) {
  LogCapture log(LogLevel::kInfo);
  Config both = test_config();
  both.transports = {transport::loopback::kKind, TransportKind::kTcp};
  Engine target(both);
  Engine initiator(both);
  Peer peer = initiator.connect(target.address());
  std::string who = "peer " + std::to_string(target.id()) + " at ";
  ASSERT_TRUE(log.wait_for(who));
  ASSERT_TRUE(log.wait_for("peer " + std::to_string(initiator.id()) + " at "));
  std::vector<LogCapture::Entry> ours = log.containing(who);
  ASSERT_EQ(ours.size(), 1u);
  const LogCapture::Entry& e = ours[0];
  EXPECT_EQ(e.level, LogLevel::kInfo);
  EXPECT_EQ(e.component, "engine");
  EXPECT_NE(e.message.find("(same process, we connected)"), std::string::npos) << e.message;
  // Every class goes over loopback, and each says what TCP's verdict was.
  for (const char* op : {"write/read", "write_with_imm", "send/recv"}) {
    EXPECT_NE(e.message.find(std::string(op) + " over loopback (loopback: chosen"),
              std::string::npos)
        << e.message;
  }
  EXPECT_NE(e.message.find("tcp: "), std::string::npos) << e.message;
  ASSERT_EQ(log.containing("connected to us").size(), 1u);
}

TEST(Log, NothingBelowTheLevelIsLogged) {
  // Connecting and closing on purpose are routine: nothing at warn, on either side.
  LogCapture log(LogLevel::kWarn);
  Engine target(tcp_only());
  Engine initiator(tcp_only());
  Peer peer = initiator.connect(target.address());
  peer.close();
  initiator.shutdown();
  target.shutdown();
  EXPECT_TRUE(log.entries().empty()) << log.entries()[0].message;
}

TEST(Log, ATransportUnusableHereIsLoggedWithItsReason) {
  std::vector<TransportInfo> unusable;
  for (TransportInfo& t : Engine::transports()) {
    if (!t.usable) unusable.push_back(std::move(t));
  }
  if (unusable.empty()) GTEST_SKIP() << "every transport is usable on this host";
  LogCapture log(LogLevel::kInfo);
  Config c = tcp_only();
  for (const TransportInfo& t : unusable) c.transports.push_back(t.kind);
  Engine engine(c);
  for (const TransportInfo& t : unusable) {
    std::string line = "transport " + std::string(to_string(t.kind)) + " is not usable here: ";
    std::vector<LogCapture::Entry> found = log.containing(line);
    ASSERT_EQ(found.size(), 1u) << line;
    EXPECT_EQ(found[0].level, LogLevel::kInfo);
  }
}

TEST(Log, APeerLostIsAWarningAndAPeerClosedIsInfo) {
  LogCapture log(LogLevel::kInfo);
  Engine engine(tcp_only());
  TargetProcess target(4096, "tcp");
  Peer lost = engine.connect(target.address);
  target.kill_now();
  ASSERT_TRUE(log.wait_for(" lost: "));
  std::vector<LogCapture::Entry> l = log.containing(" lost: ");
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].level, LogLevel::kWarn);
  EXPECT_NE(l[0].message.find("at " + target.address), std::string::npos) << l[0].message;
  EXPECT_NE(l[0].message.find("peer_lost: "), std::string::npos) << l[0].message;

  Engine other(tcp_only());
  Peer closed = engine.connect(other.address());
  // The other side logs the end of a peer it had set up (planned its routes) only.
  ASSERT_TRUE(log.wait_for("peer " + std::to_string(engine.id()) + " at "));
  closed.close();
  std::string mine = "peer " + std::to_string(other.id()) + " at " + other.address() + " closed: ";
  ASSERT_TRUE(log.wait_for(mine));
  EXPECT_EQ(log.containing(mine)[0].level, LogLevel::kInfo);
  // The other side finds our goodbye waiting as our streams end: routine there too.
  std::string theirs = "peer " + std::to_string(engine.id()) + " at ";
  auto their_end = [&]() -> std::optional<LogCapture::Entry> {
    for (const LogCapture::Entry& e : log.containing(theirs)) {
      if (e.message.find(" closed: ") != std::string::npos ||
          e.message.find(" lost: ") != std::string::npos) {
        return e;
      }
    }
    return std::nullopt;
  };
  auto until = std::chrono::steady_clock::now() + kWait;
  while (!their_end() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(their_end());
  EXPECT_EQ(their_end()->level, LogLevel::kInfo) << their_end()->message;
}

TEST(Log, AFloodOfRefusedHandshakesLogsABurstAndCountsTheRest) {
  LogCapture log(LogLevel::kWarn);
  Engine target(tcp_only());
  constexpr int kRefused = 60;
  auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < kRefused; ++i) {
    Raw raw(target);
    // A frame header of no known type: a protocol error, refused.
    raw.send(std::vector<uint8_t>(core::kFrameHeaderSize, 0xEE));
    (void)raw.refusal();
  }
  auto elapsed = std::chrono::steady_clock::now() - started;
  ASSERT_TRUE(log.wait_for("handshake from 127.0.0.1:"));
  std::vector<LogCapture::Entry> lines = log.containing("handshake from 127.0.0.1:");
  for (const LogCapture::Entry& e : lines) {
    EXPECT_EQ(e.level, LogLevel::kWarn);
    EXPECT_EQ(e.component, "listener");
    EXPECT_NE(e.message.find("refused: protocol: "), std::string::npos) << e.message;
  }
  // A burst of 10, then one a second at most, however fast the refusals came.
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(elapsed).count();
  EXPECT_LE(lines.size(), static_cast<std::size_t>(10 + seconds + 1));
  EXPECT_GE(lines.size(), 1u);
  // Those not logged are counted, in the first line after them.
  uint64_t counted = 0;
  for (const LogCapture::Entry& e : lines) {
    std::size_t at = e.message.find(" more like it not logged)");
    if (at == std::string::npos) continue;
    std::size_t open = e.message.rfind('(', at);
    counted += std::stoull(e.message.substr(open + 1, at - open - 1));
  }
  EXPECT_LE(lines.size() + counted, static_cast<std::size_t>(kRefused));
}

TEST(Log, AnAdmissionLimitReachedIsAWarning) {
  LogCapture log(LogLevel::kWarn);
  Config one = tcp_only();
  one.max_peers = 1;
  Engine target(one);
  Engine first(tcp_only());
  Engine second(tcp_only());
  Peer p = first.connect(target.address());
  EXPECT_THROW(second.connect(target.address()), Error);
  ASSERT_TRUE(log.wait_for("admission limit reached: "));
  std::vector<LogCapture::Entry> e = log.containing("admission limit reached: ");
  EXPECT_EQ(e[0].level, LogLevel::kWarn);
  EXPECT_NE(e[0].message.find("(max_peers 1)"), std::string::npos) << e[0].message;
}

TEST(Log, ListeningEverywhereWithoutASecretIsAConfigurationWarning) {
  LogCapture log(LogLevel::kWarn);
  Config open = tcp_only();
  open.listen_host = "0.0.0.0";
  { Engine e(open); }
  std::vector<LogCapture::Entry> e = log.containing("listening on every interface (0.0.0.0)");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].level, LogLevel::kWarn);
  EXPECT_EQ(e[0].component, "config");
  open.secret = "s3cret";
  { Engine e(open); }
  EXPECT_EQ(log.containing("listening on every interface").size(), 1u);
}

}  // namespace
}  // namespace ferry::test
