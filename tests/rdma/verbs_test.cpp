// The verbs transport against a real device: runs in the Soft-RoCE guest (make test-rdma),
// where rxe0 exists. Two engines in one process connect through the guest's own RoCE GID.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

class Verbs : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(p.peer.transport(), TransportKind::kVerbs) << "no verbs device: run in the guest";
    ASSERT_EQ(p.target_peer.transport(), TransportKind::kVerbs);
  }
  Pair p;
};

// Completions that no caller polls for: the send queue must wake the progress thread for them.
TEST_F(Verbs, CompletionsWithoutAWaiter) {
  constexpr int kOps = 64;
  constexpr uint64_t kSize = 256;
  Buffer local(p.initiator, kOps * kSize, Access::kLocal, 14);
  Buffer remote(p.target, kOps * kSize, Access::kRemoteWrite, 15);
  Descriptor d = remote.region.descriptor();
  auto transfer = [&](int i) {
    uint64_t off = static_cast<uint64_t>(i) * kSize;
    return Transfer{&local.region, off, &d, off, kSize};
  };

  // A waited write first: its waiter polls, so afterwards no completion event is armed.
  Transfer first = transfer(0);
  ASSERT_TRUE(p.peer.write({&first, 1}).wait(kWait).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));

  // Callbacks only: no wait(), no test(); the futures stay alive meanwhile.
  std::atomic<int> called{0}, succeeded{0};
  std::vector<Future> watched;
  for (int i = 0; i < kOps; ++i) {
    Transfer t = transfer(i);
    watched.push_back(p.peer.write({&t, 1}));
    watched.back().then([&](const Status& s) {
      succeeded += s.ok() ? 1 : 0;
      ++called;
    });
  }
  auto deadline = Clock::now() + kWait;
  while (called.load() < kOps && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(called.load(), kOps);
  EXPECT_EQ(succeeded.load(), kOps);
  EXPECT_EQ(local.bytes, remote.bytes);

  // Futures kept but never waited for: deregistering their source waits for them, which needs
  // their completions handled.
  fill_pattern(local.bytes, 16);
  std::vector<Future> kept;
  for (int i = 0; i < kOps; ++i) {
    Transfer t = transfer(i);
    kept.push_back(p.peer.write({&t, 1}));
  }
  local.region.deregister();
  for (const Future& f : kept) {
    ASSERT_TRUE(f.test());
    EXPECT_TRUE(f.status().ok()) << f.status().to_string();
  }
  EXPECT_EQ(local.bytes, remote.bytes);
}

// Waiters that sleep at once (no spin) are woken through the completion channel.
TEST(VerbsNoSpin, SleepingWaitersAreWoken) {
  Config c = test_config();
  c.wait_spin = std::chrono::microseconds(0);
  Pair q(c, c);
  ASSERT_EQ(q.peer.transport(), TransportKind::kVerbs);
  Buffer local(q.initiator, 4096, Access::kLocal, 17);
  Buffer remote(q.target, 4096, Access::kRemoteReadWrite, 18);
  Descriptor d = remote.region.descriptor();
  for (int i = 0; i < 200; ++i) {
    Transfer t{&local.region, static_cast<uint64_t>(i), &d, static_cast<uint64_t>(i * 7), 64};
    Status s = (i % 2 == 0 ? q.peer.write({&t, 1}) : q.peer.read({&t, 1})).wait(kWait);
    ASSERT_TRUE(s.ok()) << i << ": " << s.to_string();
    ASSERT_EQ(0, std::memcmp(local.bytes.data() + i, remote.bytes.data() + i * 7, 64)) << i;
  }
}

TEST_F(Verbs, ConcurrentThreadsAndMessages) {
  constexpr int kThreads = 3;
  constexpr uint64_t kSlot = 512 << 10;
  Buffer local(p.initiator, kThreads * kSlot, Access::kLocal, 7);
  Buffer remote(p.target, kThreads * kSlot, Access::kRemoteWrite, 8);
  Descriptor d = remote.region.descriptor();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i <= 10; ++i) {
        // Varying lengths, and the whole slot last, so the final contents are known.
        uint64_t len = i == 10 ? kSlot : 1 + (static_cast<uint64_t>(i) * 65537) % kSlot;
        Transfer tr{&local.region, t * kSlot, &d, t * kSlot, len};
        if (!p.peer.write({&tr, 1}).wait(kWait).ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(local.bytes, remote.bytes);
  Future r = p.target_peer.recv(7, remote.region, 0, 4096);
  ASSERT_TRUE(p.peer.send(7, local.region, 0, 4096).wait(kWait).ok());
  ASSERT_TRUE(r.wait(kWait).ok());
}

// ---------------------------------------------------------------------------------------------
// Tagged messages over verbs

TEST_F(Verbs, SmallMessagesGoEagerOverVerbs) {
  Buffer src(p.initiator, 128 << 10, Access::kLocal, 20);
  Buffer dst(p.target, 128 << 10, Access::kLocal, 21);
  // Posted first, then sent; an empty message; the largest eager one (64 KiB + 16).
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{100}, uint64_t{65552}}) {
    SCOPED_TRACE(size);
    Future r = p.target_peer.recv(1, dst.region, 0, 65552);
    ASSERT_TRUE(p.peer.send(1, src.region, size % 5, size).wait(kWait).ok());
    ASSERT_TRUE(r.wait(kWait).ok()) << r.status().to_string();
    EXPECT_EQ(r.bytes(), size);
    EXPECT_EQ(0, std::memcmp(src.bytes.data() + size % 5, dst.bytes.data(), size));
  }
  // (Sent first, then received, in order per tag: SendRecv.* in the guest's `messages` run.)
  // Both directions over the one connection.
  Future back = p.peer.recv(4, src.region, 0, 64);
  ASSERT_TRUE(p.target_peer.send(4, dst.region, 0, 64).wait(kWait).ok());
  ASSERT_TRUE(back.wait(kWait).ok());
  // Every one went over verbs, none over TCP.
  PeerStats target = p.target_peer.stats(), initiator = p.peer.stats();
  const ChannelStats& target_verbs = *target.channel(TransportKind::kVerbs);
  const ChannelStats& initiator_verbs = *initiator.channel(TransportKind::kVerbs);
  EXPECT_EQ(target_verbs.messages_received, 4u);
  EXPECT_EQ(initiator_verbs.messages_sent, 4u);
  EXPECT_EQ(initiator_verbs.messages_received, 1u);
  EXPECT_EQ(target.channel(TransportKind::kTcp)->messages_received +
                initiator.channel(TransportKind::kTcp)->messages_received,
            0u);
  EXPECT_EQ(target_verbs.messages_zero_copy, 0u);
}

// Many eager messages in flight: their ACKs go out several to a message (up to 4 senders' ops
// named in one), and a refusal among them still reaches its own sender alone.
TEST_F(Verbs, EagerMessagesInFlightAreEachAcknowledged) {
  constexpr int kMessages = 64;
  constexpr uint64_t kSize = 64 << 10;
  Buffer src(p.initiator, kSize * kMessages, Access::kLocal, 40);
  Buffer dst(p.target, kSize * kMessages, Access::kLocal, 41);
  std::vector<Future> recvs, sends;
  for (int i = 0; i < kMessages; ++i) {
    // Message 10's receive is too small: that send alone fails, truncated.
    uint64_t capacity = i == 10 ? 100 : kSize;
    recvs.push_back(p.target_peer.recv(11, dst.region, i * kSize, capacity));
  }
  for (int i = 0; i < kMessages; ++i)
    sends.push_back(p.peer.send(11, src.region, i * kSize, kSize));
  for (int i = 0; i < kMessages; ++i) {
    SCOPED_TRACE(i);
    Status sent = sends[i].wait(kWait), received = recvs[i].wait(kWait);
    if (i == 10) {
      EXPECT_EQ(sent.code(), ErrorCode::kTruncated) << sent.to_string();
      EXPECT_EQ(received.code(), ErrorCode::kTruncated) << received.to_string();
      EXPECT_EQ(0, std::memcmp(src.bytes.data() + i * kSize, dst.bytes.data() + i * kSize, 100));
      continue;
    }
    ASSERT_TRUE(sent.ok()) << sent.to_string();
    ASSERT_TRUE(received.ok()) << received.to_string();
    EXPECT_EQ(0, std::memcmp(src.bytes.data() + i * kSize, dst.bytes.data() + i * kSize, kSize));
  }
  EXPECT_EQ(p.peer.stats().channel(TransportKind::kVerbs)->messages_sent,
            static_cast<uint64_t>(kMessages));
  // Replies after the messages were taken: the connection is in order both ways.
  Future back = p.peer.recv(12, src.region, 0, 64);
  ASSERT_TRUE(p.target_peer.send(12, dst.region, 0, 64).wait(kWait).ok());
  ASSERT_TRUE(back.wait(kWait).ok());
}

// Eager messages with tags below 2^32 go compact (no header, the tag in the immediate, ACKed by
// count), the others with a header (ACKed by op id). Interleaved, with refusals of both kinds
// and messages nobody receives yet, each send learns its own outcome and each receive gets its
// own bytes.
TEST_F(Verbs, CompactAndHeaderedMessagesInterleavedKeepTheirOwnOutcomes) {
  constexpr int kMessages = 48;
  constexpr uint64_t kSize = 64 << 10;
  // The largest tag that goes compact, and the smallest that does not.
  constexpr uint64_t kSmallTag = UINT32_MAX, kWideTag = uint64_t{1} << 32;
  Buffer src(p.initiator, kSize * kMessages, Access::kLocal, 42);
  Buffer dst(p.target, kSize * kMessages, Access::kLocal, 43);
  auto tag_of = [&](int i) { return i % 3 == 0 ? kWideTag : kSmallTag; };
  auto size_of = [&](int i) { return i % 4 == 1 ? kSize : static_cast<uint64_t>(1 + i * 97); };
  auto truncated = [](int i) { return i == 7 || i == 9; };  // 7 compact, 9 with a header
  std::vector<Future> recvs(kMessages), sends;
  // The first half's receives are posted first; the second half arrives unexpected.
  for (int i = 0; i < kMessages / 2; ++i)
    recvs[i] = p.target_peer.recv(tag_of(i), dst.region, i * kSize, truncated(i) ? 10 : kSize);
  for (int i = 0; i < kMessages; ++i)
    sends.push_back(p.peer.send(tag_of(i), src.region, i * kSize, size_of(i)));
  for (int i = kMessages / 2; i < kMessages; ++i)
    recvs[i] = p.target_peer.recv(tag_of(i), dst.region, i * kSize, kSize);
  for (int i = 0; i < kMessages; ++i) {
    SCOPED_TRACE(i);
    Status sent = sends[i].wait(kWait), received = recvs[i].wait(kWait);
    uint64_t landed = truncated(i) ? 10 : size_of(i);
    if (truncated(i)) {
      EXPECT_EQ(sent.code(), ErrorCode::kTruncated) << sent.to_string();
      EXPECT_EQ(received.code(), ErrorCode::kTruncated) << received.to_string();
    } else {
      ASSERT_TRUE(sent.ok()) << sent.to_string();
      ASSERT_TRUE(received.ok()) << received.to_string();
      EXPECT_EQ(recvs[i].bytes(), size_of(i));
    }
    EXPECT_EQ(0, std::memcmp(src.bytes.data() + i * kSize, dst.bytes.data() + i * kSize, landed));
  }
  PeerStats stats = p.target_peer.stats();
  const ChannelStats& target = *stats.channel(TransportKind::kVerbs);
  EXPECT_EQ(target.messages_received, static_cast<uint64_t>(kMessages));
  EXPECT_EQ(target.messages_compact, static_cast<uint64_t>(kMessages - kMessages / 3))
      << "every message with the small tag, none with the wide one";
  // The largest compact message and an empty one.
  Future largest = p.target_peer.recv(kSmallTag, dst.region, 0, 65552);
  ASSERT_TRUE(p.peer.send(kSmallTag, src.region, 3, 65552).wait(kWait).ok());
  ASSERT_TRUE(largest.wait(kWait).ok()) << largest.status().to_string();
  EXPECT_EQ(largest.bytes(), 65552u);
  EXPECT_EQ(0, std::memcmp(src.bytes.data() + 3, dst.bytes.data(), 65552));
  Future empty = p.target_peer.recv(0, dst.region, 0, 64);
  ASSERT_TRUE(p.peer.send(0, src.region, 0, 0).wait(kWait).ok());
  ASSERT_TRUE(empty.wait(kWait).ok());
  EXPECT_EQ(empty.bytes(), 0u);
}

// Refusals among compact messages whose ACKs are batched: with nobody receiving, the limit on
// unmatched messages refuses some; each send learns its own outcome, in order.
TEST(VerbsMessages, CompactMessagesRefusedAmongTakenOnesFailAlone) {
  Config c = test_config();
  c.max_unexpected_messages = 5;
  Pair p(c, c);
  ASSERT_EQ(p.peer.transport(), TransportKind::kVerbs);
  constexpr int kMessages = 12;
  Buffer src(p.initiator, 4096, Access::kLocal, 44);
  std::vector<Future> sends;
  for (int i = 0; i < kMessages; ++i) sends.push_back(p.peer.send(21, src.region, 0, 100 + i));
  for (int i = 0; i < kMessages; ++i) {
    SCOPED_TRACE(i);
    Status s = sends[i].wait(kWait);
    if (i < 5) {
      EXPECT_TRUE(s.ok()) << s.to_string();
    } else {
      EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
    }
  }
  EXPECT_EQ(p.target_peer.stats().channel(TransportKind::kVerbs)->messages_compact,
            static_cast<uint64_t>(kMessages));
  // What was taken is intact and in order; the connection still works both ways.
  Buffer dst(p.target, 4096, Access::kLocal, 45);
  for (int i = 0; i < 5; ++i) {
    Future r = p.target_peer.recv(21, dst.region, 0, 4096);
    ASSERT_TRUE(r.wait(kWait).ok()) << r.status().to_string();
    EXPECT_EQ(r.bytes(), static_cast<uint64_t>(100 + i));
    EXPECT_EQ(0, std::memcmp(src.bytes.data(), dst.bytes.data(), 100 + i));
  }
  Future back = p.peer.recv(22, src.region, 0, 64);
  ASSERT_TRUE(p.target_peer.send(22, dst.region, 0, 64).wait(kWait).ok());
  ASSERT_TRUE(back.wait(kWait).ok());
}

// A large message: announced, then written by the sender straight into a posted receive buffer
// that grants remote write (where the receiver allows zero-copy), or sent in chunks and copied;
// with no receive posted, buffered at the receiver as over TCP.
void expect_large_message(Pair& p, Access receive_access, bool zero_copy) {
  constexpr uint64_t kSize = (5 << 20) + 13;
  Buffer src(p.initiator, kSize + 7, Access::kLocal, 22);
  Buffer dst(p.target, kSize + 64, receive_access, 23);
  uint64_t zero_copied = p.target_peer.stats().channel(TransportKind::kVerbs)->messages_zero_copy;
  // Receive posted first.
  Future r = p.target_peer.recv(5, dst.region, 3, kSize);
  ASSERT_TRUE(p.peer.send(5, src.region, 7, kSize).wait(kWait).ok());
  ASSERT_TRUE(r.wait(kWait).ok()) << r.status().to_string();
  EXPECT_EQ(r.bytes(), kSize);
  EXPECT_EQ(0, std::memcmp(src.bytes.data() + 7, dst.bytes.data() + 3, kSize));
  // Sent first: buffered by the receiver, the send completes without a receive.
  fill_pattern(src.bytes.data(), src.bytes.size(), 24);
  ASSERT_TRUE(p.peer.send(6, src.region, 0, kSize).wait(kWait).ok());
  Future r2 = p.target_peer.recv(6, dst.region, 0, kSize + 64);
  ASSERT_TRUE(r2.wait(kWait).ok()) << r2.status().to_string();
  EXPECT_EQ(r2.bytes(), kSize);
  EXPECT_EQ(0, std::memcmp(src.bytes.data(), dst.bytes.data(), kSize));
  // Truncated: both sides learn it; nothing beyond the receive buffer is touched.
  std::vector<uint8_t> tail(dst.bytes.begin() + 4096 * 3, dst.bytes.end());
  Future small = p.target_peer.recv(7, dst.region, 0, 4096 * 3);
  Status sent = p.peer.send(7, src.region, 1, kSize).wait(kWait);
  EXPECT_EQ(sent.code(), ErrorCode::kTruncated) << sent.to_string();
  EXPECT_EQ(small.wait(kWait).code(), ErrorCode::kTruncated);
  EXPECT_EQ(small.bytes(), 4096u * 3);
  EXPECT_EQ(0, std::memcmp(src.bytes.data() + 1, dst.bytes.data(), 4096 * 3));
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), dst.bytes.begin() + 4096 * 3));
  EXPECT_EQ(p.target_peer.stats().channel(TransportKind::kVerbs)->messages_zero_copy - zero_copied,
            zero_copy ? 2u : 0u);
  EXPECT_EQ(p.target_peer.stats().channel(TransportKind::kTcp)->messages_received, 0u);
}

TEST(VerbsMessages, LargeMessageIntoARemotelyWritableBufferIsZeroCopyWhenAllowed) {
  Config target = test_config();
  target.verbs.zero_copy_receives = true;
  Pair allowed(target, test_config());
  ASSERT_EQ(allowed.peer.transport(), TransportKind::kVerbs);
  expect_large_message(allowed, Access::kRemoteWrite, true);
}

TEST_F(Verbs, ZeroCopyIsOffByDefault) {
  expect_large_message(p, Access::kRemoteWrite, false);  // the peer never learns the rkey
}

TEST_F(Verbs, LargeMessageIntoALocalBufferIsChunked) {
  expect_large_message(p, Access::kLocal, false);
}

TEST_F(Verbs, MixedSizesKeepTheirOrderPerTag) {
  Buffer src(p.initiator, 1 << 20, Access::kLocal, 25);
  Buffer dst(p.target, 5 << 20, Access::kRemoteWrite, 26);
  const uint64_t sizes[] = {10, 1 << 20, 20, 300 << 10, 0};
  std::vector<Future> sends;
  for (uint64_t size : sizes) sends.push_back(p.peer.send(8, src.region, 0, size));
  std::vector<Future> recvs;
  for (int i = 0; i < 5; ++i) recvs.push_back(p.target_peer.recv(8, dst.region, i << 20, 1 << 20));
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(sends[i].wait(kWait).ok()) << sends[i].status().to_string();
    ASSERT_TRUE(recvs[i].wait(kWait).ok()) << recvs[i].status().to_string();
    EXPECT_EQ(recvs[i].bytes(), sizes[i]);
    EXPECT_EQ(0, std::memcmp(src.bytes.data(), dst.bytes.data() + (i << 20), sizes[i]));
  }
}

TEST(VerbsMessages, NobodyReceivingRefusesBeyondTheLimit) {
  Config c = test_config();
  c.max_unexpected_bytes = 1 << 20;
  Pair p(c, c);
  ASSERT_EQ(p.peer.transport(), TransportKind::kVerbs);
  Buffer a(p.initiator, 1 << 20, Access::kLocal, 27);
  ASSERT_TRUE(p.peer.send(9, a.region, 0, 4000).wait(kWait).ok());
  ASSERT_TRUE(p.peer.send(9, a.region, 0, 1040000).wait(kWait).ok());
  // Eager and announced messages both count against the limit.
  Status eager = p.peer.send(9, a.region, 0, 8000).wait(kWait);
  EXPECT_EQ(eager.code(), ErrorCode::kResourceExhausted) << eager.to_string();
  EXPECT_NE(eager.message().find("limit"), std::string::npos) << "the receiver's text arrives";
  Status large = p.peer.send(9, a.region, 0, 100000).wait(kWait);
  EXPECT_EQ(large.code(), ErrorCode::kResourceExhausted) << large.to_string();
  EXPECT_EQ(p.peer.stats().channel(TransportKind::kVerbs)->messages_sent, 2u);
  // What was taken is intact and in order.
  Buffer b(p.target, 1 << 20, Access::kLocal, 30);
  Future first = p.target_peer.recv(9, b.region, 0, 1 << 20);
  ASSERT_TRUE(first.wait(kWait).ok());
  EXPECT_EQ(first.bytes(), 4000u);
  EXPECT_EQ(0, std::memcmp(a.bytes.data(), b.bytes.data(), 4000));
  Future second = p.target_peer.recv(9, b.region, 0, 1 << 20);
  ASSERT_TRUE(second.wait(kWait).ok());
  EXPECT_EQ(second.bytes(), 1040000u);
  EXPECT_EQ(0, std::memcmp(a.bytes.data(), b.bytes.data(), 1040000));
}

TEST(VerbsMessages, APeerThatLeavesFailsWaitingMessages) {
  auto p = std::make_unique<Pair>();
  ASSERT_EQ(p->peer.transport(), TransportKind::kVerbs);
  Buffer a(p->initiator, 2 << 20, Access::kLocal, 28);
  Buffer b(p->target, 2 << 20, Access::kLocal, 29);
  // Buffered by the target, which then leaves: a large message that arrived stays receivable.
  ASSERT_TRUE(p->target_peer.send(10, b.region, 0, 2 << 20).wait(kWait).ok());
  Future waiting = p->peer.recv(11, a.region, 0, 64);  // nobody sends it
  p->target.shutdown();
  EXPECT_EQ(waiting.wait(kWait).code(), ErrorCode::kPeerLost) << waiting.status().to_string();
  Future late = p->peer.recv(10, a.region, 0, 2 << 20);
  ASSERT_TRUE(late.wait(kWait).ok()) << late.status().to_string();
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST_F(Verbs, TheNicRefusesWhatWasNotGranted) {
  Buffer local(p.initiator, 4096, Access::kLocal, 9);
  Buffer remote(p.target, 4096, Access::kRemoteRead, 10);
  std::vector<uint8_t> before = remote.bytes;
  Descriptor forged = remote.region.descriptor();
  forged.access = Access::kRemoteReadWrite;  // passes the initiator's own check
  Transfer t{&local.region, 0, &forged, 0, 4096};
  Status s = p.peer.write({&t, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kPermissionDenied) << s.to_string();
  EXPECT_NE(s.message().find("work completion"), std::string::npos) << s.message();
  EXPECT_EQ(before, remote.bytes);
  // A queue pair in error fails the path: later operations fail at once, nothing hangs.
  Transfer again{&local.region, 0, &forged, 0, 8};
  Status later = p.peer.write({&again, 1}).wait(kWait);
  EXPECT_FALSE(later.ok());
  EXPECT_NE(later.code(), ErrorCode::kTimeout);
}

TEST_F(Verbs, ARevokedRegionIsRefusedByTheNic) {
  Buffer local(p.initiator, 4096, Access::kLocal, 11);
  std::vector<uint8_t> target_memory(4096, 0);
  Region remote = p.target.register_memory(target_memory.data(), 4096, Access::kRemoteWrite);
  Descriptor d = remote.descriptor();
  Transfer t{&local.region, 0, &d, 0, 4096};
  ASSERT_TRUE(p.peer.write({&t, 1}).wait(kWait).ok());
  std::fill(target_memory.begin(), target_memory.end(), 0);
  remote.deregister();
  Status s = p.peer.write({&t, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kPermissionDenied) << s.to_string();
  EXPECT_TRUE(
      std::all_of(target_memory.begin(), target_memory.end(), [](uint8_t b) { return b == 0; }));
}

}  // namespace
}  // namespace ferry::test
