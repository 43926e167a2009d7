#include "engine/listener.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/crypto.hpp"
#include "core/sys.hpp"
#include "engine/peer_impl.hpp"

namespace ferry::detail {

using core::FrameHeader;
using core::FrameType;

namespace {
// Connections taken from the accept queue per wake-up, so a connection flood cannot keep the
// thread from the handshakes already under way.
constexpr int kAcceptBurst = 32;
// After accept() fails for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) the
// listening socket is left alone for this long, doubling up to the maximum while it keeps
// failing; the pending connection would otherwise wake the thread again at once.
constexpr Duration kAcceptBackoffMin = std::chrono::milliseconds(10);
constexpr Duration kAcceptBackoffMax = std::chrono::seconds(1);
constexpr uint64_t kWakeId = 0;
constexpr uint64_t kSocketId = 1;

bool out_of_descriptors_or_memory(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

// Reads of 1 KiB a refused connection's unread bytes get before it closes (Listener::fail):
// more than the largest CHANNEL_ADDRESSES (8 channels of 1 KiB addresses).
constexpr int kUnreadDrained = 16;

int milliseconds_until(Clock::time_point when, Clock::time_point now) {
  if (when <= now) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(when - now).count();
  return static_cast<int>(std::min<int64_t>(ms, 60'000));
}
}  // namespace

struct Listener::Handshake {
  enum class Stage : uint8_t {
    kFirst,      // expects HELLO (a control connection) or JOIN (a side connection)
    kAuth,       // HELLO_ACK (signed) sent; expects AUTH
    kAddresses,  // peer and its channels created; expects the client's channel addresses
    kHandOver,   // the last reply is queued; once it is out the connection leaves
  };
  uint64_t id = 0;
  core::Fd fd;    // until it moves into the peer (control) or the channel (stream)
  int sock = -1;  // stays valid while `fd` or `peer` holds the descriptor
  std::string source;
  std::string address;
  Clock::time_point deadline;
  Stage stage = Stage::kFirst;
  bool watching_out = false;
  HandshakeIo io;
  engine::Hello hello;
  engine::HelloAck ack;
  engine::Join join;
  bool is_stream = false;
  bool publish = false;  // a peer whose channels need no side connections: ready at hand-over
  std::shared_ptr<PeerImpl> peer;
};

Listener::Listener(ListenerHost& engine, core::Fd socket)
    : engine_(engine), socket_(std::move(socket)) {
  epoll_ = core::Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) throw Error(core::sys_status("epoll_create1"));
  wake_ = core::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) throw Error(core::sys_status("eventfd"));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
    throw Error(core::sys_status("epoll_ctl ADD eventfd"));
  }
  if (socket_.valid()) {
    core::throw_if_error(core::set_nonblocking(socket_.get(), true));
    ev.data.u64 = kSocketId;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, socket_.get(), &ev) != 0) {
      throw Error(core::sys_status("epoll_ctl ADD listening socket"));
    }
  }
}

Listener::~Listener() { stop(); }

std::size_t Listener::worst_case_handshake_bytes() {
  constexpr std::size_t kFrame = core::kFrameHeaderSize + core::kMaxControlPayload;
  // The frame being read, at most two replies queued (HELLO_ACK then AUTH_OK or
  // CHANNEL_ADDRESSES),
  // the map nodes and the per-source count.
  return sizeof(Handshake) + 3 * kFrame + 256;
}

void Listener::start() {
  if (socket_.valid()) thread_ = std::thread([this] { run(); });
}

void Listener::stop() {
  if (stopping_.exchange(true)) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

void Listener::run() {
  epoll_event events[64];
  while (!stopping_.load()) {
    Clock::time_point now = Clock::now();
    Clock::time_point wake_at = Clock::time_point::max();
    for (const auto& [id, h] : handshakes_) wake_at = std::min(wake_at, h->deadline);
    bool backing_off = accept_backoff_ != Duration::zero();
    if (backing_off) wake_at = std::min(wake_at, accept_resumes_);
    int n = ::epoll_wait(epoll_.get(), events, 64, milliseconds_until(wake_at, now));
    if (stopping_.load()) break;
    now = Clock::now();
    for (int i = 0; i < n; ++i) {
      uint64_t id = events[i].data.u64;
      if (id == kSocketId) {
        accept_burst(now);
      } else if (id != kWakeId) {
        // Looked up per event: an earlier event of this round may have ended the handshake.
        auto it = handshakes_.find(id);
        if (it != handshakes_.end()) on_ready(*it->second, events[i].events);
      }
    }
    if (backing_off && now >= accept_resumes_) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kSocketId;
      (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, socket_.get(), &ev);
      accept_resumes_ = {};
      accept_burst(now);
    }
    expire(now);
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, h] : handshakes_) ids.push_back(id);
  for (uint64_t id : ids) fail(*handshakes_.at(id), {ErrorCode::kCancelled, "engine shut down"});
}

void Listener::accept_burst(Clock::time_point now) {
  if (accept_resumes_ != Clock::time_point{}) return;  // backing off
  for (int i = 0; i < kAcceptBurst; ++i) {
    int fd = ::accept4(socket_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      accept_backoff_ = Duration::zero();
      admit(core::Fd(fd), now);
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    if (!out_of_descriptors_or_memory(errno)) continue;  // ECONNABORTED, EINTR, EPROTO...
    accept_failures_.fetch_add(1, std::memory_order_relaxed);
    accept_backoff_ = std::clamp(accept_backoff_ * 2, kAcceptBackoffMin, kAcceptBackoffMax);
    accept_resumes_ = now + accept_backoff_;
    epoll_event ev{};
    ev.data.u64 = kSocketId;
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, socket_.get(), &ev);  // no events meanwhile
    return;
  }
}

void Listener::admit(core::Fd fd, Clock::time_point now) {
  const Config& config = engine_.settings();
  core::HostPort remote = core::peer_host_port(fd.get());
  auto h = std::make_unique<Handshake>();
  h->sock = fd.get();
  h->fd = std::move(fd);
  h->io = HandshakeIo(h->sock);
  h->source = remote.host;
  h->address = remote.to_string();
  h->deadline = now + config.connect_timeout;
  core::tune_socket(h->sock, config.peer_timeout);
  if (per_source_[h->source] >= config.max_handshakes_per_source) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    core::log_limited(limits_log_, LogLevel::kWarn, "listener", [&] {
      return "admission limit reached: connection from " + h->address + " refused, " +
             std::to_string(config.max_handshakes_per_source) +
             " handshakes pending from that address (max_handshakes_per_source)";
    });
    // What the client already sent is read first: closing on unread bytes would reset the
    // connection and could discard the refusal before the client reads it.
    uint8_t scratch[512];
    (void)::recv(h->sock, scratch, sizeof scratch, MSG_DONTWAIT);
    auto frame = engine::encode(engine::ErrorMsg{
        ErrorCode::kResourceExhausted, std::string(engine::kBusyRefusal) +
                                           "too many handshakes pending from " + h->source +
                                           " (max_handshakes_per_source " +
                                           std::to_string(config.max_handshakes_per_source) + ")"});
    (void)::send(h->sock, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (per_source_[h->source] == 0) per_source_.erase(h->source);
    return;
  }
  if (handshakes_.size() >= config.max_handshakes) evict_one();
  h->id = next_id_++;
  ++per_source_[h->source];
  Handshake& ref = *h;
  handshakes_.emplace(h->id, std::move(h));
  pending_.store(handshakes_.size(), std::memory_order_relaxed);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = ref.id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, ref.sock, &ev) != 0) {
    fail(ref, core::sys_status("epoll_ctl ADD handshake"));
  }
}

void Listener::evict_one() {
  std::string heaviest;
  int most = 0;
  for (const auto& [source, count] : per_source_) {
    if (count > most) {
      most = count;
      heaviest = source;
    }
  }
  Handshake* oldest = nullptr;
  for (const auto& [id, h] : handshakes_) {
    // Ids grow in accept order; times can tie within one burst.
    if (h->source == heaviest && (oldest == nullptr || h->id < oldest->id)) {
      oldest = h.get();
    }
  }
  if (oldest != nullptr) {
    fail(*oldest, {ErrorCode::kResourceExhausted,
                   "handshake evicted: " + std::to_string(engine_.settings().max_handshakes) +
                       " handshakes pending (max_handshakes), most of them from " + heaviest});
  }
}

void Listener::on_ready(Handshake& h, uint32_t events) {
  Status s;
  if (events & EPOLLOUT) s = flush(h);
  if (s.ok() && h.stage == Handshake::Stage::kHandOver) {
    if (!h.io.sending()) hand_over(h);
    return;
  }
  if (s.ok() && (events & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
    // One frame per wake-up: its reply goes out before the next is read.
    bool progressed = true;
    while (s.ok() && progressed && h.stage != Handshake::Stage::kHandOver) {
      s = read_frame(h, progressed);
    }
    if (s.ok() && h.stage == Handshake::Stage::kHandOver && !h.io.sending()) {
      hand_over(h);
      return;
    }
  }
  if (!s.ok()) fail(h, s);
}

Status Listener::read_frame(Handshake& h, bool& progressed) {
  FrameHeader header;
  std::vector<uint8_t> frame;
  if (Status s = h.io.read(progressed, header, frame); !s.ok() || frame.empty()) return s;
  return step(h, header, std::span(frame).subspan(core::kFrameHeaderSize));
}

Status Listener::step(Handshake& h, const FrameHeader& header, std::span<const uint8_t> body) {
  using Stage = Handshake::Stage;
  if (h.stage == Stage::kFirst && header.type == FrameType::kHello) return on_hello(h, body);
  if (h.stage == Stage::kFirst && header.type == FrameType::kJoin) return on_join(h, body);
  if (h.stage == Stage::kAuth && header.type == FrameType::kAuth) return on_auth(h, body);
  if (h.stage == Stage::kAddresses && header.type == FrameType::kChannelAddresses) {
    return on_addresses(h, body);
  }
  if (h.stage == Stage::kFirst) return {ErrorCode::kProtocol, "expected hello or join"};
  if (h.stage == Stage::kAuth) return {ErrorCode::kAuthFailed, "authentication required"};
  return {ErrorCode::kProtocol,
          "handshake: unexpected frame type " + std::to_string(static_cast<int>(header.type))};
}

Status Listener::on_hello(Handshake& h, std::span<const uint8_t> body) {
  if (Status s = engine::decode(body, h.hello); !s.ok()) return s;
  const Config& config = engine_.settings();
  engine::HelloAck& ack = h.ack;
  const engine::Identity us = engine_.identity();
  ack.key = us.key;
  ack.incarnation = us.incarnation;
  ack.locality = us.locality;
  Reach reach = core::reach_between(us.locality, h.hello.locality);
  ack.channels = engine_.channels_for(h.hello.transports, reach);
  if (ack.channels.empty()) {
    std::string ours;
    for (TransportKind t : engine_.usable_transports()) ours += " " + std::string(to_string(t));
    return {ErrorCode::kUnsupported, "no common transport reaches the peer (" +
                                         std::string(to_string(reach)) + "): this engine can use" +
                                         ours};
  }
  // Pinning refuses an untrusted key before we sign anything for it.
  if (Status s = engine_.check_trusted(h.hello.key); !s.ok()) return s;
  core::random_bytes(ack.nonce);
  core::random_bytes(ack.token);
  const engine::Transcript t = engine::transcript_of(h.hello, h.ack);
  ack.signature = engine::sign_transcript(engine_.signing_key(), true, t);
  if (!config.secret.empty()) ack.mac = engine::auth_mac(config.secret, true, t);
  if (Status s = queue(h, engine::encode(ack)); !s.ok()) return s;
  h.stage = Handshake::Stage::kAuth;
  return {};
}

Status Listener::on_auth(Handshake& h, std::span<const uint8_t> body) {
  const Config& config = engine_.settings();
  engine::Auth auth;
  if (Status s = engine::decode(body, auth); !s.ok()) return s;
  const engine::Transcript t = engine::transcript_of(h.hello, h.ack);
  if (!engine::transcript_signed(false, t, auth.signature)) {
    return {ErrorCode::kAuthFailed, "the client did not prove its identity key (engine " +
                                        std::to_string(h.hello.engine_id()) + ")"};
  }
  if (!config.secret.empty() &&
      (!auth.mac || !core::mac_equal(*auth.mac, engine::auth_mac(config.secret, false, t)))) {
    return {ErrorCode::kAuthFailed, auth.mac ? "wrong shared secret" : "shared secret required"};
  }
  if (Status s = engine_.check_admission(h.hello, h.source); !s.ok()) return s;
  return admit_peer(h);  // no answer: the client's CHANNEL_ADDRESSES follow at once
}

Status Listener::admit_peer(Handshake& h) {
  if (Status s = engine_.create_peer(h.hello, h.address, h.ack.channels, h.fd, h.peer); !s.ok()) {
    return s;
  }
  h.stage = Handshake::Stage::kAddresses;  // the client sends its channels' addresses first
  return {};
}

Status Listener::on_addresses(Handshake& h, std::span<const uint8_t> body) {
  if (Status s = engine_.connect_peer_channels(*h.peer, body); !s.ok()) return s;
  if (Status s = queue(h, engine_.peer_channel_addresses(*h.peer)); !s.ok()) return s;
  // Counted from the reply on: the client may use the peer and close it before we publish.
  engine_.add_joining(h.ack.token, h.peer, h.deadline);
  h.publish = h.peer->channels.side_connections() == 0;
  return finish_replies(h);
}

Status Listener::on_join(Handshake& h, std::span<const uint8_t> body) {
  if (Status s = engine::decode(body, h.join); !s.ok()) return s;
  h.peer = engine_.find_joining(h.join.token);
  if (!h.peer) return {ErrorCode::kProtocol, "join: unknown session"};
  h.is_stream = true;
  // Counted before it leaves: the client may use the peer and close it before we go on.
  engine_.told_joined(h.join.token, 1);
  if (Status s = queue(h, engine::encode_empty(FrameType::kJoinOk)); !s.ok()) {
    engine_.told_joined(h.join.token, -1);
    return s;
  }
  return finish_replies(h);
}

Status Listener::finish_replies(Handshake& h) {
  h.stage = Handshake::Stage::kHandOver;
  if (h.io.sending()) watch(h);  // waits for the socket to take the rest, reading nothing
  return {};
}

Status Listener::queue(Handshake& h, const std::vector<uint8_t>& frame) {
  if (Status s = h.io.queue(frame); !s.ok()) return s;
  return watch_sending(h);
}

Status Listener::flush(Handshake& h) {
  if (Status s = h.io.flush(); !s.ok()) return s;
  return watch_sending(h);
}

Status Listener::watch_sending(Handshake& h) {
  bool want_out = h.io.sending();
  if (want_out != h.watching_out) {
    h.watching_out = want_out;
    watch(h);
  }
  return {};
}

void Listener::watch(Handshake& h) {
  epoll_event ev{};
  // Handing over, nothing more is read here: input waits in the socket for its new owner (and
  // must not wake this loop until the reply is out).
  uint32_t in = h.stage == Handshake::Stage::kHandOver ? 0u : uint32_t{EPOLLIN};
  ev.events = h.watching_out ? in | EPOLLOUT : in;
  ev.data.u64 = h.id;
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, h.sock, &ev);
}

void Listener::hand_over(Handshake& h) {
  std::shared_ptr<PeerImpl> peer = std::move(h.peer);
  core::Fd stream = std::move(h.fd);
  bool is_stream = h.is_stream;
  bool publish = h.publish;
  engine::Join join = h.join;
  forget(h);
  if (is_stream) engine_.attach_side(peer, join, std::move(stream));
  if (publish) engine_.publish(peer);
}

void Listener::fail(Handshake& h, const Status& why) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  // Shutdown cancels what is pending: nothing was refused.
  if (why.code() != ErrorCode::kCancelled) {
    bool limit = why.code() == ErrorCode::kResourceExhausted;
    core::log_limited(limit ? limits_log_ : refusals_log_, LogLevel::kWarn, "listener", [&] {
      return std::string(limit ? "admission limit reached: " : "") + "handshake from " + h.address +
             " refused: " + why.to_string();
    });
  }
  // Forgotten before the refusal goes out, so a client reading it sees the counts updated.
  int sock = h.sock;
  bool reply = h.io.idle();       // else a reply is half sent: an error frame would garble it
  core::Fd fd = std::move(h.fd);  // closed on return, after the refusal
  // A peer this handshake created owns the control connection; closing it closes that. A
  // stream's peer belongs to another connection: only the stream goes.
  std::shared_ptr<PeerImpl> created = h.is_stream ? nullptr : std::move(h.peer);
  forget(h);
  if (reply) {
    auto frame = engine::encode(engine::ErrorMsg{why.code(), why.message()});
    (void)::send(sock, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    // A socket closed with bytes unread is reset, and over a network a reset can overtake the
    // refusal. The client sends its CHANNEL_ADDRESSES right behind AUTH, unasked: a refusal at
    // AUTH finds them here. So the refusal ends the stream (FIN) and what came is read away.
    (void)::shutdown(sock, SHUT_WR);
    char unread[1024];
    for (int i = 0; i<kUnreadDrained&& ::recv(sock, unread, sizeof unread, MSG_DONTWAIT)> 0; ++i) {
    }
  }
  if (created) created->close(why);
}

void Listener::forget(Handshake& h) {
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, h.sock, nullptr);
  auto it = per_source_.find(h.source);
  if (it != per_source_.end() && --it->second <= 0) per_source_.erase(it);
  handshakes_.erase(h.id);  // destroys h (and closes its descriptor if it still holds it)
  pending_.store(handshakes_.size(), std::memory_order_relaxed);
}

void Listener::expire(Clock::time_point now) {
  std::vector<uint64_t> late;
  for (const auto& [id, h] : handshakes_) {
    if (now >= h->deadline) late.push_back(id);
  }
  for (uint64_t id : late) {
    Handshake& h = *handshakes_.at(id);
    fail(h, {ErrorCode::kTimeout,
             "handshake with " + h.address + " did not complete within " +
                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    engine_.settings().connect_timeout)
                                    .count()) +
                 " ms (connect_timeout)"});
  }
}

}  // namespace ferry::detail
