// The engine's routing through real peers: each side takes its own configured order, a
// descriptor without the chosen transport's key goes over the next channel, and what each route
// is and why is reported. Faults injected into the loopback transport show which channel an
// operation really took.
#include <gtest/gtest.h>

#include <string>

#include "support/pair.hpp"
#include "transport/loopback/loopback.hpp"

namespace ferry::test {
namespace {

namespace loopback = transport::loopback;

Config with_transports(std::vector<TransportKind> kinds) {
  Config c = test_config();
  c.transports = std::move(kinds);
  return c;
}

Descriptor without_key(Descriptor d, TransportKind kind) {
  int kept = 0;
  for (int i = 0; i < d.key_count; ++i) {
    if (d.keys[i].transport != kind) d.keys[kept++] = d.keys[i];
  }
  d.key_count = static_cast<uint8_t>(kept);
  return d;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class Routing : public ::testing::Test {
 protected:
  void SetUp() override { loopback::faults().reset(); }
  void TearDown() override { loopback::faults().reset(); }
};

TEST_F(Routing, EachSideTakesItsOwnOrder) {
  // The target prefers loopback, the initiator TCP: both channels exist, each side routes its
  // own operations.
  Pair p(with_transports({loopback::kKind, TransportKind::kTcp}),
         with_transports({TransportKind::kTcp, loopback::kKind}));
  EXPECT_EQ(p.peer.transport(), TransportKind::kTcp);
  EXPECT_EQ(p.target_peer.transport(), loopback::kKind);
  EXPECT_EQ(p.peer.reach(), Reach::kSameProcess);
  std::vector<RouteInfo> routes = p.peer.routes();
  ASSERT_EQ(routes.size(), 3u);
  for (const RouteInfo& r : routes) {
    EXPECT_EQ(r.transport, TransportKind::kTcp) << r.operations;
    EXPECT_EQ(r.why,
              "tcp: chosen (rank 1); loopback: fallback (rank 2, for descriptors without a "
              "tcp key)");
  }

  // Every loopback slice fails: what goes over TCP is untouched.
  loopback::faults().fail_every_slice = 1;
  constexpr std::size_t kSize = 300000;
  Buffer a(p.initiator, kSize, Access::kRemoteReadWrite, 1);
  Buffer b(p.target, kSize, Access::kRemoteReadWrite, 2);
  Descriptor da = a.region.descriptor(), db = b.region.descriptor();
  Transfer to_target{&a.region, 0, &db, 0, kSize};
  ASSERT_TRUE(p.peer.write({&to_target, 1}).wait(kWait).ok());
  EXPECT_EQ(a.bytes, b.bytes);
  fill_pattern(b.bytes, 3);
  Transfer to_initiator{&b.region, 0, &da, 0, kSize};
  Status s = p.target_peer.write({&to_initiator, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kSystem) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "injected")) << s.to_string();

  loopback::faults().reset();
  ASSERT_TRUE(p.target_peer.write({&to_initiator, 1}).wait(kWait).ok());
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST_F(Routing, ADescriptorWithoutTheChosenKeyGoesOverTheNextChannel) {
  Pair p(with_transports({loopback::kKind, TransportKind::kTcp}),
         with_transports({loopback::kKind, TransportKind::kTcp}));
  ASSERT_EQ(p.peer.transport(), loopback::kKind);
  constexpr std::size_t kSize = 64 << 10;
  Buffer src(p.initiator, 2 * kSize, Access::kLocal, 4);
  Buffer dst(p.target, 2 * kSize, Access::kRemoteReadWrite, 5);
  Descriptor full = dst.region.descriptor();
  Descriptor tcp_only = without_key(full, loopback::kKind);

  // The first entry has both keys, the second only TCP's: the whole batch moves to TCP, its
  // first entry's key with it (a loopback key over TCP would be refused as a wrong key).
  loopback::faults().fail_every_slice = 1;
  Transfer batch[] = {{&src.region, 0, &full, 0, kSize},
                      {&src.region, kSize, &tcp_only, kSize, kSize}};
  Status s = p.peer.write(batch).wait(kWait);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(src.bytes, dst.bytes);

  // A descriptor with no key for any channel that carries writes is refused, naming them.
  Descriptor keyless = without_key(tcp_only, TransportKind::kTcp);
  Transfer bad{&src.region, 0, &keyless, 0, kSize};
  s = p.peer.write({&bad, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(s.message(), "no key for loopback or tcp")) << s.to_string();

  // With both keys, loopback carries it (and its injected failure shows it did).
  Transfer preferred{&src.region, 0, &full, 0, kSize};
  EXPECT_EQ(p.peer.write({&preferred, 1}).wait(kWait).code(), ErrorCode::kSystem);
}

TEST(EngineRoutes, PredictedRoutesFollowReach) {
  Config c = with_transports({loopback::kKind, TransportKind::kTcp});
  std::vector<RouteInfo> here = Engine::routes(c, Reach::kSameProcess);
  ASSERT_EQ(here.size(), 3u);
  EXPECT_EQ(here[0].transport, loopback::kKind);
  std::vector<RouteInfo> far = Engine::routes(c, Reach::kOtherHost);
  ASSERT_EQ(far.size(), 3u);
  EXPECT_EQ(far[1].operations, "write_with_imm");
  EXPECT_EQ(far[1].transport, TransportKind::kTcp);
  EXPECT_EQ(far[1].why, "loopback: cannot reach another host; tcp: chosen (rank 2)");
  // Nothing reaches: every route is empty, and says why.
  std::vector<RouteInfo> none =
      Engine::routes(with_transports({loopback::kKind}), Reach::kSameHost);
  ASSERT_EQ(none.size(), 3u);
  EXPECT_FALSE(none[0].transport.has_value());
  EXPECT_EQ(none[0].why, "loopback: cannot reach another process");
}

}  // namespace
}  // namespace ferry::test
