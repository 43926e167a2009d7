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
#include "transport/tcp/tcp_frame.hpp"

namespace ferry::test {
namespace {

namespace tcp = transport::tcp;

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

// trusted_keys pins identities: a listener admits only the keys it lists, a client connects only
// to a listener whose key it lists.
TEST(Auth, TrustedKeysAdmitOnlyTheEnginesTheyName) {
  Engine trusted(test_config());
  Engine stranger(test_config());
  Config sc = test_config();
  sc.trusted_keys = {trusted.public_key()};
  Engine server(sc);
  EXPECT_EQ(connect_error(trusted, server), ErrorCode::kOk);
  EXPECT_EQ(connect_error(stranger, server), ErrorCode::kAuthFailed);
  auto admitted = server.accept(kWait);
  ASSERT_TRUE(admitted.has_value());
  EXPECT_EQ(admitted->public_key(), trusted.public_key());
  EXPECT_FALSE(server.accept(std::chrono::milliseconds(200)).has_value());

  Config cc = test_config();
  cc.trusted_keys = {stranger.public_key()};
  Engine picky(cc);
  EXPECT_EQ(connect_error(picky, server), ErrorCode::kAuthFailed);  // the server is not listed
  EXPECT_EQ(connect_error(picky, stranger), ErrorCode::kOk);        // it is

  Config bad = test_config();
  bad.trusted_keys = {"not-a-key"};
  try {
    Engine refused(bad);
    ADD_FAILURE() << "a malformed trusted key was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

TEST(Wire, VersionMismatchIsRefusedWithAClearError) {
  Engine server(test_config());
  Raw raw(server);
  engine::Hello h = hello_of_a_new_key();
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
    j.kind = TransportKind::kTcp;
    raw.send(engine::encode(j));
    raw.expect_refusal(ErrorCode::kProtocol);
  }
  {
    Raw raw(server);  // a truncated hello body
    auto frame = engine::encode(hello_of_a_new_key());
    frame.pop_back();
    core::store_le(frame.data() + 8, frame.size() - core::kFrameHeaderSize, 4);
    raw.send(frame);
    raw.expect_refusal(ErrorCode::kProtocol);
  }
  expect_engine_still_serves(server);
}

TEST(Wire, MalformedDataFrameDropsOnlyThatPeer) {
  Config c = test_config();
  c.tcp.streams = 1;
  Engine server(c);
  std::vector<uint8_t> mem(4096, 0);
  Region region = server.register_memory(mem.data(), mem.size(), Access::kRemoteReadWrite);

  RawPeer raw(server);
  Raw& stream = *raw.stream;
  auto peer = server.accept(kWait);
  ASSERT_TRUE(peer.has_value());
  EXPECT_TRUE(peer->connected());

  // An ack for an operation the server never started is a protocol violation.
  core::FrameHeader bogus;
  bogus.type = tcp::TcpFrame::kWriteAck;
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

// A raw peer's group frames get exactly what single frames get: every entry checked against
// the region (a lying entry is refused and named, the others land, nothing outside them
// changes), reads answered with the table echoed, and a table that does not add up to the
// frame drops the peer before any byte of it is written.
TEST(Wire, GroupFramesAreCheckedEntryByEntry) {
  Config c = test_config();
  c.tcp.streams = 1;
  Engine server(c);
  std::vector<uint8_t> mem(8192, 0);
  Region region = server.register_memory(mem.data(), 4096, Access::kRemoteReadWrite);
  Descriptor d = region.descriptor();
  uint64_t key = 0;
  std::memcpy(&key, d.key_for(TransportKind::kTcp)->bytes, 8);

  RawPeer raw(server);
  Raw& stream = *raw.stream;
  core::FrameHeader h;
  std::vector<uint8_t> body;
  auto peer = server.accept(kWait);
  ASSERT_TRUE(peer.has_value());

  auto group = [&](core::FrameType type, const std::vector<tcp::GroupEntry>& entries,
                   const std::vector<uint8_t>& data, uint32_t length_delta = 0) {
    core::FrameHeader g;
    g.type = type;
    g.op_id = 77;
    g.region_id = static_cast<uint32_t>(entries.size());
    std::vector<uint8_t> frame(core::kFrameHeaderSize + entries.size() * tcp::kGroupEntrySize);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      tcp::encode_group_entry(entries[i],
                              frame.data() + core::kFrameHeaderSize + i * tcp::kGroupEntrySize);
    }
    frame.insert(frame.end(), data.begin(), data.end());
    g.length = static_cast<uint32_t>(frame.size() - core::kFrameHeaderSize) + length_delta;
    core::encode_header(g, frame.data());
    return frame;
  };
  // Entry index 7 runs past the region (into memory the engine never granted).
  std::vector<tcp::GroupEntry> entries = {
      {d.region_id, 4, key, 100, 5}, {d.region_id, 4, key, 4094, 7}, {d.region_id, 4, key, 200, 9}};
  stream.send(group(tcp::TcpFrame::kWriteGroup, entries,
                    {'a', 'a', 'a', 'a', 'b', 'b', 'b', 'b', 'c', 'c', 'c', 'c'}));
  ASSERT_TRUE(stream.read(h, body).ok());
  EXPECT_EQ(h.type, tcp::TcpFrame::kWriteAck);
  EXPECT_EQ(h.aux32, 3u);
  EXPECT_EQ(h.status, static_cast<uint16_t>(ErrorCode::kOutOfBounds));
  std::string text(body.begin(), body.end());
  EXPECT_NE(text.find("write entry 7:"), std::string::npos) << text;
  for (std::size_t i = 0; i < mem.size(); ++i) {
    uint8_t want = i >= 100 && i < 104 ? 'a' : i >= 200 && i < 204 ? 'c' : 0;
    ASSERT_EQ(mem[i], want) << "byte " << i;
  }

  // Reads: the records echoed, then the bytes; a refused entry refuses the group and is named.
  stream.send(group(tcp::TcpFrame::kReadGroupReq, {entries[2], entries[0]}, {}));
  ASSERT_TRUE(stream.read(h, body).ok());
  EXPECT_EQ(h.type, tcp::TcpFrame::kReadGroupData);
  EXPECT_EQ(h.status, 0);
  EXPECT_EQ(h.region_id, 2u);
  ASSERT_EQ(body.size(), 2 * tcp::kGroupEntrySize + 8);
  EXPECT_EQ(std::string(body.end() - 8, body.end()), "ccccaaaa");
  stream.send(group(tcp::TcpFrame::kReadGroupReq, entries, {}));
  ASSERT_TRUE(stream.read(h, body).ok());
  EXPECT_EQ(h.status, static_cast<uint16_t>(ErrorCode::kOutOfBounds));
  text.assign(body.begin(), body.end());
  EXPECT_NE(text.find("read entry 7:"), std::string::npos) << text;

  // Lengths that do not add up to the frame: a protocol error, the peer is dropped, and not a
  // byte of the group is written.
  std::vector<tcp::GroupEntry> bad = {{d.region_id, 4, key, 300, 0}};
  stream.send(group(tcp::TcpFrame::kWriteGroup, bad, {'x', 'x', 'x', 'x', 'y', 'y'}));
  auto deadline = Clock::now() + kWait;
  while (peer->connected() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(peer->connected());
  EXPECT_EQ(mem[300], 0);
  expect_engine_still_serves(server);
}

}  // namespace
}  // namespace ferry::test
