// Availability under hostile clients: connections that say nothing, trickle, stop half-way
// through authentication, flood, claim another engine's identity, or come and go without ever
// being accepted. Each test checks that a well-behaved peer beside them still connects and
// transfers, and that what the engine holds stays within its configured limits.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/crypto.hpp"
#include "support/pair.hpp"
#include "support/raw_client.hpp"
#include "support/raw_shm_peer.hpp"
#include "transport/tcp/tcp_frame.hpp"

namespace ferry::test {
namespace {

namespace tcp = transport::tcp;

// Stands for another host: the listener is on 127.0.0.1, the hostile clients come from here.
const std::string kOtherHost = "127.0.0.2";

bool eventually(const std::function<bool()>& done, Duration timeout = kWait) {
  auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A legitimate client beside the hostile ones: it connects and writes 4 KiB, and the bytes
// arrive. Its connect_timeout is far below the server's, so a server stalled by the hostile
// connections makes this fail with kTimeout instead of passing late.
void expect_legitimate_peer_served(Engine& server, const Config& client_config = test_config()) {
  Config c = client_config;
  c.connect_timeout = std::chrono::seconds(15);
  Engine client(c);
  std::vector<uint8_t> target(4096, 0);
  Region remote = server.register_memory(target.data(), target.size(), Access::kRemoteWrite);
  Buffer src(client, 4096, Access::kLocal, 7);
  auto started = Clock::now();
  Peer peer = client.connect(server.address());
  Descriptor d = remote.descriptor();
  Transfer t{&src.region, 0, &d, 0, 4096};
  ASSERT_TRUE(peer.write({&t, 1}).wait(kWait).ok());
  auto took = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started);
  EXPECT_EQ(target, src.bytes);
  std::printf("[ figure ] legitimate connect + 4 KiB write beside the hostile clients: %lld us\n",
              static_cast<long long>(took.count()));
}

Config patient_server() {
  Config c = test_config();
  // Far longer than any test waits: a handshake that blocked others would show as a failure.
  c.connect_timeout = std::chrono::seconds(60);
  return c;
}

std::vector<std::unique_ptr<Raw>> silent_connections(const Engine& server, int n,
                                                     const std::string& source = kOtherHost) {
  std::vector<std::unique_ptr<Raw>> out;
  for (int i = 0; i < n; ++i) out.push_back(std::make_unique<Raw>(server, source));
  return out;
}

TEST(Hostile, SilentConnectionsDelayNeitherConnectsNorShutdown) {
  Engine server(patient_server());
  auto silent = silent_connections(server, 30);
  ASSERT_TRUE(eventually([&] { return server.stats().pending_handshakes == 30; }));
  expect_legitimate_peer_served(server);
  EXPECT_EQ(server.stats().pending_handshakes, 30u);
  // Shutdown ends them at once: each is told kCancelled, not left to time out after 60 s.
  auto started = Clock::now();
  server.shutdown();
  std::printf(
      "[ figure ] shutdown() with 30 silent handshakes pending: %lld us\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started).count()));
  for (auto& raw : silent) raw->expect_refusal(ErrorCode::kCancelled);
}

TEST(Hostile, TricklingAndHalfSentFramesDelayNoOne) {
  Engine server(patient_server());
  std::vector<std::vector<uint8_t>> hellos;
  std::vector<std::unique_ptr<Raw>> tricklers;
  for (std::size_t i = 0; i < 20; ++i) {
    hellos.push_back(engine::encode(hello_of_a_new_key()));
    tricklers.push_back(std::make_unique<Raw>(server, kOtherHost));
    // Part of a header, or a header and part of the body; the rest comes later.
    tricklers.back()->send({hellos[i].begin(), hellos[i].begin() + static_cast<long>(30 + 2 * i)});
  }
  expect_legitimate_peer_served(server);
  for (std::size_t i = 0; i < tricklers.size(); ++i) {
    tricklers[i]->send({hellos[i].begin() + static_cast<long>(30 + 2 * i), hellos[i].end()});
  }
  // Completed late, each still gets its answer.
  for (auto& raw : tricklers) {
    core::FrameHeader h;
    std::vector<uint8_t> body;
    ASSERT_TRUE(raw->read(h, body).ok());
    EXPECT_EQ(h.type, core::FrameType::kHelloAck);
  }
}

TEST(Hostile, HalfAuthenticatedConnectionsDelayNoOne) {
  Config c = patient_server();
  c.secret = "s3cret";
  Engine server(c);
  std::vector<std::unique_ptr<Raw>> halfway;
  for (int i = 0; i < 20; ++i) {
    halfway.push_back(std::make_unique<Raw>(server, kOtherHost));
    halfway.back()->send(engine::encode(hello_of_a_new_key()));
    core::FrameHeader h;
    std::vector<uint8_t> body;
    ASSERT_TRUE(halfway.back()->read(h, body).ok());
    ASSERT_EQ(h.type, core::FrameType::kHelloAck);  // and then no AUTH
  }
  Config client = test_config();
  client.secret = "s3cret";
  expect_legitimate_peer_served(server, client);
  // The legitimate peer leaves as its engine goes; the server learns it a moment later.
  EXPECT_TRUE(eventually([&] { return server.stats().peers == 0; }));
  EXPECT_LE(server.stats().peers_admitted, 1u) << "a half-authenticated client was admitted";
}

TEST(Hostile, HandshakesPerSourceAreCapped) {
  Config c = patient_server();
  c.max_handshakes_per_source = 8;
  Engine server(c);
  auto silent = silent_connections(server, 8);
  ASSERT_TRUE(eventually([&] { return server.stats().pending_handshakes == 8; }));
  Raw ninth(server, kOtherHost);
  ninth.expect_refusal(ErrorCode::kResourceExhausted);
  EXPECT_EQ(server.stats().pending_handshakes, 8u);
  expect_legitimate_peer_served(server);  // from another source
}

TEST(Hostile, AFullHandshakeTableEvictsTheHeaviestSource) {
  Config c = patient_server();
  c.max_handshakes = 16;
  Engine server(c);
  auto silent = silent_connections(server, 16);
  ASSERT_TRUE(eventually([&] { return server.stats().pending_handshakes == 16; }));
  expect_legitimate_peer_served(server);
  // The legitimate client's control connection found the table full and evicted the oldest
  // silent one; its two streams, joining at once, found that place and perhaps, if the first
  // had not left yet, evicted the next oldest.
  silent[0]->expect_refusal(ErrorCode::kResourceExhausted);
  uint64_t pending = server.stats().pending_handshakes;
  EXPECT_TRUE(pending == 15u || pending == 14u) << pending;
}

TEST(Hostile, SlowHandshakesTimeOutOnTheirOwnDeadline) {
  Config c = test_config();
  c.connect_timeout = std::chrono::milliseconds(300);
  Engine server(c);
  Raw silent(server, kOtherHost);
  silent.expect_refusal(ErrorCode::kTimeout);
  EXPECT_EQ(server.stats().pending_handshakes, 0u);
  EXPECT_GE(server.stats().refused_connections, 1u);
}

TEST(Hostile, MaxPeersIsEnforcedAndFreedByLeavingPeers) {
  Config c = test_config();
  c.max_peers = 2;
  Engine server(c);
  Engine a(test_config()), b(test_config()), d(test_config());
  Peer pa = a.connect(server.address());
  Peer pb = b.connect(server.address());
  try {
    d.connect(server.address());
    ADD_FAILURE() << "a third peer was admitted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
  }
  pa.close();
  ASSERT_TRUE(eventually([&] { return server.stats().peers == 1; }));
  EXPECT_NO_THROW(d.connect(server.address()));
  // Peers this engine connects to count too.
  Config small = test_config();
  small.max_peers = 1;
  Engine lone(small);
  Engine other(test_config()), another(test_config());
  Peer first = lone.connect(other.address());
  try {
    lone.connect(another.address());
    ADD_FAILURE() << "connect went past max_peers";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
  }
}

// The answer a raw client from `source` gets once it proved its identity: the frame type (the
// server's CHANNEL_ADDRESSES when admitted), and the message of an ERROR frame.
std::pair<core::FrameType, std::string> answer_to_handshake(Engine& server,
                                                            const std::string& source) {
  Raw raw(server, source);
  RawIdentity identity;
  raw.send(engine::encode(identity.hello));
  raw.send(identity.auth(read_hello_ack(raw)));
  raw.send(tcp_channel_addresses());
  core::FrameHeader h;
  std::vector<uint8_t> body;
  EXPECT_TRUE(raw.read(h, body).ok());
  engine::ErrorMsg e;
  if (h.type == core::FrameType::kError) {
    EXPECT_TRUE(engine::decode(body, e).ok());
  }
  return {h.type, e.message};
}

// One source address cannot take every peer place: its peers not yet proven by their joins,
// and its peers in all, are capped below max_peers; other sources are admitted meanwhile.
TEST(Hostile, OneSourceHoldsOnlyItsShareOfPeerPlaces) {
  {
    Config c = patient_server();  // unjoined places do not expire during the test
    c.tcp.streams = 2;            // a raw peer joins one stream of two: it stays joining
    c.max_joining_per_source = 3;
    Engine server(c);
    std::vector<std::unique_ptr<RawPeer>> unjoined;
    for (int i = 0; i < 3; ++i) unjoined.push_back(std::make_unique<RawPeer>(server, kOtherHost));
    ASSERT_TRUE(eventually([&] { return server.stats().peers == 3; }));
    auto [type, said] = answer_to_handshake(server, kOtherHost);
    EXPECT_EQ(type, core::FrameType::kError);
    EXPECT_NE(said.find("max_joining_per_source 3"), std::string::npos) << said;
    expect_legitimate_peer_served(server);  // from 127.0.0.1
  }
  {
    Config c = test_config();
    c.tcp.streams = 1;  // a raw peer joins its one stream: admitted in full
    c.max_peers_per_source = 3;
    Engine server(c);
    std::vector<std::unique_ptr<RawPeer>> admitted;
    for (int i = 0; i < 3; ++i) admitted.push_back(std::make_unique<RawPeer>(server, kOtherHost));
    ASSERT_TRUE(eventually([&] { return server.stats().peers == 3; }));
    auto [type, said] = answer_to_handshake(server, kOtherHost);
    EXPECT_EQ(type, core::FrameType::kError);
    EXPECT_NE(said.find("max_peers_per_source 3"), std::string::npos) << said;
    expect_legitimate_peer_served(server);
    // A place given back is the source's again.
    admitted.pop_back();
    ASSERT_TRUE(eventually([&] { return server.stats().peers == 2; }));
    EXPECT_EQ(answer_to_handshake(server, kOtherHost).first, core::FrameType::kChannelAddresses);
  }
}

TEST(Hostile, PeersThatLeaveUnacceptedTakeEverythingWithThem) {
  Engine server(test_config());
  Engine client(test_config());
  int baseline = open_descriptors();
  for (int i = 0; i < 20; ++i) {
    Peer p = client.connect(server.address());
    p.close();
  }
  ASSERT_TRUE(eventually([&] { return server.stats().peers == 0; }));
  EXPECT_FALSE(server.accept(std::chrono::milliseconds(0)).has_value())
      << "a closed peer stayed in the accept queue";
  EXPECT_TRUE(eventually([&] { return open_descriptors() <= baseline; }))
      << open_descriptors() << " descriptors open, " << baseline << " before";
}

// A client that leaves while its last stream is still joining races the server's admission of
// it: whichever comes first, the peer must not stay counted, queued or holding descriptors.
TEST(Hostile, PeersThatLeaveWhileTheirStreamsJoinAreNotKept) {
  Config c = test_config();
  c.tcp.streams = 1;
  Engine server(c);
  int baseline = open_descriptors();
  for (int i = 0; i < 200; ++i) {
    RawPeer leaving(server, kOtherHost, /*await_join_ok=*/false);
    leaving.stream.reset();
  }
  EXPECT_TRUE(eventually([&] { return server.stats().peers == 0; }))
      << server.stats().peers << " peers still counted";
  while (auto p = server.accept(std::chrono::milliseconds(0))) {
    EXPECT_TRUE(eventually([&] { return !p->connected(); })) << "a peer that left is connected";
  }
  EXPECT_TRUE(eventually([&] { return open_descriptors() <= baseline; }))
      << open_descriptors() << " descriptors open, " << baseline << " before";
  expect_legitimate_peer_served(server);
}

// An engine id is its identity key's: a client that knows the shared secret but not a connected
// engine's key can neither take its id (and have immediates reported under it) nor replace it.
TEST(Hostile, AnIdentityHeldByALivePeerCannotBeClaimed) {
  Config sc = patient_server();
  sc.secret = "s3cret";
  Engine server(sc);
  ScratchPath key_file("claimed.pem");
  Config cc = test_config();
  cc.secret = "s3cret";
  cc.identity_file = key_file.str();
  Engine client(cc);
  Peer real = client.connect(server.address());
  auto real_at_server = server.accept(kWait);
  ASSERT_TRUE(real_at_server.has_value());
  EXPECT_EQ(real_at_server->engine_id(), client.id());
  EXPECT_EQ(real_at_server->public_key(), client.public_key());
  const core::SigningKey client_key = core::SigningKey::load_or_create(key_file.str());
  ASSERT_EQ(engine::engine_id_of(client_key.public_key()), client.id());
  {
    // The client's key claimed, a newer incarnation, the secret's MAC right, signed by another.
    Raw spoof(server, kOtherHost);
    RawIdentity forger;
    forger.hello = hello_from(client_key.public_key(), client.incarnation() + 1);
    spoof.send(engine::encode(forger.hello));
    spoof.send(forger.auth(read_hello_ack(spoof), "s3cret"));
    spoof.expect_refusal(ErrorCode::kAuthFailed);
  }
  {
    // The key itself, in the incarnation that is connected: one connection per incarnation.
    Raw twin(server, kOtherHost);
    RawIdentity same{client_key, hello_from(client_key.public_key(), client.incarnation())};
    twin.send(engine::encode(same.hello));
    twin.send(same.auth(read_hello_ack(twin), "s3cret"));
    twin.expect_refusal(ErrorCode::kInvalidArgument);
  }
  EXPECT_TRUE(real.connected());
  EXPECT_TRUE(real_at_server->connected());
  std::vector<uint8_t> mem(64, 0);
  Region r = server.register_memory(mem.data(), mem.size(), Access::kRemoteWrite);
  Buffer src(client, 64, Access::kLocal, 3);
  Descriptor d = r.descriptor();
  Transfer t{&src.region, 0, &d, 0, 64};
  EXPECT_TRUE(real.write_with_imm({&t, 1}, 9).wait(kWait).ok());
  auto event = server.next_imm(kWait);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->peer_engine_id, client.id());
  EXPECT_EQ(event->peer.incarnation(), client.incarnation());
}

// An engine restarted with its identity file is the same engine id in a new incarnation, which
// replaces the older at a server (no shared secret needed: the key is the proof).
TEST(Hostile, AProvenNewerIncarnationReplacesTheOlder) {
  Engine server(patient_server());
  ScratchPath key_file("restarted.pem");
  Config cc = test_config();
  cc.identity_file = key_file.str();
  Engine old_client(cc);
  Peer old_peer = old_client.connect(server.address());
  auto old_at_server = server.accept(kWait);
  ASSERT_TRUE(old_at_server.has_value());
  Engine new_client(cc);
  EXPECT_EQ(new_client.id(), old_client.id());
  EXPECT_NE(new_client.incarnation(), old_client.incarnation());
  Peer new_peer = new_client.connect(server.address());
  ASSERT_TRUE(eventually([&] { return !old_at_server->connected(); }));
  auto new_at_server = server.accept(kWait);
  ASSERT_TRUE(new_at_server.has_value());
  EXPECT_EQ(new_at_server->incarnation(), new_client.incarnation());
  EXPECT_TRUE(new_peer.connected());
}

TEST(Hostile, PingFloodFromAPeerThatNeverReadsStaysBounded) {
  Config c = test_config();
  c.tcp.streams = 1;
  Engine server(c);
  RawPeer raw(server, kOtherHost);
  Raw& control = raw.control;
  ASSERT_TRUE(server.accept(kWait).has_value());
  // 8 MiB of pings, never reading a pong: without coalescing the server would queue 8 MiB.
  auto ping = engine::encode_empty(core::FrameType::kPing);
  std::vector<uint8_t> flood;
  for (int i = 0; i < 1024; ++i) flood.insert(flood.end(), ping.begin(), ping.end());
  std::thread flooder([&] {
    for (int i = 0; i < 170; ++i) {
      if (!core::write_all(control.fd.get(), flood, Raw::deadline()).ok()) break;
    }
  });
  expect_legitimate_peer_served(server);
  flooder.join();
  EXPECT_TRUE(eventually([&] { return server.stats().peers == 1; }))
      << "the flooder stays connected (it is alive, only slow); the legitimate peer left";
}

// A small write, then a write of the whole region whose bytes stop after the first 10, in one
// segment: the stream handles all it received before it flushes the first ack, so once that ack
// is here the second write holds the region.
void stall_mid_write(Raw& stream, const Descriptor& d) {
  core::FrameHeader w;
  w.type = tcp::TcpFrame::kWrite;
  w.region_id = d.region_id;
  std::memcpy(&w.key, d.key_for(TransportKind::kTcp)->bytes, sizeof w.key);
  w.length = 8;
  w.op_id = 1;
  std::vector<uint8_t> frames(2 * core::kFrameHeaderSize + 8 + 10, 0xab);
  core::encode_header(w, frames.data());
  w.length = static_cast<uint32_t>(d.length);
  w.op_id = 2;
  core::encode_header(w, frames.data() + core::kFrameHeaderSize + 8);
  stream.send(frames);
  core::FrameHeader ack;
  std::vector<uint8_t> text;
  ASSERT_TRUE(stream.read(ack, text).ok());
  ASSERT_EQ(ack.type, tcp::TcpFrame::kWriteAck);
  ASSERT_EQ(ack.op_id, 1u);
}

TEST(Hostile, APeerThatStallsMidWriteCannotHoldADeregistration) {
  Config c = test_config();
  c.tcp.streams = 1;
  c.revoke_timeout = std::chrono::milliseconds(200);
  Engine server(c);
  std::vector<uint8_t> mem(1 << 20, 0);
  Region region = server.register_memory(mem.data(), mem.size(), Access::kRemoteWrite);
  RawPeer raw(server, kOtherHost);
  auto accepted = server.accept(kWait);
  ASSERT_TRUE(accepted.has_value());
  ASSERT_NO_FATAL_FAILURE(stall_mid_write(*raw.stream, region.descriptor()));
  region.deregister();  // returns once the stalled peer is cut off
  EXPECT_TRUE(eventually([&] { return !accepted->connected(); }));
  // The stalled write was never acknowledged: the connection closed under it.
  core::FrameHeader ack;
  std::vector<uint8_t> text;
  EXPECT_FALSE(raw.stream->read(ack, text).ok());
  expect_legitimate_peer_served(server);
}

// A peer is not published until all its streams joined, but its first stream already serves
// accesses: one of them stalled must not hold a deregistration either.
TEST(Hostile, APeerStillJoiningCannotHoldADeregistration) {
  Config c = patient_server();  // the join deadline must not be what ends the stall
  c.tcp.streams = 2;
  c.revoke_timeout = std::chrono::milliseconds(200);
  Engine server(c);
  std::vector<uint8_t> mem(1 << 20, 0);
  Region region = server.register_memory(mem.data(), mem.size(), Access::kRemoteWrite);
  RawPeer raw(server, kOtherHost);  // joins one stream of two
  ASSERT_NO_FATAL_FAILURE(stall_mid_write(*raw.stream, region.descriptor()));
  ASSERT_EQ(server.stats().peers, 1u);
  auto deregistered = std::async(std::launch::async, [&] { region.deregister(); });
  bool returned = deregistered.wait_for(kWait) == std::future_status::ready;
  EXPECT_TRUE(returned) << "a joining peer's stalled write held the deregistration";
  if (!returned) raw.stream.reset();  // ends the stall, so the test can end
  deregistered.get();
  core::FrameHeader ack;
  std::vector<uint8_t> text;
  if (returned) {
    EXPECT_FALSE(raw.stream->read(ack, text).ok()) << "the stalled write was acked";
  }
  expect_legitimate_peer_served(server);
}

// The same from the side that connects: the server we connect to answers the handshake, lets
// the first of two streams join and stalls a write into our region on it, while our connect()
// waits for the second stream's JOIN_OK.
TEST(Hostile, AServerStillJoiningOurStreamsCannotHoldADeregistration) {
  Config c = test_config();
  c.connect_timeout = std::chrono::seconds(60);  // the connect deadline must not end the stall
  c.revoke_timeout = std::chrono::milliseconds(200);
  Engine client(c);
  std::vector<uint8_t> mem(1 << 20, 0);
  Region region = client.register_memory(mem.data(), mem.size(), Access::kRemoteWrite);
  core::Fd listening;
  uint16_t port = 0;
  ASSERT_TRUE(core::listen_tcp({"127.0.0.1", 0}, listening, port).ok());
  ASSERT_TRUE(core::set_nonblocking(listening.get(), false).ok());
  // Waits kWait at most: a connect() that never opens the connection fails the test, not hangs it.
  auto accept_one = [&] {
    pollfd ready{listening.get(), POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(kWait / std::chrono::milliseconds(1))) != 1) {
      ADD_FAILURE() << "connect() opened no connection";
      return Raw(core::Fd());
    }
    return Raw(core::Fd(::accept4(listening.get(), nullptr, nullptr, SOCK_CLOEXEC)));
  };
  auto connected = std::async(std::launch::async, [&] {
    try {
      client.connect("127.0.0.1:" + std::to_string(port));
      return Status{};
    } catch (const Error& e) {
      return e.status();
    }
  });
  core::FrameHeader h;
  std::vector<uint8_t> body;
  Raw control = accept_one();
  ASSERT_TRUE(control.read(h, body).ok());
  ASSERT_EQ(h.type, core::FrameType::kHello);
  engine::Hello hello;
  ASSERT_TRUE(engine::decode(body, hello).ok());
  const engine::HelloAck ack =
      signed_hello_ack(core::SigningKey::generate(), hello, {TransportKind::kTcp});
  control.send(engine::encode(ack));
  ASSERT_TRUE(control.read(h, body).ok());
  ASSERT_EQ(h.type, core::FrameType::kAuth);
  ASSERT_TRUE(control.read(h, body).ok());
  ASSERT_EQ(h.type, core::FrameType::kChannelAddresses);
  control.send(tcp_channel_addresses(2));
  auto first = std::make_unique<Raw>(accept_one());
  ASSERT_TRUE(first->read(h, body).ok());
  ASSERT_EQ(h.type, core::FrameType::kJoin);
  first->send(engine::encode_empty(core::FrameType::kJoinOk));
  Raw second = accept_one();  // never answered
  ASSERT_TRUE(second.read(h, body).ok());
  ASSERT_EQ(h.type, core::FrameType::kJoin);
  ASSERT_NO_FATAL_FAILURE(stall_mid_write(*first, region.descriptor()));
  auto deregistered = std::async(std::launch::async, [&] { region.deregister(); });
  bool returned = deregistered.wait_for(kWait) == std::future_status::ready;
  EXPECT_TRUE(returned) << "a stalled write from a server still joining held the deregistration";
  if (returned) {
    EXPECT_FALSE(first->read(h, body).ok()) << "the stalled write was acked";
  }
  first.reset();  // ends the stall if it was not cut off, and the connect
  deregistered.get();
  control.fd.reset();
  second.fd.reset();
  Status s = connected.get();
  EXPECT_FALSE(s.ok()) << "connect() succeeded with a stream that never joined";
}

TEST(Hostile, APeerThatNeverAnswersCannotHoldADeregistrationOfOurs) {
  Config ic = test_config();
  ic.revoke_timeout = std::chrono::milliseconds(200);
  Pair p(test_config(), ic);
  // The target's only progress thread is held in a notification callback: it answers nothing.
  std::promise<void> in_callback, release;
  std::shared_future<void> released = release.get_future().share();
  p.target.on_imm([&in_callback, released](const ImmEvent&) {
    in_callback.set_value();
    released.wait();
  });
  Buffer remote(p.target, 1 << 20, Access::kRemoteWrite, 1);
  Descriptor d = remote.region.descriptor();
  Buffer small(p.initiator, 8, Access::kLocal, 2);
  Transfer poke{&small.region, 0, &d, 0, 8};
  Future notified = p.peer.write_with_imm({&poke, 1}, 1);
  in_callback.get_future().wait();
  std::vector<uint8_t> src(64 << 10, 7);
  Region local = p.initiator.register_memory(src.data(), src.size(), Access::kLocal);
  Transfer t{&local, 0, &d, 0, src.size()};
  Future stuck = p.peer.write({&t, 1});
  local.deregister();  // returns: the peer holding it is closed
  Status s = stuck.wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kRevoked) << s.to_string();
  release.set_value();
  (void)notified.wait(kWait);
}

TEST(Hostile, UnfinishedNotificationsPastTheLimitDropThePeerNotTheNotification) {
  Config c = test_config();
  c.tcp.streams = 1;
  Engine server(c);
  std::vector<uint8_t> mem(64, 0);
  Region region = server.register_memory(mem.data(), mem.size(), Access::kRemoteWrite);
  Descriptor d = region.descriptor();
  RawPeer raw(server, kOtherHost);
  auto accepted = server.accept(kWait);
  ASSERT_TRUE(accepted.has_value());
  // Each write_with_imm claims two streams and finishes on this one only: the server keeps a
  // record per operation until a second stream that never comes.
  std::atomic<bool> reading{true};
  std::thread drain([&] {  // takes the acks, so the server never stops reading
    std::vector<uint8_t> sink(1 << 16);
    while (reading.load() && ::recv(raw.stream->fd.get(), sink.data(), sink.size(), 0) > 0) {
    }
  });
  constexpr int kOps = (1 << 16) + 1;
  std::vector<uint8_t> frames;
  frames.reserve(kOps * (core::kFrameHeaderSize + 1));
  for (int i = 0; i < kOps; ++i) {
    core::FrameHeader w;
    w.type = tcp::TcpFrame::kWrite;
    w.flags = tcp::kFlagImm | tcp::kFlagLastOnStream;
    w.region_id = d.region_id;
    std::memcpy(&w.key, d.key_for(TransportKind::kTcp)->bytes, sizeof w.key);
    w.length = 1;
    w.op_id = static_cast<uint64_t>(i) + 1;
    w.aux32 = 7;
    w.aux64 = 2;
    std::size_t at = frames.size();
    frames.resize(at + core::kFrameHeaderSize + 1, 1);
    core::encode_header(w, frames.data() + at);
  }
  (void)core::write_all(raw.stream->fd.get(), frames, Raw::deadline());
  EXPECT_TRUE(eventually([&] { return !accepted->connected(); }))
      << "the peer past the limit is dropped";
  reading = false;
  ::shutdown(raw.stream->fd.get(), SHUT_RDWR);
  drain.join();
  EXPECT_FALSE(server.next_imm(std::chrono::milliseconds(0)).has_value());
  expect_legitimate_peer_served(server);
}

// 8-byte writes of a well-behaved peer, timed one by one (p50, p99 in microseconds).
std::pair<double, double> small_write_latency(Peer& peer, Region& local, const Descriptor& d) {
  std::vector<double> us;
  Transfer t{&local, 0, &d, 0, 8};
  for (int i = 0; i < 400; ++i) {
    auto start = Clock::now();
    EXPECT_TRUE(peer.write({&t, 1}).wait(kWait).ok());
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

TEST(Hostile, AFloodingPeerLeavesOthersSmallOperationsGoing) {
  Engine server(test_config());
  std::vector<uint8_t> sink(64 << 20), mem(64);
  Region big = server.register_memory(sink.data(), sink.size(), Access::kRemoteWrite);
  Region small = server.register_memory(mem.data(), mem.size(), Access::kRemoteWrite);
  Descriptor big_d = big.descriptor(), small_d = small.descriptor();
  Engine flooder(test_config()), polite(test_config());
  Peer flood = flooder.connect(server.address());
  Peer peer = polite.connect(server.address());
  Buffer from(flooder, 8 << 20, Access::kLocal, 1);
  Buffer tiny(polite, 8, Access::kLocal, 2);
  auto quiet = small_write_latency(peer, tiny.region, small_d);
  std::atomic<bool> stop{false};
  std::atomic<int> flood_writes{0};
  std::thread flooding([&] {
    Transfer t{&from.region, 0, &big_d, 0, from.bytes.size()};
    while (!stop.load()) {
      std::vector<Future> window;
      for (int i = 0; i < 4; ++i) window.push_back(flood.write({&t, 1}));
      for (Future& f : window) {
        if (f.wait(kWait).ok()) flood_writes++;
      }
    }
  });
  while (flood_writes.load() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto loaded = small_write_latency(peer, tiny.region, small_d);
  stop = true;
  flooding.join();
  EXPECT_GT(flood_writes.load(), 4) << "the flood ran beside the small writes";
  EXPECT_EQ(std::memcmp(mem.data(), tiny.bytes.data(), 8), 0);
  std::printf(
      "[ figure ] 8-byte write beside a peer flooding 8 MiB writes (4 in flight): p50 "
      "%.0f us, p99 %.0f us; alone: p50 %.0f us, p99 %.0f us\n",
      loaded.first, loaded.second, quiet.first, quiet.second);
}

// Opens connections from the child of a fork(): system calls only (no allocation, which is
// unsafe after fork() in a threaded process).
void connect_silently(uint16_t port, int count) {
  for (int i = 0; i < count; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
  }
}

TEST(Hostile, AcceptOutOfDescriptorsBacksOffInsteadOfSpinning) {
  Engine server(test_config());
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  int spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(spare, 0);
  // Connections come from a child process, whose descriptors do not count against ours; it
  // connects once our table is full.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Should the test die out of descriptors, the child goes too instead of holding ctest's pipe.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    char c;
    if (::read(go[0], &c, 1) == 1) connect_silently(server.port(), 4);
    ::pause();  // killed by the parent
    ::_exit(0);
  }
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(open_descriptors() + 1);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  std::vector<int> filler;
  for (int fd; (fd = ::dup(spare)) >= 0;) filler.push_back(fd);
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  bool failed = eventually([&] { return server.stats().accept_failures > 0; });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  uint64_t failures = server.stats().accept_failures;
  for (int fd : filler) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(spare);
  ::close(go[0]);
  ::close(go[1]);
  EXPECT_TRUE(failed);
  std::printf("[ figure ] accept() failures in ~1 s out of descriptors: %llu\n",
              static_cast<unsigned long long>(failures));
  // Backing off (10 ms doubling to 1 s) tries a handful of times a second; spinning would try
  // hundreds of thousands.
  EXPECT_LE(failures, 200u);
  expect_legitimate_peer_served(server);
}

namespace shm = transport::shm;

Config same_host_server_config() {
  Config c = test_config();
  c.transports = {TransportKind::kShm, TransportKind::kTcp};
  return c;
}

// One record of message `op` (tag 5) of `length` bytes: `bytes` of it from `offset`.
void message_record(RawShmPeer& raw, uint64_t op, uint64_t length, uint64_t offset, bool more,
                    std::size_t bytes = shm::kInlineBytes) {
  static const std::vector<uint8_t> filler(shm::kInlineBytes, 0x5a);
  shm::Header h;
  h.type = shm::Record::kSend;
  h.flags = shm::kFlagInline | (more ? shm::kFlagMore : 0);
  h.op_id = op;
  h.tag = 5;
  shm::Entry e;
  e.length = length;
  e.entry_offset = offset;
  raw.write(h, &e, {filler.data(), bytes});
}

// A same-host peer's message in several records, with a record out of place: each such lie
// closes the channel, so the receive it was filling (or waiting in) fails instead of waiting
// for bytes that will never come, and the engine goes on serving others.
TEST(Hostile, ASameHostPeersMessageRecordsOutOfPlaceCloseItsChannel) {
  Engine server(same_host_server_config());
  constexpr uint64_t kLength = 4 * shm::kInlineBytes, kSlice = shm::kInlineBytes;
  struct Forgery {
    const char* what;
    std::function<void(RawShmPeer&)> records;
  };
  const std::vector<Forgery> forgeries = {
      {"a gap",
       [&](RawShmPeer& raw) {
         message_record(raw, 7, kLength, 0, true);
         message_record(raw, 7, kLength, 2 * kSlice, true);
       }},
      {"a second message begun before the first ended",
       [&](RawShmPeer& raw) {
         message_record(raw, 7, kLength, 0, true);
         message_record(raw, 8, kLength, 0, true);
       }},
      {"a later record of a message never begun",
       [&](RawShmPeer& raw) { message_record(raw, 7, kLength, kSlice, true); }},
      {"another length in a later record",
       [&](RawShmPeer& raw) {
         message_record(raw, 7, kLength, 0, true);
         message_record(raw, 7, 2 * kLength, kSlice, true);
       }},
      {"a last record short of the length",
       [&](RawShmPeer& raw) {
         message_record(raw, 7, kLength, 0, true);
         message_record(raw, 7, kLength, kSlice, false);
       }},
      {"a record of more bytes than are left",
       [&](RawShmPeer& raw) {
         message_record(raw, 7, kSlice + 10, 0, true);
         message_record(raw, 7, kSlice + 10, kSlice, false, 20);
       }},
  };
  auto admit = [&](RawShmPeer& raw) {
    raw.start(server);
    std::optional<Peer> peer = server.accept(kWait);
    EXPECT_TRUE(peer.has_value());
    EXPECT_TRUE(!peer || peer->transport() == TransportKind::kShm);
    return peer;
  };
  {
    // The same records in place make one message, which lands and is answered.
    RawShmPeer raw;
    std::optional<Peer> peer;
    ASSERT_NO_FATAL_FAILURE(peer = admit(raw));
    ASSERT_TRUE(peer.has_value());
    Buffer dst(server, kLength, Access::kLocal, 3);
    Future recv = peer->recv(5, dst.region, 0, kLength);
    for (uint64_t at = 0; at < kLength; at += kSlice) {
      message_record(raw, 7, kLength, at, at + kSlice < kLength);
    }
    ASSERT_TRUE(recv.wait(kWait).ok()) << recv.status().to_string();
    EXPECT_EQ(recv.bytes(), kLength);
    EXPECT_EQ(dst.bytes, std::vector<uint8_t>(kLength, 0x5a));
    std::vector<uint8_t> buffer;
    shm::View answer;
    ASSERT_TRUE(raw.next(buffer, answer));
    EXPECT_EQ(answer.header.type, shm::Record::kSendAck);
    EXPECT_EQ(answer.header.op_id, 7u);
    EXPECT_EQ(answer.header.status, 0);
  }
  for (const Forgery& f : forgeries) {
    for (bool posted : {true, false}) {
      SCOPED_TRACE(std::string(f.what) + (posted ? ", a receive posted" : ", none posted"));
      RawShmPeer raw;
      std::optional<Peer> peer;
      ASSERT_NO_FATAL_FAILURE(peer = admit(raw));
      ASSERT_TRUE(peer.has_value());
      Buffer dst(server, kLength, Access::kLocal, 3);
      // Without a receive for tag 5 the message is buffered; one for a tag never sent fails
      // once the channel closed.
      Future recv = peer->recv(posted ? 5 : 6, dst.region, 0, kLength);
      f.records(raw);
      Status s = recv.wait(kWait);
      EXPECT_EQ(s.code(), ErrorCode::kProtocol) << s.to_string();
      EXPECT_EQ(peer->stats().unexpected_bytes, 0u) << "a message cut short counts no more";
      if (posted) std::printf("[ figure ] %s: %s\n", f.what, s.to_string().c_str());
    }
  }
  expect_legitimate_peer_served(server);
}

// A same-host peer that answers a message before its last record was sent: refused, so the
// send fails instead of completing while its records still wait to be copied from the caller's
// buffer, which the caller may reuse once the send completed.
TEST(Hostile, ASameHostPeerCannotAnswerAMessageBeforeItsLastRecord) {
  Engine server(same_host_server_config());
  RawShmPeer raw;
  ASSERT_NO_FATAL_FAILURE(raw.start(server));
  std::optional<Peer> peer = server.accept(kWait);
  ASSERT_TRUE(peer.has_value());
  Buffer src(server, 1 << 20, Access::kLocal, 9);
  Future sent = peer->send(5, src.region, 0, 1 << 20);
  // We read its first record only: the rest wait for room in our ring.
  std::vector<uint8_t> buffer;
  shm::View first;
  ASSERT_TRUE(raw.next(buffer, first));
  ASSERT_EQ(first.header.type, shm::Record::kSend);
  ASSERT_NE(first.header.flags & shm::kFlagMore, 0) << "1 MiB travels in several records";
  shm::Header ack;
  ack.type = shm::Record::kSendAck;
  ack.op_id = first.header.op_id;
  ack.count = 1;
  raw.write(ack, nullptr);
  Status s = sent.wait(kWait);
  EXPECT_FALSE(s.ok()) << "the send completed on an answer for records it had not sent";
  EXPECT_NE(s.code(), ErrorCode::kTimeout) << s.to_string();
  std::printf("[ figure ] an early answer: %s\n", s.to_string().c_str());
  expect_legitimate_peer_served(server);
}

// A same-host peer that stops halfway through a message whose receive fills a region: the
// receive holds the region, so its deregistration waits for the message, but no longer than
// revoke_timeout. Then the peer is cut off, the receive fails, and the records it sends after
// never reach the memory.
TEST(Hostile, ASameHostPeerStoppedMidMessageCannotHoldADeregistration) {
  Config c = same_host_server_config();
  c.revoke_timeout = std::chrono::milliseconds(200);
  Engine server(c);
  RawShmPeer raw;
  ASSERT_NO_FATAL_FAILURE(raw.start(server));
  std::optional<Peer> peer = server.accept(kWait);
  ASSERT_TRUE(peer.has_value());
  constexpr uint64_t kLength = 4 * shm::kInlineBytes, kSlice = shm::kInlineBytes;
  Buffer dst(server, kLength, Access::kLocal, 3);
  const std::vector<uint8_t> before = dst.bytes;
  Future recv = peer->recv(5, dst.region, 0, kLength);
  message_record(raw, 7, kLength, 0, true);
  // The engine took the first record: the receive is matched and filling, no longer posted.
  ASSERT_TRUE(eventually([&] { return !raw.out.pending(); }));
  auto deregistered = std::async(std::launch::async, [&] { dst.region.deregister(); });
  bool returned = deregistered.wait_for(kWait) == std::future_status::ready;
  EXPECT_TRUE(returned) << "a message stopped halfway held the deregistration";
  if (!returned) {  // ends the stall, so the test can end
    for (uint64_t at = kSlice; at < kLength; at += kSlice) {
      message_record(raw, 7, kLength, at, at + kSlice < kLength);
    }
  }
  deregistered.get();
  Status s = recv.wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kRevoked) << s.to_string();
  std::printf("[ figure ] a receive cut off mid-message: %s\n", s.to_string().c_str());
  EXPECT_TRUE(eventually([&] { return !peer->connected(); }));
  // The rest of the message, sent after the deregistration returned, lands nowhere.
  if (returned) {
    for (uint64_t at = kSlice; at < kLength; at += kSlice) {
      message_record(raw, 7, kLength, at, at + kSlice < kLength);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(std::equal(dst.bytes.begin() + kSlice, dst.bytes.end(), before.begin() + kSlice))
      << "records after the cut-off were copied into the deregistered memory";
  expect_legitimate_peer_served(server);
}

}  // namespace
}  // namespace ferry::test
