// The engine's routing, failure and shutdown paths under faults a real transport can have,
// injected through the loopback transport (src/transport/loopback): a slice that fails, a lane
// that breaks with operations in flight, a connection the transport refuses, operations held up
// while the peer closes, the engine shuts down or a region is deregistered. No hardware needed.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/pair.hpp"
#include "transport/loopback/loopback.hpp"

namespace ferry::test {
namespace {

namespace loopback = transport::loopback;

Config loopback_config() {
  Config c = test_config();
  c.transports = {loopback::kKind};
  c.slice_bytes = 64 << 10;
  return c;
}

class LoopbackFaults : public ::testing::Test {
 protected:
  void SetUp() override { loopback::faults().reset(); }
  void TearDown() override { loopback::faults().reset(); }
};

// Two engines connected over loopback, and one transfer of `size` bytes into the target.
struct OneTransfer {
  OneTransfer(std::size_t size, uint32_t seed)
      : p(loopback_config(), loopback_config()),
        src(p.initiator, size, Access::kLocal, seed),
        dst(p.target, size, Access::kRemoteReadWrite, seed + 1),
        d(dst.region.descriptor()),
        t{&src.region, 0, &d, 0, size} {}
  Pair p;
  Buffer src;
  Buffer dst;
  Descriptor d;
  Transfer t;
};

bool contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST_F(LoopbackFaults, PeersUseLoopbackAndNeedNoSideConnection) {
  Pair p(loopback_config(), loopback_config());
  EXPECT_EQ(p.peer.transport(), loopback::kKind);
  EXPECT_EQ(p.target_peer.transport(), loopback::kKind);
  EXPECT_EQ(to_string(loopback::kKind), "loopback");
  EXPECT_EQ(p.target.stats().pending_handshakes, 0u);
}

// A channel that cuts writes finer for a path of its own (shm's rings) is asked at each post,
// of every write and prepared write, never of a read, and gets them in its slices.
TEST_F(LoopbackFaults, AChannelThatShapesWritesIsAskedAtEachPostAndGetsItsSlices) {
  loopback::faults().shape_from = 256 << 10;
  loopback::faults().shape_slice = 16 << 10;
  Pair p(loopback_config(), loopback_config());  // slice_bytes 64 KiB
  Buffer src(p.initiator, 2 << 20, Access::kLocal, 5);
  Buffer dst(p.target, 2 << 20, Access::kRemoteReadWrite, 6);
  Descriptor d = dst.region.descriptor();
  Transfer whole{&src.region, 0, &d, 0, 1 << 20};
  Prepared prepared = p.peer.prepare_write({&whole, 1});
  uint32_t seed = 10;
  auto slices_of = [&](uint64_t size, bool read, bool with_imm = false, bool post = false) {
    fill_pattern(read ? dst.bytes : src.bytes, ++seed);  // what was there before cannot pass
    uint64_t before = loopback::faults().slices.load();
    Transfer t{&src.region, 0, &d, 0, size};
    Future f = read       ? p.peer.read({&t, 1})
               : with_imm ? p.peer.write_with_imm({&t, 1}, 9)
               : post     ? prepared.post()
                          : p.peer.write({&t, 1});
    EXPECT_TRUE(f.wait(kWait).ok());
    EXPECT_EQ(0, std::memcmp(src.bytes.data(), dst.bytes.data(), size)) << size;
    if (with_imm) {
      EXPECT_TRUE(p.target.next_imm(kWait).has_value());
    }
    return loopback::faults().slices.load() - before;
  };
  EXPECT_EQ(slices_of((256 << 10) - 1, false), 4u) << "left as it was: 64 KiB slices";
  EXPECT_EQ(slices_of(256 << 10, false), 16u);
  EXPECT_EQ(slices_of(1 << 20, false), 64u);
  EXPECT_EQ(slices_of(512 << 10, false, true), 32u) << "write_with_imm is a write";
  EXPECT_EQ(slices_of(1 << 20, false, false, true), 64u) << "a prepared write is cut alike";
  EXPECT_EQ(slices_of(1 << 20, true), 16u) << "reads are not shaped";
  // A prepared write is asked again at each post: the channel's answer now differs.
  loopback::faults().shape_slice = 32 << 10;
  EXPECT_EQ(slices_of(1 << 20, false, false, true), 32u);
  loopback::faults().shape_from = 2 << 20;
  EXPECT_EQ(slices_of(1 << 20, false, false, true), 16u) << "left to the engine's 64 KiB";
}

TEST_F(LoopbackFaults, AFailedSliceFailsItsOperationOnlyAndNamesTheEntry) {
  OneTransfer x(1 << 20, 1);
  Pair& p = x.p;
  Transfer& t = x.t;

  loopback::faults().fail_every_slice = 1;
  Status s = p.peer.write_with_imm({&t, 1}, 7).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kSystem) << s.to_string();
  EXPECT_TRUE(contains(s, "write entry 0") && contains(s, "injected")) << s.to_string();
  EXPECT_FALSE(p.target.next_imm(std::chrono::milliseconds(100)).has_value())
      << "a write that failed notifies nothing";

  // Every 5th slice fails: the operation fails once, with the first failure.
  loopback::faults().reset();
  loopback::faults().fail_every_slice = 5;
  s = p.peer.write({&t, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kSystem) << s.to_string();

  loopback::faults().reset();
  ASSERT_TRUE(p.peer.write_with_imm({&t, 1}, 8).wait(kWait).ok());
  auto imm = p.target.next_imm(kWait);
  ASSERT_TRUE(imm.has_value());
  EXPECT_EQ(imm->imm, 8u);
  EXPECT_EQ(x.src.bytes, x.dst.bytes);
  EXPECT_TRUE(p.peer.connected()) << "a failed slice does not cost the peer";
}

TEST_F(LoopbackFaults, ABrokenLaneFailsEveryOperationInFlightOnceAndThePeerOnBothSides) {
  OneTransfer x(1 << 20, 3);
  Pair& p = x.p;
  Transfer& t = x.t;
  // Operations wait before they run, so many are in flight when the lane breaks.
  loopback::faults().delay_us = 20'000;
  loopback::faults().break_at_slice = 20;
  std::vector<Future> futures;
  for (int i = 0; i < 8; ++i) futures.push_back(p.peer.write({&t, 1}));
  int failed = 0;
  for (Future& f : futures) {
    Status s = f.wait(kWait);
    ASSERT_NE(s.code(), ErrorCode::kInProgress) << "an operation hung";
    if (!s.ok()) {
      ++failed;
      EXPECT_EQ(s.code(), ErrorCode::kPeerLost) << s.to_string();
    }
  }
  EXPECT_GE(failed, 7) << "the first op (16 slices) may finish; every later one fails";
  EXPECT_FALSE(p.peer.connected());
  Status after = p.peer.write({&t, 1}).wait(kWait);
  EXPECT_EQ(after.code(), ErrorCode::kPeerLost);
  for (auto deadline = Clock::now() + kWait; p.target_peer.connected() && Clock::now() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(p.target_peer.connected()) << "the target learns its peer is gone";
}

TEST_F(LoopbackFaults, AConnectionTheTransportRefusesLeavesNoStateOnEitherSide) {
  Engine target(loopback_config());
  Engine initiator(loopback_config());
  loopback::faults().refuse_connect = true;
  try {
    initiator.connect(target.address());
    FAIL() << "connected through a refusing transport";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConnectFailed) << e.what();
  }
  EXPECT_EQ(initiator.stats().peers, 0u);
  for (auto deadline = Clock::now() + kWait;
       target.stats().peers + target.stats().pending_handshakes > 0 && Clock::now() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(target.stats().peers, 0u);
  EXPECT_EQ(target.stats().pending_handshakes, 0u);
  EXPECT_FALSE(target.accept(std::chrono::milliseconds(50)).has_value());

  loopback::faults().refuse_connect = false;
  Peer peer = initiator.connect(target.address());
  EXPECT_TRUE(peer.connected());
  EXPECT_TRUE(target.accept(kWait).has_value());
}

TEST_F(LoopbackFaults, ClosingOrShuttingDownWhileOperationsAreHeldUpEndsEachOfThem) {
  for (bool shutdown : {false, true}) {
    SCOPED_TRACE(shutdown ? "shutdown" : "close");
    OneTransfer x(256 << 10, 5);
    Pair& p = x.p;
    Transfer& t = x.t;
    loopback::faults().delay_us = 50'000;
    std::vector<Future> futures;
    for (int i = 0; i < 6; ++i) futures.push_back(p.peer.read({&t, 1}));
    if (shutdown) {
      p.initiator.shutdown();
    } else {
      p.peer.close();
    }
    for (Future& f : futures) {
      Status s = f.wait(kWait);
      ASSERT_NE(s.code(), ErrorCode::kInProgress) << "an operation hung";
      EXPECT_TRUE(s.ok() || s.code() == ErrorCode::kCancelled) << s.to_string();
    }
    loopback::faults().reset();
  }
}

TEST_F(LoopbackFaults, ADroppedSliceHoldsOnlyItsOperationUntilItsPeerOrRegionGoes) {
  // A slice whose completion is lost: its operation stays in flight (a wait times out) while
  // the peer carries on; whatever ends the peer or the region the operation uses ends it.
  enum class Ending { kClose, kShutdown, kDeregister };
  for (Ending ending : {Ending::kClose, Ending::kShutdown, Ending::kDeregister}) {
    SCOPED_TRACE(static_cast<int>(ending));
    Config c = loopback_config();
    c.revoke_timeout = std::chrono::milliseconds(200);
    Pair p(c, c);
    constexpr std::size_t kSize = 1 << 20;  // 16 slices
    auto src = std::make_unique<Buffer>(p.initiator, kSize, Access::kLocal, 9);
    Buffer other(p.initiator, kSize, Access::kLocal, 10);
    Buffer dst(p.target, kSize, Access::kRemoteReadWrite, 11);
    Descriptor d = dst.region.descriptor();
    loopback::faults().drop_slice = 3;
    Transfer t{&src->region, 0, &d, 0, kSize};
    Future dropped = p.peer.write({&t, 1});
    EXPECT_EQ(dropped.wait(std::chrono::milliseconds(100)).code(), ErrorCode::kTimeout);

    Transfer next{&other.region, 0, &d, 0, kSize};
    ASSERT_TRUE(p.peer.write({&next, 1}).wait(kWait).ok()) << "the peer carries on";
    EXPECT_EQ(other.bytes, dst.bytes);
    EXPECT_FALSE(dropped.test());

    Status s;
    switch (ending) {
      case Ending::kClose:
        p.peer.close();
        s = dropped.wait(kWait);
        EXPECT_EQ(s.code(), ErrorCode::kCancelled) << s.to_string();
        break;
      case Ending::kShutdown:
        p.initiator.shutdown();
        s = dropped.wait(kWait);
        EXPECT_EQ(s.code(), ErrorCode::kCancelled) << s.to_string();
        break;
      case Ending::kDeregister:
        // Deregistering waits for the operation, then cuts the peer off after revoke_timeout.
        src->region.deregister();
        s = dropped.wait(kWait);
        EXPECT_EQ(s.code(), ErrorCode::kRevoked) << s.to_string();
        EXPECT_FALSE(p.peer.connected());
        break;
    }
    loopback::faults().reset();
  }
}

TEST_F(LoopbackFaults, ARegionDeregisteredWhileAnAccessWaitsIsRefusedNotTouched) {
  Pair p(loopback_config(), loopback_config());
  Buffer src(p.initiator, 4096, Access::kLocal, 7);
  auto dst = std::make_unique<Buffer>(p.target, 4096, Access::kRemoteWrite, 8);
  std::vector<uint8_t> before = dst->bytes;
  Descriptor d = dst->region.descriptor();
  Transfer t{&src.region, 0, &d, 0, 4096};
  loopback::faults().delay_us = 200'000;
  Future f = p.peer.write({&t, 1});
  dst->region.deregister();  // returns at once: the waiting access holds nothing
  Status s = f.wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kRevoked) << s.to_string();
  EXPECT_EQ(dst->bytes, before) << "nothing was written into the revoked region";
  EXPECT_TRUE(p.peer.connected());
}

}  // namespace
}  // namespace ferry::test
