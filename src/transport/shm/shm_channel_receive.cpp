// ShmChannel, receive side (docs/architecture.md, "Same-host specifics"): records taken from
// the peer's ring by whichever thread polls it, requests served (writes pulled, reads granted,
// messages matched and pulled into posted receives) and answers completing our ops. Set-up, the
// send side and closing are in shm_channel.cpp.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "core/sys.hpp"
#include "transport/shm/shm_channel.hpp"
#include "transport/shm/shm_socket.hpp"

namespace ferry::transport::shm {

namespace {

// The slices of the op an answer finishes: an ack's and read data's count, else one.
int64_t answered_slices(const Header& h) {
  switch (h.type) {
    case Record::kAck:
    case Record::kReadData:
      return h.count;
    case Record::kGrant:
      return h.imm;  // the slices of one entry the grant covers
    default:
      return 1;
  }
}

}  // namespace

void ShmChannel::on_event(uint32_t events) {
  if (stopped_) return;
  Status s;
  if (events & EPOLLIN) {
    bool waiting;
    {
      std::lock_guard lock(send_mu_);
      waiting = !outbound_.valid();
    }
    if (waiting) {
      std::vector<uint8_t> hello;
      s = take_ring(fd_.get(), hello);
      if (s.ok()) {
        std::lock_guard lock(send_mu_);
        (void)host_.reactor().modify(loop_, fd_.get(), socket_events_locked(), this);
        // What waited for the ring goes now; and the listener may wait for room already.
        s = pump_locked();
        ring_bell(peer_bell_.get());
      }
    }
  }
  if (s.ok() && (events & EPOLLOUT)) {
    std::lock_guard lock(send_mu_);
    s = pump_locked();
  }
  if (s.ok() && (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
    // What the peer wrote before it hung up is still handled: its last answers complete ops.
    bool more = false;
    polling_.lock();
    if (!stopped_) s = consume(false, more);
    polling_.unlock();
    if (s.ok()) s = {ErrorCode::kPeerLost, "shm: the peer closed the connection"};
  }
  if (!s.ok()) close(s);
}

void ShmChannel::on_bell() {
  if (stopped_) return;
  eventfd_t rings = 0;
  (void)::eventfd_read(bell_.get(), &rings);
  inbound_.woken();
  Status s;
  {
    std::lock_guard lock(send_mu_);  // the peer rings for room it freed, too
    s = pump_locked();
  }
  bool more = false;
  if (s.ok()) {
    polling_.lock();
    if (!stopped_) s = consume(true, more);
    polling_.unlock();
  }
  if (!s.ok()) {
    close(s);
  } else if (more) {
    // The loop serves its other channels first; the bell need not ring for what waits.
    host_.reactor().post(loop_, [self = shared_from_this()] { self->on_bell(); });
  }
}

Status ShmChannel::consume(bool budget, bool& more) {
  more = false;
  std::size_t pulled = 0;
  Status s;
  for (int i = 0;; ++i) {
    if (budget && (i >= kRecordsPerWake || pulled >= kPullBytesPerWake)) {
      more = inbound_.pending();
      break;
    }
    // Inline bytes are copied into place from the ring, the rest from our copy in in_.
    const uint8_t* at = nullptr;
    std::size_t length = 0;
    if (s = inbound_.peek(in_.size(), at, length); !s.ok() || length == 0) break;
    View v;
    s = parse_in_place({at, length}, in_, v);
    if (s.ok() && v.header.type == Record::kMap) {
      core::Fd file;
      s = receive_file(v.entry(0).region, file);
      if (s.ok()) s = on_map(v, std::move(file));
    } else if (s.ok()) {
      s = handle(v, pulled);
      // A full piece is most likely one of many, and a request most likely followed by
      // another: the next is polled for, not waited for.
      if (s.ok() && v.payload.size() >= kInlineBytes / 2) {
        host_.reactor().keep_polling(loop_, stream_poll_);
      } else if (s.ok() && is_request(v.header.type)) {
        host_.reactor().poll_for_requests(loop_, request_poll_);
      }
    }
    inbound_.release();
    if (!s.ok()) break;
  }
  if (inbound_.room_wanted()) {
    std::lock_guard lock(send_mu_);
    if (peer_bell_.valid()) ring_bell(peer_bell_.get());
  }
  return s;
}

Status ShmChannel::receive_file(uint32_t region, core::Fd& file) {
  uint8_t body[sizeof region + 1];
  Files files;
  std::size_t length = 0, count = 0;
  if (Status s = receive_with_files(fd_.get(), body, length, files, count); !s.ok()) return s;
  uint32_t named = 0;
  if (length == sizeof region) std::memcpy(&named, body, sizeof named);
  if (length != sizeof region || named != region || count != 1) {
    return {ErrorCode::kProtocol,
            "shm: region " + std::to_string(region) + " lent without its file on the socket"};
  }
  file = std::move(files[0]);
  return {};
}

void ShmChannel::begin_polling() { inbound_.poll_begin(); }

bool ShmChannel::poll() {
  bool work = room_awaited_.load(std::memory_order_relaxed) && refill();
  if (!inbound_.pending()) return work;
  try_consume();  // else a waiter takes them
  return true;
}

bool ShmChannel::try_consume() {
  if (!polling_.try_lock()) return false;
  bool more = false;
  Status s = stopped_ ? Status() : consume(true, more);
  polling_.unlock();
  if (!s.ok()) close(s);
  return true;
}

void ShmChannel::end_polling() {
  if (inbound_.poll_end()) ring_bell(bell_.get());
}

void ShmChannel::progress() {
  // Holding a reference: a completion callback may drop the last other one.
  std::shared_ptr<ShmChannel> self = weak_from_this().lock();
  if (self && !polling_.held_here()) try_consume();
}

std::shared_ptr<void> ShmChannel::watch_begin() {
  std::shared_ptr<ShmChannel> self = weak_from_this().lock();
  if (self) begin_polling();  // the peer rings no bell while we look
  return self;
}

void ShmChannel::watch_poll(bool) {
  // A wait inside a completion callback cannot poll: the poll it runs in holds the right.
  if (polling_.held_here()) return;
  if (inbound_.pending()) try_consume();
  if (room_awaited_.load(std::memory_order_relaxed)) refill();
}

// Records that came while we looked and nobody took: the progress thread's.
void ShmChannel::watch_end() { end_polling(); }

bool ShmChannel::refill() {
  Status s;
  bool wrote = false;
  {
    // Never waits: whoever holds the lock is writing already.
    std::unique_lock lock(send_mu_, std::try_to_lock);
    if (!lock.owns_lock() || send_closed_ || !outbound_.room_freed()) return false;
    const uint64_t before = written_;
    s = pump_locked();
    wrote = written_ != before;
  }
  if (!s.ok()) close(s);
  return wrote;
}

Status ShmChannel::handle(const View& r, std::size_t& pulled) {
  bool bodiless = r.header.type == Record::kImm || r.header.type == Record::kRevoke ||
                  r.header.type == Record::kUnmapped || r.header.type == Record::kRelease;
  if (bodiless && !r.payload.empty()) return {ErrorCode::kProtocol, "shm record: stray bytes"};
  switch (r.header.type) {
    case Record::kWrite:
      return on_write(r, pulled);
    case Record::kRead:
      return on_read(r);
    case Record::kSend:
      return on_send(r, pulled);
    case Record::kRelease:
      return on_release(r);
    case Record::kImm:
      return on_imm(r);
    case Record::kRevoke:
      return on_revoke(r);
    case Record::kUnmapped:
      return on_unmapped(r);
    case Record::kAck:
    case Record::kReadData:
    case Record::kGrant:
    case Record::kSendAck:
      return on_answer(r, pulled);
    case Record::kHello:
    case Record::kMap:  // taken with its file in consume()
      break;
  }
  return {ErrorCode::kProtocol, "shm record: hello after set-up"};
}

Status ShmChannel::pull(const iovec* local, const iovec* remote, std::size_t n,
                        uint64_t total) const {
  if (!no_cross_memory_.empty()) {
    return {ErrorCode::kProtocol, "shm: asked to pull where " + no_cross_memory_};
  }
  return pool_->pull(peer_pid_, local, remote, n, total);
}

Status ShmChannel::on_write(const View& r, std::size_t& pulled) {
  const Header& h = r.header;
  if (h.op_id != imm_op_) {  // an op's records arrive one after the other
    imm_op_ = h.op_id;
    imm_op_failed_ = false;
  }
  const bool inline_bytes = (h.flags & kFlagInline) != 0;
  const uint8_t* src = r.payload.data();
  std::size_t inline_left = r.payload.size();
  if (!inline_bytes && inline_left != 0) return {ErrorCode::kProtocol, "shm write: stray bytes"};
  // The uses taken below go whichever way this returns: a use left behind would hold its
  // region's deregistration forever.
  struct Release {
    std::vector<RegionUse>& uses;
    ~Release() { uses.clear(); }
  } release{uses_};
  Status status;
  uint64_t total = 0;
  local_iov_.clear();
  remote_iov_.clear();
  for (uint32_t i = 0; i < h.count; ++i) {
    Entry e = r.entry(i);
    if (inline_bytes && e.length > inline_left) {
      return {ErrorCode::kProtocol, "shm write: entries longer than the bytes carried"};
    }
    uint8_t* dst = nullptr;
    RegionUse use;  // held while the bytes land: a deregistration waits for it
    Status s = host_.regions().acquire(e.region, e.key ^ ShmTransport::kKeyFlip, e.offset, e.length,
                                       Access::kRemoteWrite, &dst, use);
    if (s.ok()) {
      if (Status l = lend(e, use); !l.ok()) return l;
    }
    if (!s.ok()) {
      if (status.ok())
        status = {s.code(), "write entry " + std::to_string(e.index) + ": " + s.message()};
    } else if (inline_bytes) {
      if (e.length > 0) std::memcpy(dst, src, e.length);
    } else if (e.length > 0) {
      local_iov_.push_back({dst, e.length});
      remote_iov_.push_back({peer_address(e.address), e.length});
      uses_.push_back(std::move(use));
      total += e.length;
    }
    if (inline_bytes) {
      src += e.length;
      inline_left -= e.length;
    }
  }
  if (inline_left != 0) return {ErrorCode::kProtocol, "shm write: bytes beyond its entries"};
  if (!local_iov_.empty()) {
    Status s = pull(local_iov_.data(), remote_iov_.data(), local_iov_.size(), total);
    if (!s.ok() && status.ok()) status = s;
    pulled += total;
  }
  uses_.clear();
  if (!status.ok()) imm_op_failed_ = true;
  // Every byte of the op landed: the notification comes after them, as RC and TCP order it.
  if ((h.flags & kFlagImm) && !imm_op_failed_) host_.deliver_imm(*link_, h.imm);
  return respond_status(Record::kAck, h.op_id, h.count, status);
}

Status ShmChannel::on_read(const View& r) {
  const Header& h = r.header;
  if (!r.payload.empty()) return {ErrorCode::kProtocol, "shm read: stray bytes"};
  Status status;
  if (h.flags & kFlagInline) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < h.count; ++i)
      total += std::min<uint64_t>(r.entry(i).length, kInlineBytes + 1);
    if (total > kInlineBytes) return {ErrorCode::kProtocol, "shm read: too many bytes inline"};
    scratch_.resize(total);
    uint8_t* at = scratch_.data();
    for (uint32_t i = 0; i < h.count && status.ok(); ++i) {
      Entry e = r.entry(i);
      uint8_t* src = nullptr;
      RegionUse use;
      Status s = host_.regions().acquire(e.region, e.key ^ ShmTransport::kKeyFlip, e.offset,
                                         e.length, Access::kRemoteRead, &src, use);
      if (!s.ok()) {
        status = {s.code(), "read entry " + std::to_string(e.index) + ": " + s.message()};
      } else if (Status l = lend(e, use); !l.ok()) {
        return l;
      } else if (e.length > 0) {
        std::memcpy(at, src, e.length);
      }
      at += e.length;
    }
    if (!status.ok()) return respond_status(Record::kAck, h.op_id, h.count, status);
    Header a;
    a.type = Record::kReadData;
    a.op_id = h.op_id;
    a.count = h.count;
    a.payload = static_cast<uint32_t>(total);
    return respond(a, r.table, scratch_);
  }
  if (h.count != 1 || h.imm == 0) {
    return {ErrorCode::kProtocol, "shm read: a pulled read takes one entry of one or more slices"};
  }
  Entry e = r.entry(0);
  uint8_t* src = nullptr;
  RegionUse use;
  Status s = host_.regions().acquire(e.region, e.key ^ ShmTransport::kKeyFlip, e.offset, e.length,
                                     Access::kRemoteRead, &src, use);
  if (!s.ok()) {  // answers every slice the range covers
    return respond_status(Record::kAck, h.op_id, h.imm,
                          {s.code(), "read entry " + std::to_string(e.index) + ": " + s.message()});
  }
  if (grants_.size() >= static_cast<std::size_t>(kRequestsInFlight)) {
    return {ErrorCode::kResourceExhausted,
            "shm: the peer holds " + std::to_string(grants_.size()) + " read grants"};
  }
  if (Status l = lend(e, use); !l.ok()) return l;
  // Held until the peer released it: a deregistration waits for the peer's pull.
  grants_.push_back({next_grant_++, std::move(use), src, e.length});
  e.address = reinterpret_cast<uint64_t>(src);
  uint8_t table[kEntryBytes];
  put_entry(e, table);
  Header a;
  a.type = Record::kGrant;
  a.op_id = h.op_id;
  a.count = 1;
  a.tag = grants_.back().id;
  a.imm = h.imm;
  return respond(a, table);
}

Status ShmChannel::on_imm(const View& r) {
  // Its bytes were copied before it was sent; it notifies only a peer that may still write.
  Entry e = r.entry(0);
  uint8_t* unused = nullptr;
  RegionUse use;
  Status s = host_.regions().acquire(e.region, e.key ^ ShmTransport::kKeyFlip, 0, 0,
                                     Access::kRemoteWrite, &unused, use);
  if (s.ok()) host_.deliver_imm(*link_, r.header.imm);
  return respond_status(Record::kAck, r.header.op_id, 1,
                        s.ok() ? s : Status{s.code(), "write_with_imm: " + s.message()});
}

Status ShmChannel::on_release(const View& r) {
  auto it = std::find_if(grants_.begin(), grants_.end(),
                         [&](const Held& g) { return g.id == r.header.tag; });
  if (it == grants_.end()) {
    return {ErrorCode::kProtocol,
            "shm: release of grant " + std::to_string(r.header.tag) + ", which is not held"};
  }
  *it = std::move(grants_.back());
  grants_.pop_back();
  return {};
}

namespace {
// A large message that found no receive posted: its bytes stay with the sender until one is.
struct HeldSend final : Rendezvous {
  HeldSend(std::weak_ptr<ShmChannel> channel, uint64_t op_id, uint64_t tag, const Entry& e)
      : channel(std::move(channel)), op_id(op_id), tag(tag), entry(e) {}
  void matched(OpState* recv) override {
    // Without the channel the peer is gone: the receive fails with it.
    if (auto c = channel.lock()) c->taken_later(op_id, tag, entry, recv);
  }
  std::weak_ptr<ShmChannel> channel;
  uint64_t op_id, tag;
  Entry entry;
};
}  // namespace

Status ShmChannel::on_send(const View& r, std::size_t& pulled) {
  const Header& h = r.header;
  if ((h.flags & kFlagInline) != 0) return on_message_bytes(r, pulled);
  if (!r.payload.empty()) return {ErrorCode::kProtocol, "shm send: bytes beside a pulled message"};
  if (arriving_.active) return message_out_of_place(h.op_id);
  return hold_or_pull(h.op_id, h.tag, r.entry(0), pulled);
}

Status ShmChannel::hold_or_pull(uint64_t op_id, uint64_t tag, const Entry& e, std::size_t& pulled) {
  Status refused;
  OpState* recv = link_->matcher.announce(
      tag, 0, std::make_shared<HeldSend>(weak_from_this(), op_id, tag, e), refused);
  if (!refused.ok()) return respond_status(Record::kSendAck, op_id, 1, refused);
  if (recv == nullptr) {
    // Held: the sender gets its credit back, so that its other requests go on meanwhile.
    return respond_status(Record::kSendAck, op_id, 1, {ErrorCode::kInProgress, ""});
  }
  return into_receive(recv, op_id, tag, e, false, pulled);
}

Status ShmChannel::message_out_of_place(uint64_t op_id) const {
  std::string arriving =
      arriving_.active ? "op " + std::to_string(arriving_.op_id) + "'s arrives" : "none arrives";
  return {ErrorCode::kProtocol, "shm send: a record of op " + std::to_string(op_id) +
                                    " out of place (of the messages in several records, " +
                                    arriving + ")"};
}

Status ShmChannel::on_message_bytes(const View& r, std::size_t& pulled) {
  const Header& h = r.header;
  Entry e = r.entry(0);
  Arriving& m = arriving_;
  if (e.entry_offset == 0) {
    if (m.active) return message_out_of_place(h.op_id);
    m.active = true;
    m.op_id = h.op_id;
    m.tag = h.tag;
    m.length = e.length;
    m.received = 0;
    m.address = e.address;
    Matcher::Arrival a = link_->matcher.arrive(h.tag, e.length);
    m.recv = a.recv;
    m.counted = a.error.ok() && a.recv == nullptr;
    // One of several records that the limits leave no room to buffer is held instead, once
    // its last record is in, as a pulled message is: the receive that takes it pulls it.
    m.held = !a.error.ok() && (h.flags & kFlagMore) != 0;
    m.refused = m.held ? Status() : a.error;
  } else if (!m.active || h.op_id != m.op_id || h.tag != m.tag || e.length != m.length ||
             e.entry_offset != m.received) {
    return message_out_of_place(h.op_id);
  }
  const std::size_t n = r.payload.size();
  const uint64_t left = m.length - m.received;
  const bool more = (h.flags & kFlagMore) != 0;
  if (more ? n == 0 || n >= left : n != left) {
    return {ErrorCode::kProtocol, "shm send: its length and its bytes disagree"};
  }
  if (m.recv != nullptr) {
    const OpEntry& dst = m.recv->entries[0];
    if (m.received < dst.length) {
      std::memcpy(dst.local + m.received, r.payload.data(),
                  std::min<uint64_t>(n, dst.length - m.received));
    }
  } else if (m.counted) {
    if (m.buffer.capacity() < m.length) m.buffer.reserve(m.length);  // arrive() counted it
    m.buffer.insert(m.buffer.end(), r.payload.begin(), r.payload.end());
  }
  m.received += n;
  if (more) return {};
  m.active = false;
  if (m.recv != nullptr)
    return complete_receive(std::exchange(m.recv, nullptr), m.op_id, m.tag, m.length, {}, false);
  if (m.held) {
    Entry whole;
    whole.length = m.length;
    whole.address = m.address;
    return hold_or_pull(m.op_id, m.tag, whole, pulled);
  }
  if (!m.counted) return respond_status(Record::kSendAck, m.op_id, 1, m.refused);
  m.counted = false;
  Status queued = respond_status(Record::kSendAck, m.op_id, 1, {});
  messages.received.fetch_add(1, std::memory_order_relaxed);
  link_->matcher.commit(m.tag, std::exchange(m.buffer, {}));
  return queued;
}

Status ShmChannel::into_receive(OpState* recv, uint64_t op_id, uint64_t tag, const Entry& e,
                                bool held, std::size_t& pulled) {
  const OpEntry& dst = recv->entries[0];
  uint64_t n = std::min(e.length, dst.length);
  Status s;
  if (n > 0) {
    iovec local{dst.local, n}, remote{peer_address(e.address), n};
    pulled += n;
    s = pull(&local, &remote, 1, n);
  }
  return complete_receive(recv, op_id, tag, e.length, s, held);
}

Status ShmChannel::complete_receive(OpState* recv, uint64_t op_id, uint64_t tag, uint64_t length,
                                    const Status& copied, bool held) {
  const uint64_t capacity = recv->entries[0].length;
  Status answer = copied;
  if (copied.ok() && length > capacity) answer = Matcher::truncated_send(tag, capacity);
  // The ack is queued before the receiver can run: anything it sends next goes out after it.
  Status queued = respond_status(Record::kSendAck, op_id, 1, answer, held);
  if (copied.ok()) {
    messages.received.fetch_add(1, std::memory_order_relaxed);
    Matcher::settle(recv, length);
  } else {
    recv->record_error(copied);
  }
  recv->finish_posted();
  return queued;
}

void ShmChannel::taken_later(uint64_t op_id, uint64_t tag, const Entry& e, OpState* recv) {
  link_->matcher.release(0);
  host_.reactor().post(loop_, [self = shared_from_this(), op_id, tag, e, recv] {
    self->polling_.lock();
    std::size_t pulled = 0;
    // Once stopped, closing fails the receive with the peer's other ops.
    Status s = self->stopped_ ? Status() : self->into_receive(recv, op_id, tag, e, true, pulled);
    self->polling_.unlock();
    if (!s.ok()) self->close(s);
  });
}

OpState* ShmChannel::answered_op(const View& r, Status& error) const {
  OpState* op = link_->pool->lookup(r.header.op_id);
  bool fits = op != nullptr;
  if (fits) {
    switch (r.header.type) {
      case Record::kAck:  // a write's, or a read's refusal
        fits = op->kind == OpKind::kWrite || op->kind == OpKind::kRead;
        break;
      case Record::kSendAck:
        fits = op->kind == OpKind::kSend;
        break;
      default:
        fits = op->kind == OpKind::kRead;
    }
  }
  if (!fits) {
    error = {ErrorCode::kProtocol,
             "shm: an answer for op " + std::to_string(r.header.op_id) + ", which is not asking"};
    return nullptr;
  }
  int64_t count = answered_slices(r.header);
  if (count < 1 || count > on_wire(*op).load()) {
    error = {ErrorCode::kProtocol, "shm: an answer for " + std::to_string(count) +
                                       " slices of op " + std::to_string(r.header.op_id)};
    return nullptr;
  }
  // Every echoed entry must be one the op has.
  for (std::size_t i = 0; i < r.table.size() / kEntryBytes; ++i) {
    Entry e = r.entry(i);
    if (e.index >= op->entries.size() || e.entry_offset > op->entries[e.index].length ||
        e.length > op->entries[e.index].length - e.entry_offset) {
      error = {ErrorCode::kProtocol, "shm: an answer names bytes op " +
                                         std::to_string(r.header.op_id) + " does not have"};
      return nullptr;
    }
  }
  return op;
}

Status ShmChannel::on_answer(const View& r, std::size_t& pulled) {
  const Header& h = r.header;
  Status error;
  OpState* op = answered_op(r, error);
  if (op == nullptr) return error;
  if (h.type == Record::kSendAck && h.status == static_cast<uint16_t>(ErrorCode::kInProgress)) {
    // Held until the peer posts a receive: the credit comes back now, the op stays.
    ShmOpArea& area = op->transport_area<ShmOpArea>();
    bool& held = area.held;
    if (held || !r.payload.empty()) {
      return {ErrorCode::kProtocol, "shm: send " + std::to_string(h.op_id) + " held twice"};
    }
    held = true;
    area.route = ShmOpArea::kUnrouted;  // its time is now the receiver's wait: not the way's
    std::lock_guard lock(send_mu_);
    if (Status s = take_credit_back_locked(); !s.ok()) return s;
    return pump_locked();
  }
  if (h.status != 0) {
    op->record_error(
        {static_cast<ErrorCode>(h.status),
         std::string(reinterpret_cast<const char*>(r.payload.data()), r.payload.size())});
  }
  if (h.type == Record::kSendAck &&
      (h.status == 0 || h.status == static_cast<uint16_t>(ErrorCode::kTruncated))) {
    messages.sent.fetch_add(1, std::memory_order_relaxed);
  }
  if (h.type == Record::kReadData) {
    const uint8_t* src = r.payload.data();
    std::size_t left = r.payload.size();
    for (uint32_t i = 0; i < h.count; ++i) {
      Entry e = r.entry(i);
      if (e.length > left) return {ErrorCode::kProtocol, "shm read data: fewer bytes than asked"};
      if (e.length > 0) std::memcpy(op->entries[e.index].local + e.entry_offset, src, e.length);
      src += e.length;
      left -= e.length;
    }
    if (left != 0) return {ErrorCode::kProtocol, "shm read data: more bytes than asked"};
  } else if (h.type == Record::kGrant) {
    Entry e = r.entry(0);
    iovec local{op->entries[e.index].local + e.entry_offset, e.length};
    iovec remote{peer_address(e.address), e.length};
    Status s = e.length > 0 ? pull(&local, &remote, 1, e.length) : Status();
    pulled += e.length;
    if (!s.ok())
      op->record_error({s.code(), "read entry " + std::to_string(e.index) + ": " + s.message()});
    Header release;
    release.type = Record::kRelease;
    release.tag = h.tag;
    if (Status q = respond(release); !q.ok()) return q;
  }
  // A held send's credit came back with its first answer. The credit comes back before the op
  // completes: a caller that posts again at once finds none of its requests on the wire.
  if (!(h.type == Record::kSendAck && op->transport_area<ShmOpArea>().held)) {
    std::lock_guard lock(send_mu_);
    if (Status s = take_credit_back_locked(); !s.ok()) return s;
  }
  int64_t answered = answered_slices(h);
  on_wire(*op).fetch_sub(answered, std::memory_order_relaxed);
  finish_answered(op, answered);
  std::lock_guard lock(send_mu_);
  return pump_locked();
}

Status ShmChannel::take_credit_back_locked() {
  if (credits_ == kRequestsInFlight) {
    return {ErrorCode::kProtocol, "shm: more answers than requests"};
  }
  ++credits_;
  return {};
}

}  // namespace ferry::transport::shm
