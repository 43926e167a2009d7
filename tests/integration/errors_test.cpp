// Misuse and bad input: every failure is typed, names the call, and changes nothing remotely.
#include <gtest/gtest.h>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

TEST(Registration, RejectsBadArguments) {
  Engine e(test_config());
  uint8_t b[8];
  EXPECT_THROW(e.register_memory(nullptr, 8, Access::kLocal), Error);
  EXPECT_THROW(e.register_memory(b, 0, Access::kLocal), Error);
  EXPECT_THROW(e.register_memory(b, 8, static_cast<Access>(9)), Error);
}

TEST(Peer, AnEmptyHandleRefusesWhatNeedsAPeer) {
  Peer empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_FALSE(empty.connected());
  try {
    (void)empty.transport();
    FAIL() << "an empty handle named a transport";
  } catch (const Error& e) {
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("empty Peer handle"), std::string::npos) << e.what();
  }
  uint8_t b[8];
  Engine engine(test_config());
  Region r = engine.register_memory(b, sizeof b, Access::kLocal);
  EXPECT_THROW(empty.send(1, r, 0, sizeof b), Error);
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
  c.transports = {static_cast<TransportKind>(0x70)};  // a kind no build has yet
  try {
    Engine e(c);
    FAIL() << "an engine with a transport this build lacks was created";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("unknown is not built"), std::string::npos) << e.what();
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
