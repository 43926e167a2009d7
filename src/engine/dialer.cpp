// The client half of the handshake: EngineImpl::connect dials a listener, proves who it is,
// sets up the channels both sides chose and joins their side connections. (The server half is
// listener.cpp.)
#include <string>
#include <vector>

#include "core/crypto.hpp"
#include "core/sys.hpp"
#include "engine/engine_impl.hpp"

namespace ferry::detail {

using core::FrameHeader;
using core::FrameType;

namespace {

Status read_frame(int fd, core::Deadline deadline, FrameHeader& h, std::vector<uint8_t>& body) {
  uint8_t raw[core::kFrameHeaderSize];
  if (Status s = core::read_all(fd, raw, deadline); !s.ok()) return s;
  if (Status s = core::decode_header(raw, h); !s.ok()) return s;
  if (!core::is_control(h.type)) {
    return {ErrorCode::kProtocol,
            "expected a control frame, got type " + std::to_string(static_cast<int>(h.type))};
  }
  body.resize(h.length);
  return core::read_all(fd, body, deadline);
}

Status write_frame(int fd, const std::vector<uint8_t>& frame, core::Deadline deadline) {
  return core::write_all(fd, frame, deadline);
}

// Reads the reply to a handshake step: the wanted frame, or an Error frame turned into a Status.
Status expect(int fd, core::Deadline deadline, FrameType want, std::vector<uint8_t>& body) {
  FrameHeader h;
  if (Status s = read_frame(fd, deadline, h, body); !s.ok()) return s;
  if (h.type == FrameType::kError) {
    engine::ErrorMsg e;
    if (Status s = engine::decode(body, e); !s.ok()) return s;
    return {e.code, "peer refused: " + e.message};
  }
  if (h.type != want) {
    return {ErrorCode::kProtocol,
            "handshake: unexpected frame type " + std::to_string(static_cast<int>(h.type))};
  }
  return {};
}

}  // namespace

Peer EngineImpl::connect(std::string_view host_port) {
  if (stopping_.load()) throw Error(ErrorCode::kCancelled, "connect: engine shut down");
  core::HostPort where;
  core::throw_if_error(core::parse_host_port(host_port, where));
  {
    std::lock_guard lock(mu_);
    if (peer_count_locked() >= config.max_peers) {
      throw Error(ErrorCode::kResourceExhausted,
                  "connect " + where.to_string() + ": " + std::to_string(peer_count_locked()) +
                      " peers connected (max_peers " + std::to_string(config.max_peers) + ")");
    }
  }
  core::Deadline deadline = Clock::now() + config.connect_timeout;
  core::Fd fd;
  core::throw_if_error(core::connect_tcp(where, deadline, fd));
  core::tune_socket(fd.get(), config.peer_timeout);

  engine::Hello hello;
  hello.engine_id = id;
  hello.incarnation = incarnation;
  hello.locality = locality;
  hello.transports = usable_transports();
  core::random_bytes(hello.nonce);
  hello.wants_auth = !config.secret.empty();
  core::throw_if_error(write_frame(fd.get(), engine::encode(hello), deadline));

  std::vector<uint8_t> body;
  core::throw_if_error(expect(fd.get(), deadline, FrameType::kHelloAck, body));
  engine::HelloAck ack;
  core::throw_if_error(engine::decode(body, ack));
  const engine::Identity us{id, incarnation, locality},
      them{ack.engine_id, ack.incarnation, ack.locality};
  auto fail = [&](const Status& s, const std::string& step = {}) {
    throw Error(s.code(), "connect " + where.to_string() + ": " + step + s.message());
  };
  if (!config.secret.empty()) {
    engine::Transcript t{hello.nonce, ack.nonce, us, them, hello.transports, ack.channels};
    if (!ack.mac || !core::mac_equal(*ack.mac, engine::auth_mac(config.secret, true, t))) {
      fail({ErrorCode::kAuthFailed, "peer did not prove knowledge of the shared secret"});
    }
    engine::Auth auth{engine::auth_mac(config.secret, false, t)};
    core::throw_if_error(write_frame(fd.get(), engine::encode(auth), deadline));
    core::throw_if_error(expect(fd.get(), deadline, FrameType::kAuthOk, body));
  } else if (ack.mac) {
    fail({ErrorCode::kAuthFailed, "peer requires a shared secret"});
  }

  int control = fd.get();
  auto peer = PeerImpl::create(shared_from_this(), them, where.to_string(), false, std::move(fd));
  // Our addresses first, then the listener's: its own decide what both share (TCP streams).
  Status s = make_channels(peer, ack.channels, true);
  if (s.ok()) s = write_frame(control, channel_addresses(*peer), deadline);
  if (s.ok()) s = expect(control, deadline, FrameType::kChannelAddresses, body);
  if (s.ok()) s = connect_channels(*peer, body);
  if (!s.ok()) {
    peer->close(s);
    fail(s);
  }
  // Listed, its channels complete, until it is published or given up: from its first attached
  // stream on the listener may use it, and a deregistration or shutdown must reach it.
  struct Listed {
    EngineImpl& engine;
    const std::shared_ptr<PeerImpl>& peer;
    Listed(EngineImpl& e, const std::shared_ptr<PeerImpl>& p) : engine(e), peer(p) {
      std::lock_guard lock(engine.mu_);
      engine.connecting_.push_back(peer);
    }
    ~Listed() {
      std::lock_guard lock(engine.mu_);
      std::erase(engine.connecting_, peer);
    }
    Listed(const Listed&) = delete;
    Listed& operator=(const Listed&) = delete;
  } listed(*this, peer);
  for (const auto& channel : peer->channels.all()) {
    for (int i = 0; i < channel->side_connections(); ++i) {
      core::Fd side;
      s = core::connect_tcp(where, deadline, side);
      if (s.ok()) {
        core::tune_socket(side.get(), config.peer_timeout);
        engine::Join join;
        join.token = ack.token;
        join.kind = channel->kind();
        join.index = static_cast<uint16_t>(i);
        s = write_frame(side.get(), engine::encode(join), deadline);
      }
      if (s.ok()) s = expect(side.get(), deadline, FrameType::kJoinOk, body);
      if (s.ok()) s = channel->attach_side(i, std::move(side));
      if (!s.ok()) {
        peer->close(s);
        fail(s,
             std::string(to_string(channel->kind())) + " connection " + std::to_string(i) + ": ");
      }
    }
  }
  plan_routes(*peer);  // every channel is set up and knows whether it can carry
  peer->start_control();
  bool registered = false;
  {
    // A peer closed while connecting (cut off by a deregistration, or its link lost) is not
    // published: it would stay listed, dead, holding a max_peers place.
    std::lock_guard lock(mu_);
    if (!stopping_.load() && !peer->lost.load()) {
      std::erase(connecting_, peer);  // from one list to the other in one step
      peers_.push_back(peer);
      update_polled_locked();
      registered = true;
    }
  }
  if (!registered) {
    Status why = stopping_.load()
                     ? Status(ErrorCode::kCancelled, "engine shut down")
                     : Status(ErrorCode::kPeerLost, "the peer was closed while connecting");
    peer->close(why);
    fail(why);
  }
  return Peer(peer);
}

}  // namespace ferry::detail
