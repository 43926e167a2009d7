// Shutdown, closing, deregistration under load, several engines, restarted peers.
#include <gtest/gtest.h>

#include <thread>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

TEST(Lifecycle, AnEngineThatDoesNotListenOpensNoPortAndServesItsPeersBothWays) {
  Config quiet = test_config();
  quiet.listen = false;
  Engine initiator(quiet);
  EXPECT_EQ(initiator.address(), "");
  EXPECT_TRUE(initiator.addresses().empty());
  EXPECT_EQ(initiator.port(), 0);

  Engine target(test_config());
  Peer to_target = initiator.connect(target.address());
  std::optional<Peer> to_initiator = target.accept(kWait);
  ASSERT_TRUE(to_initiator.has_value());
  // The target starts an operation too, over the connection the initiator opened.
  std::vector<uint8_t> mine(4096, 0), theirs(4096);
  fill_pattern(theirs, 3);
  Region granted = initiator.register_memory(mine.data(), mine.size(), Access::kRemoteWrite);
  Region source = target.register_memory(theirs.data(), theirs.size(), Access::kLocal);
  Descriptor d = granted.descriptor();
  Transfer t{&source, 0, &d, 0, theirs.size()};
  ASSERT_TRUE(to_initiator->write({&t, 1}).wait(kWait).ok());
  EXPECT_EQ(mine, theirs);
}

TEST(Lifecycle, AWildcardListenerAdvertisesInterfaceAddressesWithLoopbackLast) {
  Config any = test_config();
  any.listen_host = "0.0.0.0";
  Engine target(any);
  std::vector<std::string> addresses = target.addresses();
  ASSERT_FALSE(addresses.empty());
  EXPECT_EQ(target.address(), addresses.front());
  std::string port = ":" + std::to_string(target.port());
  for (const auto& a : addresses) {
    EXPECT_NE(a.rfind("0.0.0.0", 0), 0u) << "a wildcard is no address to connect to";
    EXPECT_EQ(a.substr(a.size() - port.size()), port);
  }
  EXPECT_EQ(addresses.back(), "127.0.0.1" + port);
  // Only the loopback entry is dialled: tests send no traffic to other interfaces.
  Engine initiator(test_config());
  Peer peer = initiator.connect(addresses.back());
  EXPECT_TRUE(peer.connected());
}

TEST(Lifecycle, SeveralEnginesInOneProcess) {
  std::vector<std::unique_ptr<Engine>> engines;
  for (int i = 0; i < 3; ++i) engines.push_back(std::make_unique<Engine>(test_config()));
  std::vector<std::vector<uint8_t>> mem(3, std::vector<uint8_t>(4096));
  std::vector<Region> regions;
  for (int i = 0; i < 3; ++i) {
    std::fill(mem[i].begin(), mem[i].end(), static_cast<uint8_t>(i + 1));
    regions.push_back(engines[i]->register_memory(mem[i].data(), 4096, Access::kRemoteReadWrite));
  }
  // Each engine reads its right neighbour's region.
  for (int i = 0; i < 3; ++i) {
    int j = (i + 1) % 3;
    Peer peer = engines[i]->connect(engines[j]->address());
    std::vector<uint8_t> got(4096);
    Region lr = engines[i]->register_memory(got.data(), got.size(), Access::kLocal);
    Descriptor d = regions[j].descriptor();
    Transfer t{&lr, 0, &d, 0, 4096};
    ASSERT_TRUE(peer.read({&t, 1}).wait(kWait).ok());
    EXPECT_EQ(got, mem[j]);
  }
  EXPECT_NE(engines[0]->id(), engines[1]->id());
}

// A target that waits for one initiator to come and go watches peers_admitted (the Python
// examples' serve_one): an initiator that wrote and left before its last stream's join was
// handled must count too. It did not, once, on a loaded machine; the window is narrow, so only
// rounds that hit it can catch a regression.
TEST(Lifecycle, EveryPeerThatConnectedIsCountedAdmittedHoweverFastItLeft) {
  Engine server(test_config());
  std::vector<uint8_t> mem(4096);
  Region region = server.register_memory(mem.data(), mem.size(), Access::kRemoteWrite);
  Descriptor d = region.descriptor();
  constexpr uint64_t kRounds = 50;
  for (uint64_t i = 0; i < kRounds; ++i) {
    Config c = test_config();
    c.listen = false;
    Engine client(c);
    Peer peer = client.connect(server.address());
    std::vector<uint8_t> src(4096, static_cast<uint8_t>(i));
    Region lr = client.register_memory(src.data(), src.size(), Access::kLocal);
    Transfer t{&lr, 0, &d, 0, src.size()};
    ASSERT_TRUE(peer.write({&t, 1}).wait(kWait).ok());
  }  // each client leaves at once
  auto deadline = Clock::now() + kWait;
  while (server.stats().peers > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EngineStats s = server.stats();
  EXPECT_EQ(s.peers, 0u);
  EXPECT_EQ(s.peers_admitted, kRounds);
}

TEST(Lifecycle, RestartedPeerIsANewIncarnation) {
  Config tc = test_config();
  ScratchPath key_file("restarted-target.pem");
  tc.identity_file = key_file.str();
  auto target = std::make_unique<Engine>(tc);
  tc.listen_port = target->port();
  std::vector<uint8_t> mem(4096), src(4096, 9);
  Region r = target->register_memory(mem.data(), mem.size(), Access::kRemoteWrite);
  Descriptor old_desc = r.descriptor();

  Engine initiator(test_config());
  Region lr = initiator.register_memory(src.data(), src.size(), Access::kLocal);
  Peer p1 = initiator.connect(target->address());
  Transfer t{&lr, 0, &old_desc, 0, 64};
  ASSERT_TRUE(p1.write({&t, 1}).wait(kWait).ok());

  r.deregister();
  const uint64_t id = target->id();
  target.reset();  // the target process "restarts" on the same port with the same identity
  target = std::make_unique<Engine>(tc);
  EXPECT_EQ(target->id(), id);
  Region r2 = target->register_memory(mem.data(), mem.size(), Access::kRemoteWrite);

  EXPECT_EQ(p1.write({&t, 1}).wait(kWait).code(), ErrorCode::kPeerLost);
  Peer p2 = initiator.connect(target->address());
  EXPECT_EQ(p2.engine_id(), id);
  EXPECT_EQ(p2.write({&t, 1}).wait(kWait).code(), ErrorCode::kStaleIncarnation);
  Descriptor fresh = r2.descriptor();
  Transfer t2{&lr, 0, &fresh, 0, 64};
  EXPECT_TRUE(p2.write({&t2, 1}).wait(kWait).ok());
}

}  // namespace
}  // namespace ferry::test
