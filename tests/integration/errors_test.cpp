// Misuse and bad input: every failure is typed, names the call, and changes nothing remotely.
#include <gtest/gtest.h>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    fill_pattern(local_buf, 1);
    remote = p.target.register_memory(remote_buf.data(), remote_buf.size(), Access::kRemoteWrite);
    local = p.initiator.register_memory(local_buf.data(), local_buf.size(), Access::kLocal);
    desc = remote.descriptor();
  }
  Status write(const Descriptor& d, uint64_t roff, uint64_t len, uint64_t loff = 0) {
    Transfer t{&local, loff, &d, roff, len};
    return p.peer.write({&t, 1}).wait(kWait);
  }
  bool remote_untouched() const {
    return std::all_of(remote_buf.begin(), remote_buf.end(), [](uint8_t b) { return b == 0; });
  }

  Pair p;
  std::vector<uint8_t> local_buf = std::vector<uint8_t>(8192);
  std::vector<uint8_t> remote_buf = std::vector<uint8_t>(4096);
  Region local, remote;
  Descriptor desc;
};

TEST_F(Errors, OutOfBoundsIsRefusedByTheInitiator) {
  Status s = write(desc, 4000, 200);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds);
  EXPECT_NE(s.message().find("write entry 0"), std::string::npos) << s.message();
  EXPECT_EQ(write(desc, ~0ull - 1, 4).code(), ErrorCode::kOutOfBounds);
  EXPECT_EQ(write(desc, 0, 16, 8190).code(), ErrorCode::kOutOfBounds) << "local bounds";
  EXPECT_TRUE(remote_untouched());
}

TEST_F(Errors, TargetValidatesEvenWhenTheDescriptorLies) {
  // A forged descriptor claiming more length and more rights passes the initiator's checks;
  // the target must still refuse, and write nothing.
  Descriptor forged = desc;
  forged.length = 1 << 20;
  Status s = write(forged, 4000, 4096);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds) << s.to_string();
  EXPECT_NE(s.message().find("exceeds"), std::string::npos) << s.message();

  forged = desc;
  forged.access = Access::kRemoteReadWrite;
  Transfer t{&local, 0, &forged, 0, 64};
  Status r = p.peer.read({&t, 1}).wait(kWait);
  EXPECT_EQ(r.code(), ErrorCode::kPermissionDenied) << r.to_string();

  forged = desc;
  forged.keys[0].bytes[0] ^= 1;
  EXPECT_EQ(write(forged, 0, 64).code(), ErrorCode::kWrongKey);

  forged = desc;
  forged.region_id += 1;
  EXPECT_EQ(write(forged, 0, 64).code(), ErrorCode::kUnknownRegion);
  EXPECT_TRUE(remote_untouched());
}

TEST_F(Errors, MissingPermissionIsRefusedAtOnce) {
  Transfer t{&local, 0, &desc, 0, 64};
  Status s = p.peer.read({&t, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(s.message().find("remote read"), std::string::npos) << s.message();
}

TEST_F(Errors, RevokedRegionFailsAtTheInitiator) {
  ASSERT_TRUE(write(desc, 0, 64).ok());
  remote.deregister();
  std::fill(remote_buf.begin(), remote_buf.end(), 0);
  Status s = write(desc, 0, 64);
  EXPECT_TRUE(s.code() == ErrorCode::kRevoked || s.code() == ErrorCode::kUnknownRegion)
      << s.to_string();
  EXPECT_TRUE(remote_untouched());
}

TEST_F(Errors, DescriptorOfAnotherEngineOrIncarnationIsRejected) {
  Descriptor stale = desc;
  stale.incarnation ^= 1;
  EXPECT_EQ(write(stale, 0, 8).code(), ErrorCode::kStaleIncarnation);
  Descriptor other = desc;
  other.engine_id ^= 1;
  EXPECT_EQ(write(other, 0, 8).code(), ErrorCode::kWrongPeer);
  Transfer no_remote{&local, 0, nullptr, 0, 8};
  EXPECT_EQ(p.peer.write({&no_remote, 1}).wait(kWait).code(), ErrorCode::kInvalidArgument);
  Transfer no_local{nullptr, 0, &desc, 0, 8};
  EXPECT_EQ(p.peer.write({&no_local, 1}).wait(kWait).code(), ErrorCode::kInvalidArgument);
  // A region of another engine cannot be used as the local side.
  Transfer foreign{&remote, 0, &desc, 0, 8};
  EXPECT_EQ(p.peer.write({&foreign, 1}).wait(kWait).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(remote_untouched());
}

TEST_F(Errors, OneBadEntryFailsTheBatchBeforeAnythingIsSent) {
  std::vector<Transfer> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back({&local, 0, &desc, static_cast<uint64_t>(i) * 64, 64});
  batch.push_back({&local, 0, &desc, 4090, 64});
  Status s = p.peer.write(batch).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds);
  EXPECT_NE(s.message().find("entry 10"), std::string::npos) << s.message();
  EXPECT_TRUE(remote_untouched());
}

TEST_F(Errors, EmptyBatchSucceeds) {
  EXPECT_TRUE(p.peer.write({}).wait(kWait).ok());
  Transfer zero{&local, 0, &desc, 0, 0};
  EXPECT_TRUE(p.peer.write({&zero, 1}).wait(kWait).ok());
}

TEST(Registration, RejectsBadArguments) {
  Engine e(test_config());
  uint8_t b[8];
  EXPECT_THROW(e.register_memory(nullptr, 8, Access::kLocal), Error);
  EXPECT_THROW(e.register_memory(b, 0, Access::kLocal), Error);
  EXPECT_THROW(e.register_memory(b, 8, static_cast<Access>(9)), Error);
}

TEST(Config, RejectsBadSettings) {
  Config c = test_config();
  c.tcp.streams = 0;
  EXPECT_THROW(Engine{c}, Error);
  c = test_config();
  c.slice_bytes = 100;
  EXPECT_THROW(Engine{c}, Error);
  c = test_config();
  c.transports = {};
  EXPECT_THROW(Engine{c}, Error);
  c.transports = {TransportKind::kShm};
  try {
    Engine e(c);
    FAIL() << "an engine with a transport this build lacks was created";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("shm is not built"), std::string::npos) << e.what();
  }
  // Only transports that cannot be used on this host: refused, each one's reason given.
  for (const TransportInfo& t : Engine::transports()) {
    if (t.usable) continue;
    c.transports = {t.kind};
    try {
      Engine e(c);
      FAIL() << "an engine without a usable transport was created";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find(t.detail), std::string::npos) << e.what();
    }
  }
}

TEST(Connect, FailsClearlyWhenNobodyListens) {
  Config c = test_config();
  c.connect_timeout = std::chrono::seconds(2);
  Engine e(c);
  uint16_t port;
  {
    Engine gone(test_config());
    port = gone.port();
  }
  try {
    e.connect("127.0.0.1:" + std::to_string(port));
    FAIL() << "connect succeeded";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kConnectFailed) << err.what();
    EXPECT_NE(std::string(err.what()).find("connect 127.0.0.1"), std::string::npos) << err.what();
  }
  EXPECT_THROW(e.connect("no-port"), Error);
}

}  // namespace
}  // namespace ferry::test
