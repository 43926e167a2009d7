#include "engine/engine_impl.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/crypto.hpp"
#include "core/sys.hpp"

namespace ferry::detail {

using core::FrameHeader;
using core::FrameType;
using transport::OpEntry;
using transport::OpKind;
using transport::OpState;

namespace {
// Largest slice: a frame's length field is 32 bits, and bigger slices only delay acks.
constexpr std::size_t kMaxSliceBytes = 64 << 20;
constexpr std::size_t kMinSliceBytes = 4 << 10;
// How often the acceptor thread checks peers' liveness and pings idle ones.
constexpr int kHousekeepingMs = 100;

const char* op_name(OpKind kind, bool imm) {
  switch (kind) {
    case OpKind::kWrite:
      return imm ? "write_with_imm" : "write";
    case OpKind::kRead:
      return "read";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
  }
  return "op";
}

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

void refuse(int fd, const Status& why, core::Deadline deadline) {
  (void)write_frame(fd, engine::encode(engine::ErrorMsg{why.code(), why.message()}), deadline);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Control connection: liveness pings and orderly goodbye, on a progress thread.

struct PeerImpl::Control final : core::Reactor::Handler {
  std::weak_ptr<PeerImpl> peer;
  core::Reactor* reactor = nullptr;
  int loop = 0;
  core::Fd fd;
  std::atomic<int64_t> last_heard_ns{0};
  Clock::time_point last_ping{};
  std::mutex out_mu;
  std::string out;  // bytes a full socket did not take yet
  uint8_t in[core::kFrameHeaderSize + core::kMaxControlPayload];
  std::size_t in_len = 0;
  bool stopped = false;  // loop thread only

  void heard() { last_heard_ns.store(Clock::now().time_since_epoch().count()); }

  void send_frame(FrameType type) {
    auto frame = engine::encode_empty(type);
    std::lock_guard lock(out_mu);
    out.append(reinterpret_cast<const char*>(frame.data()), frame.size());
    ssize_t n = ::send(fd.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) out.erase(0, static_cast<std::size_t>(n));
  }

  void on_event(uint32_t) override {
    if (stopped) return;
    Status lost;
    for (;;) {
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
      heard();
      while (lost.ok() && in_len >= core::kFrameHeaderSize) {
        FrameHeader h;
        if (Status s = core::decode_header(in, h); !s.ok() || !core::is_control(h.type)) {
          lost = s.ok() ? Status(ErrorCode::kProtocol, "data frame on the control connection") : s;
          break;
        }
        std::size_t whole = core::kFrameHeaderSize + h.length;
        if (in_len < whole) break;
        if (h.type == FrameType::kPing) {
          send_frame(FrameType::kPong);
        } else if (h.type == FrameType::kBye) {
          lost = {ErrorCode::kPeerLost, "peer closed the connection"};
        } else if (h.type != FrameType::kPong) {
          lost = {ErrorCode::kProtocol,
                  "unexpected control frame " + std::to_string(static_cast<int>(h.type))};
        }
        std::memmove(in, in + whole, in_len - whole);
        in_len -= whole;
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
      if (auto p = peer.lock()) p->close(lost);
    }
  }

  // On the loop thread.
  void stop(const std::shared_ptr<Control>& self) {
    if (stopped) return;
    stopped = true;
    reactor->remove(loop, fd.get());
    reactor->retire(loop, self);
  }
};

PeerImpl::PeerImpl(std::shared_ptr<EngineImpl> eng, const engine::Hello& remote, std::string addr,
                   TransportKind kind, core::Fd control)
    : engine_id(remote.engine_id),
      incarnation(remote.incarnation),
      address(std::move(addr)),
      transport(kind),
      engine(std::move(eng)),
      link(std::make_shared<transport::PeerLink>(
          remote.engine_id, engine->config.max_unexpected_bytes, engine->unexpected_budget)),
      control_(std::make_shared<Control>()) {
  control_->fd = std::move(control);
  control_->reactor = &engine->reactor();
  control_->heard();
}

void PeerImpl::start_control() {
  control_->peer = weak_from_this();
  control_->loop = engine->reactor().pick_loop();
  if (core::set_nonblocking(control_->fd.get(), true).ok()) {
    (void)engine->reactor().add(control_->loop, control_->fd.get(), EPOLLIN | EPOLLRDHUP,
                                control_.get());
  }
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

void PeerImpl::close(const Status& reason) {
  if (lost.exchange(true)) return;
  // The channel first: its close reason is what in-flight operations report, and the goodbye
  // below makes the remote side drop our streams, which must not be mistaken for a loss.
  if (verbs) verbs->close(reason);
  if (channel) channel->close(reason);
  if (reason.code() == ErrorCode::kCancelled) control_->send_frame(FrameType::kBye);
  ::shutdown(control_->fd.get(), SHUT_RDWR);
  std::shared_ptr<Control> control = control_;
  engine->reactor().post(control->loop, [control] { control->stop(control); });
}

void PeerImpl::channel_closed(const Status& reason) {
  // Marks the peer lost first, so a caller woken by a failure already sees connected() false.
  close(reason);
  if (open_channels.fetch_sub(1) != 1) return;
  link->fail_all(reason);
  engine->peer_closed(this);
}

transport::Channel& PeerImpl::data_channel() const {
  if (verbs) return *verbs;
  return *channel;
}

OpState* PeerImpl::start_op(OpKind kind) {
  OpState* op = link->pool->acquire();
  op->kind = kind;
  op->slice_bytes = engine->config.slice_bytes;
  op->spin_ns = engine->config.wait_spin.count();
  return op;
}

Future PeerImpl::finish_now(OpState* op, const Status& status) {
  op->complete_with(status);
  return Future(op);
}

bool PeerImpl::lease_local(OpState* op, const Region* local, uint64_t offset, uint64_t length,
                           uint8_t** addr, uint32_t* region_id) {
  if (local == nullptr || !local->valid()) return false;
  const RegionRecord& rec = *local->record_;
  if (rec.engine.get() != engine.get()) return false;
  transport::RegionSlot* slot =
      engine->regions().try_acquire(rec.id, rec.key, offset, length, Access::kLocal, addr);
  if (slot == nullptr) return false;
  op->leases.push_back(slot);
  *region_id = rec.id;
  return true;
}

Status PeerImpl::local_refusal(const Region* local, uint64_t offset, uint64_t length) const {
  if (local == nullptr || !local->valid()) return {ErrorCode::kInvalidArgument, "no local region"};
  const RegionRecord& rec = *local->record_;
  if (rec.engine.get() != engine.get()) {
    return {ErrorCode::kInvalidArgument, "local region belongs to another engine"};
  }
  return region_refusal(rec.id, rec.key, offset, length);
}

Status PeerImpl::region_refusal(uint32_t id, uint64_t key, uint64_t offset, uint64_t length) const {
  transport::RegionUse use;
  uint8_t* addr = nullptr;
  Status s = engine->regions().acquire(id, key, offset, length, Access::kLocal, &addr, use);
  // A refused id stays refused (ids are never reused), so this names the same reason.
  if (s.ok()) return {ErrorCode::kRevoked, "local region changed while in use"};
  return {s.code(), "local " + s.message()};
}

Status PeerImpl::take_local(OpState* op, const Region* local, uint64_t offset, uint64_t length,
                            uint8_t** addr, uint32_t* region_id) {
  uint32_t id = 0;
  if (!lease_local(op, local, offset, length, addr, &id))
    return local_refusal(local, offset, length);
  if (region_id != nullptr) *region_id = id;
  return {};
}

Future PeerImpl::post(OpState* op) {
  if (lost.load() || !link->pool->mark_posted(op)) {
    if (op->kind == OpKind::kRecv && link->matcher.take_buffered(op)) return finish_now(op, {});
    return finish_now(op, {ErrorCode::kPeerLost, "peer " + address + " is not connected"});
  }
  if (op->kind == OpKind::kRecv) {
    link->matcher.post(op);
  } else {
    data_channel().post(op);
  }
  return Future(op);
}

PeerImpl::Refusal PeerImpl::admit(OpState* op, const Transfer& t, Access wanted,
                                  TransportKind via) {
  const Descriptor* remote = t.remote;
  if (remote == nullptr) return Refusal::kNoRemote;
  if (remote->engine_id != engine_id) return Refusal::kWrongPeer;
  if (remote->incarnation != incarnation) return Refusal::kStale;
  if (!allows(remote->access, wanted)) return Refusal::kNotGranted;
  if (t.remote_offset > remote->length || t.length > remote->length - t.remote_offset) {
    return Refusal::kOutOfBounds;
  }
  const Descriptor::Key* key = remote->key_for(via);
  if (key == nullptr || key->length > sizeof(uint64_t)) return Refusal::kNoKey;
  uint8_t* local = nullptr;
  uint32_t local_region = 0;
  if (!lease_local(op, t.local, t.local_offset, t.length, &local, &local_region)) {
    return Refusal::kLocal;
  }
  if (t.length > 0) {
    uint64_t remote_key = 0;
    std::memcpy(&remote_key, key->bytes, key->length);
    op->entries.push_back(OpEntry{local, t.length, remote->region_id, remote_key, t.remote_offset,
                                  local_region, remote->address + t.remote_offset});
  }
  return Refusal::kNone;
}

Future PeerImpl::refuse(OpState* op, std::size_t entry, const Transfer& t, Refusal why) {
  const Descriptor* remote = t.remote;
  bool read = op->kind == OpKind::kRead;
  Status s;
  switch (why) {
    case Refusal::kNoRemote:
      s = {ErrorCode::kInvalidArgument, "no remote descriptor"};
      break;
    case Refusal::kWrongPeer:
      s = {ErrorCode::kWrongPeer, "descriptor of engine " + std::to_string(remote->engine_id) +
                                      ", peer is " + std::to_string(engine_id)};
      break;
    case Refusal::kStale:
      s = {ErrorCode::kStaleIncarnation, "descriptor from an earlier incarnation of the peer"};
      break;
    case Refusal::kNotGranted:
      s = {ErrorCode::kPermissionDenied, "region " + std::to_string(remote->region_id) +
                                             " does not grant remote " + (read ? "read" : "write")};
      break;
    case Refusal::kOutOfBounds:
      s = {ErrorCode::kOutOfBounds, "remote offset " + std::to_string(t.remote_offset) +
                                        " + length " + std::to_string(t.length) +
                                        " exceeds region length " + std::to_string(remote->length)};
      break;
    case Refusal::kNoKey:
      s = {ErrorCode::kUnsupported,
           "descriptor has no " +
               std::string(to_string(verbs ? TransportKind::kVerbs : TransportKind::kTcp)) +
               " key"};
      break;
    default:
      s = local_refusal(t.local, t.local_offset, t.length);
      break;
  }
  return finish_now(op, {s.code(), std::string(op_name(op->kind, op->with_imm)) + " entry " +
                                       std::to_string(entry) + ": " + s.message()});
}

transport::OpState* PeerImpl::start_one_sided(OpKind kind, bool with_imm, uint32_t imm) {
  OpState* op = start_op(kind);
  op->with_imm = with_imm;
  op->imm = imm;
  return op;
}

std::optional<Future> PeerImpl::admit_batch(OpState* op, std::span<const Transfer> batch,
                                            uint64_t& slices, uint64_t& total) {
  Access wanted = op->kind == OpKind::kRead ? Access::kRemoteRead : Access::kRemoteWrite;
  TransportKind via = verbs ? TransportKind::kVerbs : TransportKind::kTcp;
  slices = 0;
  total = 0;
  // Messages are built only on refusal: the success path allocates nothing.
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Transfer& t = batch[i];
    if (Refusal why = admit(op, t, wanted, via); why != Refusal::kNone) [[unlikely]] {
      return refuse(op, i, t, why);
    }
    slices += t.length <= op->slice_bytes ? (t.length > 0 ? 1 : 0)
                                          : transport::slice_count(t.length, op->slice_bytes);
    total += t.length;
  }
  return std::nullopt;
}

Future PeerImpl::one_sided(OpKind kind, std::span<const Transfer> batch, bool with_imm,
                           uint32_t imm) {
  OpState* op = start_one_sided(kind, with_imm, imm);
  uint64_t slices = 0, total = 0;
  if (std::optional<Future> refused = admit_batch(op, batch, slices, total)) [[unlikely]] {
    return std::move(*refused);
  }
  return plan_and_post(op, slices, total);
}

std::shared_ptr<const PreparedImpl> PeerImpl::prepare(OpKind kind, std::span<const Transfer> batch,
                                                      bool with_imm, uint32_t imm) {
  // Checked by the op a write() or read() would post, which then completes unposted.
  OpState* op = start_one_sided(kind, with_imm, imm);
  auto p = std::make_shared<PreparedImpl>();
  if (std::optional<Future> refused = admit_batch(op, batch, p->slices, p->total)) {
    throw Error(refused->status());
  }
  p->peer = shared_from_this();
  p->kind = kind;
  p->with_imm = with_imm;
  p->imm = imm;
  p->entries = op->entries;
  // Each local region once, with the span of it the batch touches: a post leases it again.
  for (const Transfer& t : batch) {
    const RegionRecord& rec = *t.local->record_;
    auto it = std::find_if(p->locals.begin(), p->locals.end(),
                           [&](const PreparedImpl::Local& l) { return l.region_id == rec.id; });
    if (it == p->locals.end()) {
      p->locals.push_back({rec.id, rec.key, t.local_offset, t.local_offset + t.length});
    } else {
      it->begin = std::min(it->begin, t.local_offset);
      it->end = std::max(it->end, t.local_offset + t.length);
    }
  }
  finish_now(op, {});  // releases the leases taken while checking
  return p;
}

Future PeerImpl::post_prepared(const PreparedImpl& p) {
  OpState* op = start_one_sided(p.kind, p.with_imm, p.imm);
  transport::RegionTable& regions = engine->regions();
  for (const PreparedImpl::Local& l : p.locals) {
    uint8_t* addr = nullptr;
    transport::RegionSlot* slot =
        regions.try_acquire(l.region_id, l.key, l.begin, l.end - l.begin, Access::kLocal, &addr);
    if (slot == nullptr) [[unlikely]] {
      return finish_now(op, region_refusal(l.region_id, l.key, l.begin, l.end - l.begin));
    }
    op->leases.push_back(slot);
  }
  op->entries.assign(p.entries.begin(), p.entries.end());  // capacity kept: no allocation
  return plan_and_post(op, p.slices, p.total);
}

Future PeerImpl::plan_and_post(OpState* op, uint64_t slices, uint64_t total) {
  if (slices == 0) return finish_now(op, {});
  // Striping: small operations stay on one stream (chosen in turn), large ones use them all.
  int lanes = data_channel().lanes();
  if (total > engine->config.stripe_threshold && lanes > 1) {
    op->lane_count = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(lanes), slices));
    op->first_lane = 0;
    for (int lane = 0; lane < op->lane_count; ++lane) {
      transport::LaneCursor& c = op->lanes[lane];
      c = {};
      transport::advance(*op, c, static_cast<uint64_t>(lane));
      c.remaining =
          slices / static_cast<uint64_t>(op->lane_count) +
          (static_cast<uint64_t>(lane) < slices % static_cast<uint64_t>(op->lane_count) ? 1 : 0);
    }
  } else {
    // The turn is a hint: a lost update between racing callers costs nothing, an atomic
    // increment costs every small operation.
    unsigned turn = next_lane_.load(std::memory_order_relaxed);
    next_lane_.store(turn + 1, std::memory_order_relaxed);
    op->lane_count = 1;
    op->first_lane = static_cast<int>(turn % static_cast<unsigned>(lanes));
    op->lanes[0] = {0, 0, slices};
  }
  // Published to the completing thread by the posting (pool and lane synchronisation).
  op->pending.store(static_cast<int64_t>(slices), std::memory_order_relaxed);
  op->bytes.store(total, std::memory_order_relaxed);
  return post(op);
}

Future PeerImpl::send(uint64_t tag, const Region& local, uint64_t offset, uint64_t length) {
  OpState* op = start_op(OpKind::kSend);
  op->tag = tag;
  if (length > UINT32_MAX) {
    return finish_now(op, {ErrorCode::kInvalidArgument, "send: messages are limited to 4 GiB - 1"});
  }
  uint8_t* addr = nullptr;
  uint32_t region_id = 0;
  if (Status s = take_local(op, &local, offset, length, &addr, &region_id); !s.ok()) {
    return finish_now(op, {s.code(), "send: " + s.message()});
  }
  op->entries.push_back(OpEntry{addr, length, 0, 0, 0, region_id});
  op->slice_bytes = length > 0 ? length : 1;  // one frame per message
  // All messages of a peer travel on stream (TCP) or queue pair (verbs) 0, so messages with one
  // tag arrive in order.
  op->lane_count = 1;
  op->first_lane = 0;
  op->lanes[0] = {0, 0, 1};
  op->pending.store(1);
  op->bytes.store(length);
  return post(op);
}

Future PeerImpl::recv(uint64_t tag, const Region& local, uint64_t offset, uint64_t capacity) {
  OpState* op = start_op(OpKind::kRecv);
  op->tag = tag;
  uint8_t* addr = nullptr;
  uint32_t region_id = 0;
  if (Status s = take_local(op, &local, offset, capacity, &addr, &region_id); !s.ok()) {
    return finish_now(op, {s.code(), "recv: " + s.message()});
  }
  op->entries.push_back(OpEntry{addr, capacity, 0, 0, 0, region_id});
  op->pending.store(1);
  return post(op);
}

// ---------------------------------------------------------------------------------------------
// Engine

namespace {
void validate(const Config& c) {
  auto bad = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "config: " + what);
  };
  if (c.progress_threads < 1 || c.progress_threads > 64) bad("progress_threads must be 1..64");
  if (c.tcp_streams < 1 || c.tcp_streams > OpState::kMaxLanes) bad("tcp_streams must be 1..16");
  if (c.slice_bytes < kMinSliceBytes || c.slice_bytes > kMaxSliceBytes) {
    bad("slice_bytes must be 4 KiB..64 MiB");
  }
  if (c.slices_in_flight_per_stream < 1) bad("slices_in_flight_per_stream must be >= 1");
  if (c.peer_timeout.count() <= 0 || c.connect_timeout.count() <= 0) bad("timeouts must be > 0");
  if (std::find(c.transports.begin(), c.transports.end(), TransportKind::kTcp) ==
      c.transports.end()) {
    throw Error(ErrorCode::kUnsupported,
                "config: no usable transport selected (this build provides tcp)");
  }
}

uint64_t nonzero_random() {
  uint64_t v;
  do v = core::random_u64();
  while (v == 0);
  return v;
}
}  // namespace

EngineImpl::EngineImpl(const Config& cfg)
    : config((validate(cfg), cfg)),
      id(cfg.engine_id != 0 ? cfg.engine_id : nonzero_random()),
      incarnation(nonzero_random()) {
  transports_.push_back(std::make_unique<transport::tcp::TcpTransport>());
  if (std::find(config.transports.begin(), config.transports.end(), TransportKind::kVerbs) !=
      config.transports.end()) {
    transport::verbs::VerbsOptions vo{config.rdma_device, config.rdma_gid_index, config.verbs_qps};
    auto dev = transport::verbs::VerbsDevice::open(vo, verbs_unusable_);
    if (dev) {
      verbs_ = dev.get();
      transports_.push_back(std::move(dev));
    } else if (!config.rdma_device.empty() || config.rdma_gid_index >= 0) {
      // Asked for by name or index: never fall back silently.
      throw Error(ErrorCode::kUnsupported, "verbs: " + verbs_unusable_);
    }
  }
  reactor_ = std::make_unique<core::Reactor>(config.progress_threads, config.busy_poll);
  if (config.listen) {
    core::HostPort where{config.listen_host, config.listen_port};
    core::throw_if_error(core::listen_tcp(where, listener_, port));
    for (auto& host : core::reachable_hosts(config.listen_host))
      advertised.push_back(core::HostPort{std::move(host), port}.to_string());
  }
  stop_event_ = core::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_event_.valid()) throw Error(core::sys_status("eventfd"));
}

EngineImpl::~EngineImpl() { shutdown(); }

void EngineImpl::start() {
  acceptor_ = std::thread([this] { acceptor_loop(); });
}

void EngineImpl::deliver_imm(uint64_t peer_engine_id, uint32_t imm) {
  std::unique_lock lock(imm_mu_);
  if (imm_callback_) {
    auto fn = imm_callback_;
    lock.unlock();
    fn(ImmEvent{peer_engine_id, imm});
    return;
  }
  imms_.push_back(ImmEvent{peer_engine_id, imm});
  lock.unlock();
  imm_cv_.notify_one();
}

std::optional<ImmEvent> EngineImpl::next_imm(Duration timeout) {
  std::unique_lock lock(imm_mu_);
  if (!imm_cv_.wait_for(lock, timeout, [&] { return !imms_.empty() || stopping_.load(); }) ||
      imms_.empty()) {
    return std::nullopt;
  }
  ImmEvent e = imms_.front();
  imms_.pop_front();
  return e;
}

void EngineImpl::on_imm(std::function<void(const ImmEvent&)> fn) {
  std::deque<ImmEvent> queued;
  std::function<void(const ImmEvent&)> deliver;
  {
    std::lock_guard lock(imm_mu_);
    imm_callback_ = std::move(fn);
    if (imm_callback_) {
      queued.swap(imms_);
      deliver = imm_callback_;
    }
  }
  for (const ImmEvent& e : queued) deliver(e);  // nothing already received is dropped
}

Region EngineImpl::register_memory(void* data, std::size_t length, Access access) {
  if (stopping_.load()) throw Error(ErrorCode::kCancelled, "register_memory: engine shut down");
  if (data == nullptr || length == 0) {
    throw Error(ErrorCode::kInvalidArgument, "register_memory: null pointer or zero length");
  }
  if (static_cast<uint8_t>(access) > static_cast<uint8_t>(Access::kRemoteReadWrite)) {
    throw Error(ErrorCode::kInvalidArgument, "register_memory: unknown access flags");
  }
  auto rec = std::make_shared<RegionRecord>();
  rec->engine = shared_from_this();
  rec->base = static_cast<uint8_t*>(data);
  rec->length = length;
  rec->access = access;
  rec->key = nonzero_random();
  rec->id = regions_.insert(rec->base, length, access, rec->key);

  Descriptor& d = rec->descriptor;
  d.engine_id = id;
  d.incarnation = incarnation;
  d.region_id = rec->id;
  d.address = reinterpret_cast<uint64_t>(data);
  d.length = length;
  d.access = access;
  for (auto& t : transports_) {
    Descriptor::Key& key = d.keys[d.key_count];
    key.transport = t->kind();
    Status s =
        t->register_region(rec->id, rec->base, length, access, rec->key, key.bytes, key.length);
    if (!s.ok()) {
      deregister(*rec);
      throw Error(s);
    }
    ++d.key_count;
  }
  return Region(std::move(rec));
}

void EngineImpl::deregister(RegionRecord& record) {
  if (!record.registered.exchange(false)) return;
  // Revocation waits for the operations using the region: their completions must be handled
  // even if nobody waits for them.
  std::vector<std::shared_ptr<PeerImpl>> peers;
  {
    std::lock_guard lock(mu_);
    peers = peers_;
  }
  for (auto& p : peers) p->link->pool->unwatched();
  regions_.revoke(record.id);
  for (auto& t : transports_) t->deregister_region(record.id);
}

std::shared_ptr<transport::tcp::TcpChannel> EngineImpl::make_channel(
    const std::shared_ptr<PeerImpl>& peer, int streams) {
  transport::tcp::TcpOptions options;
  options.streams = streams;
  options.slices_in_flight_per_stream = config.slices_in_flight_per_stream;
  std::weak_ptr<PeerImpl> weak = peer;
  peer->open_channels.fetch_add(1);
  return transport::tcp::TcpChannel::create(*this, peer->link, options, [weak](const Status& why) {
    if (auto p = weak.lock()) p->channel_closed(why);
  });
}

std::vector<TransportKind> EngineImpl::usable_transports() const {
  std::vector<TransportKind> out;
  for (TransportKind t : config.transports) {
    if (t == TransportKind::kTcp || (t == TransportKind::kVerbs && verbs_ != nullptr))
      out.push_back(t);
  }
  return out;
}

Status EngineImpl::connect_verbs(const std::shared_ptr<PeerImpl>& peer, int control, bool client,
                                 core::Deadline deadline) {
  if (verbs_ == nullptr) return {ErrorCode::kUnsupported, "verbs chosen but no device is open"};
  std::weak_ptr<PeerImpl> weak = peer;
  try {
    transport::verbs::VerbsChannel::Options options{config.verbs_qps, config.busy_poll,
                                                    config.zero_copy_receives};
    peer->verbs = transport::verbs::VerbsChannel::create(*this, *verbs_, peer->link, options,
                                                         [weak](const Status& why) {
                                                           if (auto p = weak.lock())
                                                             p->channel_closed(why);
                                                         });
  } catch (const Error& e) {
    return e.status();  // no queue pairs for this peer: it is refused, the engine goes on
  }
  peer->open_channels.fetch_add(1);
  auto send_address = [&] {
    std::vector<uint8_t> body = peer->verbs->local_address().encode();
    std::vector<uint8_t> frame(core::kFrameHeaderSize);
    FrameHeader h;
    h.type = FrameType::kVerbsAddress;
    h.length = static_cast<uint32_t>(body.size());
    core::encode_header(h, frame.data());
    frame.insert(frame.end(), body.begin(), body.end());
    return write_frame(control, frame, deadline);
  };
  if (client) {
    if (Status s = send_address(); !s.ok()) return s;
  }
  std::vector<uint8_t> body;
  if (Status s = expect(control, deadline, FrameType::kVerbsAddress, body); !s.ok()) return s;
  transport::verbs::VerbsAddress remote;
  if (Status s = transport::verbs::VerbsAddress::decode(body, remote); !s.ok()) return s;
  if (Status s = peer->verbs->connect(remote); !s.ok()) return s;
  if (!client) return send_address();
  return {};
}

void EngineImpl::peer_closed(PeerImpl* peer) {
  {
    std::lock_guard lock(mu_);
    std::erase_if(peers_, [peer](const auto& p) { return p.get() == peer; });
    std::erase_if(joining_, [peer](const auto& j) { return j.second.peer.get() == peer; });
  }
  accept_cv_.notify_all();
}

Peer EngineImpl::connect(std::string_view host_port) {
  if (stopping_.load()) throw Error(ErrorCode::kCancelled, "connect: engine shut down");
  core::HostPort where;
  core::throw_if_error(core::parse_host_port(host_port, where));
  core::Deadline deadline = Clock::now() + config.connect_timeout;
  core::Fd fd;
  core::throw_if_error(core::connect_tcp(where, deadline, fd));
  core::tune_socket(fd.get(), config.peer_timeout);

  engine::Hello hello;
  hello.engine_id = id;
  hello.incarnation = incarnation;
  hello.transports = usable_transports();
  core::random_bytes(hello.nonce);
  hello.wants_auth = !config.secret.empty();
  core::throw_if_error(write_frame(fd.get(), engine::encode(hello), deadline));

  std::vector<uint8_t> body;
  core::throw_if_error(expect(fd.get(), deadline, FrameType::kHelloAck, body));
  engine::HelloAck ack;
  core::throw_if_error(engine::decode(body, ack));
  if (!config.secret.empty()) {
    if (!ack.mac || !core::mac_equal(*ack.mac, engine::auth_mac(config.secret, true, hello.nonce,
                                                                ack.nonce, id, ack.engine_id))) {
      throw Error(
          ErrorCode::kAuthFailed,
          "connect " + where.to_string() + ": peer did not prove knowledge of the shared secret");
    }
    engine::Auth auth{
        engine::auth_mac(config.secret, false, hello.nonce, ack.nonce, id, ack.engine_id)};
    core::throw_if_error(write_frame(fd.get(), engine::encode(auth), deadline));
    core::throw_if_error(expect(fd.get(), deadline, FrameType::kAuthOk, body));
  } else if (ack.mac) {
    throw Error(ErrorCode::kAuthFailed,
                "connect " + where.to_string() + ": peer requires a shared secret");
  }

  engine::Hello remote;
  remote.engine_id = ack.engine_id;
  remote.incarnation = ack.incarnation;
  int control = fd.get();
  auto peer = std::make_shared<PeerImpl>(shared_from_this(), remote, where.to_string(),
                                         ack.transport, std::move(fd));
  peer->channel = make_channel(peer, ack.streams);
  if (ack.transport == TransportKind::kVerbs) {
    if (Status s = connect_verbs(peer, control, true, deadline); !s.ok()) {
      peer->close(s);
      throw Error(s.code(), "connect " + where.to_string() + ": " + s.message());
    }
  }
  for (int i = 0; i < ack.streams; ++i) {
    core::Fd sfd;
    Status s = core::connect_tcp(where, deadline, sfd);
    if (s.ok()) {
      core::tune_socket(sfd.get(), config.peer_timeout);
      engine::Join join;
      join.token = ack.token;
      join.stream = static_cast<uint8_t>(i);
      s = write_frame(sfd.get(), engine::encode(join), deadline);
    }
    if (s.ok()) s = expect(sfd.get(), deadline, FrameType::kJoinOk, body);
    if (s.ok()) s = peer->channel->attach(i, std::move(sfd));
    if (!s.ok()) {
      peer->close(s);
      throw Error(s.code(), "connect " + where.to_string() + ": stream " + std::to_string(i) +
                                ": " + s.message());
    }
  }
  peer->start_control();
  bool registered = false;
  {
    std::lock_guard lock(mu_);
    if (!stopping_.load()) {
      peers_.push_back(peer);
      registered = true;
    }
  }
  if (!registered) {
    peer->close({ErrorCode::kCancelled, "engine shut down"});
    throw Error(ErrorCode::kCancelled, "connect: engine shut down");
  }
  return Peer(peer);
}

std::optional<Peer> EngineImpl::accept(Duration timeout) {
  std::unique_lock lock(mu_);
  if (!accept_cv_.wait_for(lock, timeout, [&] { return !accepted_.empty() || stopping_.load(); }) ||
      accepted_.empty()) {
    return std::nullopt;
  }
  auto p = std::move(accepted_.front());
  accepted_.pop_front();
  return Peer(std::move(p));
}

void EngineImpl::acceptor_loop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {stop_event_.get(), POLLIN, 0}};
    int rc = ::poll(fds, 2, kHousekeepingMs);
    if (stopping_.load()) break;
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) serve_new_connection(core::Fd(fd));
    }
    housekeeping();
  }
}

void EngineImpl::serve_new_connection(core::Fd fd) {
  core::Deadline deadline = Clock::now() + config.connect_timeout;
  core::tune_socket(fd.get(), config.peer_timeout);
  FrameHeader h;
  std::vector<uint8_t> body;
  Status s = read_frame(fd.get(), deadline, h, body);
  // Nothing a connecting peer causes may end the acceptor thread: failures refuse that peer.
  try {
    if (s.ok()) {
      if (h.type == FrameType::kHello) {
        s = serve_hello(fd, body, deadline);
      } else if (h.type == FrameType::kJoin) {
        s = serve_join(fd, body, deadline);
      } else {
        s = {ErrorCode::kProtocol, "expected hello or join"};
      }
    }
  } catch (const Error& e) {
    s = e.status();
  } catch (const std::exception& e) {
    s = {ErrorCode::kSystem, std::string("accepting a peer: ") + e.what()};
  }
  if (!s.ok() && fd.valid()) refuse(fd.get(), s, deadline);
}

Status EngineImpl::serve_hello(core::Fd& fd, std::span<const uint8_t> body,
                               core::Deadline deadline) {
  engine::Hello hello;
  if (Status s = engine::decode(body, hello); !s.ok()) return s;
  auto offered = [&](TransportKind t) {
    return std::find(hello.transports.begin(), hello.transports.end(), t) != hello.transports.end();
  };
  // TCP carries the control connection and messages, so both sides must have it.
  if (!offered(TransportKind::kTcp)) return {ErrorCode::kUnsupported, "peer does not offer tcp"};
  TransportKind chosen = TransportKind::kTcp;
  for (TransportKind t : usable_transports()) {
    if (offered(t)) {
      chosen = t;
      break;
    }
  }

  engine::HelloAck ack;
  ack.engine_id = id;
  ack.incarnation = incarnation;
  ack.transport = chosen;
  ack.streams = static_cast<uint8_t>(config.tcp_streams);
  core::random_bytes(ack.nonce);
  core::random_bytes(ack.token);
  if (!config.secret.empty()) {
    ack.mac = engine::auth_mac(config.secret, true, hello.nonce, ack.nonce, hello.engine_id, id);
  }
  if (Status s = write_frame(fd.get(), engine::encode(ack), deadline); !s.ok()) return s;
  if (!config.secret.empty()) {
    std::vector<uint8_t> auth_body;
    FrameHeader h;
    if (Status s = read_frame(fd.get(), deadline, h, auth_body); !s.ok()) return s;
    engine::Auth auth;
    if (h.type != FrameType::kAuth) return {ErrorCode::kAuthFailed, "authentication required"};
    if (Status s = engine::decode(auth_body, auth); !s.ok()) return s;
    if (!core::mac_equal(auth.mac, engine::auth_mac(config.secret, false, hello.nonce, ack.nonce,
                                                    hello.engine_id, id))) {
      return {ErrorCode::kAuthFailed, "wrong shared secret"};
    }
    if (Status s = write_frame(fd.get(), engine::encode_empty(FrameType::kAuthOk), deadline);
        !s.ok()) {
      return s;
    }
  }
  std::string address = core::peer_name(fd.get());
  int control = fd.get();
  auto peer = std::make_shared<PeerImpl>(shared_from_this(), hello, address, chosen, std::move(fd));
  peer->channel = make_channel(peer, config.tcp_streams);
  if (chosen == TransportKind::kVerbs) {
    if (Status s = connect_verbs(peer, control, false, deadline); !s.ok()) {
      peer->close(s);
      return s;
    }
  }
  std::lock_guard lock(mu_);
  joining_.push_back({ack.token, Joining{peer, 0, config.tcp_streams, deadline}});
  return {};
}

Status EngineImpl::serve_join(core::Fd& fd, std::span<const uint8_t> body,
                              core::Deadline deadline) {
  engine::Join join;
  if (Status s = engine::decode(body, join); !s.ok()) return s;
  std::shared_ptr<PeerImpl> peer;
  {
    std::lock_guard lock(mu_);
    auto it = std::find_if(joining_.begin(), joining_.end(),
                           [&](const auto& j) { return j.first == join.token; });
    if (it == joining_.end()) return {ErrorCode::kProtocol, "join: unknown session"};
    peer = it->second.peer;
  }
  if (Status s = write_frame(fd.get(), engine::encode_empty(FrameType::kJoinOk), deadline);
      !s.ok()) {
    return s;
  }
  if (Status s = peer->channel->attach(join.stream, std::move(fd)); !s.ok()) {
    peer->close(s);
    return {};
  }
  bool ready = false;
  {
    std::lock_guard lock(mu_);
    auto it = std::find_if(joining_.begin(), joining_.end(),
                           [&](const auto& j) { return j.first == join.token; });
    if (it != joining_.end() && ++it->second.joined == it->second.streams) {
      joining_.erase(it);
      peers_.push_back(peer);
      accepted_.push_back(peer);
      ready = true;
    }
  }
  if (ready) {
    peer->start_control();
    accept_cv_.notify_all();
  }
  return {};
}

void EngineImpl::housekeeping() {
  auto now = Clock::now();
  std::vector<std::shared_ptr<PeerImpl>> expired, live;
  {
    std::lock_guard lock(mu_);
    for (auto it = joining_.begin(); it != joining_.end();) {
      if (now > it->second.deadline) {
        expired.push_back(it->second.peer);
        it = joining_.erase(it);
      } else {
        ++it;
      }
    }
    live = peers_;
  }
  for (auto& p : expired)
    p->close({ErrorCode::kTimeout, "peer did not open all its streams in time"});
  for (auto& p : live) p->housekeeping(now);
}

void EngineImpl::shutdown() {
  if (stopping_.exchange(true)) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_event_.get(), &one, sizeof one);
  if (acceptor_.joinable()) acceptor_.join();

  std::vector<std::shared_ptr<PeerImpl>> all;
  {
    std::lock_guard lock(mu_);
    all = peers_;
    for (auto& j : joining_) all.push_back(j.second.peer);
  }
  Status cancelled{ErrorCode::kCancelled, "engine shut down"};
  for (auto& p : all) p->close(cancelled);
  // Let the progress threads stop the streams, which fails what was in flight.
  auto deadline = Clock::now() + std::chrono::seconds(2);
  for (auto& p : all) {
    while ((!p->channel->fully_closed() || (p->verbs && !p->verbs->fully_closed())) &&
           Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  reactor_->stop();
  for (auto& p : all) {
    if (p->verbs) p->verbs->stop_after_reactor();
    p->channel->stop_after_reactor();
  }
  {
    std::lock_guard lock(mu_);
    peers_.clear();
    joining_.clear();
    accepted_.clear();
  }
  accept_cv_.notify_all();
  imm_cv_.notify_all();
}

}  // namespace ferry::detail
