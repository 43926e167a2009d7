// Batches, concurrency, both directions, write_with_imm and tagged send/recv.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "support/pair.hpp"
#include "transport/matcher.hpp"

namespace ferry::test {
namespace {

TEST(Batch, TenThousandScatteredEntriesWriteAndRead) {
  Pair p;
  constexpr int kEntries = 10000;
  constexpr uint64_t kEntry = 333;  // odd size: entries straddle every alignment
  Buffer local(p.initiator, kEntries * kEntry, Access::kLocal, 3);
  Buffer remote(p.target, kEntries * kEntry * 2, Access::kRemoteReadWrite, 4);
  Descriptor d = remote.region.descriptor();
  std::vector<Transfer> batch;
  for (int i = 0; i < kEntries; ++i) {
    // Reverse order and a stride of two on the remote side: nothing is contiguous.
    uint64_t r = static_cast<uint64_t>(kEntries - 1 - i) * kEntry * 2;
    batch.push_back({&local.region, static_cast<uint64_t>(i) * kEntry, &d, r, kEntry});
  }
  Future w = p.peer.write(batch);
  ASSERT_TRUE(w.wait(kWait).ok()) << w.status().to_string();
  EXPECT_EQ(w.bytes(), kEntries * kEntry);
  for (int i = 0; i < kEntries; ++i) {
    uint64_t r = static_cast<uint64_t>(kEntries - 1 - i) * kEntry * 2;
    ASSERT_EQ(0, std::memcmp(local.bytes.data() + i * kEntry, remote.bytes.data() + r, kEntry))
        << i;
  }
  std::vector<uint8_t> expected = local.bytes;
  std::fill(local.bytes.begin(), local.bytes.end(), 0);
  ASSERT_TRUE(p.peer.read(batch).wait(kWait).ok());
  EXPECT_EQ(expected, local.bytes);
}

TEST(Concurrency, ManyThreadsBothDirectionsOnePeer) {
  Pair p;
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 40;
  constexpr uint64_t kSlot = 3 << 20;
  Buffer init_side(p.initiator, kThreads * kSlot, Access::kRemoteReadWrite, 5);
  Buffer target_side(p.target, kThreads * kSlot, Access::kRemoteReadWrite, 6);
  Descriptor at_target = target_side.region.descriptor();
  Descriptor at_initiator = init_side.region.descriptor();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Even threads push initiator -> target, odd ones target -> initiator, in disjoint slots.
      bool forward = t % 2 == 0;
      const Peer& peer = forward ? p.peer : p.target_peer;
      Buffer& src = forward ? init_side : target_side;
      Buffer& dst = forward ? target_side : init_side;
      const Descriptor& d = forward ? at_target : at_initiator;
      uint64_t base = static_cast<uint64_t>(t) * kSlot;
      std::vector<Future> inflight;
      for (int i = 0; i < kOpsPerThread; ++i) {
        uint64_t len = 1 + (static_cast<uint64_t>(i) * 104729) % kSlot;
        uint64_t off = (static_cast<uint64_t>(i) * 7919) % (kSlot - len + 1);
        Transfer tr{&src.region, base + off, &d, base + off, len};
        // Keep a few operations in flight per thread; wait in order.
        inflight.push_back(peer.write({&tr, 1}));
        if (inflight.size() == 4 || i == kOpsPerThread - 1) {
          for (auto& f : inflight) {
            if (!f.wait(kWait).ok()) failures++;
          }
          inflight.clear();
        }
      }
      (void)dst;
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  // Every slot's last-written bytes match the source (the writes overlap, the sources don't
  // change).
  for (int t = 0; t < kThreads; ++t) {
    bool forward = t % 2 == 0;
    Buffer& src = forward ? init_side : target_side;
    Buffer& dst = forward ? target_side : init_side;
    uint64_t base = static_cast<uint64_t>(t) * kSlot;
    for (int i = 0; i < kOpsPerThread; ++i) {
      uint64_t len = 1 + (static_cast<uint64_t>(i) * 104729) % kSlot;
      uint64_t off = (static_cast<uint64_t>(i) * 7919) % (kSlot - len + 1);
      ASSERT_EQ(0, std::memcmp(src.bytes.data() + base + off, dst.bytes.data() + base + off, len))
          << t << " " << i;
    }
  }
}

TEST(WriteWithImm, CallbackDeliversAndRefusedWritesNotifyNothing) {
  Pair p;
  Buffer local(p.initiator, 1 << 20, Access::kLocal, 9);
  Buffer remote(p.target, 1 << 20, Access::kRemoteWrite, 10);
  Descriptor d = remote.region.descriptor();
  std::atomic<int> seen{0};
  std::atomic<uint32_t> last{0};
  p.target.on_imm([&](const ImmEvent& e) {
    last = e.imm;
    seen++;
  });
  Descriptor forged = d;
  forged.keys[0].bytes[1] ^= 0x40;
  Transfer bad{&local.region, 0, &forged, 0, 1 << 20};
  EXPECT_EQ(p.peer.write_with_imm({&bad, 1}, 1).wait(kWait).code(), ErrorCode::kWrongKey);
  Transfer good{&local.region, 0, &d, 0, 1 << 20};
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(p.peer.write_with_imm({&good, 1}, 100 + i).wait(kWait).ok());
  auto deadline = Clock::now() + kWait;
  while (seen.load() < 20 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(seen.load(), 20) << "the refused write must not notify";
  EXPECT_EQ(last.load(), 119u);
}

TEST(WriteWithImm, APeerWhoseNotificationsAreNotTakenIsClosed) {
  Config tc = test_config();
  tc.max_queued_imms = 5;
  Pair p(tc);
  Buffer local(p.initiator, 64, Access::kLocal, 11);
  Buffer remote(p.target, 64, Access::kRemoteWrite, 12);
  Descriptor d = remote.region.descriptor();
  Transfer t{&local.region, 0, &d, 0, 64};
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(p.peer.write_with_imm({&t, 1}, i).wait(kWait).ok());
  // The sixth finds the peer's queue full: the peer is closed, loudly.
  (void)p.peer.write_with_imm({&t, 1}, 5).wait(kWait);
  auto deadline = Clock::now() + kWait;
  while (p.target_peer.connected() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_FALSE(p.target_peer.connected());
  // What was queued before stays receivable, in order.
  for (uint32_t i = 0; i < 5; ++i) {
    auto ev = p.target.next_imm(kWait);
    ASSERT_TRUE(ev.has_value());
    EXPECT_EQ(ev->imm, i);
  }
  EXPECT_FALSE(p.target.next_imm(std::chrono::milliseconds(50)).has_value());
}

TEST(SendRecv, MatchesByTagInOrderBeforeAndAfterArrival) {
  Pair p;
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

TEST(SendRecv, LargeMessagesAndTruncation) {
  Pair p;
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

TEST(SendRecv, BothDirectionsAndUnexpectedLimit) {
  Config c = test_config();
  c.max_unexpected_bytes = 4096;
  Pair p(c, c);
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

// Over TCP a message above tcp.eager_bytes is announced; its bytes wait at the sender until a
// receive takes it, and then land in that receive. (Over verbs, large messages have their own
// rendezvous; this checks the same outcomes there.)
TEST(SendRecv, LargeMessagesWaitForTheirReceiveAndLandInIt) {
  Config c = test_config();
  c.tcp.eager_bytes = 64 << 10;
  Pair p(c, c);
  Buffer src(p.initiator, 1 << 20, Access::kLocal, 21);
  Buffer dst(p.target, 1 << 20, Access::kLocal, 22);
  Future big = p.peer.send(4, src.region, 0, 1 << 20);
  Future small = p.peer.send(4, src.region, 100, 1000);  // same tag: keeps its place after big
  bool tcp = p.peer.transport() == TransportKind::kTcp;
  if (tcp) {
    // Announced, not buffered: the receiver holds the small message and an announcement.
    auto deadline = Clock::now() + kWait;
    while (p.target_peer.stats().unexpected_messages < 2 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    PeerStats held = p.target_peer.stats();
    EXPECT_EQ(held.unexpected_messages, 2u);
    EXPECT_EQ(held.unexpected_bytes, 1000u + 2 * transport::Matcher::kUnexpectedOverheadBytes);
    EXPECT_FALSE(big.test()) << "a large send completes only once a receive took it";
  }
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

TEST(SendRecv, AnAnnouncedMessageFailsWithItsPeer) {
  Config c = test_config();
  c.tcp.eager_bytes = 4096;
  Pair p(c, c);
  Buffer src(p.initiator, 1 << 20, Access::kLocal, 24);
  Future waiting = p.peer.send(7, src.region, 0, 1 << 20);
  p.target_peer.close();
  Status s = waiting.wait(kWait);
  EXPECT_TRUE(s.code() == ErrorCode::kPeerLost || s.code() == ErrorCode::kCancelled)
      << s.to_string();
}

TEST(SendRecv, DeregisteringFailsTheReceivesPostedIntoTheRegion) {
  Pair p;
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

TEST(Future, WaitTimesOutThenCompletesAndCallsBack) {
  Pair p;
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
