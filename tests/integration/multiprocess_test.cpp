// Two processes: which transports are offered across the process boundary. (Transfers, a
// killed and a hung target are conformance cases: tests/conformance/multiprocess_test.cpp.)
#include <gtest/gtest.h>

#include <vector>

#include "support/pair.hpp"
#include "support/target_process.hpp"

namespace ferry::test {
namespace {

TEST(MultiProcess, ATransportThatStaysInOneProcessIsNotOfferedToAnother) {
  constexpr std::size_t kSize = 1 << 20;
  TargetProcess target(kSize, "loopback,tcp");
  ASSERT_FALSE(target.address.empty());
  Config c = test_config();
  c.transports = {transport_named("loopback").value(), TransportKind::kTcp};
  Engine e(c);
  Peer peer = e.connect(target.address);
  EXPECT_EQ(peer.reach(), Reach::kSameHost);
  EXPECT_EQ(peer.transport(), TransportKind::kTcp);
  std::vector<RouteInfo> routes = peer.routes();
  ASSERT_FALSE(routes.empty());
  EXPECT_EQ(routes[0].why, "loopback: cannot reach another process; tcp: chosen (rank 2)");

  std::vector<uint8_t> buf(kSize);
  Region local = e.register_memory(buf.data(), kSize, Access::kLocal);
  Transfer whole{&local, 0, &target.descriptor, 0, kSize};
  ASSERT_TRUE(peer.read({&whole, 1}).wait(kWait).ok());
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(buf[i], target_byte(i)) << i;
}

}  // namespace
}  // namespace ferry::test
