// Two processes: which transports are offered across the process boundary. (Transfers, a
// killed and a hung target are conformance cases: tests/conformance/multiprocess_test.cpp.)
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/pair.hpp"
#include "support/target_process.hpp"

namespace ferry::test {
namespace {

// An engine offering `transports` (best first), connected to a target in another process of
// this host.
struct SameHostPeer {
  SameHostPeer(const TargetProcess& target, std::vector<TransportKind> transports)
      : engine(configured(std::move(transports))),
        peer(engine.connect(target.address)),
        routes(peer.routes()) {
    EXPECT_EQ(peer.reach(), Reach::kSameHost);
  }
  static Config configured(std::vector<TransportKind> transports) {
    Config c = test_config();
    c.transports = std::move(transports);
    return c;
  }
  Engine engine;
  Peer peer;
  std::vector<RouteInfo> routes;
};

TEST(MultiProcess, ATransportThatStaysInOneProcessIsNotOfferedToAnother) {
  constexpr std::size_t kSize = 1 << 20;
  TargetProcess target(kSize, "loopback,tcp");
  ASSERT_FALSE(target.address.empty());
  SameHostPeer x(target, {transport_named("loopback").value(), TransportKind::kTcp});
  Engine& e = x.engine;
  Peer& peer = x.peer;
  EXPECT_EQ(peer.transport(), TransportKind::kTcp);
  ASSERT_FALSE(x.routes.empty());
  EXPECT_EQ(x.routes[0].why, "loopback: cannot reach another process; tcp: chosen (rank 2)");

  std::vector<uint8_t> buf(kSize);
  Region local = e.register_memory(buf.data(), kSize, Access::kLocal);
  Transfer whole{&local, 0, &target.descriptor, 0, kSize};
  ASSERT_TRUE(peer.read({&whole, 1}).wait(kWait).ok());
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(buf[i], target_byte(i)) << i;
}

// A same-host peer whose process may not call process_vm_readv (a seccomp profile, installed
// after its engine opened the shm transport): the pair's probe fails and the shm channel says
// so; writes, reads and write_with_imm still go over it, in 16 KiB pieces through the rings,
// and messages (a large one is pulled into its receive) take TCP. Nothing fails.
TEST(MultiProcess, ASameHostPeerThatCannotReadUsIsServedThroughTheRingsAndMessagesOverTcp) {
  constexpr std::size_t kSize = 4 << 20;
  ScopedEnv deny("FERRY_TEST_DENY_CROSS_MEMORY", "1");
  TargetProcess target(kSize, "shm,tcp");
  ASSERT_FALSE(target.address.empty());
  SameHostPeer x(target, {TransportKind::kShm, TransportKind::kTcp});
  Engine& e = x.engine;
  Peer& peer = x.peer;
  EXPECT_EQ(peer.transport(), TransportKind::kShm);
  const std::string why =
      "the peer (process " + std::to_string(target.pid) + ") may not read this process";
  int messages = 0;
  for (const RouteInfo& r : x.routes) {
    if (r.operations == "send/recv") {
      ++messages;
      EXPECT_EQ(r.transport, TransportKind::kTcp);
      EXPECT_NE(r.why.find("shm: cannot carry send/recv here: " + why), std::string::npos) << r.why;
    } else {
      EXPECT_EQ(r.transport, TransportKind::kShm) << r.operations << ": " << r.why;
    }
  }
  EXPECT_EQ(messages, 1);

  std::vector<uint8_t> buf(kSize), back(kSize);
  Region local = e.register_memory(buf.data(), kSize, Access::kLocal);
  Region check = e.register_memory(back.data(), kSize, Access::kLocal);
  Transfer whole{&local, 0, &target.descriptor, 0, kSize};
  ASSERT_TRUE(peer.read({&whole, 1}).wait(kWait).ok());
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(buf[i], target_byte(i)) << i;
  fill_pattern(buf.data(), kSize, 17);
  Transfer odd{&local, 3, &target.descriptor, 70001, kSize - 90001};
  ASSERT_TRUE(peer.write_with_imm({&odd, 1}, 5).wait(kWait).ok());
  Transfer again{&check, 0, &target.descriptor, 70001, kSize - 90001};
  ASSERT_TRUE(peer.read({&again, 1}).wait(kWait).ok());
  EXPECT_EQ(0, std::memcmp(buf.data() + 3, back.data(), kSize - 90001));
}

// Where cross-memory attach is refused, a region the target allocated is still lent and mapped:
// once lent, a write and a read complete while the target process is stopped.
TEST(MultiProcess, AnAllocatedRegionIsMappedWhereCrossMemoryAttachIsRefused) {
  constexpr std::size_t kSize = 1 << 20;
  ScopedEnv deny("FERRY_TEST_DENY_CROSS_MEMORY", "1");
  ScopedEnv allocate("FERRY_TEST_ALLOCATE", "1");
  TargetProcess target(kSize, "shm");
  ASSERT_FALSE(target.address.empty());
  SameHostPeer x(target, {TransportKind::kShm});
  Peer& peer = x.peer;
  std::vector<uint8_t> buf(kSize), back(kSize);
  Region local = x.engine.register_memory(buf.data(), kSize, Access::kLocal);
  Region check = x.engine.register_memory(back.data(), kSize, Access::kLocal);
  Transfer whole{&local, 0, &target.descriptor, 0, kSize};
  ASSERT_TRUE(peer.read({&whole, 1}).wait(kWait).ok());  // through the rings; lent with it
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(buf[i], target_byte(i)) << i;
  for (int i = 0; i < 400 && memory_files().all == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(memory_files().all, 1);

  ASSERT_EQ(kill(target.pid, SIGSTOP), 0);
  fill_pattern(buf.data(), kSize, 29);
  EXPECT_TRUE(peer.write({&whole, 1}).wait(kWait).ok()) << "a stopped target answers no record";
  Transfer again{&check, 0, &target.descriptor, 0, kSize};
  EXPECT_TRUE(peer.read({&again, 1}).wait(kWait).ok());
  EXPECT_EQ(0, std::memcmp(buf.data(), back.data(), kSize));
  ASSERT_EQ(kill(target.pid, SIGCONT), 0);
}

// A region the target allocated is lent to us on first use: from then on our writes and reads
// copy through the mapping on this thread, without the target's CPU, so they complete even while
// the target process is stopped. When the target dies, the mapping goes with the channel.
TEST(MultiProcess, AnAllocatedRegionIsCopiedThroughItsMappingWithoutTheTarget) {
  constexpr std::size_t kSize = 4 << 20;
  ScopedEnv allocate("FERRY_TEST_ALLOCATE", "1");
  TargetProcess target(kSize, "shm");
  ASSERT_FALSE(target.address.empty());
  SameHostPeer x(target, {TransportKind::kShm});
  Engine& e = x.engine;
  Peer& peer = x.peer;
  EXPECT_EQ(peer.transport(), TransportKind::kShm);
  std::vector<uint8_t> buf(kSize), back(kSize);
  Region local = e.register_memory(buf.data(), kSize, Access::kLocal);
  Region check = e.register_memory(back.data(), kSize, Access::kLocal);
  Transfer whole{&local, 0, &target.descriptor, 0, kSize};
  ASSERT_TRUE(peer.read({&whole, 1}).wait(kWait).ok());  // through the target; lent with it
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(buf[i], target_byte(i)) << i;

  ASSERT_EQ(kill(target.pid, SIGSTOP), 0);
  fill_pattern(buf.data(), kSize, 23);
  Transfer odd{&local, 5, &target.descriptor, 1001, kSize - 3000};
  EXPECT_TRUE(peer.write({&odd, 1}).wait(kWait).ok()) << "a stopped target answers no record";
  Transfer again{&check, 0, &target.descriptor, 1001, kSize - 3000};
  EXPECT_TRUE(peer.read({&again, 1}).wait(kWait).ok());
  EXPECT_EQ(0, std::memcmp(buf.data() + 5, back.data(), kSize - 3000));
  ASSERT_EQ(kill(target.pid, SIGCONT), 0);

  EXPECT_EQ(memory_files().all, 1);
  target.kill_now();
  // The channel closes on the target's death and unmaps what it lent; the op fails, no hang.
  // (The peer may be marked lost by its control connection a moment before the channel's
  // progress thread unmapped.)
  ErrorCode code = ErrorCode::kOk;
  for (int i = 0; i < 400 && code == ErrorCode::kOk; ++i) {
    code = peer.write({&odd, 1}).wait(kWait).code();
    if (code == ErrorCode::kOk) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(code, ErrorCode::kPeerLost);
  for (int i = 0; i < 400 && memory_files().all != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(memory_files().all, 0);
}

// A process we lent a region to, stopped while it holds the mapping: our deregistration asks
// for it back, gets no answer, cuts the peer off after revoke_timeout and returns; the memory
// goes with the region, so what the stopped process writes later reaches nobody.
TEST(MultiProcess, AStoppedPeerHoldingAMappingDoesNotHoldADeregistration) {
  constexpr std::size_t kSize = 1 << 20;
  Config c = SameHostPeer::configured({TransportKind::kShm});
  c.revoke_timeout = std::chrono::milliseconds(300);
  Engine e(c);
  Region lent = e.allocate(kSize, Access::kRemoteReadWrite);
  std::string into = e.address() + " " + lent.descriptor().to_string();
  ScopedEnv write_into("FERRY_TEST_WRITE_INTO", into.c_str());
  TargetProcess writer(4096, "shm");  // it wrote into `lent` before it printed its address
  ASSERT_FALSE(writer.address.empty());
  std::optional<Peer> peer = e.accept(kWait);
  ASSERT_TRUE(peer.has_value());
  // Its second write went through the mapping; the notification after it came to us.
  std::optional<ImmEvent> imm = e.next_imm(kWait);
  ASSERT_TRUE(imm.has_value());
  EXPECT_EQ(imm->imm, 1u);
  const auto* bytes = static_cast<const uint8_t*>(lent.data());
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(bytes[i], target_byte(i)) << i;
  EXPECT_EQ(memory_files(writer.pid).all, 1) << "the writer maps the region it was lent";

  ASSERT_EQ(kill(writer.pid, SIGSTOP), 0);
  ASSERT_TRUE(wait_until_stopped(writer.pid));
  lent.deregister();  // returns: the stopped peer is cut off
  // Its channel closed (which let the region go); the peer follows on the progress thread.
  for (auto until = std::chrono::steady_clock::now() + kWait;
       peer->connected() && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(peer->connected());
  ASSERT_EQ(kill(writer.pid, SIGCONT), 0);
}

}  // namespace
}  // namespace ferry::test
