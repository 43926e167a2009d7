// The client half of the handshake: EngineImpl::connect dials a listener, proves who it is,
// sets up the channels both sides chose and joins their side connections. Like the server half
// (listener.cpp) it never blocks on one socket: each step's frames go out and their answers
// come back through HandshakeIo under one poll() with the connect deadline, several side
// connections at once, and the engine's shutdown wakes it.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "core/crypto.hpp"
#include "core/sys.hpp"
#include "engine/engine_impl.hpp"
#include "engine/handshake_io.hpp"

namespace ferry::detail {

using core::FrameHeader;
using core::FrameType;

namespace {

// Side connections joining at once: a few round trips instead of one per connection, while a
// client never holds more of the listener's handshake places than this (max_handshakes_per_source
// is 32 by default; tcp.streams may be 64).
constexpr std::size_t kJoinsInFlight = 8;

// The pause before trying a listener again that refused us as busy (kBusyRefusal), doubling
// from the first to the most, each jittered down by up to half. Bounds, not measurements: the
// first is about one loopback handshake, and the most keeps a refused client's wait short
// against a connect_timeout of seconds. With them 256 engines of one host connecting at once
// under the default max_handshakes_per_source (32) all connected (docs/architecture.md,
// "Handshakes").
constexpr Duration kBusyBackoffFirst = std::chrono::milliseconds(5);
constexpr Duration kBusyBackoffMost = std::chrono::milliseconds(200);

// One connection the dialer drives: the control connection, or a side connection joining.
struct Link {
  core::Fd fd;    // until it moves into the peer (control) or its channel (side)
  int sock = -1;  // stays valid while `fd` or the peer holds the descriptor
  HandshakeIo io;
  bool connecting = false;     // its non-blocking connect() is under way
  std::vector<uint8_t> reply;  // the whole answer (header and body), once it came
};

// Why a connect woken to stop stopped.
Status cancelled(bool engine_stopping) {
  return {ErrorCode::kCancelled, engine_stopping ? "engine shut down" : "stopped by the caller"};
}

// Runs handshake steps on links: each sends what it queued and takes one answer.
class Dialer {
 public:
  // `shut_down` and `stopped` (-1: none) become readable when the engine shuts down and when
  // the caller stops the connect.
  Dialer(std::string where, core::Deadline deadline, int shut_down, int stopped)
      : where_(std::move(where)), deadline_(deadline), shut_down_(shut_down), stopped_(stopped) {}

  // Sends what each link of `links` queued and waits until every one answered with a whole
  // frame, which must be `want` (an ERROR frame is the peer's refusal); the body of link i's
  // answer is then body_of(*links[i]).
  Status exchange(std::span<Link* const> links, FrameType want) {
    for (Link* l : links) l->reply.clear();
    std::vector<Link*> answered;
    for (std::size_t done = 0; done < links.size(); done += answered.size()) {
      if (Status s = answers(links, want, answered); !s.ok()) return s;
    }
    return {};
  }

  // As exchange(), but returns as soon as one or more of the links still waiting answered:
  // those, in `answered`.
  Status answers(std::span<Link* const> links, FrameType want, std::vector<Link*>& answered) {
    answered.clear();
    std::vector<pollfd> polled;
    std::vector<Link*> waiting;
    while (answered.empty()) {
      polled.clear();
      waiting.clear();
      for (Link* l : links) {
        if (!l->reply.empty()) continue;
        short events = POLLIN;
        if (l->connecting || l->io.sending()) events |= POLLOUT;
        polled.push_back({l->sock, events, 0});
        waiting.push_back(l);
      }
      if (waiting.empty()) return {};
      polled.push_back({shut_down_, POLLIN, 0});
      polled.push_back({stopped_, POLLIN, 0});
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
      if (left <= 0) return {ErrorCode::kTimeout, "handshake: timed out"};
      int n =
          ::poll(polled.data(), polled.size(), static_cast<int>(std::min<int64_t>(left, 60'000)));
      if (n < 0 && errno != EINTR) return core::sys_status("poll");
      if (polled[waiting.size()].revents != 0) return cancelled(true);
      if (polled.back().revents != 0) return cancelled(false);
      for (std::size_t i = 0; n > 0 && i < waiting.size(); ++i) {
        if (polled[i].revents == 0) continue;
        Link& l = *waiting[i];
        if (Status s = advance(l, polled[i].revents); !s.ok()) return s;
        if (l.reply.empty()) continue;
        if (Status s = check(l, want); !s.ok()) return s;
        answered.push_back(&l);
      }
    }
    return {};
  }

 private:
  Status advance(Link& l, short revents) {
    Status s;
    if (l.connecting) {
      if ((revents & (POLLOUT | POLLERR | POLLHUP)) == 0) return {};
      s = core::finish_connect(l.sock, where_);
      if (s.ok()) l.connecting = false;
    }
    if (s.ok()) s = l.io.flush();
    if (!s.ok()) {
      // A listener that refused us at once (busy) closes before our frame arrives, which resets
      // the connection; its answer, received before the reset, still waits here and says why.
      return read_reply(l).ok() && !l.reply.empty() ? Status() : s;
    }
    if ((revents & (POLLIN | POLLERR | POLLHUP)) == 0) return {};
    return read_reply(l);
  }

  // Reads until a whole frame is in l.reply or nothing more is there yet.
  static Status read_reply(Link& l) {
    FrameHeader header;
    for (bool progressed = true; progressed && l.reply.empty();) {
      if (Status s = l.io.read(progressed, header, l.reply); !s.ok()) return s;
    }
    return {};
  }

  static Status check(const Link& l, FrameType want) {
    FrameHeader h;
    if (Status s = core::decode_header(l.reply.data(), h); !s.ok()) return s;
    auto body = std::span(l.reply).subspan(core::kFrameHeaderSize);
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

  const std::string where_;
  const core::Deadline deadline_;
  const int shut_down_;
  const int stopped_;
};

[[noreturn]] void connect_failed(const core::HostPort& where, const Status& s,
                                 const std::string& step = {}) {
  throw Error(s.code(), "connect " + where.to_string() + ": " + step + s.message());
}

std::span<const uint8_t> body_of(const Link& l) {
  return std::span(l.reply).subspan(core::kFrameHeaderSize);
}

}  // namespace

Peer EngineImpl::connect(std::string_view host_port, const std::stop_token& stop) {
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
  // A stop requested on `stop` wakes the dialer through an eventfd of this call's own.
  core::Fd stopped;
  if (stop.stop_possible()) {
    stopped = core::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!stopped.valid()) connect_failed(where, core::sys_status("eventfd"));
  }
  auto on_stop_requested = [fd = stopped.get()] {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t woke = ::write(fd, &one, sizeof one);
  };
  std::optional<std::stop_callback<decltype(on_stop_requested)>> on_stop;
  if (stopped.valid()) on_stop.emplace(stop, on_stop_requested);
  // A listener busy with other handshakes from our host (many processes starting at once) is
  // tried again after a backoff, until the deadline.
  for (Duration backoff = kBusyBackoffFirst;; backoff = std::min(backoff * 2, kBusyBackoffMost)) {
    try {
      return dial(where, deadline, stopped.get());
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kResourceExhausted ||
          e.status().message().find(engine::kBusyRefusal) == std::string::npos) {
        throw;
      }
      // Jittered, so that a burst refused together does not come back together.
      Duration pause = backoff / 2 + Duration(core::random_u64() %
                                              (static_cast<uint64_t>(backoff.count()) / 2 + 1));
      if (Clock::now() + pause >= deadline) throw;
      pollfd wake[] = {{connect_cancel_.get(), POLLIN, 0}, {stopped.get(), POLLIN, 0}};
      int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(pause).count());
      if (::poll(wake, 2, ms) > 0) connect_failed(where, cancelled(stopping_.load()));
    }
  }
}

Peer EngineImpl::connect_named(std::string_view name, const std::stop_token& stop) {
  Directory& dir = directory("connect_named");
  const NamedEngine published = dir.resolve(name);
  const std::string what = "connect_named '" + std::string(name) + "'";
  if (published.addresses.empty()) {
    throw Error(ErrorCode::kConnectFailed, what + ": the engine published no address");
  }
  // The addresses are the best first; one that cannot be reached from here gives way to the next.
  std::optional<Peer> peer;
  Status last;
  for (const std::string& address : published.addresses) {
    try {
      peer = connect(address, stop);
      break;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kConnectFailed && e.code() != ErrorCode::kTimeout) throw;
      last = e.status();
    }
  }
  if (!peer) throw Error(last.code(), what + ": " + last.message());
  // The handshake proved the id the peer holds; the directory says which one the name means.
  auto refuse = [&](ErrorCode code, const std::string& why) {
    peer->close();
    throw Error(code, what + ": " + why);
  };
  if (peer->engine_id() != published.engine_id) {
    refuse(ErrorCode::kWrongPeer, "the engine at " + peer->address() + " is " +
                                      std::to_string(peer->engine_id()) + ", not the published " +
                                      std::to_string(published.engine_id));
  }
  if (peer->incarnation() != published.incarnation) {
    uint64_t now = 0;
    try {
      now = dir.resolve(name).incarnation;
    } catch (const Error& e) {
      refuse(e.code(), e.status().message());
    }
    if (now != peer->incarnation()) {
      refuse(ErrorCode::kStaleIncarnation, "the engine at " + peer->address() +
                                               " is in another incarnation than the directory's");
    }
  }
  return *std::move(peer);
}

Peer EngineImpl::dial(const core::HostPort& where, core::Deadline deadline, int stopped) {
  auto fail = [&](const Status& s, const std::string& step = {}) {
    connect_failed(where, s, step);
  };
  Dialer dialer(where.to_string(), deadline, connect_cancel_.get(), stopped);
  Link control;
  const int wake[] = {connect_cancel_.get(), stopped};
  if (Status s = core::connect_tcp(where, deadline, control.fd, wake); !s.ok()) {
    if (s.code() != ErrorCode::kCancelled) throw Error(s);
    fail(cancelled(stopping_.load()));
  }
  core::tune_socket(control.fd.get(), config.peer_timeout);
  core::throw_if_error(core::set_nonblocking(control.fd.get(), true));
  control.sock = control.fd.get();
  control.io = HandshakeIo(control.sock);
  Link* const just_control[] = {&control};

  engine::Hello hello;
  hello.key = identity_key.public_key();
  hello.incarnation = incarnation;
  hello.locality = locality;
  hello.transports = usable_transports();
  core::random_bytes(hello.nonce);
  hello.wants_auth = !config.secret.empty();
  Status s = control.io.queue(engine::encode(hello));
  if (s.ok()) s = dialer.exchange(just_control, FrameType::kHelloAck);
  if (!s.ok()) fail(s);
  engine::HelloAck ack;
  if (s = engine::decode(body_of(control), ack); !s.ok()) fail(s);
  const engine::Transcript t = engine::transcript_of(hello, ack);
  const engine::Identity& them = t.server;
  if (!engine::transcript_signed(true, t, ack.signature)) {
    fail({ErrorCode::kAuthFailed,
          "peer did not prove its identity key (engine " + std::to_string(them.engine_id()) + ")"});
  }
  if (s = check_trusted(ack.key); !s.ok()) fail(s);
  engine::Auth auth{engine::sign_transcript(identity_key, false, t), std::nullopt};
  if (!config.secret.empty()) {
    if (!ack.mac || !core::mac_equal(*ack.mac, engine::auth_mac(config.secret, true, t))) {
      fail({ErrorCode::kAuthFailed, "peer did not prove knowledge of the shared secret"});
    }
    auth.mac = engine::auth_mac(config.secret, false, t);
  } else if (ack.mac) {
    fail({ErrorCode::kAuthFailed, "peer requires a shared secret"});
  }

  // The peer owns the control connection from here (start_control() watches it, non-blocking).
  int control_fd = control.sock;
  auto peer =
      PeerImpl::create(shared_from_this(), them, where.to_string(), false, std::move(control.fd));
  // AUTH, then our addresses, in one go: the listener answers with its own addresses (which
  // decide what both share, TCP streams) or refuses us.
  s = make_channels(peer, ack.channels, true);
  if (s.ok()) s = control.io.queue(engine::encode(auth));
  if (s.ok()) s = control.io.queue(channel_addresses(*peer));
  if (s.ok()) s = dialer.exchange(just_control, FrameType::kChannelAddresses);
  if (s.ok()) s = connect_channels(*peer, body_of(control));
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
  // The side connections of every channel, kJoinsInFlight at a time: connected, JOIN sent,
  // and each handed to its channel as its JOIN_OK comes.
  struct Side {
    transport::Channel* channel;
    int index;
  };
  std::vector<Side> sides;
  for (const auto& channel : peer->channels.all()) {
    for (int i = 0; i < channel->side_connections(); ++i) sides.push_back({channel.get(), i});
  }
  std::vector<Link> links(sides.size());
  std::vector<Link*> in_flight, answered;
  std::string step = "side connections: ";
  for (std::size_t next = 0, attached = 0; s.ok() && attached < sides.size();) {
    for (; s.ok() && next < sides.size() && in_flight.size() < kJoinsInFlight; ++next) {
      Link& l = links[next];
      s = core::start_connect_like(control_fd, l.fd);
      if (!s.ok()) break;
      core::tune_socket(l.fd.get(), config.peer_timeout);
      l.connecting = true;
      l.sock = l.fd.get();
      l.io = HandshakeIo(l.sock);
      engine::Join join;
      join.token = ack.token;
      join.kind = sides[next].channel->kind();
      join.index = static_cast<uint16_t>(sides[next].index);
      s = l.io.queue(engine::encode(join));  // sent once connected, if the socket is not yet
      in_flight.push_back(&l);
    }
    if (s.ok()) s = dialer.answers(in_flight, FrameType::kJoinOk, answered);
    for (Link* l : answered) {
      if (!s.ok()) break;
      const Side& side = sides[static_cast<std::size_t>(l - links.data())];
      s = side.channel->attach_side(side.index, std::move(l->fd));
      if (!s.ok()) {
        step = std::string(to_string(side.channel->kind())) + " connection " +
               std::to_string(side.index) + ": ";
      }
      std::erase(in_flight, l);
      ++attached;
    }
  }
  if (!s.ok()) {
    peer->close(s);
    fail(s, step);
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
