// A raw TCP connection to an engine, speaking the wire protocol by hand: the hostile or broken
// client of the security and availability tests.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/crypto.hpp"
#include "core/frame.hpp"
#include "core/net.hpp"
#include "engine/handshake.hpp"
#include "ferry/ferry.hpp"

namespace ferry::test {

struct Raw {
  // Connects from `source` (any 127.x.y.z address reaches a loopback listener; a second
  // source stands for another host).
  explicit Raw(const Engine& e, const std::string& source = "127.0.0.1") {
    fd = core::Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) throw Error(ErrorCode::kSystem, "socket");
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
      throw Error(ErrorCode::kSystem, "bind " + source);
    }
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(e.port());
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      throw Error(ErrorCode::kConnectFailed, "connect from " + source);
    }
  }
  // A connection our test listener accepted: it plays a hostile server.
  explicit Raw(core::Fd accepted) : fd(std::move(accepted)) {}
  static core::Deadline deadline() { return Clock::now() + std::chrono::seconds(20); }
  void send(const std::vector<uint8_t>& bytes) {
    ASSERT_TRUE(core::write_all(fd.get(), bytes, deadline()).ok());
  }
  // Reads one frame; returns its header and body.
  Status read(core::FrameHeader& h, std::vector<uint8_t>& body) {
    uint8_t raw[core::kFrameHeaderSize];
    if (Status s = core::read_all(fd.get(), raw, deadline()); !s.ok()) return s;
    if (Status s = core::decode_header(raw, h); !s.ok()) return s;
    body.resize(h.length);
    return core::read_all(fd.get(), body, deadline());
  }
  // The Error frame the engine sent before closing, as a Status (kOk if another frame came).
  Status refusal() {
    core::FrameHeader h;
    std::vector<uint8_t> body;
    if (Status s = read(h, body); !s.ok())
      return {ErrorCode::kProtocol, "no refusal: " + s.to_string()};
    if (h.type != core::FrameType::kError) return {};
    engine::ErrorMsg e;
    if (Status s = engine::decode(body, e); !s.ok()) return s;
    return {e.code, e.message};
  }
  // The engine answered with an Error frame of `code`, then closed.
  void expect_refusal(ErrorCode code) {
    Status s = refusal();
    EXPECT_EQ(s.code(), code) << s.to_string();
    core::FrameHeader h;
    std::vector<uint8_t> body;
    EXPECT_EQ(read(h, body).code(), ErrorCode::kPeerLost) << "connection closed afterwards";
  }
  core::Fd fd;
};

// A HELLO claiming the identity `key` (whoever holds it).
inline engine::Hello hello_from(const core::PublicKey& key, uint64_t incarnation = 1) {
  engine::Hello h;
  h.key = key;
  h.incarnation = incarnation;
  h.transports = {TransportKind::kTcp};
  core::random_bytes(h.nonce);
  return h;
}

// A HELLO of an identity nobody will prove.
inline engine::Hello hello_of_a_new_key() {
  return hello_from(core::SigningKey::generate().public_key());
}

// A raw client of an identity of its own: its key, and the HELLO and AUTH that prove it.
struct RawIdentity {
  core::SigningKey key = core::SigningKey::generate();
  engine::Hello hello = hello_from(key.public_key());
  // AUTH for the server's answer `ack`, with a MAC of `secret` when one is given.
  std::vector<uint8_t> auth(const engine::HelloAck& ack, const std::string& secret = {}) const {
    const engine::Transcript t = engine::transcript_of(hello, ack);
    engine::Auth a{engine::sign_transcript(key, false, t), std::nullopt};
    if (!secret.empty()) a.mac = engine::auth_mac(secret, false, t);
    return engine::encode(a);
  }
};

// A raw server's answer to `hello`, signed by `key`, naming `channels`.
inline engine::HelloAck signed_hello_ack(const core::SigningKey& key, const engine::Hello& hello,
                                         std::vector<TransportKind> channels) {
  engine::HelloAck ack;
  ack.key = key.public_key();
  ack.incarnation = 1;
  ack.channels = std::move(channels);
  core::random_bytes(ack.nonce);
  ack.signature = engine::sign_transcript(key, true, engine::transcript_of(hello, ack));
  return ack;
}

// The server's HELLO_ACK, read from `raw` (a test failure if another frame came).
inline engine::HelloAck read_hello_ack(Raw& raw) {
  core::FrameHeader h;
  std::vector<uint8_t> body;
  engine::HelloAck ack;
  EXPECT_TRUE(raw.read(h, body).ok());
  EXPECT_EQ(h.type, core::FrameType::kHelloAck);
  EXPECT_TRUE(engine::decode(body, ack).ok());
  return ack;
}

// The CHANNEL_ADDRESSES frame of a client with one TCP channel of `streams` streams.
inline std::vector<uint8_t> tcp_channel_addresses(uint16_t streams = 1) {
  engine::ChannelAddresses m;
  m.channels.push_back({TransportKind::kTcp, {static_cast<uint8_t>(streams), 0}});
  return engine::encode(m);
}

// A raw peer admitted by `server` (tcp.streams 1) with its one data stream: what a hostile
// client holds after a complete handshake. Without `await_join_ok` it sends its stream's JOIN
// and returns at once, so it can leave while the server is still admitting it. With a server of
// more streams it joins only the first: the server holds it as joining, never publishes it.
struct RawPeer {
  explicit RawPeer(Engine& server, const std::string& source = "127.0.0.1",
                   bool await_join_ok = true)
      : control(server, source) {
    control.send(engine::encode(identity.hello));
    engine::HelloAck ack = read_hello_ack(control);
    control.send(identity.auth(ack));
    control.send(tcp_channel_addresses());
    core::FrameHeader h;
    std::vector<uint8_t> body;
    EXPECT_TRUE(control.read(h, body).ok());
    EXPECT_EQ(h.type, core::FrameType::kChannelAddresses);
    stream = std::make_unique<Raw>(server, source);
    engine::Join join;
    join.token = ack.token;
    join.kind = TransportKind::kTcp;
    stream->send(engine::encode(join));
    if (!await_join_ok) return;
    EXPECT_TRUE(stream->read(h, body).ok());
    EXPECT_EQ(h.type, core::FrameType::kJoinOk);
  }
  RawIdentity identity;
  Raw control;
  std::unique_ptr<Raw> stream;
};

}  // namespace ferry::test
