// The CUDA IPC transport: see cuda_ipc.hpp for the protocol; docs/gpu.md for the whole.
#include "transport/cuda_ipc/cuda_ipc.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "core/log.hpp"
#include "core/sys.hpp"

namespace ferry::transport::cuda_ipc {

namespace cu = core::cuda;

namespace {

// How long the progress thread keeps polling the copies' events after finding one still
// running: a 1 MiB copy takes tens of microseconds on a GPU; 100 us keeps the thread from
// sleeping between the events of back-to-back copies without spinning long once they end.
constexpr auto kPollPeriod = std::chrono::microseconds(100);
// Frames queued for a peer that does not read them: far above what the protocol keeps in flight
// (a frame per mapping asked for or given back, one per write_with_imm), so only a stuck or
// hostile peer reaches it; its channel then closes.
constexpr std::size_t kMaxQueuedBytes = std::size_t{1} << 20;

Access access_for(const OpState& op) {
  return op.kind == OpKind::kRead ? Access::kRemoteRead : Access::kRemoteWrite;
}

}  // namespace

CudaIpcChannel::CudaIpcChannel(ChannelArgs args, const cu::Driver& driver, Settings settings)
    : host_(args.host),
      link_(std::move(args.link)),
      driver_(driver),
      settings_(settings),
      loop_(host_.reactor().pick_loop()),
      latch_(std::move(args.on_closed)) {
  in_.reserve(2 * kFrameBytes);
}

CudaIpcChannel::~CudaIpcChannel() {
  for (const auto& pool : free_events_) {
    for (cu::CUevent e : pool) driver_.event_destroy(e);
  }
  for (cu::CUstream s : streams_) {
    if (s != nullptr) driver_.stream_destroy(s);
  }
}

std::vector<uint8_t> CudaIpcChannel::local_address() const {
  return encode_address(static_cast<uint32_t>(::getpid()));
}

Status CudaIpcChannel::connect(std::span<const uint8_t> remote) {
  uint32_t pid = 0;
  if (Status s = decode_address(remote, pid); !s.ok()) return s;
  same_process_ = pid == static_cast<uint32_t>(::getpid());
  return {};
}

Status CudaIpcChannel::attach_side(int index, core::Fd fd) {
  if (index != 0) {
    return {ErrorCode::kProtocol,
            "cuda_ipc: side connection " + std::to_string(index) + " (it takes one)"};
  }
  if (Status s = core::set_nonblocking(fd.get(), true); !s.ok()) return s;
  std::lock_guard lock(latch_.lock());
  if (latch_.closing()) return {ErrorCode::kPeerLost, "cuda_ipc: connection already closed"};
  uint32_t events = EPOLLIN | EPOLLRDHUP;
  {
    // Frames queued before the connection came (none today: a kOpen waits for a post, and a post
    // for routing, which waits for the connection) go first.
    std::lock_guard send_lock(send_mu_);
    fd_ = std::move(fd);
    if (Status s = flush_locked(); !s.ok()) return s;
    if (!out_.empty()) events |= EPOLLOUT;
  }
  {
    std::lock_guard state_lock(mu_);
    keep_alive_ = shared_from_this();
  }
  if (Status s = host_.reactor().add(loop_, fd_.get(), events, this); !s.ok()) {
    std::lock_guard state_lock(mu_);
    keep_alive_.reset();
    return s;
  }
  host_.reactor().post(loop_, [self = shared_from_this()] {
    std::lock_guard lock(self->mu_);
    if (!self->stopped_) self->host_.reactor().add_poller(self->loop_, self.get());
  });
  return {};
}

// ---------------------------------------------------------------- initiator

PostResult CudaIpcChannel::post(OpState* op) {
  auto& area = op->transport_area<CudaIpcOpArea>();
  const Access need = access_for(*op);
  Status refused;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return PostResult::kAccepted;  // the close path fails the op
    // The first entry's local region, leased first: its device's context and streams copy.
    const RegionSlot* local = op->leases.empty() ? nullptr : op->leases.front();
    if (local == nullptr || local->memory.kind != MemoryKind::kCuda) {
      refused = {ErrorCode::kUnsupported, "cuda_ipc: the local memory is not CUDA memory"};
    } else {
      area.device = local->memory.device;
    }
    // First every key, so that a bad one refuses the op before it waits on any mapping.
    for (std::size_t i = 0; i < op->entries.size() && refused.ok(); ++i) {
      const OpEntry& e = op->entries[i];
      auto it = mappings_.find(e.remote_region);
      if (it != mappings_.end()) {
        if (it->second.give_back) {
          refused = {ErrorCode::kRevoked,
                     "cuda_ipc: region " + std::to_string(e.remote_region) + " was deregistered"};
        }
        continue;
      }
      Key key;
      refused = decode(op->remote_key(i, 0), key);
      if (refused.ok() && !make_room()) {
        refused = {ErrorCode::kResourceExhausted,
                   "cuda_ipc: all " + std::to_string(settings_.mappings) +
                       " mappings of the peer's regions are in use (cuda_ipc.mappings)"};
      }
      if (refused.ok()) mappings_[e.remote_region].key = key;
    }
    if (refused.ok()) {
      // The op holds every mapping it names from now until it ends: none is evicted or given
      // back under it.
      uint32_t waiting = 0;
      for (const OpEntry& e : op->entries) {
        Mapping& m = mappings_[e.remote_region];
        ++m.uses;
        if (m.state == Mapping::kOpen && allows(m.granted, need)) continue;
        if (!m.waiting.empty() && m.waiting.back() == op) continue;  // an earlier entry's
        if (m.state == Mapping::kOpen || m.asked == Access::kLocal) {
          m.state = Mapping::kAsking;
          m.asked = m.granted | need;
          send({FrameType::kOpen, ErrorCode::kOk, m.asked, e.remote_region, m.key.table_key});
        }
        m.waiting.push_back(op);
        ++waiting;
      }
      area.waiting = waiting;
      if (waiting > 0) return PostResult::kQueued;
      start_copies(op);
      return PostResult::kAccepted;
    }
    forget_unasked(*op);  // the keys this op brought, never asked for
  }
  // A close may be failing the peer's ops meanwhile: the pool decides who completes it.
  link_->pool->fail_posted(op, [&](const OpState&) { return refused; });
  return PostResult::kAccepted;
}

void CudaIpcChannel::forget_unasked(const OpState& op) {
  for (const OpEntry& e : op.entries) {
    auto it = mappings_.find(e.remote_region);
    if (it != mappings_.end() && it->second.asked == Access::kLocal) mappings_.erase(it);
  }
}

cu::CUstream CudaIpcChannel::stream_for(int device, int lane) {
  std::size_t at = static_cast<std::size_t>(device) * settings_.streams + lane;
  if (streams_.size() <= at) streams_.resize(at + 1, nullptr);
  if (streams_[at] == nullptr) {
    driver_.check(driver_.stream_create(&streams_[at], cu::kStreamNonBlocking), "cuStreamCreate");
  }
  return streams_[at];
}

cu::CUevent CudaIpcChannel::take_event(int device) {
  auto at = static_cast<std::size_t>(device);
  if (free_events_.size() <= at) free_events_.resize(at + 1);
  std::vector<cu::CUevent>& pool = free_events_[at];
  cu::CUevent event = nullptr;
  if (pool.empty()) {
    driver_.check(driver_.event_create(&event, cu::kEventDisableTiming), "cuEventCreate");
  } else {
    event = pool.back();
    pool.pop_back();
  }
  return event;
}

void CudaIpcChannel::give_event(int device, cu::CUevent event) {
  if (event != nullptr) free_events_[static_cast<std::size_t>(device)].push_back(event);
}

cu::CUresult CudaIpcChannel::copy_entry(const OpState& op, const OpEntry& e, const Mapping& m,
                                        cu::CUstream stream) {
  if (e.length == 0) return cu::kSuccess;
  // A peer in this process: the region's own address. Else where this process mapped its
  // allocation, the region's offset in it and the entry's in the region.
  cu::CUdeviceptr remote = same_process_ ? e.remote_addr : m.base + m.key.offset + e.remote_offset;
  if (!same_process_ && (m.key.offset + e.remote_offset > m.key.allocation_bytes ||
                         e.length > m.key.allocation_bytes - m.key.offset - e.remote_offset)) {
    return cu::kErrorInvalidValue;
  }
  auto local = reinterpret_cast<cu::CUdeviceptr>(e.local);
  return op.kind == OpKind::kRead ? driver_.memcpy_async(local, remote, e.length, stream)
                                  : driver_.memcpy_async(remote, local, e.length, stream);
}

void CudaIpcChannel::start_copies(OpState* op) {
  auto& area = op->transport_area<CudaIpcOpArea>();
  Status failed;
  cu::CUevent event = nullptr;
  cu::CUstream stream = nullptr;
  bool queued = false;
  try {
    cu::ScopedContext scope(driver_, cu::primary_context(driver_, area.device));
    stream = stream_for(area.device, op->first_lane % settings_.streams);
    ++use_clock_;
    for (const OpEntry& e : op->entries) {
      auto it = mappings_.find(e.remote_region);  // held by the op since its post
      it->second.last_used = use_clock_;
      if (cu::CUresult r = copy_entry(*op, e, it->second, stream); r != cu::kSuccess) {
        failed = driver_.status(r, "cuMemcpyAsync region " + std::to_string(e.remote_region));
        break;
      }
      queued = queued || e.length > 0;
    }
    event = take_event(area.device);
    if (cu::CUresult r = driver_.event_record(event, stream); r != cu::kSuccess) {
      give_event(area.device, event);
      event = nullptr;
      driver_.check(r, "cuEventRecord");
    }
  } catch (const Error& e) {
    failed = e.status();
  }
  if (!failed.ok()) {
    op->record_error(failed);
    // Copies already queued touch the op's memory until they end: without an event to poll,
    // wait for them here (a driver failure, not the common path).
    if (queued && event == nullptr) driver_.stream_synchronize(stream);
  }
  in_flight_.push_back({op, event, !failed.ok()});
  wake_poller();
}

void CudaIpcChannel::wake_poller() {
  host_.reactor().keep_polling(loop_, kPollPeriod);
  if (loop_polling_.load() || poll_task_.exchange(true)) return;
  host_.reactor().post(loop_, [self = shared_from_this()] {
    self->poll_task_.store(false);
    self->poll();
  });
}

void CudaIpcChannel::end_polling() {
  loop_polling_.store(false);
  std::lock_guard lock(mu_);
  if (!in_flight_.empty()) wake_poller();
}

void CudaIpcChannel::release_mappings(const OpState& op) {
  for (const OpEntry& e : op.entries) {
    auto it = mappings_.find(e.remote_region);
    if (it == mappings_.end()) continue;
    if (--it->second.uses == 0 && it->second.give_back) unmap(e.remote_region);
  }
}

bool CudaIpcChannel::poll() {
  done_.clear();
  bool more = false;
  bool ended = false;
  {
    std::lock_guard lock(mu_);
    if (in_flight_.empty()) return false;
    for (std::size_t i = 0; i < in_flight_.size();) {
      InFlight f = in_flight_[i];
      auto& area = f.op->transport_area<CudaIpcOpArea>();
      cu::CUresult r = cu::kSuccess;
      if (f.event != nullptr) {
        try {
          cu::ScopedContext scope(driver_, cu::primary_context(driver_, area.device));
          r = driver_.event_query(f.event);
        } catch (const Error&) {
          r = cu::kErrorInvalidContext;  // retained when the copies went out: not expected
        }
      }
      if (r == cu::kErrorNotReady) {
        ++i;
        continue;
      }
      Done d{f.op, {}, f.failed};
      if (r != cu::kSuccess) d.outcome = driver_.status(r, "cuEventQuery");
      give_event(area.device, f.event);
      // Every byte landed in the target's memory (the copy's event): the notification follows,
      // before the op lets go of its mappings (a CLOSED after it would end the target's grant).
      if (f.op->kind == OpKind::kWrite && f.op->with_imm && !d.failed && d.outcome.ok() &&
          !send({FrameType::kImm, ErrorCode::kOk, Access::kLocal, 0, f.op->imm})) {
        d.outcome = {ErrorCode::kPeerLost, "cuda_ipc: the channel closed before the immediate"};
      }
      release_mappings(*f.op);
      done_.push_back(std::move(d));
      in_flight_[i] = in_flight_.back();
      in_flight_.pop_back();
    }
    more = !in_flight_.empty();
    ended = stopping_ && !more;
  }
  for (const Done& d : done_) {
    if (!d.outcome.ok()) d.op->record_error(d.outcome);
    if (d.op->finish_slices(d.op->pending.load())) d.op->finish_posted();
  }
  if (more) wake_poller();
  if (ended) finish_closing();
  return !done_.empty();
}

void CudaIpcChannel::fail_waiting(std::vector<OpState*>& ops, const Status& why,
                                  std::vector<OpState*>& finished) {
  for (OpState* op : ops) {
    auto& area = op->transport_area<CudaIpcOpArea>();
    op->record_error(why);
    area.failed = 1;
    if (--area.waiting > 0) continue;  // still in another mapping's list: it ends from there
    release_mappings(*op);
    finished.push_back(op);
  }
  ops.clear();
}

void CudaIpcChannel::fail_mapping(uint32_t region, const Status& why,
                                  std::vector<OpState*>& finished) {
  auto it = mappings_.find(region);
  if (it == mappings_.end()) return;
  waiting_.swap(it->second.waiting);
  mappings_.erase(it);  // first: releasing the ops' other mappings must not find it
  fail_waiting(waiting_, why, finished);
}

void CudaIpcChannel::unmap(uint32_t region) {
  auto it = mappings_.find(region);
  if (it == mappings_.end()) return;
  if (it->second.base != 0) {
    cu::CUresult r = cu::kErrorInvalidContext;
    try {
      cu::ScopedContext scope(driver_, cu::primary_context(driver_, it->second.device));
      r = driver_.ipc_close_mem_handle(it->second.base);
    } catch (const Error&) {
    }
    if (r != cu::kSuccess) {
      core::log(LogLevel::kWarn, "cuda_ipc", [&] {
        return driver_.status(r, "cuIpcCloseMemHandle region " + std::to_string(region))
            .to_string();
      });
    }
  }
  mappings_.erase(it);
  send({FrameType::kClosed, ErrorCode::kOk, Access::kLocal, region, 0});
}

bool CudaIpcChannel::make_room() {
  if (mappings_.size() < static_cast<std::size_t>(settings_.mappings)) return true;
  auto idle = mappings_.end();
  for (auto it = mappings_.begin(); it != mappings_.end(); ++it) {
    const Mapping& m = it->second;
    if (m.state != Mapping::kOpen || m.uses > 0) continue;
    if (idle == mappings_.end() || m.last_used < idle->second.last_used) idle = it;
  }
  if (idle == mappings_.end()) return false;
  unmap(idle->first);
  return true;
}

void CudaIpcChannel::on_opened(const Frame& frame) {
  std::vector<OpState*> finished;
  bool asked = false;
  {
    std::lock_guard lock(mu_);
    auto it = mappings_.find(frame.region);
    asked = it != mappings_.end() && it->second.state == Mapping::kAsking;
    if (asked) answered(it->second, frame, finished);
  }
  if (!asked) {
    close({ErrorCode::kProtocol, "cuda_ipc: an answer for region " + std::to_string(frame.region) +
                                     ", which was not asked for"});
  }
  for (OpState* op : finished) {
    if (op->finish_slices(op->pending.load())) op->finish_posted();
  }
}

void CudaIpcChannel::answered(Mapping& m, const Frame& frame, std::vector<OpState*>& finished) {
  std::string region = "cuda_ipc: map region " + std::to_string(frame.region);
  if (m.give_back) {
    // Revoked while this answer was on its way: what waits for it fails; the mapping goes once
    // the ops holding it ended.
    m.state = Mapping::kOpen;
    m.asked = m.granted;
    waiting_.swap(m.waiting);
    fail_waiting(waiting_, {ErrorCode::kRevoked, region + ": it was deregistered"}, finished);
    return;
  }
  Status refused;
  if (frame.code != ErrorCode::kOk) {
    refused = {frame.code, region + ": the target refused: " + std::string(to_string(frame.code))};
    // Nothing granted before: the mapping goes with its waiting ops. Else only more access was
    // refused, and the mapping stays for what was granted.
    if (m.granted == Access::kLocal) {
      fail_mapping(frame.region, refused, finished);
      return;
    }
  } else if (!same_process_ && m.base == 0) {
    Status opened;
    m.device = m.waiting.empty() ? 0 : m.waiting.front()->transport_area<CudaIpcOpArea>().device;
    try {
      cu::ScopedContext scope(driver_, cu::primary_context(driver_, m.device));
      opened = driver_.status(
          driver_.ipc_open_mem_handle(&m.base, m.key.handle, cu::kIpcLazyEnablePeerAccess),
          "cuIpcOpenMemHandle");
    } catch (const Error& e) {
      opened = e.status();
    }
    if (!opened.ok()) {
      fail_mapping(frame.region, {opened.code(), region + ": " + opened.message()}, finished);
      send({FrameType::kClosed, ErrorCode::kOk, Access::kLocal, frame.region, 0});
      return;
    }
  }
  if (refused.ok()) m.granted = m.asked;
  m.asked = m.granted;
  m.state = Mapping::kOpen;
  std::vector<OpState*> ready;
  waiting_.swap(m.waiting);  // the mapping keeps the capacity of the list it gets
  for (OpState* op : waiting_) {
    auto& area = op->transport_area<CudaIpcOpArea>();
    if (!allows(m.granted, access_for(*op))) {
      if (!refused.ok()) {
        op->record_error(refused);
        area.failed = 1;
      } else {
        // Asked for by an op of the other kind while the first answer was on its way.
        if (m.state == Mapping::kOpen) {
          m.state = Mapping::kAsking;
          m.asked = m.granted | access_for(*op);
          send({FrameType::kOpen, ErrorCode::kOk, m.asked, frame.region, m.key.table_key});
        }
        m.waiting.push_back(op);
        continue;
      }
    }
    if (--area.waiting > 0) continue;
    if (area.failed != 0) {
      release_mappings(*op);  // may close this very mapping: `m` is not used after
      finished.push_back(op);
    } else {
      start_copies(op);
    }
  }
  waiting_.clear();
}

// ---------------------------------------------------------------- target

void CudaIpcChannel::on_open(const Frame& frame) {
  ErrorCode code = ErrorCode::kOk;
  {
    std::lock_guard lock(mu_);
    auto it = lent_.find(frame.region);
    if (it != lent_.end()) {
      // Mapped already: the peer asks for more access.
      const RegionSlot* slot = it->second.use.slot();
      if (slot->state.load() != RegionSlot::kActive) {
        code = ErrorCode::kRevoked;
      } else if (!allows(slot->access, frame.access)) {
        code = ErrorCode::kPermissionDenied;
      } else {
        it->second.access = it->second.access | frame.access;
      }
    } else if (lent_.size() >= static_cast<std::size_t>(settings_.mappings)) {
      code = ErrorCode::kResourceExhausted;
    } else {
      Lent lent;
      uint8_t* address = nullptr;
      code = host_.regions()
                 .acquire(frame.region, frame.value, 0, 0, frame.access, &address, lent.use,
                          memory_bit(MemoryKind::kCuda))
                 .code();
      lent.access = frame.access;
      if (code == ErrorCode::kOk) lent_.emplace(frame.region, std::move(lent));
    }
  }
  send({FrameType::kOpened, code, Access::kLocal, frame.region, 0});
}

void CudaIpcChannel::revoking(uint32_t region_id) {
  std::lock_guard lock(mu_);
  if (lent_.count(region_id) != 0)
    send({FrameType::kRevoke, ErrorCode::kOk, Access::kLocal, region_id, 0});
}

void CudaIpcChannel::cut_off(const uint8_t* base, uint64_t length, const Status& why) {
  bool touched = false;
  {
    std::lock_guard lock(mu_);
    for (const auto& [region, lent] : lent_) {
      const uint8_t* start = lent.use.slot()->base;
      touched = touched || (start >= base && start < base + length);
    }
  }
  if (touched) close(why);
}

// ---------------------------------------------------------------- the side connection

void CudaIpcChannel::handle(const Frame& frame) {
  {
    // Closing: nothing more is granted, mapped or delivered.
    std::lock_guard lock(mu_);
    if (stopping_) return;
  }
  switch (frame.type) {
    case FrameType::kOpen:
      on_open(frame);
      return;
    case FrameType::kOpened:
      on_opened(frame);
      return;
    case FrameType::kClosed: {
      std::lock_guard lock(mu_);
      lent_.erase(frame.region);  // its use ends: a deregistration waiting on it goes on
      return;
    }
    case FrameType::kRevoke: {
      std::lock_guard lock(mu_);
      auto it = mappings_.find(frame.region);
      if (it == mappings_.end()) {
        send({FrameType::kClosed, ErrorCode::kOk, Access::kLocal, frame.region, 0});
      } else {
        // Asked for more access meanwhile: the answer finds it revoked (answered()).
        it->second.give_back = true;
        if (it->second.uses == 0) unmap(frame.region);
      }
      return;
    }
    case FrameType::kImm: {
      // Only from a peer that maps a region of ours it may write: the notification of a write.
      bool writer = false;
      {
        std::lock_guard lock(mu_);
        for (const auto& [region, lent] : lent_)
          writer = writer || allows(lent.access, Access::kRemoteWrite);
      }
      if (!writer) {
        close({ErrorCode::kProtocol, "cuda_ipc: an immediate from a peer that writes nothing"});
        return;
      }
      link_->imms_received.fetch_add(1, std::memory_order_relaxed);
      host_.deliver_imm(*link_, static_cast<uint32_t>(frame.value));
      return;
    }
  }
}

void CudaIpcChannel::on_event(uint32_t events) {
  if ((events & EPOLLOUT) != 0) {
    Status flushed;
    {
      std::lock_guard lock(send_mu_);
      flushed = flush_locked();
      if (flushed.ok() && out_.empty())
        host_.reactor().modify(loop_, fd_.get(), EPOLLIN | EPOLLRDHUP, this);
    }
    if (!flushed.ok()) {
      close(flushed);  // it takes send_mu_
      return;
    }
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) return;
  uint8_t buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
      close({ErrorCode::kPeerLost, "cuda_ipc: the peer closed the connection"});
      return;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      Status s = core::sys_status("recv (cuda_ipc)");
      close({ErrorCode::kPeerLost, s.message()});
      return;
    }
    std::size_t at = 0;
    auto take = [&](std::span<const uint8_t, kFrameBytes> bytes) {
      Frame frame;
      if (Status s = decode(bytes, frame); !s.ok()) {
        close(s);
        return false;
      }
      handle(frame);
      return !latch_.closing();
    };
    if (!in_.empty()) {  // the rest of a frame that came in parts
      std::size_t more = std::min(kFrameBytes - in_.size(), static_cast<std::size_t>(n));
      in_.insert(in_.end(), buf, buf + more);
      at = more;
      if (in_.size() < kFrameBytes) continue;
      std::array<uint8_t, kFrameBytes> whole;
      std::copy(in_.begin(), in_.end(), whole.begin());
      in_.clear();
      if (!take(whole)) return;
    }
    for (; at + kFrameBytes <= static_cast<std::size_t>(n); at += kFrameBytes) {
      if (!take(std::span<const uint8_t, kFrameBytes>(buf + at, kFrameBytes))) return;
    }
    in_.insert(in_.end(), buf + at, buf + n);
  }
}

bool CudaIpcChannel::send(const Frame& frame) {
  std::array<uint8_t, kFrameBytes> bytes;
  encode(frame, bytes);
  Status failed;
  {
    std::lock_guard lock(send_mu_);
    if (send_closed_) return false;
    bool was_empty = out_.empty();
    out_.insert(out_.end(), bytes.begin(), bytes.end());
    if (out_.size() > kMaxQueuedBytes) {
      failed = {ErrorCode::kResourceExhausted, "cuda_ipc: the peer reads none of " +
                                                   std::to_string(out_.size()) +
                                                   " bytes of frames queued for it"};
    } else if (fd_.valid() && was_empty) {
      failed = flush_locked();
      if (failed.ok() && !out_.empty()) {
        host_.reactor().modify(loop_, fd_.get(), EPOLLIN | EPOLLRDHUP | EPOLLOUT, this);
      }
    }
  }
  if (!failed.ok()) {
    // The caller may hold mu_, which closing takes: the loop closes the channel.
    host_.reactor().post(loop_, [self = shared_from_this(), failed] { self->close(failed); });
    return false;
  }
  return true;
}

Status CudaIpcChannel::flush_locked() {
  std::size_t sent = 0;
  while (sent < out_.size()) {
    ssize_t n =
        ::send(fd_.get(), out_.data() + sent, out_.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Status s = core::sys_status("send (cuda_ipc)");
      return {ErrorCode::kPeerLost, s.message()};
    }
    sent += static_cast<std::size_t>(n);
  }
  out_.erase(out_.begin(), out_.begin() + static_cast<std::ptrdiff_t>(sent));
  return {};
}

// ---------------------------------------------------------------- closing

void CudaIpcChannel::close(const Status& reason) {
  if (!latch_.begin(reason)) return;
  {
    std::lock_guard lock(send_mu_);
    send_closed_ = true;
  }
  // Ops waiting for a mapping never touched memory: the engine fails them once closed. Copies
  // on their way write into user memory until their events say they ended: polled to the end.
  bool ended = false;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& [region, m] : mappings_) m.waiting.clear();
    ended = in_flight_.empty();
  }
  if (ended) {
    host_.reactor().post(loop_, [self = shared_from_this()] { self->finish_closing(); });
  }
}

void CudaIpcChannel::finish_closing() {
  std::shared_ptr<CudaIpcChannel> in_reactor;
  {
    std::lock_guard lock(mu_);
    if (stopped_ || !in_flight_.empty()) return;
    stopped_ = true;
    for (auto& [region, m] : mappings_) {
      if (m.base == 0) continue;
      try {
        cu::ScopedContext scope(driver_, cu::primary_context(driver_, m.device));
        driver_.ipc_close_mem_handle(m.base);
      } catch (const Error&) {
        // The context is the driver's: a failure here leaves the mapping to the process's end.
      }
    }
    mappings_.clear();
    lent_.clear();  // the peer's mappings end with it or are cut off: the regions may go
    in_reactor = std::move(keep_alive_);
  }
  if (in_reactor != nullptr) {
    host_.reactor().remove_poller(loop_, this);
    host_.reactor().remove(loop_, fd_.get());
    host_.reactor().retire(loop_, std::move(in_reactor));
  }
  latch_.report();
}

void CudaIpcChannel::stop_after_reactor() {
  latch_.begin({ErrorCode::kCancelled, "engine shut down"});
  {
    std::lock_guard lock(send_mu_);
    send_closed_ = true;
  }
  // No progress thread polls any more: wait for the copies here.
  std::vector<InFlight> copies;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    copies.swap(in_flight_);
    for (const InFlight& f : copies) {
      if (f.event == nullptr) continue;
      auto& area = f.op->transport_area<CudaIpcOpArea>();
      try {
        cu::ScopedContext scope(driver_, cu::primary_context(driver_, area.device));
        driver_.event_synchronize(f.event);
      } catch (const Error&) {
      }
      give_event(area.device, f.event);
    }
  }
  for (const InFlight& f : copies) {
    f.op->record_error({ErrorCode::kCancelled, "engine shut down"});
    if (f.op->finish_slices(f.op->pending.load())) f.op->finish_posted();
  }
  finish_closing();
}

// ---------------------------------------------------------------- the transport

Status CudaIpcTransport::register_region(uint32_t, uint8_t* base, uint64_t length, Access,
                                         uint64_t table_key, KeySink& keys) {
  cu::PointerInfo where = cu::pointer_info(base);
  if (!where.device) return {ErrorCode::kInvalidArgument, "cuda_ipc: not CUDA memory"};
  Key key;
  key.offset = reinterpret_cast<uint64_t>(base) - where.range_start;
  key.allocation_bytes = where.range_size;
  key.table_key = table_key;
  if (key.offset + length > key.allocation_bytes) {
    return {ErrorCode::kInvalidArgument, "cuda_ipc: the region runs past its allocation"};
  }
  try {
    cu::ScopedContext scope(driver_, cu::primary_context(driver_, where.ordinal));
    cu::CUresult r = driver_.ipc_get_mem_handle(&key.handle, where.range_start);
    if (r != cu::kSuccess) {
      Status s = driver_.status(r, "cuIpcGetMemHandle");
      return {s.code(), "cuda_ipc: " + s.message() +
                            ": the region must lie in memory from cuMemAlloc (cudaMalloc, "
                            "PyTorch's caching allocator); VMM allocations (PyTorch's expandable "
                            "segments) are not exported by this build"};
    }
  } catch (const Error& e) {
    return {e.code(), "cuda_ipc: " + e.status().message()};
  }
  std::array<uint8_t, kKeyBytes> bytes = encode(key);
  return keys.add(0, bytes);
}

Status CudaIpcTransport::make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) {
  out = std::make_shared<CudaIpcChannel>(std::move(args), driver_, settings_);
  return {};
}

}  // namespace ferry::transport::cuda_ipc
