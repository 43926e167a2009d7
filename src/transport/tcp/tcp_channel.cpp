#include "transport/tcp/tcp_channel.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <unordered_map>

#include "core/bytes.hpp"
#include "core/sys.hpp"
#include "transport/tcp/tcp_stream.hpp"

namespace ferry::transport::tcp {

// ---------------------------------------------------------------------------------------------
// Channel

std::shared_ptr<TcpChannel> TcpChannel::create(Host& host, std::shared_ptr<PeerLink> link,
                                               const TcpOptions& options,
                                               std::function<void(const Status&)> on_closed,
                                               bool dialer) {
  return std::shared_ptr<TcpChannel>(
      new TcpChannel(host, std::move(link), options, std::move(on_closed), dialer));
}

TcpChannel::TcpChannel(Host& host, std::shared_ptr<PeerLink> link, const TcpOptions& options,
                       std::function<void(const Status&)> on_closed, bool dialer)
    : host_(host),
      link_(std::move(link)),
      options_(options),
      latch_(std::move(on_closed)),
      dialer_(dialer) {
  if (options_.streams < 1 || options_.streams > OpState::kMaxLanes) {
    throw Error(ErrorCode::kInvalidArgument,
                "tcp.streams must be 1.." + std::to_string(OpState::kMaxLanes));
  }
  make_streams(options_.streams);
}

TcpChannel::~TcpChannel() = default;

void TcpChannel::make_streams(int count) {
  streams_.clear();
  for (int i = 0; i < count; ++i) {
    auto s = std::make_shared<Stream>(*this, i);
    s->credits = options_.slices_in_flight_per_stream;
    streams_.push_back(std::move(s));
  }
}

std::vector<uint8_t> TcpChannel::local_address() const {
  std::vector<uint8_t> out;
  core::ByteWriter(out).u16(static_cast<uint16_t>(streams_.size()));
  return out;
}

Status TcpChannel::connect(std::span<const uint8_t> remote) {
  core::ByteReader r(remote);
  uint16_t streams = r.u16();
  if (!r.ok() || !r.at_end()) return {ErrorCode::kProtocol, "tcp address: not a stream count"};
  if (streams < 1 || streams > OpState::kMaxLanes) {
    return {ErrorCode::kProtocol, "tcp address: " + std::to_string(streams) + " streams (1.." +
                                      std::to_string(OpState::kMaxLanes) + ")"};
  }
  if (!dialer_ || streams == streams_.size()) return {};
  // Under the latch's lock, which close() takes before it looks at the streams; none is attached
  // yet.
  std::lock_guard lock(latch_.lock());
  if (latch_.closing()) return {ErrorCode::kPeerLost, "tcp: connection already closed"};
  make_streams(streams);
  return {};
}

Status TcpChannel::attach_side(int index, core::Fd fd) {
  if (index < 0 || index >= static_cast<int>(streams_.size())) {
    return {ErrorCode::kProtocol, "join: stream index " + std::to_string(index) + " out of range"};
  }
  // Under the latch's lock, so a concurrent close() either sees this stream attached or
  // refuses it.
  std::lock_guard close_lock(latch_.lock());
  if (latch_.closing()) return {ErrorCode::kPeerLost, "join: connection already closed"};
  Stream& s = *streams_[static_cast<std::size_t>(index)];
  if (s.attached) return {ErrorCode::kProtocol, "join: stream " + std::to_string(index) + " twice"};
  if (Status st = core::set_nonblocking(fd.get(), true); !st.ok()) return st;
  s.fd = std::move(fd);
  s.loop = host_.reactor().pick_loop();
  s.keep_channel = shared_from_this();
  std::lock_guard lock(s.send_mu);
  s.attached = true;  // before the loop can see the stream
  live_streams_.fetch_add(1);
  if (Status st = host_.reactor().add(s.loop, s.fd.get(), EPOLLIN | EPOLLRDHUP, &s); !st.ok()) {
    s.attached = false;
    live_streams_.fetch_sub(1);
    s.keep_channel.reset();
    return st;
  }
  return {};
}

PostResult TcpChannel::post(OpState* op) {
  PostResult result = PostResult::kAccepted;
  Status failed;
  std::size_t budget = kCallerSendBytes;  // shared by the op's streams
  int n = static_cast<int>(streams_.size());
  for (int lane = 0; lane < op->lane_count; ++lane) {
    Stream& s = *streams_[static_cast<std::size_t>((op->first_lane + lane) % n)];
    std::lock_guard lock(s.send_mu);
    if (s.closed) continue;  // closing: the close path fails the op
    s.enqueue_locked(op);
    if (Status st = s.flush_locked(budget); !st.ok()) {
      if (failed.ok()) failed = st;
      continue;
    }
    if (s.queue_head != nullptr) result = PostResult::kQueued;
  }
  // Never under a send lock: close() takes the latch's lock, which comes first (see
  // attach_side()).
  if (!failed.ok()) close(failed);
  return result;
}

void TcpChannel::close(const Status& reason) {
  std::vector<std::shared_ptr<Stream>> attached;
  bool began = latch_.begin(reason, [&] {
    for (auto& s : streams_) {
      if (s->attached) attached.push_back(s);
    }
    // Counts as one live stream until the loop below is done, so the last stream to stop
    // cannot finish the close before every stop was scheduled.
    live_streams_.fetch_add(1);
  });
  if (!began) return;
  for (auto& s : attached) {
    // Answers already queued go out first, if the socket takes them now: an ack for a message
    // the application has already received must reach its sender, or an orderly shutdown
    // right after a receive would fail the sender's send.
    {
      std::lock_guard lock(s->send_mu);
      s->answers_only = true;
      (void)s->flush_locked();
    }
    // The fd stays open until the stream is destroyed, so this never hits a reused number.
    ::shutdown(s->fd.get(), SHUT_RDWR);
    host_.reactor().post(s->loop, [s] { s->stop(); });
  }
  stream_stopped();
}

void TcpChannel::cut_off(const uint8_t* base, uint64_t length, const Status& why) {
  if (latch_.closing()) return;
  auto self = shared_from_this();
  // Under the latch's lock, as attach_side() attaches a stream and sets its loop: a peer still
  // joining has streams not attached yet, which hold nothing.
  std::lock_guard lock(latch_.lock());
  for (auto& s : streams_) {
    if (!s->attached) continue;
    host_.reactor().post(s->loop, [self, s, base, length, why] {
      if (s->touches(base, length)) self->close(why);
    });
  }
}

std::size_t TcpChannel::worst_case_bytes(const TcpOptions& options) {
  std::size_t response_limit =
      std::max(kMinResponseLimit,
               2 * static_cast<std::size_t>(std::max(options.slices_in_flight_per_stream, 1)));
  // The ring doubles past the limit once; each answer may carry an error text (a heap string).
  std::size_t responses = 2 * std::bit_ceil(response_limit) * (sizeof(Response) + kMaxErrorText);
  // A group frame's parts: received (table, decoded entries, destinations, region uses) and
  // sent or queued (table, pieces, leases), in each of the staged frames and queued answers.
  std::size_t group_in =
      kGroupTableBytes +
      kMaxGroupEntries * (sizeof(GroupEntry) + sizeof(GroupDst) + sizeof(RegionUse));
  constexpr std::size_t kLeaseBytes = sizeof(std::uintptr_t);  // a lease is a slot pointer
  std::size_t group_out = kGroupTableBytes + kMaxGroupEntries * (sizeof(Segment) + kLeaseBytes);
  std::size_t per_stream = sizeof(Stream) + kRecvBufferBytes + kMaxErrorText + responses +
                           kMaxStaged * kMaxErrorText + group_in +
                           (kMaxStaged + group_answers_allowed(options) + 1) * group_out;
  return sizeof(TcpChannel) + static_cast<std::size_t>(options.streams) * per_stream +
         kMaxImmInProgress * kImmProgressBytes;
}

void TcpChannel::stop_after_reactor() {
  for (auto& s : streams_) s->stop();
}

std::vector<TcpChannel::StreamUsage> TcpChannel::usage() {
  std::vector<StreamUsage> out(streams_.size());
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    std::shared_ptr<Stream> s = streams_[i];
    {
      std::lock_guard lock(latch_.lock());
      if (!s->attached) continue;
    }
    auto answer = std::make_shared<std::promise<StreamUsage>>();
    std::future<StreamUsage> answered = answer->get_future();
    host_.reactor().post(s->loop, [s, answer] {
      StreamUsage u;
      if (!s->stopped) {
        u.receive_buffer = s->rbuf.capacity();
        u.message_buffer = s->frame_buffer.capacity();
        u.message_bytes = s->sink_grows ? s->frame_copied : 0;
        std::lock_guard lock(s->send_mu);
        u.queued_responses = s->responses.size();
        u.reading_paused = s->read_paused.load();
      }
      answer->set_value(u);
    });
    // A loop that does not answer has stopped (the reactor keeps its queued tasks unrun).
    if (answered.wait_for(std::chrono::seconds(10)) == std::future_status::ready) {
      out[i] = answered.get();
    }
  }
  return out;
}

void TcpChannel::stream_stopped() {
  if (live_streams_.fetch_sub(1) != 1 || !latch_.closing()) return;
  latch_.report();  // nothing receives into or sends from user memory any more
}

Status TcpChannel::imm_progress(uint64_t op_id, uint32_t streams, uint32_t imm, bool last,
                                bool failed) {
  bool deliver = false;
  {
    std::lock_guard lock(imm_mu_);
    auto it = imm_progress_.find(op_id);
    if (it == imm_progress_.end()) {
      if (last && streams <= 1) {
        deliver = !failed;
      } else if (imm_progress_.size() >= kMaxImmInProgress) {
        // A peer honouring its credits keeps far fewer open (each holds a credit on a stream
        // still to finish): this one is broken or hostile, and its notification cannot be kept.
        return {ErrorCode::kResourceExhausted, "write_with_imm: more than " +
                                                   std::to_string(kMaxImmInProgress) +
                                                   " operations in progress on one connection"};
      } else {
        imm_progress_.emplace(op_id, ImmProgress{last ? 1u : 0u, failed});
      }
    } else {
      ImmProgress& p = it->second;
      p.streams_done += last ? 1 : 0;
      p.failed |= failed;
      if (p.streams_done >= streams) {
        deliver = !p.failed;
        imm_progress_.erase(it);
      }
    }
  }
  if (deliver) host_.deliver_imm(*link_, imm);
  return {};
}

bool TcpChannel::Stream::touches(const uint8_t* base, uint64_t length) {
  auto inside = [&](const uint8_t* p) { return p != nullptr && p >= base && p < base + length; };
  auto any_segment = [&](const std::vector<Segment>& segments) {
    return std::any_of(segments.begin(), segments.end(),
                       [&](const Segment& g) { return inside(g.data); });
  };
  if (inside(sink)) return true;
  // The entries of the group frame being received that are still to come.
  for (std::size_t i = group_next; group && i < group_dst.size(); ++i) {
    if (inside(group_dst[i].addr)) return true;
  }
  std::lock_guard lock(send_mu);
  for (int i = 0; i < staged_count; ++i) {
    const Outbound& o = staged[(staged_head + i) % kMaxStaged];
    if (inside(o.payload) || any_segment(o.segments)) return true;
  }
  return responses.any_of(
      [&](const Response& r) { return inside(r.payload) || any_segment(r.segments); });
}

// ---------------------------------------------------------------------------------------------
// Send side

void TcpChannel::Stream::enqueue_locked(OpState* op) {
  int lane = lane_of(op);
  op->lane_next[lane] = nullptr;
  if (queue_tail == nullptr) {
    queue_head = queue_tail = op;
  } else {
    queue_tail->lane_next[lane_of(queue_tail)] = op;
    queue_tail = op;
  }
}

void TcpChannel::Stream::arm_locked(bool out) {
  want_out = out;
  update_events_locked();
}

void TcpChannel::Stream::update_events_locked() {
  uint32_t events = (read_paused.load() ? 0u : EPOLLIN | EPOLLRDHUP) | (want_out ? EPOLLOUT : 0u);
  if (events == armed || closed) return;
  armed = events;
  (void)ch.host_.reactor().modify(loop, fd.get(), events, this);
}

// The responses drained: read again, starting with frames left in the staging buffer (the
// socket may hold nothing more to wake the loop).
void TcpChannel::Stream::resume_reading_locked() {
  read_paused.store(false);
  update_events_locked();
  post_resume();
}

// Queues a task that calls on_event() on the loop, unless one is queued already.
void TcpChannel::Stream::post_resume() {
  if (resume_posted.exchange(true)) return;
  std::shared_ptr<Stream> self = ch.streams_[static_cast<std::size_t>(index)];
  ch.host_.reactor().post(loop, [self] {
    self->resume_posted.store(false);
    self->on_event(0);
  });
}

void TcpChannel::Stream::stage_response_locked(Response& r) {
  Outbound& o = staged[(staged_head + staged_count) % kMaxStaged];
  o.text = std::move(r.text);
  if (!o.text.empty()) {
    r.header.length = static_cast<uint32_t>(o.text.size());
    o.payload = reinterpret_cast<const uint8_t*>(o.text.data());
  } else {
    o.payload = r.payload;
  }
  o.payload_length = payload_length(r.header);
  o.wire = core::kFrameHeaderSize + o.payload_length;
  o.asks = 0;
  o.lease = r.lease;
  if (!r.table.empty()) {  // a group answer: table, then the entries' bytes
    --group_answers;
    o.table.swap(r.table);
    o.segments.swap(r.segments);
    o.leases.swap(r.leases);
    o.payload = o.table.data();
    o.payload_length = o.table.size();
  }
  core::encode_header(r.header, o.header);
  ++staged_count;
}

namespace {
// The length of the slice at `c`.
uint64_t slice_at(const OpState& op, const LaneCursor& c) {
  const OpEntry& e = op.entries[c.entry];
  return std::min<uint64_t>(e.length - c.offset, op.slice_bytes);
}
}  // namespace

// Stages the lane's next slices of a write or read as one group frame when at least two of them
// are small; false (nothing staged) otherwise.
bool TcpChannel::Stream::stage_group_locked(OpState* op, int lane, std::size_t group_bytes) {
  LaneCursor& c = op->lanes[lane];
  if (c.remaining < 2 || (op->kind != OpKind::kWrite && op->kind != OpKind::kRead)) return false;
  auto step = static_cast<uint64_t>(op->lane_count);
  uint64_t first = slice_at(*op, c);
  LaneCursor next = c;
  advance(*op, next, step);
  uint64_t second = slice_at(*op, next);
  uint64_t limit = std::min<uint64_t>(op->slice_bytes, group_bytes);
  if (first > kMaxGroupedSlice || second > kMaxGroupedSlice || first + second > limit) return false;

  bool write = op->kind == OpKind::kWrite;
  Outbound& o = staged[(staged_head + staged_count) % kMaxStaged];
  o.table.reserve(kGroupTableBytes);
  o.table.clear();
  o.segments.reserve(kMaxGroupEntries);
  o.segments.clear();
  uint32_t n = 0;
  uint64_t bytes = 0;
  while (c.remaining > 0 && n < kMaxGroupEntries) {
    const OpEntry& e = op->entries[c.entry];
    uint64_t length = slice_at(*op, c);
    if (length > kMaxGroupedSlice || bytes + length > limit) break;
    GroupEntry g{e.remote_region, static_cast<uint32_t>(length), e.remote_key,
                 e.remote_offset + c.offset, c.entry};
    o.table.resize(o.table.size() + kGroupEntrySize);
    encode_group_entry(g, o.table.data() + o.table.size() - kGroupEntrySize);
    if (write) o.segments.push_back({e.local + c.offset, length});
    bytes += length;
    ++n;
    --c.remaining;
    advance(*op, c, step);
  }
  FrameHeader h;
  h.op_id = op->id.load(std::memory_order_relaxed);
  h.type = write ? TcpFrame::kWriteGroup : TcpFrame::kReadGroupReq;
  h.region_id = n;
  h.length = static_cast<uint32_t>(o.table.size() + (write ? bytes : 0));
  if (write && op->with_imm) {
    h.flags = kFlagImm | (c.remaining == 0 ? kFlagLastOnStream : 0);
    h.aux32 = op->imm;
    h.aux64 = static_cast<uint64_t>(op->lane_count);
  }
  o.payload = o.table.data();
  o.payload_length = o.table.size();
  o.wire = core::kFrameHeaderSize + h.length;
  o.asks = write ? 0 : bytes;
  o.lease = nullptr;
  core::encode_header(h, o.header);
  ++staged_count;
  --credits;
  ++outstanding;
  return true;
}

// `group_bytes`: the most data a group frame may move (the caller's budget; else unlimited, and
// a group moves at most a slice).
void TcpChannel::Stream::stage_slice_locked(OpState* op, int lane, std::size_t group_bytes) {
  if (stage_group_locked(op, lane, group_bytes)) return;
  LaneCursor& c = op->lanes[lane];
  const OpEntry& e = op->entries[c.entry];
  uint64_t length = e.length - c.offset;
  if (length > op->slice_bytes) length = op->slice_bytes;

  FrameHeader h;
  h.op_id = op->id.load(std::memory_order_relaxed);
  h.length = static_cast<uint32_t>(length);
  Outbound& o = staged[(staged_head + staged_count) % kMaxStaged];
  o.payload = nullptr;
  o.payload_length = 0;
  o.lease = nullptr;
  switch (op->kind) {
    case OpKind::kWrite:
      h.type = TcpFrame::kWrite;
      h.region_id = e.remote_region;
      h.key = e.remote_key;
      h.offset = e.remote_offset + c.offset;
      if (op->with_imm) {
        h.flags = kFlagImm | (c.remaining == 1 ? kFlagLastOnStream : 0);
        h.aux32 = op->imm;
        h.aux64 = static_cast<uint64_t>(op->lane_count);
      }
      o.payload = e.local + c.offset;
      o.payload_length = length;
      break;
    case OpKind::kRead:
      h.type = TcpFrame::kReadReq;
      h.region_id = e.remote_region;
      h.key = e.remote_key;
      h.offset = e.remote_offset + c.offset;
      h.aux32 = c.entry;
      h.aux64 = c.offset;
      break;
    case OpKind::kSend:
      h.type = TcpFrame::kSend;
      h.key = op->tag;
      if (rendezvous(*op)) {  // the bytes follow the receiver's kSendCts, uncounted by credits
        h.flags = kFlagAnnounce;
        ++credits;
        --outstanding;
        break;
      }
      o.payload = e.local;
      o.payload_length = length;
      break;
    case OpKind::kRecv:
      break;  // never queued
  }
  o.wire = core::kFrameHeaderSize + o.payload_length;
  o.asks = op->kind == OpKind::kRead ? length : 0;
  core::encode_header(h, o.header);
  ++staged_count;
  --credits;
  ++outstanding;
  --c.remaining;
  advance(*op, c, static_cast<uint64_t>(op->lane_count));
}

// Stages answers and slices until the ring is full or frames of `budget` bytes are staged,
// counting the bytes a read request asks for (the caller of post() stages no more than it
// sends itself, and asks for no more than that either).
bool TcpChannel::Stream::stage_more_locked(std::size_t budget) {
  bool staged_any = false;
  auto weight = [](const Outbound& o) { return o.wire + o.asks; };
  std::size_t staged_bytes = 0;
  for (int i = 0; i < staged_count; ++i)
    staged_bytes += weight(staged[(staged_head + i) % kMaxStaged]);
  while (staged_count < kMaxStaged && staged_bytes < budget) {
    if (!responses.empty()) {
      stage_response_locked(responses.front());
      responses.pop_front();
    } else if (queue_head != nullptr && credits > 0 && !answers_only) {
      OpState* op = queue_head;
      int lane = lane_of(op);
      stage_slice_locked(op, lane, budget - staged_bytes);
      if (op->lanes[lane].remaining == 0) {
        queue_head = op->lane_next[lane];
        if (queue_head == nullptr) queue_tail = nullptr;
      }
    } else {
      break;
    }
    staged_any = true;
    staged_bytes += weight(staged[(staged_head + staged_count - 1) % kMaxStaged]);
  }
  return staged_any;
}

Status TcpChannel::Stream::flush_locked() {
  std::size_t unlimited = SIZE_MAX;
  return flush_locked(unlimited);
}

// Sends what is staged and queued until the socket is full, or `budget` bytes were offered
// (then the progress thread goes on when the socket is writable); takes what it offered off
// the budget.
Status TcpChannel::Stream::flush_locked(std::size_t& budget) {
  if (closed) return {};
  Status st = send_staged_locked(budget);
  if (read_paused.load() && responses.size() <= response_limit / 2 &&
      group_answers <= group_answer_limit / 2) {
    resume_reading_locked();
  }
  return st;
}

Status TcpChannel::Stream::send_staged_locked(std::size_t& budget) {
  for (;;) {
    if (budget == 0) {  // the progress thread goes on (it finds nothing to do, at worst)
      arm_locked(true);
      return {};
    }
    stage_more_locked(budget);
    if (staged_count == 0) {
      arm_locked(false);
      return {};
    }
    iovec iov[kMaxSendIov];
    int n = 0;
    std::size_t total = 0;
    // The frames' pieces past what was sent, as many as one call takes.
    auto add = [&](const uint8_t* p, std::size_t length, std::size_t& skip) {
      if (skip >= length) {
        skip -= length;
        return true;
      }
      if (n == kMaxSendIov) return false;
      iov[n++] = {const_cast<uint8_t*>(p) + skip, length - skip};
      total += length - skip;
      skip = 0;
      return true;
    };
    for (int i = 0; i < staged_count; ++i) {
      if (i > 0 && total >= budget) break;  // whole frames, at least the first
      Outbound& o = staged[(staged_head + i) % kMaxStaged];
      std::size_t skip = i == 0 ? front_sent : 0;
      bool fits = add(o.header, core::kFrameHeaderSize, skip) &&
                  (o.payload_length == 0 || add(o.payload, o.payload_length, skip));
      for (std::size_t k = 0; fits && k < o.segments.size(); ++k) {
        if (o.segments[k].length > 0) fits = add(o.segments[k].data, o.segments[k].length, skip);
      }
      if (!fits) break;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    ssize_t sent = ::sendmsg(fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        arm_locked(true);
        return {};
      }
      return core::sys_status("sendmsg on stream " + std::to_string(index), errno,
                              ErrorCode::kPeerLost);
    }
    auto left = static_cast<std::size_t>(sent);
    std::size_t spent = left;  // what went out, and what the read requests that went ask for
    while (staged_count > 0) {
      Outbound& o = staged[staged_head];
      std::size_t frame_left = o.wire - front_sent;
      if (left < frame_left) {
        front_sent += left;
        break;
      }
      left -= frame_left;
      spent += o.asks;
      front_sent = 0;
      if (o.lease != nullptr) RegionTable::release(o.lease);
      o.lease = nullptr;
      o.text.clear();
      o.segments.clear();
      release_all(o.leases);
      staged_head = (staged_head + 1) % kMaxStaged;
      --staged_count;
    }
    if (budget != SIZE_MAX) budget -= std::min(budget, spent);
    if (static_cast<std::size_t>(sent) < total) {
      arm_locked(true);
      return {};
    }
  }
}

}  // namespace ferry::transport::tcp
