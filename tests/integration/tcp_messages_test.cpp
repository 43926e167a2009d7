// Tagged messages where TCP's own protocol shows: an announced large message (what every
// transport does with messages is in tests/conformance/messages_test.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "support/pair.hpp"
#include "transport/matcher.hpp"

namespace ferry::test {
namespace {

// Over TCP a message above tcp.eager_bytes is announced, not buffered: its bytes wait at the
// sender until a receive takes it (the outcomes every transport shares are conformance cases).
TEST(SendRecv, ALargeMessageIsAnnouncedAndWaitsAtTheSender) {
  Config c = test_config();
  c.transports = {TransportKind::kTcp};
  c.tcp.eager_bytes = 64 << 10;
  Pair p(c, c);
  ASSERT_EQ(p.peer.transport(), TransportKind::kTcp);
  Buffer src(p.initiator, 1 << 20, Access::kLocal, 21);
  Buffer dst(p.target, 1 << 20, Access::kLocal, 22);
  Future big = p.peer.send(4, src.region, 0, 1 << 20);
  ASSERT_TRUE(p.peer.send(4, src.region, 100, 1000).wait(kWait).ok());
  // The receiver holds the small message and an announcement.
  auto deadline = Clock::now() + kWait;
  while (p.target_peer.stats().unexpected_messages < 2 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  PeerStats held = p.target_peer.stats();
  EXPECT_EQ(held.unexpected_messages, 2u);
  EXPECT_EQ(held.unexpected_bytes, 1000u + 2 * transport::Matcher::kUnexpectedOverheadBytes);
  EXPECT_FALSE(big.test()) << "a large send completes only once a receive took it";
  ASSERT_TRUE(p.target_peer.recv(4, dst.region, 0, 1 << 20).wait(kWait).ok());
  ASSERT_TRUE(big.wait(kWait).ok());
  EXPECT_EQ(dst.bytes, src.bytes);
}

TEST(SendRecv, AnAnnouncedMessageFailsWithItsPeer) {
  Config c = test_config();
  c.transports = {TransportKind::kTcp};
  c.tcp.eager_bytes = 4096;
  Pair p(c, c);
  Buffer src(p.initiator, 1 << 20, Access::kLocal, 24);
  Future waiting = p.peer.send(7, src.region, 0, 1 << 20);
  p.target_peer.close();
  Status s = waiting.wait(kWait);
  EXPECT_TRUE(s.code() == ErrorCode::kPeerLost || s.code() == ErrorCode::kCancelled)
      << s.to_string();
}

}  // namespace
}  // namespace ferry::test
