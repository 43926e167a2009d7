// The engine's routing through real peers: each side takes its own configured order, a
// descriptor without the chosen transport's key goes over the next channel, and what each route
// is and why is reported. Faults injected into the loopback transport show which channel an
// operation really took.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

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

// The descriptor without its keys of `kind` (of one device, or all when `device` is -1).
Descriptor without_key(const Descriptor& d, TransportKind kind, int device = -1) {
  Descriptor out = d;
  out.key_count = 0;
  out.more_keys.clear();
  auto keep = [&](TransportKind k, uint8_t dev, std::span<const uint8_t> bytes) {
    if (k != kind || (device >= 0 && dev != device)) out.add_key(k, dev, bytes);
  };
  for (int i = 0; i < d.key_count; ++i)
    keep(d.keys[i].transport, d.keys[i].device, d.keys[i].view());
  for (const Descriptor::MoreKey& k : d.more_keys) keep(k.transport, k.device, k.bytes);
  return out;
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

TEST_F(Routing, AMultiRailChannelGivesEachLaneTheKeyOfItsRail) {
  // The initiator's loopback has three devices (rails), the target's four: their channel
  // stripes over three, each lane using its rail's key (every rail's key differs, and a wrong
  // one is refused by the target's region table).
  loopback::faults().rails = 4;
  Engine target(with_transports({loopback::kKind, TransportKind::kTcp}));
  loopback::faults().rails = 3;
  Engine initiator(with_transports({loopback::kKind, TransportKind::kTcp}));
  Peer peer = initiator.connect(target.address());
  ASSERT_TRUE(target.accept(kWait).has_value());
  ASSERT_EQ(peer.transport(), loopback::kKind);
  EXPECT_EQ(peer.stats().channel(loopback::kKind)->lanes, 6);

  constexpr std::size_t kSize = 8 << 20;  // 8 slices of 1 MiB: every lane takes some
  Buffer src(initiator, kSize, Access::kLocal, 12);
  Buffer dst(target, kSize, Access::kRemoteReadWrite, 13);
  Descriptor d = Descriptor::parse(dst.region.descriptor().to_string());
  ASSERT_EQ(d.key_count + d.more_keys.size(), 5u) << "tcp and four loopback devices";
  for (uint8_t rail = 0; rail < 4; ++rail) EXPECT_FALSE(d.find_key(loopback::kKind, rail).empty());
  Transfer t{&src.region, 0, &d, 0, kSize};
  ASSERT_TRUE(peer.write({&t, 1}).wait(kWait).ok());
  EXPECT_EQ(src.bytes, dst.bytes);
  fill_pattern(dst.bytes, 14);
  ASSERT_TRUE(peer.read({&t, 1}).wait(kWait).ok());
  EXPECT_EQ(src.bytes, dst.bytes);

  // Several entries, one empty, striped: each entry's keys stay its own.
  fill_pattern(src.bytes, 19);
  constexpr std::size_t kHalf = kSize / 2;
  Transfer parts[] = {{&src.region, 0, &d, kHalf, kHalf},
                      {&src.region, 0, &d, 0, 0},
                      {&src.region, kHalf, &d, 0, kHalf}};
  ASSERT_TRUE(peer.write(parts).wait(kWait).ok());
  EXPECT_EQ(0, std::memcmp(src.bytes.data(), dst.bytes.data() + kHalf, kHalf));
  EXPECT_EQ(0, std::memcmp(src.bytes.data() + kHalf, dst.bytes.data(), kHalf));

  // Rail 2's key replaced by rail 1's: the lanes on rail 2 are refused, striped or not (small
  // operations take the lanes in turn).
  Descriptor swapped = without_key(d, loopback::kKind, 2);
  swapped.add_key(loopback::kKind, 2, d.find_key(loopback::kKind, 1));
  Transfer wrong{&src.region, 0, &swapped, 0, kSize};
  Status s = peer.write({&wrong, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kWrongKey) << s.to_string();
  int refused = 0, landed = 0;
  for (int i = 0; i < 6; ++i) {
    Transfer small{&src.region, 0, &swapped, 0, 4096};
    Status r = peer.write({&small, 1}).wait(kWait);
    if (r.ok()) {
      ++landed;
    } else {
      ++refused;
      EXPECT_EQ(r.code(), ErrorCode::kWrongKey) << r.to_string();
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(landed, 0);

  // Without rail 2's key, the loopback channel cannot carry it: TCP does, for the whole batch,
  // the entry admitted before with it.
  Descriptor two_rails = without_key(d, loopback::kKind, 2);
  loopback::faults().fail_every_slice = 1;
  fill_pattern(src.bytes, 15);
  Transfer over_tcp[] = {{&src.region, 0, &d, 0, kHalf},
                         {&src.region, kHalf, &two_rails, kHalf, kHalf}};
  ASSERT_TRUE(peer.write(over_tcp).wait(kWait).ok());
  EXPECT_EQ(src.bytes, dst.bytes);
  // With TCP's key gone too, the refusal names the missing one.
  Descriptor neither = without_key(two_rails, TransportKind::kTcp);
  Transfer none{&src.region, 0, &neither, 0, kHalf};
  s = peer.write({&none, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(s.message(), "no key for loopback device 2 or tcp")) << s.to_string();
  // Prepared batches keep every rail's keys.
  loopback::faults().fail_every_slice = 0;
  fill_pattern(src.bytes, 16);
  Prepared prepared = peer.prepare_write({&t, 1});
  ASSERT_TRUE(prepared.post().wait(kWait).ok());
  EXPECT_EQ(src.bytes, dst.bytes);
}

TEST_F(Routing, KeysOfSixtyFourBytesReachTheTransportWhole) {
  // A transport whose keys are 64 bytes (a CUDA IPC handle's size): every byte of each reaches
  // the target, which checks them all.
  loopback::faults().rails = 2;
  Config c = with_transports({loopback::kKind, TransportKind::kTcp});
  Engine::set(c, "loopback.key_bytes", "64");  // a setting its transport keeps by name
  Pair p(c, c);
  ASSERT_EQ(p.peer.transport(), loopback::kKind);
  constexpr std::size_t kSize = 3 << 20;
  Buffer src(p.initiator, kSize, Access::kLocal, 31);
  Buffer dst(p.target, kSize, Access::kRemoteReadWrite, 32);
  Descriptor d = Descriptor::parse(dst.region.descriptor().to_string());
  for (uint8_t rail = 0; rail < 2; ++rail) {
    ASSERT_EQ(d.find_key(loopback::kKind, rail).size(), 64u);
  }
  // One large write and read, striped over both rails.
  Transfer whole{&src.region, 0, &d, 0, kSize};
  ASSERT_TRUE(p.peer.write({&whole, 1}).wait(kWait).ok());
  EXPECT_EQ(src.bytes, dst.bytes);
  fill_pattern(dst.bytes, 33);
  ASSERT_TRUE(p.peer.read({&whole, 1}).wait(kWait).ok());
  EXPECT_EQ(src.bytes, dst.bytes);

  // A batch of 1,000 entries at odd sizes and offsets, posted and prepared.
  fill_pattern(src.bytes, 34);
  std::vector<Transfer> batch;
  std::vector<uint8_t> expected = dst.bytes;
  for (std::size_t i = 0, at = 0; i < 1000; ++i) {
    std::size_t length = 1 + (i * 37) % 1021;
    batch.push_back({&src.region, at + 3, &d, at + 5, length});
    std::memcpy(expected.data() + at + 5, src.bytes.data() + at + 3, length);
    at += length + 11;
  }
  ASSERT_TRUE(p.peer.write(batch).wait(kWait).ok());
  EXPECT_EQ(expected, dst.bytes);
  fill_pattern(src.bytes, 35);
  Prepared prepared = p.peer.prepare_write(batch);
  for (const Transfer& t : batch) {
    std::memcpy(expected.data() + t.remote_offset, src.bytes.data() + t.local_offset, t.length);
  }
  for (int post = 0; post < 3; ++post) ASSERT_TRUE(prepared.post().wait(kWait).ok());
  EXPECT_EQ(expected, dst.bytes);

  // One byte of the 64 changed: refused as a wrong key, nothing written.
  std::vector<uint8_t> forged_key(d.find_key(loopback::kKind, 0).begin(),
                                  d.find_key(loopback::kKind, 0).end());
  forged_key[40] ^= 1;
  Descriptor forged = without_key(d, loopback::kKind, 0);
  forged.add_key(loopback::kKind, 0, forged_key);
  std::vector<uint8_t> before = dst.bytes;
  Transfer small{&src.region, 0, &forged, 0, 4096};
  int refused = 0;
  for (int i = 0; i < 4; ++i) {  // small writes take the lanes, and so the rails, in turn
    Status s = p.peer.write({&small, 1}).wait(kWait);
    if (!s.ok()) {
      ++refused;
      EXPECT_EQ(s.code(), ErrorCode::kWrongKey) << s.to_string();
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_EQ(0, std::memcmp(before.data() + 4096, dst.bytes.data() + 4096, kSize - 4096));
}

TEST_F(Routing, AShortKeyBeforeALongOneInOneBatchKeepsItsOwn) {
  // The first entry's key fits the entry (8 bytes, here a truncated 64-byte one); the second's
  // does not, so the op moves every key to its store: each entry must keep its own.
  Config c = with_transports({loopback::kKind});
  Engine::set(c, "loopback.key_bytes", "64");
  Pair p(c, c);
  constexpr std::size_t kSize = 8192;
  Buffer src(p.initiator, kSize, Access::kLocal, 41);
  Buffer dst(p.target, kSize, Access::kRemoteReadWrite, 42);
  Descriptor d = dst.region.descriptor();
  std::span<const uint8_t> key = d.find_key(loopback::kKind, 0);
  Descriptor truncated = without_key(d, loopback::kKind);
  truncated.add_key(loopback::kKind, 0, key.first(8));
  std::vector<uint8_t> before = dst.bytes;
  Transfer batch[] = {{&src.region, 0, &truncated, 0, 4096}, {&src.region, 4096, &d, 4096, 4096}};
  Status s = p.peer.write(batch).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kWrongKey) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "write entry 0: ")) << s.to_string();
  EXPECT_EQ(0, std::memcmp(before.data(), dst.bytes.data(), 4096)) << "entry 0 refused";
  EXPECT_EQ(0, std::memcmp(src.bytes.data() + 4096, dst.bytes.data() + 4096, 4096))
      << "entry 1 landed with its own key";
}

TEST_F(Routing, MemoryNoChannelCanMoveIsRefusedAndNamed) {
  Pair p(with_transports({loopback::kKind, TransportKind::kTcp}),
         with_transports({loopback::kKind, TransportKind::kTcp}));
  Buffer src(p.initiator, 4096, Access::kLocal, 17);
  Buffer dst(p.target, 4096, Access::kRemoteReadWrite, 18);
  std::vector<uint8_t> before = dst.bytes;
  Descriptor host = dst.region.descriptor();
  EXPECT_EQ(host.memory, MemoryKind::kHost);
  Descriptor device = host;
  device.memory = MemoryKind::kCuda;  // as a descriptor of GPU memory would say
  device = Descriptor::decode(device.encode());
  ASSERT_EQ(device.memory, MemoryKind::kCuda);

  Transfer t{&src.region, 0, &device, 0, 4096};
  Status s = p.peer.write({&t, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "from host to cuda memory")) << s.to_string();
  // A later entry of a kind no channel moves is refused by its index.
  Transfer mixed[] = {{&src.region, 0, &host, 0, 2048}, {&src.region, 2048, &device, 2048, 2048}};
  s = p.peer.write(mixed).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "entry 1: region")) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "is cuda memory, which loopback or tcp")) << s.to_string();
  EXPECT_EQ(dst.bytes, before) << "a refused batch writes nothing";
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

// FERRY_TRANSPORTS orders and restricts the transports without a rebuild: engines and the
// predicted routes take it, a configuration may opt out, and a bad value names itself.
TEST(EngineRoutes, TheEnvironmentOrdersAndRestrictsTheTransports) {
  Config c = test_config();
  c.transports_from_environment = true;
  {
    ScopedEnv env(Engine::kTransportsVariable, "loopback,tcp");
    Engine e(c);
    EXPECT_EQ(e.config().transports,
              (std::vector<TransportKind>{loopback::kKind, TransportKind::kTcp}));
    EXPECT_EQ(Engine::routes(c, Reach::kSameProcess)[0].transport, loopback::kKind);
    // Two engines so configured talk over loopback, the first one it names.
    Engine other(c);
    Peer p = e.connect(other.address());
    EXPECT_EQ(p.transport(), loopback::kKind);
    Config own = c;
    own.transports_from_environment = false;
    EXPECT_EQ(Engine(own).config().transports, c.transports);
  }
  for (const char* bad : {"tcp,nope", "", "tcp,", ",tcp"}) {
    ScopedEnv env(Engine::kTransportsVariable, bad);
    try {
      Engine e(c);
      ADD_FAILURE() << "FERRY_TRANSPORTS=\"" << bad << "\" was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_TRUE(contains(e.what(), std::string("FERRY_TRANSPORTS=\"") + bad + "\"")) << e.what();
      EXPECT_TRUE(contains(e.what(), "(known: tcp, shm, verbs, cuda_ipc, loopback)")) << e.what();
    }
    EXPECT_THROW(Engine::routes(c, Reach::kSameHost), Error);
  }
  ScopedEnv env(Engine::kTransportsVariable, "tcp,nope");
  try {
    Engine e(c);
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "unknown transport 'nope'")) << e.what();
  }
}

// The same-host transport's settings out of range stop the engine with the setting named.
TEST(EngineRoutes, SameHostSettingsOutOfRangeAreRefused) {
  Config c = test_config();
  c.transports = {TransportKind::kShm, TransportKind::kTcp};
  struct Poll {
    Duration ShmConfig::*field;
    std::string name;
  };
  for (const Poll& poll : {Poll{&ShmConfig::stream_poll, "shm.stream_poll"},
                           Poll{&ShmConfig::request_poll, "shm.request_poll"}}) {
    for (Duration bad : {Duration(-1), Duration(std::chrono::seconds(2))}) {
      Config wrong = c;
      wrong.shm.*poll.field = bad;
      try {
        Engine e(wrong);
        ADD_FAILURE() << poll.name << " " << bad.count() << " ns was taken";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
        EXPECT_TRUE(contains(e.what(), "config: " + poll.name + " must be 0..1s (is ")) << e.what();
      }
    }
    Config off = c;
    off.shm.*poll.field = Duration::zero();
    EXPECT_NO_THROW(Engine{off});
  }
}

}  // namespace
}  // namespace ferry::test
