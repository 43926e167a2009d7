// Limits one peer cannot pass (unmatched messages per peer and engine-wide) and the TCP
// channel's lock order under a peer lost mid-flight.
#include <gtest/gtest.h>
#include <malloc.h>

#include <future>
#include <thread>

#include "engine/engine_impl.hpp"
#include "support/pair.hpp"
#include "transport/matcher.hpp"

namespace ferry::test {
namespace {

// A caller whose write finds the socket already broken closes the channel from post(); the
// stream's send lock must not be held then (one lock order: close lock before send lock, as in
// attach_side()). The initiator's only progress thread is kept busy in a callback so that it cannot
// notice the lost connection first: the callers' writes meet the broken sockets. TSan reports a
// lock-order inversion if post() closes under the send lock.
TEST(LockOrder, APostThatFindsTheSocketBrokenClosesOutsideTheSendLock) {
  Config c = test_config();
  c.progress_threads = 1;
  auto target = std::make_unique<Engine>(test_config());
  Engine initiator(c);
  Peer peer = initiator.connect(target->address());
  auto accepted = target->accept(kWait);
  ASSERT_TRUE(accepted.has_value());
  Buffer local(initiator, 4096, Access::kLocal, 1);
  Buffer remote(*target, 4096, Access::kRemoteWrite, 2);
  Descriptor d = remote.region.descriptor();
  Buffer msg(*target, 8, Access::kLocal, 3);

  std::promise<void> in_callback, release;
  std::shared_future<void> released = release.get_future().share();
  Future r = peer.recv(1, local.region, 0, 8);
  r.then([&in_callback, released](const Status&) {
    in_callback.set_value();
    released.wait();  // holds the initiator's progress thread
  });
  Future sent = accepted->send(1, msg.region, 0, 8);
  in_callback.get_future().wait();

  target.reset();  // closes every socket of the peer
  std::vector<Future> writes;
  Transfer t{&local.region, 0, &d, 0, 8};
  for (int i = 0; i < 32; ++i) writes.push_back(peer.write({&t, 1}));
  release.set_value();
  for (Future& f : writes) {
    Status s = f.wait(kWait);
    EXPECT_EQ(s.code(), ErrorCode::kPeerLost) << s.to_string();
  }
  EXPECT_TRUE(r.wait(kWait).ok());
}

// Three engines: `target` accepts `a` then `b`.
struct Three {
  explicit Three(const Config& target_config) : target(target_config) {
    pa = a.connect(target.address());
    ta = *target.accept(kWait);
    pb = b.connect(target.address());
    tb = *target.accept(kWait);
  }
  Engine target;
  Engine a{test_config()}, b{test_config()};
  Peer pa, ta, pb, tb;  // a -> target, target -> a, ...
};

TEST(UnexpectedLimits, ManyTinyMessagesHitTheCountCapAndOtherPeersSeeNoDifference) {
  Config c = test_config();
  c.max_unexpected_messages = 8;
  Three t(c);
  Buffer from_a(t.a, 64, Access::kLocal, 1);
  Buffer from_b(t.b, 64, Access::kLocal, 2);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(t.pa.send(1, from_a.region, 0, 1).wait(kWait).ok()) << i;
  EXPECT_EQ(t.ta.stats().unexpected_messages, 8u);
  Status s = t.pa.send(1, from_a.region, 0, 1).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("8 messages"), std::string::npos) << s.message();
  EXPECT_TRUE(t.pa.connected()) << "a refusal, not a disconnection";

  // The other peer's messages, both ways, and its one-sided operations are unaffected.
  Buffer at_target(t.target, 64, Access::kRemoteReadWrite, 3);
  ASSERT_TRUE(t.pb.send(2, from_b.region, 0, 64).wait(kWait).ok());
  Future r = t.tb.recv(2, at_target.region, 0, 64);
  ASSERT_TRUE(r.wait(kWait).ok());
  EXPECT_EQ(at_target.bytes, from_b.bytes);
  Future back = t.pb.recv(3, from_b.region, 0, 64);
  ASSERT_TRUE(t.tb.send(3, at_target.region, 0, 64).wait(kWait).ok());
  ASSERT_TRUE(back.wait(kWait).ok());
  Descriptor d = at_target.region.descriptor();
  Transfer w{&from_b.region, 0, &d, 0, 64};
  EXPECT_TRUE(t.pb.write({&w, 1}).wait(kWait).ok());
  EXPECT_EQ(t.tb.stats().unexpected_messages, 0u);

  // Receiving one of a's messages makes room for one more.
  ASSERT_TRUE(t.ta.recv(1, at_target.region, 0, 64).wait(kWait).ok());
  EXPECT_EQ(t.ta.stats().unexpected_messages, 7u);
  EXPECT_TRUE(t.pa.send(1, from_a.region, 0, 1).wait(kWait).ok());
}

TEST(UnexpectedLimits, TheEngineWideLimitHoldsForPeersEachUnderTheirOwn) {
  Config c = test_config();
  c.max_unexpected_bytes = 64 << 10;
  c.max_unexpected_bytes_total = 100 << 10;
  Three t(c);
  Buffer from_a(t.a, 40 << 10, Access::kLocal, 1);
  Buffer from_b(t.b, 40 << 10, Access::kLocal, 2);
  ASSERT_TRUE(t.pa.send(1, from_a.region, 0, 40 << 10).wait(kWait).ok());
  ASSERT_TRUE(t.pb.send(1, from_b.region, 0, 40 << 10).wait(kWait).ok());
  // a would hold 70 KiB of its 64 KiB: refused by its own limit.
  Status own = t.pa.send(1, from_a.region, 0, 30 << 10).wait(kWait);
  EXPECT_EQ(own.code(), ErrorCode::kResourceExhausted) << own.to_string();
  // 20 KiB more stays within a's limit, not within the engine's (100 KiB for both).
  Status s = t.pa.send(1, from_a.region, 0, 20 << 10).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("engine"), std::string::npos) << s.message();
  EXPECT_EQ(t.ta.stats().unexpected_messages, 1u);
  EXPECT_EQ(t.ta.stats().unexpected_bytes,
            (40u << 10) + transport::Matcher::kUnexpectedOverheadBytes);

  // Once b's message is received, a's fits.
  Buffer at_target(t.target, 40 << 10, Access::kLocal, 3);
  ASSERT_TRUE(t.tb.recv(1, at_target.region, 0, 40 << 10).wait(kWait).ok());
  EXPECT_EQ(at_target.bytes, from_b.bytes);
  EXPECT_TRUE(t.pa.send(1, from_a.region, 0, 20 << 10).wait(kWait).ok());
}

// Peers flooding every resource the limits cover (unmatched messages far past their limit,
// notifications up to theirs) leave the engine within the documented bound
// (docs/architecture.md, "Limits"; EngineImpl::memory_bound). Without the limits the flood
// would add 500 MiB (8 × 62.5 MiB).
TEST(MemoryBound, PeersFloodingEveryLimitStayWithinTheFormula) {
  if (::mallinfo2().arena == 0) GTEST_SKIP() << "no heap statistics (a sanitizer's allocator)";
  Config sc = test_config();
  sc.max_peers = 16;
  sc.max_unexpected_bytes = 256 << 10;
  sc.max_unexpected_bytes_total = 1 << 20;
  sc.max_queued_imms = 32;
  constexpr int kPeers = 8;
  constexpr int kMessages = 1000;
  constexpr uint64_t kMessageBytes = 64 << 10;
  Engine server(sc);
  std::vector<uint8_t> inbox(64);
  Region target = server.register_memory(inbox.data(), inbox.size(), Access::kRemoteWrite);
  Descriptor d = target.descriptor();
  Config cc = test_config();
  cc.listen = false;
  std::vector<std::unique_ptr<Engine>> clients;
  std::vector<std::unique_ptr<Buffer>> payloads;
  for (int i = 0; i < kPeers; ++i) {
    clients.push_back(std::make_unique<Engine>(cc));
    payloads.push_back(std::make_unique<Buffer>(*clients.back(), kMessageBytes, Access::kLocal, i));
  }
  std::size_t before = ::mallinfo2().uordblks;
  std::vector<Peer> peers;
  int refused = 0;
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(clients[i]->connect(server.address()));
    for (int m = 0; m < kMessages; ++m) {
      Status s = peers.back().send(9, payloads[i]->region, 0, kMessageBytes).wait(kWait);
      if (s.code() == ErrorCode::kResourceExhausted) ++refused;
    }
    Transfer t{&payloads[i]->region, 0, &d, 0, 64};
    for (uint32_t n = 0; n < sc.max_queued_imms; ++n) {
      ASSERT_TRUE(peers.back().write_with_imm({&t, 1}, n).wait(kWait).ok());
    }
  }
  std::size_t grown = ::mallinfo2().uordblks - before;
  auto bound = detail::EngineImpl::memory_bound(sc);
  // One process holds both sides: each client's own state counts too, at most what a server
  // peer's state does.
  std::size_t allowed = kPeers * (bound.per_peer + bound.per_peer_fixed);
  std::printf(
      "[ figure ] %d flooding peers grew the heap by %zu KiB (%zu KiB per peer, both "
      "sides); formula allows %zu KiB per server peer, %zu KiB for the engine\n",
      kPeers, grown >> 10, (grown / kPeers) >> 10, bound.per_peer >> 10, bound.engine >> 10);
  auto defaults = detail::EngineImpl::memory_bound(Config{});
  std::printf(
      "[ figure ] with the default Config: %zu KiB per peer's fixed state, %zu KiB per "
      "peer, %zu MiB per engine\n",
      defaults.per_peer_fixed >> 10, defaults.per_peer >> 10, defaults.engine >> 20);
  EXPECT_GT(refused, kPeers * (kMessages - 8)) << "the limits refused the flood";
  EXPECT_LE(grown, allowed);
  EXPECT_LE(grown / 2, bound.engine);
}

}  // namespace
}  // namespace ferry::test
