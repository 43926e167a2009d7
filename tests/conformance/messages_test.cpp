// Tagged send / recv and futures, the same cases for every transport
// (tests/conformance/conformance.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "conformance/conformance.hpp"

namespace ferry::test {
namespace {

TEST_P(Conformance, MessagesMatchByTagInOrderBeforeAndAfterArrival) {
  Pair& p = pair();
  Buffer src(p.initiator, 1 << 20, Access::kLocal, 11);
  Buffer dst(p.target, 1 << 20, Access::kLocal, 12);
  // Posted first, then sent.
  Future r1 = p.target_peer.recv(1, dst.region, 0, 1000);
  ASSERT_TRUE(p.peer.send(1, src.region, 0, 1000).wait(kWait).ok());
  ASSERT_TRUE(r1.wait(kWait).ok());
  EXPECT_EQ(r1.bytes(), 1000u);
  EXPECT_EQ(0, std::memcmp(src.bytes.data(), dst.bytes.data(), 1000));

  // Sent first (buffered), then received; order per tag is kept; tags do not mix.
  ASSERT_TRUE(p.peer.send(2, src.region, 100, 10).wait(kWait).ok());
  ASSERT_TRUE(p.peer.send(3, src.region, 200, 30).wait(kWait).ok());
  ASSERT_TRUE(p.peer.send(2, src.region, 300, 20).wait(kWait).ok());
  Future a = p.target_peer.recv(2, dst.region, 0, 100);
  Future b = p.target_peer.recv(2, dst.region, 100, 100);
  Future c = p.target_peer.recv(3, dst.region, 200, 100);
  ASSERT_TRUE(a.wait(kWait).ok());
  ASSERT_TRUE(b.wait(kWait).ok());
  ASSERT_TRUE(c.wait(kWait).ok());
  EXPECT_EQ(a.bytes(), 10u);
  EXPECT_EQ(b.bytes(), 20u);
  EXPECT_EQ(c.bytes(), 30u);
  EXPECT_EQ(0, std::memcmp(src.bytes.data() + 100, dst.bytes.data(), 10));
  EXPECT_EQ(0, std::memcmp(src.bytes.data() + 300, dst.bytes.data() + 100, 20));
  EXPECT_EQ(0, std::memcmp(src.bytes.data() + 200, dst.bytes.data() + 200, 30));
  // Counted once each, on the channel that carried them (the send/recv route).
  PeerStats in = p.target_peer.stats(), out = p.peer.stats();
  ASSERT_EQ(in.channels.size(), out.channels.size());
  const ChannelStats* carried = out.channel(*p.peer.routes()[2].transport);
  ASSERT_NE(carried, nullptr);
  EXPECT_EQ(carried->messages_sent, 4u);
  EXPECT_EQ(in.channel(carried->transport)->messages_received, 4u);
  uint64_t received = 0, initiator_moved = 0;  // over every channel
  for (const ChannelStats& c : in.channels) received += c.messages_received;
  for (const ChannelStats& c : out.channels)
    initiator_moved += c.messages_sent + c.messages_received;
  EXPECT_EQ(received, 4u);
  EXPECT_EQ(initiator_moved, 4u);
  EXPECT_GE(carried->lanes, 1);
}

TEST_P(Conformance, LargeMessagesAndTruncation) {
  Pair& p = pair();
  constexpr uint64_t kBig = 16 << 20;
  Buffer src(p.initiator, kBig, Access::kLocal, 13);
  Buffer dst(p.target, kBig, Access::kLocal, 14);
  Future r = p.target_peer.recv(9, dst.region, 0, kBig);
  ASSERT_TRUE(p.peer.send(9, src.region, 0, kBig).wait(kWait).ok());
  ASSERT_TRUE(r.wait(kWait).ok());
  EXPECT_EQ(src.bytes, dst.bytes);

  Future small = p.target_peer.recv(10, dst.region, 0, 16);
  Status sent = p.peer.send(10, src.region, 0, 64).wait(kWait);
  EXPECT_EQ(sent.code(), ErrorCode::kTruncated) << "the sender learns its message was cut";
  EXPECT_EQ(small.wait(kWait).code(), ErrorCode::kTruncated);
  EXPECT_EQ(small.bytes(), 16u);
}

TEST_P(Conformance, MessagesBothDirectionsAndUnexpectedLimit) {
  Config c = config();
  c.max_unexpected_bytes = 4096;
  auto owned = connect(c, c);
  Pair& p = *owned;
  Buffer a(p.initiator, 8192, Access::kLocal, 15);
  Buffer b(p.target, 8192, Access::kLocal, 16);
  ASSERT_TRUE(p.target_peer.send(4, b.region, 0, 100).wait(kWait).ok());
  Future r = p.peer.recv(4, a.region, 0, 100);
  ASSERT_TRUE(r.wait(kWait).ok());
  EXPECT_EQ(0, std::memcmp(a.bytes.data(), b.bytes.data(), 100));
  // Nobody receives: the target refuses what exceeds its buffer limit, and says so.
  Status s = p.peer.send(5, a.region, 0, 8192).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
}

// A large message sent before its receive is posted lands in that receive, in its place among
// the tag's messages (over TCP above tcp.eager_bytes it is announced and waits at the sender;
// verbs has its own rendezvous).
TEST_P(Conformance, LargeMessagesWaitForTheirReceiveAndLandInIt) {
  Config c = config();
  c.tcp.eager_bytes = 64 << 10;
  auto owned = connect(c, c);
  Pair& p = *owned;
  Buffer src(p.initiator, 1 << 20, Access::kLocal, 21);
  Buffer dst(p.target, 1 << 20, Access::kLocal, 22);
  Future big = p.peer.send(4, src.region, 0, 1 << 20);
  Future small = p.peer.send(4, src.region, 100, 1000);  // same tag: keeps its place after big
  Buffer dst2(p.target, 1000, Access::kLocal, 25);
  Future first = p.target_peer.recv(4, dst.region, 0, 1 << 20);
  Future second = p.target_peer.recv(4, dst2.region, 0, 1000);
  ASSERT_TRUE(second.wait(kWait).ok());  // the small one may land first: it was here
  ASSERT_TRUE(first.wait(kWait).ok());
  EXPECT_EQ(first.bytes(), 1u << 20);
  EXPECT_EQ(second.bytes(), 1000u);
  EXPECT_EQ(dst.bytes, src.bytes);
  EXPECT_EQ(0, std::memcmp(dst2.bytes.data(), src.bytes.data() + 100, 1000));
  ASSERT_TRUE(big.wait(kWait).ok());
  ASSERT_TRUE(small.wait(kWait).ok());
  EXPECT_EQ(p.target_peer.stats().unexpected_bytes, 0u);

  // A receive posted first takes it at once; a smaller receive truncates it, as eagerly.
  fill_pattern(src.bytes, 23);
  Future posted = p.target_peer.recv(5, dst.region, 0, 1 << 20);
  Status sent = p.peer.send(5, src.region, 0, 1 << 20).wait(kWait);
  ASSERT_TRUE(sent.ok()) << sent.to_string();
  ASSERT_TRUE(posted.wait(kWait).ok()) << posted.status().to_string();
  EXPECT_EQ(dst.bytes, src.bytes);
  Future part = p.target_peer.recv(6, dst.region, 0, 300 << 10);
  Status cut = p.peer.send(6, src.region, 0, 1 << 20).wait(kWait);
  EXPECT_EQ(cut.code(), ErrorCode::kTruncated) << cut.to_string();
  EXPECT_EQ(part.wait(kWait).code(), ErrorCode::kTruncated);
  EXPECT_EQ(part.bytes(), 300u << 10);
  EXPECT_EQ(0, std::memcmp(dst.bytes.data(), src.bytes.data(), 300 << 10));
}

// Messages of every size class the transports draw lines between (same host: inline up to
// 16 KiB, pulled, through the rings from 256 KiB to 1 MiB in 16 KiB records, pulled beyond;
// TCP: eager, then rendezvous), all of one tag: sent before their receives and after, each
// lands whole in its own receive, in order.
TEST_P(Conformance, MessagesOfEverySizeClassArriveWholeAndInOrder) {
  Pair& p = pair();
  // Inline, pulled, through the rings (256 KiB - 1 MiB, 300 KiB among them), pulled again.
  const std::vector<uint64_t> sizes = {
      0,  1,     16 << 10,        (16 << 10) + 1, 300 << 10, 256 << 10,
      15, 40000, (256 << 10) + 1, (1 << 20) - 7,  1 << 20,   (1 << 20) + 1};
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  Buffer src(p.initiator, total, Access::kLocal, 31);
  Buffer dst(p.target, total, Access::kLocal, 32);
  // One op per size, each on the next bytes of its buffer.
  auto each_size = [&](const std::function<Future(uint64_t, uint64_t)>& op) {
    std::vector<Future> out;
    uint64_t at = 0;
    for (uint64_t n : sizes) {
      out.push_back(op(at, n));
      at += n;
    }
    return out;
  };
  auto sends = [&] {
    return each_size([&](uint64_t at, uint64_t n) { return p.peer.send(7, src.region, at, n); });
  };
  auto receives = [&] {
    return each_size(
        [&](uint64_t at, uint64_t n) { return p.target_peer.recv(7, dst.region, at, n); });
  };
  for (bool receives_first : {false, true}) {
    SCOPED_TRACE(receives_first ? "receives posted first" : "messages sent first");
    fill_pattern(src.bytes, receives_first ? 33 : 34);
    std::vector<Future> got, sent;
    if (receives_first) got = receives();
    sent = sends();
    if (!receives_first) got = receives();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Status r = got[i].wait(kWait);
      ASSERT_TRUE(r.ok()) << "message " << i << " (" << sizes[i] << " bytes): " << r.to_string();
      EXPECT_EQ(got[i].bytes(), sizes[i]) << "message " << i;
      Status s = sent[i].wait(kWait);
      ASSERT_TRUE(s.ok()) << "message " << i << ": " << s.to_string();
    }
    EXPECT_EQ(dst.bytes, src.bytes);
    EXPECT_EQ(p.target_peer.stats().unexpected_bytes, 0u);
  }
  uint64_t received = 0;  // once per message, however many records or frames carried it
  for (const ChannelStats& c : p.target_peer.stats().channels) received += c.messages_received;
  EXPECT_EQ(received, 2 * sizes.size());
}

TEST_P(Conformance, DeregisteringFailsTheReceivesPostedIntoTheRegion) {
  Pair& p = pair();
  Buffer a(p.initiator, 64, Access::kLocal, 19);
  std::vector<uint8_t> inbox(64, 0);
  Region doomed = p.target.register_memory(inbox.data(), inbox.size(), Access::kLocal);
  Future never = p.target_peer.recv(8, doomed, 0, 64);
  doomed.deregister();  // returns: the receive no longer holds the region
  EXPECT_EQ(never.wait(kWait).code(), ErrorCode::kRevoked) << never.status().to_string();
  // A message for that tag now waits for another receive; the peer is unaffected.
  ASSERT_TRUE(p.peer.send(8, a.region, 0, 64).wait(kWait).ok());
  Buffer b(p.target, 64, Access::kLocal, 20);
  ASSERT_TRUE(p.target_peer.recv(8, b.region, 0, 64).wait(kWait).ok());
  EXPECT_EQ(b.bytes, a.bytes);
  EXPECT_TRUE(std::all_of(inbox.begin(), inbox.end(), [](uint8_t x) { return x == 0; }));
}

TEST_P(Conformance, FutureWaitTimesOutThenCompletesAndCallsBack) {
  Pair& p = pair();
  Buffer a(p.initiator, 64, Access::kLocal, 17);
  Buffer b(p.target, 64, Access::kLocal, 18);
  Future r = p.target_peer.recv(77, b.region, 0, 64);
  EXPECT_EQ(r.wait(std::chrono::milliseconds(20)).code(), ErrorCode::kTimeout);
  EXPECT_FALSE(r.test());
  EXPECT_EQ(r.status().code(), ErrorCode::kInProgress);
  std::atomic<int> called{0};
  std::atomic<int> order{0};
  r.then([&](const Status& s) {
    EXPECT_TRUE(s.ok());
    EXPECT_EQ(order.fetch_add(1), 0);
    called++;
  });
  // A second callback runs too, after the first: none replaces another.
  r.then([&](const Status&) {
    EXPECT_EQ(order.fetch_add(1), 1);
    called++;
  });
  ASSERT_TRUE(p.peer.send(77, a.region, 0, 64).wait(kWait).ok());
  ASSERT_TRUE(r.wait(kWait).ok());
  EXPECT_TRUE(r.test());
  auto deadline = Clock::now() + kWait;
  while (called.load() < 2 && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(called.load(), 2);
  // then() on a finished future runs at once.
  r.then([&](const Status&) { called++; });
  EXPECT_EQ(called.load(), 3);
  Future copy = r;
  EXPECT_TRUE(copy.test());
}

}  // namespace
}  // namespace ferry::test
