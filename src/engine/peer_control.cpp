// The peer's control connection (liveness pings and orderly goodbye, on a progress thread)
// and how a peer closes.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cstring>

#include "core/log.hpp"
#include "core/sys.hpp"
#include "engine/engine_impl.hpp"

namespace ferry::detail {

using core::FrameHeader;
using core::FrameType;

namespace {
// Bytes the control connection reads per wake-up: a peer flooding it with pings gets its turn
// like every other socket of the progress thread (a ping is 48 bytes).
constexpr std::size_t kControlReadBudget = 16 << 10;
}  // namespace

struct PeerImpl::Control final : core::Reactor::Handler {
  std::weak_ptr<PeerImpl> peer;
  core::Reactor* reactor = nullptr;
  int loop = 0;
  core::Fd fd;
  std::atomic<int64_t> last_heard_ns{0};
  Clock::time_point last_ping{};
  std::mutex out_mu;
  std::string out;  // bytes a full socket did not take yet
  // After the handshake only PING, PONG and BYE come, each a bare header.
  uint8_t in[core::kFrameHeaderSize];
  std::size_t in_len = 0;
  bool stopped = false;  // loop thread only
  // Watched by the reactor (start_control), and closed: whichever comes second decides, so a
  // peer closed before it was started is never watched, and a watched one is always stopped.
  std::mutex watch_mu;
  bool watched = false;
  bool closed = false;

  void heard() { last_heard_ns.store(Clock::now().time_since_epoch().count()); }

  void send_frame(FrameType type) {
    auto frame = engine::encode_empty(type);
    std::lock_guard lock(out_mu);
    // Pings and pongs only say "alive": one waiting to go says it for the next ones too, so a
    // peer that pings without reading costs us at most one frame.
    if (!out.empty() && type != FrameType::kBye) return;
    out.append(reinterpret_cast<const char*>(frame.data()), frame.size());
    ssize_t n = ::send(fd.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) out.erase(0, static_cast<std::size_t>(n));
  }

  void on_event(uint32_t) override {
    if (stopped) return;
    Status lost;
    bool goodbye = false;
    for (std::size_t budget = kControlReadBudget; budget > 0;) {
      ssize_t n = ::recv(fd.get(), in + in_len, sizeof in - in_len, MSG_DONTWAIT);
      if (n == 0) {
        lost = {ErrorCode::kPeerLost, "control connection closed by peer"};
        break;
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        lost = core::sys_status("recv on control connection", errno, ErrorCode::kPeerLost);
        break;
      }
      in_len += static_cast<std::size_t>(n);
      budget -= std::min(budget, static_cast<std::size_t>(n));
      heard();
      while (lost.ok() && in_len >= core::kFrameHeaderSize) {
        FrameHeader h;
        if (Status s = core::decode_header(in, h); !s.ok() || !core::is_control(h.type)) {
          lost = s.ok() ? Status(ErrorCode::kProtocol, "data frame on the control connection") : s;
          break;
        }
        if (h.length != 0) {
          lost = {ErrorCode::kProtocol, "control frame with a body after the handshake"};
          break;
        }
        if (h.type == FrameType::kPing) {
          send_frame(FrameType::kPong);
        } else if (h.type == FrameType::kBye) {
          lost = {ErrorCode::kPeerLost, "peer closed the connection"};
          goodbye = true;
        } else if (h.type != FrameType::kPong) {
          lost = {ErrorCode::kProtocol,
                  "unexpected control frame " + std::to_string(static_cast<int>(h.type))};
        }
        in_len = 0;
      }
      if (!lost.ok()) break;
    }
    {
      std::lock_guard lock(out_mu);
      if (!out.empty()) {
        ssize_t n = ::send(fd.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) out.erase(0, static_cast<std::size_t>(n));
      }
    }
    if (!lost.ok()) {
      if (auto p = peer.lock()) p->close(lost, goodbye);
    }
  }

  // Whether a BYE has arrived and not been read yet: looked at without reading it, from any
  // thread. The loop thread may have read part of a header, so every offset is tried (a
  // header's magic makes a false match at a wrong one as good as impossible).
  bool goodbye_waiting() const {
    uint8_t peeked[8 * core::kFrameHeaderSize];
    ssize_t n = ::recv(fd.get(), peeked, sizeof peeked, MSG_PEEK | MSG_DONTWAIT);
    for (std::size_t at = 0; n > 0 && at + core::kFrameHeaderSize <= static_cast<std::size_t>(n);
         ++at) {
      FrameHeader h;
      if (core::decode_header(peeked + at, h).ok() && h.type == FrameType::kBye) return true;
    }
    return false;
  }

  // On the loop thread.
  void stop(const std::shared_ptr<Control>& self) {
    if (stopped) return;
    stopped = true;
    reactor->remove(loop, fd.get());
    reactor->retire(loop, self);
  }
};

namespace {
// The host of a "host:port" (an IPv6 host without its brackets), as the listener names a source.
std::string source_host(const std::string& address) {
  core::HostPort hp;
  return core::parse_host_port(address, hp).ok() ? hp.host : address;
}
}  // namespace

PeerImpl::PeerImpl(std::shared_ptr<EngineImpl> eng, const engine::Identity& remote,
                   std::string addr, bool from_peer, core::Fd control)
    : public_key(remote.key),
      engine_id(remote.engine_id()),
      incarnation(remote.incarnation),
      address(std::move(addr)),
      incoming(from_peer),
      source(from_peer ? source_host(address) : std::string()),
      engine(std::move(eng)),
      link(std::make_shared<transport::PeerLink>(engine_id, engine->config.max_unexpected_bytes,
                                                 engine->unexpected_budget)),
      reach(core::reach_between(engine->locality, remote.locality)),
      control_(std::make_shared<Control>()) {
  control_->fd = std::move(control);
  control_->reactor = &engine->reactor();
  control_->heard();
}

std::shared_ptr<PeerImpl> PeerImpl::create(std::shared_ptr<EngineImpl> eng,
                                           const engine::Identity& remote, std::string addr,
                                           bool from_peer, core::Fd control) {
  // The state and at most two frames waiting to go (a coalesced ping or pong, and BYE).
  static_assert(sizeof(Control) + 2 * core::kFrameHeaderSize <= kControlBytes);
  auto peer = std::make_shared<PeerImpl>(std::move(eng), remote, std::move(addr), from_peer,
                                         std::move(control));
  peer->link->owner = peer;
  return peer;
}

void PeerImpl::start_control() {
  std::lock_guard lock(control_->watch_mu);
  if (control_->closed) return;  // lost while joining: nothing to watch
  control_->peer = weak_from_this();
  control_->loop = engine->reactor().pick_loop();
  if (core::set_nonblocking(control_->fd.get(), true).ok()) {
    control_->watched =
        engine->reactor()
            .add(control_->loop, control_->fd.get(), EPOLLIN | EPOLLRDHUP, control_.get())
            .ok();
  }
}

bool PeerImpl::control_alive() const {
  if (lost.load()) return false;
  pollfd p{control_->fd.get(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 0;  // any event here is a hang-up or an error
}

void PeerImpl::housekeeping(Clock::time_point now) {
  if (lost.load()) return;
  auto silent = now - Clock::time_point(Clock::duration(control_->last_heard_ns.load()));
  if (silent > engine->config.peer_timeout) {
    close(
        {ErrorCode::kPeerLost,
         "no sign of life from " + address + " for " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
             " ms"});
    return;
  }
  if (now - control_->last_ping > engine->config.peer_timeout / 4) {
    control_->last_ping = now;
    control_->send_frame(FrameType::kPing);
  }
}

void PeerImpl::close(const Status& reason, bool goodbye) {
  {
    std::lock_guard lock(close_mu_);
    if (lost.load()) return;
    close_reason_ = reason;
    lost.store(true);
  }
  if (established.load()) {
    // Closing on purpose (Peer::close, shutdown, the peer's goodbye) is routine; anything else
    // loses it. A peer that said goodbye closes its streams first, so the end of one may be
    // what brought us here, with the goodbye already waiting on the control connection.
    bool routine = goodbye || reason.code() == ErrorCode::kCancelled || control_->goodbye_waiting();
    core::log(routine ? LogLevel::kInfo : LogLevel::kWarn, "engine", [&] {
      return "peer " + std::to_string(engine_id) + " at " + address +
             (routine ? " closed: " : " lost: ") + reason.to_string();
    });
  }
  // The goodbye goes out before our channels end, so the peer finds it waiting when it sees
  // them end and knows we left on purpose (goodbye_waiting). The peer may answer by ending its
  // side before ours closed (a thread switch between these lines): our in-flight operations
  // still report our reason, which close_reason_ keeps.
  if (reason.code() == ErrorCode::kCancelled) control_->send_frame(FrameType::kBye);
  channels.close(reason);
  ::shutdown(control_->fd.get(), SHUT_RDWR);
  std::shared_ptr<Control> control = control_;
  std::lock_guard lock(control->watch_mu);
  control->closed = true;
  if (control->watched)
    engine->reactor().post(control->loop, [control] { control->stop(control); });
}

void PeerImpl::channel_closed(const Status& reason) {
  // Marks the peer lost first, so a caller woken by a failure already sees connected() false.
  close(reason);
  if (open_channels.fetch_sub(1) != 1) return;
  Status first;
  {
    std::lock_guard lock(close_mu_);
    first = close_reason_;
  }
  link->fail_all(first);
  engine->peer_closed(this);
}

}  // namespace ferry::detail
