// A same-host peer by hand: the control handshake and the shm channel's set-up (socket, rings,
// bells), then records written straight into the engine's ring and read from ours. The hostile
// shm peer of the tests: it says whatever a test makes it say.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "core/crypto.hpp"
#include "core/locality.hpp"
#include "support/raw_client.hpp"
#include "transport/shm/shm_ring.hpp"
#include "transport/shm/shm_socket.hpp"
#include "transport/shm/shm_wire.hpp"

namespace ferry::test {

struct RawShmPeer {
  // Connects to `server` (which offers the shm transport) as an engine of its own, up to where
  // the server published the peer: then accept() returns it.
  void start(Engine& server) {
    namespace shm = transport::shm;
    control = std::make_unique<Raw>(server);
    RawIdentity identity;
    identity.hello.locality = core::this_locality();
    identity.hello.transports = {TransportKind::kShm};
    control->send(engine::encode(identity.hello));
    engine::HelloAck ack = read_hello_ack(*control);
    ASSERT_EQ(ack.channels, std::vector<TransportKind>{TransportKind::kShm});
    control->send(identity.auth(ack));
    core::FrameHeader h;
    std::vector<uint8_t> body;

    shm::Address ours;
    ours.pid = static_cast<uint32_t>(::getpid());
    core::random_bytes(probe);
    ours.probe = probe;
    ours.probe_address = reinterpret_cast<uint64_t>(probe.data());
    engine::ChannelAddresses addresses;
    addresses.channels.push_back({TransportKind::kShm, shm::encode(ours)});
    control->send(engine::encode(addresses));
    ASSERT_TRUE(control->read(h, body).ok());
    ASSERT_EQ(h.type, core::FrameType::kChannelAddresses);
    engine::ChannelAddresses theirs;
    ASSERT_TRUE(engine::decode(body, theirs).ok());
    ASSERT_EQ(theirs.channels.size(), 1u);
    shm::Address listener;
    ASSERT_TRUE(shm::decode(theirs.channels[0].bytes, listener).ok());

    // The socket with our ring and bell, then the side connection that lets the engine take it.
    socket = core::Fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr;
    socklen_t len = shm::abstract_address(listener.socket, addr);
    ASSERT_EQ(::connect(socket.get(), reinterpret_cast<const sockaddr*>(&addr), len), 0);
    ASSERT_TRUE(shm::Ring::create(in).ok());
    bell = core::Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    std::array<uint8_t, shm::kHeaderBytes + shm::kHelloBytes> record{};
    shm::Header hello_record;
    hello_record.type = shm::Record::kHello;
    hello_record.payload = shm::kHelloBytes;
    shm::put_header(hello_record, record.data());
    std::memcpy(record.data() + shm::kHeaderBytes, listener.token.data(), listener.token.size());
    record.back() = 1;  // we read its probe: it may pull from us as we may from it
    const int files[] = {in.file(), bell.get()};
    bool full = false;
    ASSERT_TRUE(shm::send_with_files(socket.get(), record, files, full).ok());
    ASSERT_FALSE(full);
    side = std::make_unique<Raw>(server);
    engine::Join join;
    join.token = ack.token;
    join.kind = TransportKind::kShm;
    side->send(engine::encode(join));
    ASSERT_TRUE(side->read(h, body).ok());
    ASSERT_EQ(h.type, core::FrameType::kJoinOk);

    // The engine's ring and bell, which it sends once it took our socket.
    pollfd p{socket.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 20000), 1);
    std::array<uint8_t, shm::kHeaderBytes + shm::kHelloBytes + 1> reply{};
    shm::Files got;
    std::size_t length = 0, count = 0;
    ASSERT_TRUE(shm::receive_with_files(socket.get(), reply, length, got, count).ok());
    ASSERT_EQ(count, 2u);
    ASSERT_TRUE(shm::Ring::open(std::move(got[0]), out).ok());
    peer_bell = std::move(got[1]);
  }

  // Writes one record into the engine's ring (`entry`: its one table entry, if any) and rings
  // its bell.
  void write(transport::shm::Header h, const transport::shm::Entry* entry,
             std::span<const uint8_t> payload = {}) {
    namespace shm = transport::shm;
    std::vector<uint8_t> head(shm::kHeaderBytes + (entry != nullptr ? shm::kEntryBytes : 0));
    if (entry != nullptr) {
      h.count = 1;
      shm::put_entry(*entry, head.data() + shm::kHeaderBytes);
    }
    h.payload = static_cast<uint32_t>(payload.size());
    shm::put_header(h, head.data());
    ASSERT_TRUE(out.write(head, payload)) << "the engine's ring is full";
    shm::ring_bell(peer_bell.get());
  }

  // The next record the engine wrote into our ring (false if none came within 20 s); its
  // payload points into `buffer`.
  bool next(std::vector<uint8_t>& buffer, transport::shm::View& record) {
    buffer.resize(transport::shm::kMaxRecordBytes);
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      std::size_t length = 0;
      if (!in.read(buffer, length).ok()) return false;
      if (length > 0) return transport::shm::parse({buffer.data(), length}, record).ok();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  std::unique_ptr<Raw> control, side;
  core::Fd socket, bell, peer_bell;
  transport::shm::Ring in, out;  // ours, which the engine writes; the engine's, which we write
  transport::shm::Nonce probe{};
};

}  // namespace ferry::test
