// Closing, leaving and deregistering with work in flight, the same cases for every transport
// (tests/conformance/conformance.hpp).
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "conformance/conformance.hpp"

namespace ferry::test {
namespace {

TEST_P(Conformance, ClosingAPeerFailsItsWorkWithCancelled) {
  Pair& p = pair();
  std::vector<uint8_t> a(64);
  Region la = p.initiator.register_memory(a.data(), a.size(), Access::kLocal);
  Future r = p.peer.recv(3, la, 0, 64);
  p.peer.close();
  EXPECT_EQ(r.wait(kWait).code(), ErrorCode::kCancelled);
  EXPECT_FALSE(p.peer.connected());
  Future r2 = p.target_peer.recv(3, la, 0, 64);  // la belongs to the other engine
  EXPECT_EQ(r2.wait(kWait).code(), ErrorCode::kInvalidArgument);
}

TEST_P(Conformance, MessagesThatArrivedBeforeThePeerLeftStayReceivable) {
  auto p = connect(config(), config());
  std::vector<uint8_t> a(64, 0), b(64, 5);
  Region la = p->initiator.register_memory(a.data(), a.size(), Access::kLocal);
  Region lb = p->target.register_memory(b.data(), b.size(), Access::kLocal);
  ASSERT_TRUE(p->target_peer.send(8, lb, 0, 64).wait(kWait).ok());
  p->target.shutdown();
  auto deadline = Clock::now() + kWait;
  while (p->peer.connected() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_FALSE(p->peer.connected());
  Future r = p->peer.recv(8, la, 0, 64);
  ASSERT_TRUE(r.wait(kWait).ok()) << r.status().to_string();
  EXPECT_EQ(a, b);
  EXPECT_EQ(p->peer.recv(8, la, 0, 64).wait(kWait).code(), ErrorCode::kPeerLost)
      << "only one was sent";
}

TEST_P(Conformance, DeregisterWaitsForOperationsUsingTheRegion) {
  Pair& p = pair();
  std::vector<uint8_t> a(32 << 20, 1), b(32 << 20);
  Region la = p.initiator.register_memory(a.data(), a.size(), Access::kLocal);
  Region rb = p.target.register_memory(b.data(), b.size(), Access::kRemoteWrite);
  Descriptor d = rb.descriptor();
  Transfer t{&la, 0, &d, 0, a.size()};
  Future f = p.peer.write({&t, 1});
  la.deregister();  // must not return while the write still reads from `a`
  EXPECT_TRUE(f.test()) << "deregister returned before the operation finished";
  EXPECT_TRUE(f.wait(kWait).ok());
  Future after = p.peer.write({&t, 1});
  EXPECT_EQ(after.wait(kWait).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::test
