// One-sided operations, the same cases for every transport (tests/conformance/conformance.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "conformance/conformance.hpp"

namespace ferry::test {
namespace {

TEST_P(Conformance, WriteAndReadAcrossSizesAndOddOffsets) {
  Pair& p = pair();
  // Up to 8 MiB: 128 slices over every lane. (The sanitized guest runs these cases in 1 GiB, where
  // TSan's shadow of 64 MiB buffers was killed for want of memory.)
  constexpr std::size_t kCap = (8u << 20) + 64;
  Buffer local(p.initiator, kCap, Access::kLocal, 1);
  Buffer remote(p.target, kCap, Access::kRemoteReadWrite, 2);
  Descriptor d = Descriptor::parse(remote.region.descriptor().to_string());
  for (uint64_t size :
       {uint64_t{1}, uint64_t{7}, uint64_t{63}, uint64_t{64}, uint64_t{65}, uint64_t{4096},
        uint64_t{4097}, uint64_t{65537}, (uint64_t{256} << 10) - 1, uint64_t{256} << 10,
        uint64_t{1} << 20, (uint64_t{1} << 20) + 1, (uint64_t{3} << 20) + 13, uint64_t{8} << 20}) {
    SCOPED_TRACE(size);
    uint64_t loff = size % 7, roff = size % 13;
    fill_pattern(local.bytes.data() + loff, size, static_cast<uint32_t>(size));
    Transfer t{&local.region, loff, &d, roff, size};
    Status s = p.peer.write({&t, 1}).wait(kWait);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(0, std::memcmp(local.bytes.data() + loff, remote.bytes.data() + roff, size));
    std::memset(local.bytes.data() + loff, 0, size);
    fill_pattern(remote.bytes.data() + roff, size, static_cast<uint32_t>(size) + 1);
    Future f = p.peer.read({&t, 1});
    s = f.wait(kWait);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(size, f.bytes());
    ASSERT_EQ(0, std::memcmp(local.bytes.data() + loff, remote.bytes.data() + roff, size));
  }
}

TEST_P(Conformance, StripesOverMoreThanSixteenLanes) {
  // Where the transport takes a lane count, 20: more than an op holds inline, so its lane
  // state goes to the spill (OpState::reserve_lanes), kept for the op's later uses.
  Config c = conformance_config(GetParam());
  c.tcp.streams = 20;
  c.verbs.qps = 20;
  Pair p(c, c);
  PeerStats stats = p.peer.stats();
  ASSERT_EQ(stats.channels.size(), 1u);
  SCOPED_TRACE("lanes " + std::to_string(stats.channels[0].lanes));
  constexpr std::size_t kSize = 4 << 20;  // 64 slices of 64 KiB: every lane gets some
  Buffer local(p.initiator, kSize, Access::kLocal, 3);
  Buffer remote(p.target, kSize, Access::kRemoteReadWrite, 4);
  Descriptor d = remote.region.descriptor();
  for (uint32_t round = 0; round < 3; ++round) {
    fill_pattern(local.bytes, 10 + round);
    Transfer t{&local.region, 0, &d, 0, kSize};
    Status written = p.peer.write_with_imm({&t, 1}, round).wait(kWait);
    ASSERT_TRUE(written.ok()) << written.to_string();
    std::optional<ImmEvent> imm = p.target.next_imm(kWait);
    ASSERT_TRUE(imm.has_value());
    EXPECT_EQ(imm->imm, round);
    ASSERT_EQ(local.bytes, remote.bytes);
    fill_pattern(remote.bytes, 20 + round);
    Status read = p.peer.read({&t, 1}).wait(kWait);
    ASSERT_TRUE(read.ok()) << read.to_string();
    ASSERT_EQ(local.bytes, remote.bytes);
  }
}

TEST_P(Conformance, TenThousandScatteredEntriesBothWays) {
  Pair& p = pair();
  constexpr int kEntries = 10000;
  constexpr uint64_t kEntry = 333;  // odd size: entries straddle every alignment
  Buffer local(p.initiator, kEntries * kEntry, Access::kLocal, 3);
  Buffer remote(p.target, kEntries * kEntry * 2, Access::kRemoteReadWrite, 4);
  Descriptor d = remote.region.descriptor();
  std::vector<Transfer> batch;
  for (int i = 0; i < kEntries; ++i) {
    batch.push_back({&local.region, static_cast<uint64_t>(i) * kEntry, &d,
                     static_cast<uint64_t>(kEntries - 1 - i) * kEntry * 2, kEntry});
  }
  ASSERT_TRUE(p.peer.write(batch).wait(kWait).ok());
  for (int i = 0; i < kEntries; ++i) {
    ASSERT_EQ(0, std::memcmp(local.bytes.data() + i * kEntry,
                             remote.bytes.data() + (kEntries - 1 - i) * kEntry * 2, kEntry));
  }
  std::vector<uint8_t> expected = local.bytes;
  std::fill(local.bytes.begin(), local.bytes.end(), 0);
  ASSERT_TRUE(p.peer.read(batch).wait(kWait).ok());
  EXPECT_EQ(expected, local.bytes);
}

TEST_P(Conformance, ManyThreadsBothDirectionsOnePeer) {
  Pair& p = pair();
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

// write_with_imm of `len` bytes, three rounds: at the moment each notification is seen, every
// byte must already be in the target's memory; one notification per operation.
void expect_imm_after_every_byte(Pair& p, uint64_t len, uint32_t first_imm) {
  Buffer local(p.initiator, len, Access::kLocal, first_imm);
  Buffer remote(p.target, len, Access::kRemoteWrite, first_imm + 1);
  Descriptor d = remote.region.descriptor();
  for (uint32_t round = 0; round < 3; ++round) {
    fill_pattern(local.bytes, first_imm + 100 + round);
    Transfer t{&local.region, 0, &d, 0, len};
    Future f = p.peer.write_with_imm({&t, 1}, first_imm + round);
    auto ev = p.target.next_imm(kWait);
    ASSERT_TRUE(ev.has_value());
    EXPECT_EQ(ev->imm, first_imm + round);
    EXPECT_EQ(ev->peer_engine_id, p.initiator.id());
    // Named by the connection it came on, not only by the id that peer claimed.
    EXPECT_EQ(ev->peer.incarnation(), p.initiator.incarnation());
    EXPECT_EQ(ev->peer.address(), p.target_peer.address());
    // Before the initiator's future completes.
    ASSERT_EQ(0, std::memcmp(local.bytes.data(), remote.bytes.data(), len)) << round;
    ASSERT_TRUE(f.wait(kWait).ok());
  }
  EXPECT_FALSE(p.target.next_imm(std::chrono::milliseconds(100)).has_value())
      << "one notification per op";
}

// Engine::next_imm's spin polls the channels of up to OpPool::kMaxSpinPools peers itself (a
// same-host ring, a completion queue): notifications from several peers at once all come, each
// after its bytes and in its peer's order.
TEST_P(Conformance, NextImmTakesNotificationsFromSeveralPeersAtOnce) {
  constexpr uint32_t kPeers = 3, kEach = 200;
  constexpr uint64_t kSlot = 64;
  Engine target(config());
  std::vector<std::unique_ptr<Engine>> initiators;
  std::vector<Peer> peers;
  std::vector<std::unique_ptr<Buffer>> sources;
  for (uint32_t i = 0; i < kPeers; ++i) {
    initiators.push_back(std::make_unique<Engine>(config()));
    peers.push_back(initiators[i]->connect(target.address()));
    ASSERT_TRUE(target.accept(kWait).has_value());
    ASSERT_EQ(peers[i].transport(), GetParam());
    sources.push_back(
        std::make_unique<Buffer>(*initiators[i], kEach * kSlot, Access::kLocal, 10 + i));
  }
  Buffer remote(target, kPeers * kEach * kSlot, Access::kRemoteWrite, 1);
  Descriptor d = remote.region.descriptor();
  std::vector<std::thread> senders;
  for (uint32_t i = 0; i < kPeers; ++i) {
    senders.emplace_back([&, i] {
      for (uint32_t n = 0; n < kEach; ++n) {
        uint32_t imm = i * kEach + n;
        Transfer t{&sources[i]->region, n * kSlot, &d, imm * kSlot, kSlot};
        Status s = peers[i].write_with_imm({&t, 1}, imm).wait(kWait);
        if (!s.ok()) {
          ADD_FAILURE() << "peer " << i << ", write " << n << ": " << s.to_string();
          return;
        }
      }
    });
  }
  // Failures end the loop, not the test: the senders must be joined first.
  std::vector<uint32_t> next(kPeers, 0);
  for (uint32_t got = 0; got < kPeers * kEach; ++got) {
    std::optional<ImmEvent> e = target.next_imm(kWait);
    if (!e.has_value()) {
      ADD_FAILURE() << got << " of " << kPeers * kEach << " notifications came";
      break;
    }
    uint32_t from = e->imm / kEach, n = e->imm % kEach;
    if (from >= kPeers) {
      ADD_FAILURE() << "immediate " << e->imm << " was never sent";
      break;
    }
    EXPECT_EQ(e->peer_engine_id, initiators[from]->id());
    EXPECT_EQ(n, next[from]++) << "peer " << from << "'s notifications out of order";
    EXPECT_EQ(0, std::memcmp(remote.bytes.data() + uint64_t{e->imm} * kSlot,
                             sources[from]->bytes.data() + uint64_t{n} * kSlot, kSlot))
        << "write " << n << " of peer " << from << " not in place when its notification came";
  }
  for (auto& t : senders) t.join();
  EXPECT_FALSE(target.next_imm(std::chrono::milliseconds(50)).has_value());
}

TEST_P(Conformance, WriteWithImmNotifiesAfterEveryByte) {
  expect_imm_after_every_byte(pair(), 8 << 20, 0x5000);  // sliced, striped over every lane
  expect_imm_after_every_byte(pair(), 4096, 0x6000);     // one slice carries the immediate
}

// Engine::next_imms takes what is queued in one call, no more than its room, in order, once.
TEST_P(Conformance, NextImmsTakesWhatIsQueuedUpToItsRoom) {
  constexpr uint32_t kWrites = 10;
  Pair& p = pair();
  Buffer local(p.initiator, 64, Access::kLocal, 13);
  Buffer remote(p.target, 64, Access::kRemoteWrite, 14);
  Descriptor d = remote.region.descriptor();
  Transfer t{&local.region, 0, &d, 0, 64};
  std::vector<ImmEvent> out(4);
  EXPECT_EQ(p.target.next_imms(std::span(out).first(0), kWait), 0u);
  for (uint32_t round = 0; round < 2; ++round) {
    for (uint32_t i = 0; i < kWrites; ++i)
      ASSERT_TRUE(p.peer.write_with_imm({&t, 1}, round * kWrites + i).wait(kWait).ok());
    // Counted as each arrives, just before it is queued: once all are counted, the calls take
    // several at a time.
    auto deadline = Clock::now() + kWait;
    while (p.target_peer.metrics().imms_received < (round + 1) * kWrites && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    uint32_t next = round * kWrites;
    bool several = false;
    while (next < (round + 1) * kWrites) {
      std::size_t got = p.target.next_imms(out, kWait);
      ASSERT_GE(got, 1u) << "notification " << next << " never came";
      ASSERT_LE(got, out.size());
      several = several || got > 1;
      for (const ImmEvent& e : std::span(out).first(got)) {
        EXPECT_EQ(e.imm, next++);
        EXPECT_EQ(e.peer_engine_id, p.initiator.id());
      }
    }
    EXPECT_TRUE(several) << "one notification per call, with " << kWrites << " queued";
  }
  EXPECT_EQ(p.target.next_imms(out, std::chrono::milliseconds(50)), 0u);
}

TEST_P(Conformance, WriteWithImmCallbackDeliversAndRefusedWritesNotifyNothing) {
  Pair& p = pair();
  Buffer local(p.initiator, 1 << 20, Access::kLocal, 9);
  Buffer remote(p.target, 1 << 20, Access::kRemoteWrite, 10);
  Descriptor d = remote.region.descriptor();
  std::atomic<int> seen{0};
  std::atomic<uint32_t> last{0};
  p.target.on_imm([&](const ImmEvent& e) {
    last = e.imm;
    seen++;
  });
  if (!nic_served()) {
    // (A NIC's refusal fails the queue pair with the write: Verbs.TheNicRefuses* tests it.)
    Descriptor forged = d;
    forge_key(forged, GetParam());
    Transfer bad{&local.region, 0, &forged, 0, 1 << 20};
    EXPECT_EQ(p.peer.write_with_imm({&bad, 1}, 1).wait(kWait).code(), ErrorCode::kWrongKey);
  }
  Transfer good{&local.region, 0, &d, 0, 1 << 20};
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(p.peer.write_with_imm({&good, 1}, 100 + i).wait(kWait).ok());
  auto deadline = Clock::now() + kWait;
  while (seen.load() < 20 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(seen.load(), 20) << "the refused write must not notify";
  EXPECT_EQ(last.load(), 119u);
}

TEST_P(Conformance, WriteWithImmPeerWhoseNotificationsAreNotTakenIsClosed) {
  Config tc = config();
  tc.max_queued_imms = 5;
  auto owned = connect(tc, config());
  Pair& p = *owned;
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

// A scattered batch (odd sizes and offsets, one entry over the slice size) prepared once and
// posted again and again: each post moves the bytes there at the time; posts may overlap; the
// checks of write() apply when preparing; a local region deregistered since fails the post.
TEST_P(Conformance, PreparedBatchesPostAgainAndAgain) {
  Pair& p = pair();
  constexpr uint64_t kSize = 3 << 20;
  Buffer src(p.initiator, kSize, Access::kLocal, 40);
  Buffer back(p.initiator, kSize, Access::kLocal, 41);
  Buffer remote(p.target, kSize, Access::kRemoteReadWrite, 42);
  Descriptor d = remote.region.descriptor();
  struct Range {
    uint64_t local, remote, length;
  };
  const Range ranges[] = {{1, 7, 5}, {4099, 8192, 100000}, {1 << 20, (1 << 20) + 3, (2 << 20) - 8}};
  std::vector<Transfer> out, in;
  for (const Range& r : ranges) {
    out.push_back({&src.region, r.local, &d, r.remote, r.length});
    in.push_back({&back.region, r.local, &d, r.remote, r.length});
  }
  Prepared write = p.peer.prepare_write(out);
  Prepared read = p.peer.prepare_read(in);
  for (uint32_t round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    fill_pattern(src.bytes, 50 + round);
    ASSERT_TRUE(write.post().wait(kWait).ok());
    ASSERT_TRUE(read.post().wait(kWait).ok());
    for (const Range& r : ranges) {
      ASSERT_EQ(0,
                std::memcmp(src.bytes.data() + r.local, remote.bytes.data() + r.remote, r.length));
      ASSERT_EQ(0, std::memcmp(src.bytes.data() + r.local, back.bytes.data() + r.local, r.length));
    }
  }
  Future first = write.post(), second = write.post();
  EXPECT_TRUE(first.wait(kWait).ok());
  EXPECT_TRUE(second.wait(kWait).ok());
  EXPECT_EQ(second.bytes(), 5u + 100000u + (2u << 20) - 8u);

  Prepared notify = p.peer.prepare_write_with_imm(out, 77);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(notify.post().wait(kWait).ok());
    auto ev = p.target.next_imm(kWait);
    ASSERT_TRUE(ev.has_value());
    EXPECT_EQ(ev->imm, 77u);
  }

  Transfer beyond{&src.region, 0, &d, kSize - 4, 8};
  try {
    p.peer.prepare_write({&beyond, 1});
    ADD_FAILURE() << "an out-of-bounds batch was prepared";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfBounds) << e.what();
  }

  Buffer gone(p.initiator, 4096, Access::kLocal, 43);
  Transfer from_gone{&gone.region, 0, &d, 0, 4096};
  Prepared stale = p.peer.prepare_write({&from_gone, 1});
  std::vector<uint8_t> before(remote.bytes.begin(), remote.bytes.begin() + 4096);
  gone.region.deregister();
  Status s = stale.post().wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kRevoked) << s.to_string();
  EXPECT_TRUE(std::equal(before.begin(), before.end(), remote.bytes.begin()));
  EXPECT_THROW(Prepared().post(), Error);
  // A closed peer fails the post at once.
  p.peer.close();
  Status closed = write.post().wait(std::chrono::milliseconds(100));
  EXPECT_EQ(closed.code(), ErrorCode::kPeerLost) << closed.to_string();
}

TEST_P(Conformance, ShutdownCancelsInFlightOperations) {
  Pair& p = pair();
  std::vector<uint8_t> a(8 << 20), b(8 << 20);
  Region la = p.initiator.register_memory(a.data(), a.size(), Access::kLocal);
  Region rb = p.target.register_memory(b.data(), b.size(), Access::kRemoteWrite);
  Descriptor d = rb.descriptor();
  std::vector<Future> futures;
  Transfer t{&la, 0, &d, 0, a.size()};
  for (int i = 0; i < 16; ++i) futures.push_back(p.peer.write({&t, 1}));
  Future pending_recv = p.peer.recv(1, la, 0, 16);
  p.initiator.shutdown();
  for (auto& f : futures) {
    Status s = f.wait(kWait);
    EXPECT_TRUE(s.ok() || s.code() == ErrorCode::kCancelled) << s.to_string();
  }
  EXPECT_EQ(pending_recv.wait(kWait).code(), ErrorCode::kCancelled);
  EXPECT_EQ(p.peer.write({&t, 1}).wait(kWait).code(), ErrorCode::kPeerLost)
      << "no work after shutdown";
  EXPECT_THROW(p.initiator.connect(p.target.address()), Error);
  // The target notices the initiator left.
  auto deadline = Clock::now() + kWait;
  while (p.target_peer.connected() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(p.target_peer.connected());
}

INSTANTIATE_TEST_SUITE_P(Transports, Conformance, ::testing::ValuesIn(registered_kinds()),
                         transport_case_name);

}  // namespace
}  // namespace ferry::test
