// Authentication, protocol versions and malformed input on the wire.
#include <gtest/gtest.h>

#include <thread>

#include "core/bytes.hpp"
#include "core/crypto.hpp"
#include "core/frame.hpp"
#include "core/net.hpp"
#include "engine/handshake.hpp"
#include "support/pair.hpp"
#include "support/raw_client.hpp"

namespace ferry::test {
namespace {

Config with_secret(const std::string& secret) {
  Config c = test_config();
  c.secret = secret;
  return c;
}

ErrorCode connect_error(Engine& from, Engine& to) {
  try {
    from.connect(to.address());
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kOk;
}

TEST(Auth, SharedSecretAdmitsAndRefuses) {
  Engine server(with_secret("s3cret"));
  Engine good(with_secret("s3cret"));
  Engine wrong(with_secret("guess"));
  Engine none(test_config());
  EXPECT_EQ(connect_error(good, server), ErrorCode::kOk);
  EXPECT_EQ(connect_error(wrong, server), ErrorCode::kAuthFailed);
  EXPECT_EQ(connect_error(none, server), ErrorCode::kAuthFailed);
  // A client with a secret refuses a server that cannot prove it knows it.
  EXPECT_EQ(connect_error(good, none), ErrorCode::kAuthFailed);
  // Only the authenticated peer was admitted.
  EXPECT_TRUE(server.accept(kWait).has_value());
  EXPECT_FALSE(server.accept(std::chrono::milliseconds(200)).has_value());
}

void expect_engine_still_serves(Engine& server) {
  Engine client(test_config());
  EXPECT_NO_THROW(client.connect(server.address()));
}

TEST(Wire, VersionMismatchIsRefusedWithAClearError) {
  Engine server(test_config());
  Raw raw(server);
  engine::Hello h = hello_from(5);
  h.version = 99;
  raw.send(engine::encode(h));
  raw.expect_refusal(ErrorCode::kVersionMismatch);
  expect_engine_still_serves(server);
}

TEST(Wire, GarbageAndForeignProtocolsAreRefused) {
  Engine server(test_config());
  {
    Raw raw(server);
    raw.send(std::vector<uint8_t>(core::kFrameHeaderSize, 0xee));
    raw.expect_refusal(ErrorCode::kProtocol);
  }
  {
    Raw raw(server);  // an HTTP client
    std::string get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(40, ' ');
    raw.send(std::vector<uint8_t>(get.begin(), get.end()));
    raw.expect_refusal(ErrorCode::kProtocol);
  }
  {
    Raw raw(server);  // a join for a session that does not exist
    engine::Join j;
    j.token[0] = 1;
    raw.send(engine::encode(j));
    raw.expect_refusal(ErrorCode::kProtocol);
  }
  {
    Raw raw(server);  // a truncated hello body
    auto frame = engine::encode(hello_from(6));
    frame.pop_back();
    core::store_le(frame.data() + 8, frame.size() - core::kFrameHeaderSize, 4);
    raw.send(frame);
    raw.expect_refusal(ErrorCode::kProtocol);
  }
  expect_engine_still_serves(server);
}

TEST(Wire, MalformedDataFrameDropsOnlyThatPeer) {
  Config c = test_config();
  c.tcp_streams = 1;
  Engine server(c);
  std::vector<uint8_t> mem(4096, 0);
  Region region = server.register_memory(mem.data(), mem.size(), Access::kRemoteReadWrite);

  Raw control(server);
  control.send(engine::encode(hello_from(7)));
  core::FrameHeader h;
  std::vector<uint8_t> body;
  ASSERT_TRUE(control.read(h, body).ok());
  ASSERT_EQ(h.type, core::FrameType::kHelloAck);
  engine::HelloAck ack;
  ASSERT_TRUE(engine::decode(body, ack).ok());
  Raw stream(server);
  engine::Join join;
  join.token = ack.token;
  stream.send(engine::encode(join));
  ASSERT_TRUE(stream.read(h, body).ok());
  ASSERT_EQ(h.type, core::FrameType::kJoinOk);
  auto peer = server.accept(kWait);
  ASSERT_TRUE(peer.has_value());
  EXPECT_TRUE(peer->connected());

  // An ack for an operation the server never started is a protocol violation.
  core::FrameHeader bogus;
  bogus.type = core::FrameType::kWriteAck;
  bogus.op_id = 12345;
  std::vector<uint8_t> frame(core::kFrameHeaderSize);
  core::encode_header(bogus, frame.data());
  stream.send(frame);
  auto deadline = Clock::now() + kWait;
  while (peer->connected() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(peer->connected());
  EXPECT_TRUE(std::all_of(mem.begin(), mem.end(), [](uint8_t b) { return b == 0; }));
  expect_engine_still_serves(server);
}

}  // namespace
}  // namespace ferry::test
