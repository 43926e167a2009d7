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

#include "core/sys.hpp"

namespace ferry::transport::tcp {

using core::FrameHeader;
using core::FrameType;

namespace {
// Frames handed to one writev. 64 covers a full window of 64 KiB slices plus acks; more did not
// raise loopback bandwidth (docs/performance.md).
constexpr int kMaxStaged = 64;
// Staging buffer for small frames; one recv drains many acks or small writes at once. It starts
// at kRecvBufferInitial and doubles, up to kRecvBufferBytes, whenever a recv fills it: an idle
// or quiet stream holds little, a busy one soon drains a whole window per recv.
constexpr std::size_t kRecvBufferInitial = 16 << 10;
constexpr std::size_t kRecvBufferBytes = 256 << 10;
// An unmatched message's buffer: allocated when its first bytes arrive, at this size or its
// length if smaller, then at most doubled each time it is full, up to the length its header
// announced. What a peer makes us allocate stays within twice what it really sent.
constexpr std::size_t kMessageBufferInitial = 16 << 10;
// Payload left at or above this is received straight into its destination, skipping the copy.
constexpr std::size_t kDirectRecvMin = 16 << 10;
// A stream's work per wake-up, before it yields to the loop's other sockets, so that one
// flooding peer cannot monopolise a progress thread: at most this many recv calls (each at most
// the staging buffer, or what the socket holds of one large payload)...
constexpr int kRecvCallsPerEvent = 16;
// ...and at most this many bytes (a large payload is received straight into its destination,
// up to a slice per call): a peer flooding 8 MiB writes put 9.8 ms of p99 on another peer's
// 8-byte writes with 16 calls of up to 1 MiB per wake-up on one progress thread.
constexpr std::size_t kRecvBytesPerEvent = 1 << 20;
// ...and this many frames. Frames left in the staging buffer are taken up by a task posted to
// the loop, behind the other sockets' events.
constexpr int kFramesPerEvent = 256;
// Responses (acks, read data) a stream queues for its peer before it stops reading from it: a
// peer that asks faster than it reads the answers is not read until they drain to half. At
// least this many, and twice the requests a peer of our configuration keeps in flight, so
// that two honest peers never both stop reading.
constexpr std::size_t kMinResponseLimit = 1024;
// Unfinished write_with_imm operations a peer may have open at once on this connection.
constexpr std::size_t kMaxImmInProgress = 1 << 16;
// Slices of a write or read at most this long travel in group frames (kWriteGroup,
// kReadGroupReq) with the lane's next slices of the same op, up to kMaxGroupEntries of them and
// slice_bytes in all: one header, one credit and one answer for the lot.
constexpr uint64_t kMaxGroupedSlice = 64 << 10;
constexpr std::size_t kGroupTableBytes =
    std::size_t{core::kMaxGroupEntries} * core::kGroupEntrySize;
// Bytes a caller's post() stages and sends itself, over all the op's streams, before it leaves
// the rest to the progress thread (EPOLLOUT); whole frames, at least the first: an operation of
// one slice goes out without a thread hop, as before, and a large batch's write() returns after
// its first frame (one group), not after its whole transfer.
constexpr std::size_t kCallerSendBytes = 64 << 10;
// Pieces handed to one sendmsg / recvmsg (Linux's IOV_MAX is 1024).
constexpr int kMaxSendIov = 1024;
constexpr int kMaxRecvIov = static_cast<int>(core::kMaxGroupEntries);  // a whole group
// One of them: the map's node (key, value, link, allocator header) and its bucket.
constexpr std::size_t kImmProgressBytes = 64;

Status peer_lost(const std::string& what) { return {ErrorCode::kPeerLost, what}; }
}  // namespace

namespace {
// Group answers a stream queues for its peer before it stops reading from it: twice the group
// requests a peer of our configuration keeps in flight (each is one request).
std::size_t group_answers_allowed(const TcpOptions& options) {
  return 2 * static_cast<std::size_t>(std::max(options.slices_in_flight_per_stream, 1));
}
}  // namespace

// A piece of a group frame's payload: one entry's bytes.
struct Segment {
  const uint8_t* data;
  uint64_t length;
};

// An outbound frame: header plus optional payload, and what to release once it is on the wire.
// A group frame's payload is its entry table (`table`, pointed to by `payload`) followed by
// `segments`.
struct Outbound {
  uint8_t header[core::kFrameHeaderSize];
  const uint8_t* payload = nullptr;
  uint64_t payload_length = 0;  // of the first piece after the header
  uint64_t wire = 0;            // the whole frame: header, payload and segments
  uint64_t asks = 0;            // a read request: the bytes it asks the peer to send
  RegionSlot* lease = nullptr;  // region held while its bytes are being sent
  std::string text;             // error text payload
  std::vector<uint8_t> table;   // capacity kept across reuses
  std::vector<Segment> segments;
  std::vector<RegionSlot*> leases;  // regions of a group answer's entries
};

// A response the progress thread owes the peer: an ack or read data.
struct Response {
  FrameHeader header;
  const uint8_t* payload = nullptr;
  RegionSlot* lease = nullptr;
  std::string text;
  // A kReadGroupData answer: the echoed entry table, the entries' bytes and their regions.
  std::vector<uint8_t> table;
  std::vector<Segment> segments;
  std::vector<RegionSlot*> leases;
};

namespace {
void release_all(std::vector<RegionSlot*>& leases) {
  for (RegionSlot* l : leases) RegionTable::release(l);
  leases.clear();
}

// Where a group frame's entry goes: null `addr` discards its bytes.
struct GroupDst {
  uint8_t* addr;
  uint64_t length;
};
}  // namespace

struct TcpChannel::Stream final : core::Reactor::Handler {
  Stream(TcpChannel& channel, int index)
      : ch(channel),
        index(index),
        response_limit(
            std::max(kMinResponseLimit, 2 * static_cast<std::size_t>(std::max(
                                                channel.options_.slices_in_flight_per_stream, 1)))),
        group_answer_limit(group_answers_allowed(channel.options_)) {}

  TcpChannel& ch;
  const int index;
  int loop = 0;
  core::Fd fd;
  std::shared_ptr<TcpChannel> keep_channel;  // dropped when the stream stops
  bool attached = false;                     // set once under the channel's close_mu_
  bool stopped = false;                      // loop thread only

  // ---- receive side: loop thread only ----
  std::vector<uint8_t> rbuf = std::vector<uint8_t>(kRecvBufferInitial);
  std::size_t rpos = 0, rend = 0;
  bool in_payload = false;
  FrameHeader cur;
  uint8_t* sink = nullptr;    // where payload bytes go; null: discard
  uint64_t sink_left = 0;     // bytes still to place in sink
  uint64_t discard_left = 0;  // bytes to drop after the sink is full
  Status frame_error;         // why the current inbound frame is refused
  RegionUse frame_use;        // target region of the current kWrite
  OpState* frame_op = nullptr;
  std::vector<uint8_t> frame_text;    // error text: at most core::kMaxErrorText bytes
  std::vector<uint8_t> frame_buffer;  // unexpected send() message, grown as its bytes arrive
  uint64_t frame_copied = 0;          // bytes of it received
  bool sink_grows = false;            // sink is frame_buffer (see sink_room)
  bool frame_counted = false;         // the matcher counts the message until commit or abandon
  // A group frame (kWriteGroup, kReadGroupReq, kReadGroupData) being received: first its table
  // into group_table, then each entry's bytes to group_dst[i]. Sized by kMaxGroupEntries when
  // the first group arrives, never by what a header announces.
  bool group = false;
  bool group_table_done = false;
  uint32_t group_next = 0;  // the next entry to start
  std::vector<uint8_t> group_table;
  std::vector<core::GroupEntry> group_entries;
  std::vector<GroupDst> group_dst;
  std::vector<RegionUse> group_uses;  // target of a kWriteGroup: its entries' regions
  bool need_flush = false;
  bool last_payload_large = false;
  std::size_t wake_bytes = 0;  // received in this wake-up (kRecvBytesPerEvent)
  // Announced messages a receive took, by the sender's op id, until their bytes come.
  std::unordered_map<uint64_t, OpState*> announced;
  std::atomic<bool> resume_posted{false};  // a task to go on reading is queued on the loop

  // ---- send side: guarded by send_mu ----
  std::mutex send_mu;
  bool closed = false;
  bool want_out = false;
  bool answers_only = false;              // closing: send what the peer is owed, start nothing new
  uint32_t armed = EPOLLIN | EPOLLRDHUP;  // events registered with the loop
  // Responses over response_limit: the loop reads no new frame (written under send_mu).
  std::atomic<bool> read_paused{false};
  const std::size_t response_limit;
  // Group answers (kReadGroupData, each holding up to 14 KiB of table, pieces and leases)
  // queued: over group_answer_limit the loop reads no new frame either (under send_mu).
  std::size_t group_answers = 0;
  const std::size_t group_answer_limit;
  OpState* queue_head = nullptr;
  OpState* queue_tail = nullptr;
  core::Ring<Response> responses;
  Outbound staged[kMaxStaged];
  int staged_head = 0, staged_count = 0;
  std::size_t front_sent = 0;
  int credits = 0;
  int outstanding = 0;  // slices sent and not yet answered

  int lane_of(const OpState* op) const {
    int n = static_cast<int>(ch.streams_.size());
    int lane = (index - op->first_lane + n) % n;
    return lane < op->lane_count ? lane : -1;
  }

  void on_event(uint32_t events) override;

  // All called with send_mu held.
  void enqueue_locked(OpState* op);
  bool stage_more_locked(std::size_t budget);
  Status flush_locked();
  Status flush_locked(std::size_t& budget);
  Status send_staged_locked(std::size_t& budget);
  void arm_locked(bool out);
  void update_events_locked();
  void resume_reading_locked();
  void post_resume();  // any thread
  void stage_response_locked(Response& r);
  void stage_slice_locked(OpState* op, int lane, std::size_t group_bytes);
  bool stage_group_locked(OpState* op, int lane, std::size_t group_bytes);

  // Loop thread.
  Status read_some(bool& would_block);
  Status consume(int& frames);
  Status recv_into(uint8_t* dst, std::size_t len, std::size_t& got, bool& would_block);
  Status begin_frame();
  Status end_frame();
  Status lookup_reply_op(OpKind kind);
  bool rendezvous(const OpState& send) const {
    return send.entries[0].length > ch.options_.eager_bytes;
  }
  // A receive took the announced message `sender_op`: its bytes are asked for (loop thread).
  void clear_to_send(uint64_t sender_op, OpState* recv);
  // The same, for a receive posted after the announcement (any thread).
  void taken_later(const std::shared_ptr<Stream>& self, uint64_t sender_op, OpState* recv);
  Status on_announce();
  Status on_clear_to_send();
  Status begin_group();
  Status group_next_part(bool& more);
  Status recv_group_direct(bool& would_block);
  void answer_read_group();
  void respond_group(FrameHeader h, std::vector<uint8_t> table, std::vector<Segment> segments,
                     std::vector<RegionSlot*> leases);
  std::size_t sink_room(std::size_t n);
  void sank(std::size_t n);
  void respond(FrameHeader h, const Status& status, const uint8_t* payload = nullptr,
               RegionSlot* lease = nullptr);
  void fail(const Status& reason);
  void stop();
  // Whether the stream is placing bytes into [base, base + length) or sending from it (loop
  // thread).
  bool touches(const uint8_t* base, uint64_t length);
};

// ---------------------------------------------------------------------------------------------
// Channel

std::shared_ptr<TcpChannel> TcpChannel::create(Host& host, std::shared_ptr<PeerLink> link,
                                               const TcpOptions& options,
                                               std::function<void(const Status&)> on_closed) {
  return std::shared_ptr<TcpChannel>(
      new TcpChannel(host, std::move(link), options, std::move(on_closed)));
}

TcpChannel::TcpChannel(Host& host, std::shared_ptr<PeerLink> link, const TcpOptions& options,
                       std::function<void(const Status&)> on_closed)
    : host_(host), link_(std::move(link)), options_(options), on_closed_(std::move(on_closed)) {
  if (options_.streams < 1 || options_.streams > OpState::kMaxLanes) {
    throw Error(ErrorCode::kInvalidArgument,
                "tcp_streams must be 1.." + std::to_string(OpState::kMaxLanes));
  }
  for (int i = 0; i < options_.streams; ++i) {
    auto s = std::make_shared<Stream>(*this, i);
    s->credits = options_.slices_in_flight_per_stream;
    streams_.push_back(std::move(s));
  }
}

TcpChannel::~TcpChannel() = default;

Status TcpChannel::attach(int index, core::Fd fd) {
  if (index < 0 || index >= static_cast<int>(streams_.size())) {
    return {ErrorCode::kProtocol, "join: stream index " + std::to_string(index) + " out of range"};
  }
  // Under close_mu_, so a concurrent close() either sees this stream attached or refuses it.
  std::lock_guard close_lock(close_mu_);
  if (closing_.load()) return {ErrorCode::kPeerLost, "join: connection already closed"};
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
  // Never under a send lock: close() takes close_mu_, which comes first (see attach()).
  if (!failed.ok()) close(failed);
  return result;
}

void TcpChannel::close(const Status& reason) {
  std::vector<std::shared_ptr<Stream>> attached;
  {
    std::lock_guard lock(close_mu_);
    if (closing_.exchange(true)) return;
    close_reason_ = reason;
    for (auto& s : streams_) {
      if (s->attached) attached.push_back(s);
    }
    // Counts as one live stream until the loop below is done, so the last stream to stop
    // cannot finish the close before every stop was scheduled.
    live_streams_.fetch_add(1);
  }
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
  if (closing_.load()) return;
  auto self = shared_from_this();
  for (auto& s : streams_) {
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
  std::size_t responses =
      2 * std::bit_ceil(response_limit) * (sizeof(Response) + core::kMaxErrorText);
  // A group frame's parts: received (table, decoded entries, destinations, region uses) and
  // sent or queued (table, pieces, leases), in each of the staged frames and queued answers.
  std::size_t group_in =
      kGroupTableBytes +
      core::kMaxGroupEntries * (sizeof(core::GroupEntry) + sizeof(GroupDst) + sizeof(RegionUse));
  std::size_t group_out =
      kGroupTableBytes + core::kMaxGroupEntries * (sizeof(Segment) + sizeof(RegionSlot*));
  std::size_t per_stream = sizeof(Stream) + kRecvBufferBytes + core::kMaxErrorText + responses +
                           kMaxStaged * core::kMaxErrorText + group_in +
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
      std::lock_guard lock(close_mu_);
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
  if (live_streams_.fetch_sub(1) != 1 || !closing_.load()) return;
  // Nothing receives into or sends from user memory any more.
  Status reason;
  {
    std::lock_guard lock(close_mu_);
    reason = close_reason_;
  }
  if (on_closed_) on_closed_(reason);
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
  o.payload_length = core::payload_length(r.header);
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
  o.segments.reserve(core::kMaxGroupEntries);
  o.segments.clear();
  uint32_t n = 0;
  uint64_t bytes = 0;
  while (c.remaining > 0 && n < core::kMaxGroupEntries) {
    const OpEntry& e = op->entries[c.entry];
    uint64_t length = slice_at(*op, c);
    if (length > kMaxGroupedSlice || bytes + length > limit) break;
    core::GroupEntry g{e.remote_region, static_cast<uint32_t>(length), e.remote_key,
                       e.remote_offset + c.offset, c.entry};
    o.table.resize(o.table.size() + core::kGroupEntrySize);
    core::encode_group_entry(g, o.table.data() + o.table.size() - core::kGroupEntrySize);
    if (write) o.segments.push_back({e.local + c.offset, length});
    bytes += length;
    ++n;
    --c.remaining;
    advance(*op, c, step);
  }
  FrameHeader h;
  h.op_id = op->id.load(std::memory_order_relaxed);
  h.type = write ? FrameType::kWriteGroup : FrameType::kReadGroupReq;
  h.region_id = n;
  h.length = static_cast<uint32_t>(o.table.size() + (write ? bytes : 0));
  if (write && op->with_imm) {
    h.flags = core::kFlagImm | (c.remaining == 0 ? core::kFlagLastOnStream : 0);
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
      h.type = FrameType::kWrite;
      h.region_id = e.remote_region;
      h.key = e.remote_key;
      h.offset = e.remote_offset + c.offset;
      if (op->with_imm) {
        h.flags = core::kFlagImm | (c.remaining == 1 ? core::kFlagLastOnStream : 0);
        h.aux32 = op->imm;
        h.aux64 = static_cast<uint64_t>(op->lane_count);
      }
      o.payload = e.local + c.offset;
      o.payload_length = length;
      break;
    case OpKind::kRead:
      h.type = FrameType::kReadReq;
      h.region_id = e.remote_region;
      h.key = e.remote_key;
      h.offset = e.remote_offset + c.offset;
      h.aux32 = c.entry;
      h.aux64 = c.offset;
      break;
    case OpKind::kSend:
      h.type = FrameType::kSend;
      h.key = op->tag;
      if (rendezvous(*op)) {  // the bytes follow the receiver's kSendCts, uncounted by credits
        h.flags = core::kFlagAnnounce;
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

// ---------------------------------------------------------------------------------------------
// Receive side

void TcpChannel::Stream::respond(FrameHeader h, const Status& status, const uint8_t* payload,
                                 RegionSlot* lease) {
  Response r;
  h.status = static_cast<uint16_t>(status.code());
  if (!status.ok()) {
    r.text = status.message().substr(0, core::kMaxErrorText);
    h.length = 0;  // set from the text when staged
  }
  r.header = h;
  r.payload = payload;
  r.lease = lease;
  std::lock_guard lock(send_mu);
  if (closed) {
    if (lease != nullptr) RegionTable::release(lease);
    return;
  }
  responses.push_back(std::move(r));
  need_flush = true;
  if (responses.size() >= response_limit && !read_paused.load()) {
    read_paused.store(true);  // no new frame is read until the peer takes its answers
    update_events_locked();
  }
}

void TcpChannel::Stream::respond_group(FrameHeader h, std::vector<uint8_t> table,
                                       std::vector<Segment> segments,
                                       std::vector<RegionSlot*> leases) {
  Response r;
  r.header = h;
  r.table = std::move(table);
  r.segments = std::move(segments);
  r.leases = std::move(leases);
  std::lock_guard lock(send_mu);
  if (closed) {
    release_all(r.leases);
    return;
  }
  responses.push_back(std::move(r));
  ++group_answers;
  need_flush = true;
  if ((responses.size() >= response_limit || group_answers >= group_answer_limit) &&
      !read_paused.load()) {
    read_paused.store(true);
    update_events_locked();
  }
}

Status TcpChannel::Stream::lookup_reply_op(OpKind kind) {
  frame_op = ch.link_->pool->lookup(cur.op_id);
  if (frame_op == nullptr || frame_op->kind != kind) {
    return {ErrorCode::kProtocol, "reply for unknown operation " + std::to_string(cur.op_id)};
  }
  if (kind == OpKind::kSend && rendezvous(*frame_op)) return {};  // it took no credit
  std::lock_guard lock(send_mu);
  if (outstanding == 0) return {ErrorCode::kProtocol, "reply with no request outstanding"};
  --outstanding;
  ++credits;
  if (queue_head != nullptr) need_flush = true;
  return {};
}

Status TcpChannel::Stream::begin_frame() {
  sink = nullptr;
  sink_left = 0;
  discard_left = 0;
  frame_error = {};
  frame_op = nullptr;
  frame_copied = 0;
  sink_grows = false;
  uint64_t payload = core::payload_length(cur);
  bool error_text = cur.status != 0 && payload > 0;

  group = false;

  switch (cur.type) {
    case FrameType::kWriteGroup:
    case FrameType::kReadGroupReq:
      return begin_group();
    case FrameType::kReadGroupData: {
      if (Status st = lookup_reply_op(OpKind::kRead); !st.ok()) return st;
      if (cur.region_id > frame_op->pending.load(std::memory_order_relaxed)) {
        return {ErrorCode::kProtocol, "read data for " + std::to_string(cur.region_id) +
                                          " entries, more than were asked for"};
      }
      if (error_text) {
        frame_text.resize(payload);  // decode_header allows at most kMaxErrorText
        sink = frame_text.data();
        sink_left = payload;
        return {};
      }
      return begin_group();
    }
    case FrameType::kWrite: {
      uint8_t* addr = nullptr;
      frame_error = ch.host_.regions().acquire(cur.region_id, cur.key, cur.offset, cur.length,
                                               Access::kRemoteWrite, &addr, frame_use);
      if (frame_error.ok()) {
        sink = addr;
        sink_left = payload;
      } else {
        discard_left = payload;
      }
      return {};
    }
    case FrameType::kReadReq: {
      uint8_t* addr = nullptr;
      RegionUse use;
      Status st = ch.host_.regions().acquire(cur.region_id, cur.key, cur.offset, cur.length,
                                             Access::kRemoteRead, &addr, use);
      FrameHeader h;
      h.type = FrameType::kReadData;
      h.op_id = cur.op_id;
      h.aux32 = cur.aux32;
      h.aux64 = cur.aux64;
      if (st.ok()) {
        h.length = cur.length;
        respond(h, st, addr, use.detach());
      } else {
        respond(h, Status(st.code(), "read: " + st.message()));
      }
      return {};
    }
    case FrameType::kReadData: {
      if (Status st = lookup_reply_op(OpKind::kRead); !st.ok()) return st;
      if (error_text) {
        frame_text.resize(payload);  // decode_header allows at most kMaxErrorText
        sink = frame_text.data();
        sink_left = payload;
        return {};
      }
      if (cur.aux32 >= frame_op->entries.size()) {
        return {ErrorCode::kProtocol, "read data for entry " + std::to_string(cur.aux32) + " of " +
                                          std::to_string(frame_op->entries.size())};
      }
      const OpEntry& e = frame_op->entries[cur.aux32];
      if (cur.aux64 > e.length || payload > e.length - cur.aux64 ||
          payload > frame_op->slice_bytes) {
        return {ErrorCode::kProtocol, "read data outside the requested range"};
      }
      sink = e.local + cur.aux64;
      sink_left = payload;
      return {};
    }
    case FrameType::kWriteAck:
    case FrameType::kSendAck: {
      OpKind kind = cur.type == FrameType::kWriteAck ? OpKind::kWrite : OpKind::kSend;
      if (Status st = lookup_reply_op(kind); !st.ok()) return st;
      if (cur.aux32 > 1 && cur.aux32 > frame_op->pending.load(std::memory_order_relaxed)) {
        return {ErrorCode::kProtocol,
                "ack for " + std::to_string(cur.aux32) + " entries, more than were sent"};
      }
      frame_text.resize(payload);  // error text: decode_header allows at most kMaxErrorText
      sink = frame_text.data();
      sink_left = payload;
      return {};
    }
    case FrameType::kSendCts:
      return on_clear_to_send();
    case FrameType::kSend: {
      if (cur.flags & core::kFlagAnnounce) return on_announce();
      if (cur.flags & core::kFlagRendezvous) {
        auto it = announced.find(cur.op_id);
        if (it == announced.end()) {
          return {ErrorCode::kProtocol,
                  "message bytes nobody asked for (op " + std::to_string(cur.op_id) + ")"};
        }
        frame_op = it->second;
        announced.erase(it);
        const OpEntry& dst = frame_op->entries[0];
        sink = dst.local;
        sink_left = payload < dst.length ? payload : dst.length;
        discard_left = payload - sink_left;
        return {};
      }
      Matcher::Arrival a = ch.link_->matcher.arrive(cur.key, payload);
      if (!a.error.ok()) {
        frame_error = a.error;
        discard_left = payload;
      } else if (a.recv != nullptr) {
        frame_op = a.recv;
        const OpEntry& dst = a.recv->entries[0];
        sink = dst.local;
        sink_left = payload < dst.length ? payload : dst.length;
        discard_left = payload - sink_left;
      } else {
        // Counted by the matcher; nothing is allocated until bytes arrive (sink_room).
        frame_counted = true;
        frame_buffer.clear();
        sink_grows = true;
        sink = frame_buffer.data();
        sink_left = payload;
      }
      return {};
    }
    default:
      return {ErrorCode::kProtocol, "unexpected frame type " +
                                        std::to_string(static_cast<int>(cur.type)) +
                                        " on a data stream"};
  }
}

// A group frame's table comes first, into a buffer of the largest table's size.
Status TcpChannel::Stream::begin_group() {
  if (group_table.size() < kGroupTableBytes) {
    group_table.resize(kGroupTableBytes);
    group_entries.resize(core::kMaxGroupEntries);
    group_dst.reserve(core::kMaxGroupEntries);
    group_uses.reserve(core::kMaxGroupEntries);
  }
  group = true;
  group_table_done = false;
  group_next = 0;
  group_dst.clear();
  sink = group_table.data();
  sink_left = std::size_t{cur.region_id} * core::kGroupEntrySize;  // decode_header: <= length
  return {};
}

// The current group frame's next part, once the previous one is complete: after the table,
// where each entry's bytes go. `more`: a part with bytes follows (sink or discard set).
Status TcpChannel::Stream::group_next_part(bool& more) {
  more = false;
  if (!group) return {};
  uint32_t n = cur.region_id;
  if (!group_table_done) {
    group_table_done = true;
    uint64_t total = 0;
    std::size_t table = std::size_t{n} * core::kGroupEntrySize;
    if (Status st =
            core::decode_group_table(group_table.data(), table, n, group_entries.data(), total);
        !st.ok()) {
      return st;
    }
    if (cur.type == FrameType::kReadGroupReq) return {};  // answered by end_frame
    if (total != cur.length - table) {
      return {ErrorCode::kProtocol, "group of " + std::to_string(total) + " bytes in a frame of " +
                                        std::to_string(cur.length - table)};
    }
    for (uint32_t i = 0; i < n; ++i) {
      const core::GroupEntry& g = group_entries[i];
      if (cur.type == FrameType::kWriteGroup) {
        // Each entry is checked as a kWrite is: region, key, permission, bounds, revocation.
        // A refused entry's bytes are dropped; the first refusal is the answer.
        uint8_t* addr = nullptr;
        RegionUse use;
        Status st = ch.host_.regions().acquire(g.region_id, g.key, g.offset, g.length,
                                               Access::kRemoteWrite, &addr, use);
        if (!st.ok() && frame_error.ok()) {
          frame_error = {st.code(), "write entry " + std::to_string(g.index) + ": " + st.message()};
        }
        group_dst.push_back({st.ok() ? addr : nullptr, g.length});
        group_uses.push_back(std::move(use));
      } else {
        // Read data: each entry must fall inside the op's entry it names, as for kReadData.
        const std::vector<OpEntry>& entries = frame_op->entries;
        if (g.index >= entries.size()) {
          return {ErrorCode::kProtocol, "read data for entry " + std::to_string(g.index) + " of " +
                                            std::to_string(entries.size())};
        }
        const OpEntry& e = entries[g.index];
        if (g.offset < e.remote_offset || g.offset - e.remote_offset > e.length ||
            g.length > e.length - (g.offset - e.remote_offset) ||
            g.length > frame_op->slice_bytes) {
          return {ErrorCode::kProtocol, "read data outside the requested range"};
        }
        group_dst.push_back({e.local + (g.offset - e.remote_offset), g.length});
      }
    }
  }
  while (group_next < group_dst.size()) {
    const GroupDst& d = group_dst[group_next++];
    if (d.length == 0) continue;
    if (d.addr != nullptr) {
      sink = d.addr;
      sink_left = d.length;
    } else {
      discard_left = d.length;
    }
    more = true;
    return {};
  }
  return {};
}

// Receives straight into the current entry and the group's next ones, one recvmsg for many
// small entries; used when no byte is buffered.
Status TcpChannel::Stream::recv_group_direct(bool& would_block) {
  // At most what is left of this wake-up's byte budget (kRecvBytesPerEvent), as recv_into.
  std::size_t budget = kRecvBytesPerEvent - std::min(wake_bytes, kRecvBytesPerEvent - 1);
  iovec iov[kMaxRecvIov];
  int n = 0;
  std::size_t offered = std::min<std::size_t>(sink_left, budget);
  iov[n++] = {sink, offered};
  for (std::size_t i = group_next; i < group_dst.size() && n < kMaxRecvIov && offered < budget;
       ++i) {
    if (group_dst[i].length == 0) continue;
    if (group_dst[i].addr == nullptr) break;  // dropped bytes go through the staging buffer
    std::size_t take = std::min<std::size_t>(group_dst[i].length, budget - offered);
    iov[n++] = {group_dst[i].addr, take};
    offered += take;
  }
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(n);
  ssize_t got = ::recvmsg(fd.get(), &msg, MSG_DONTWAIT);
  if (got == 0) return peer_lost("stream " + std::to_string(index) + ": connection closed by peer");
  if (got < 0) {
    if (errno == EAGAIN || errno == EINTR) {
      would_block = errno == EAGAIN;
      return {};
    }
    return core::sys_status("recv on stream " + std::to_string(index), errno, ErrorCode::kPeerLost);
  }
  wake_bytes += static_cast<std::size_t>(got);
  // Hand the bytes to the entries in order: the next ones were all in the vector.
  auto left = static_cast<std::size_t>(got);
  for (;;) {
    std::size_t take = std::min<std::size_t>(left, sink_left);
    sank(take);
    left -= take;
    if (left == 0) return {};
    bool more = false;
    if (Status st = group_next_part(more); !st.ok()) return st;
    if (!more || sink_left == 0) return {ErrorCode::kProtocol, "group receive out of step"};
  }
}

// A kReadGroupReq's table has arrived: every entry checked as a kReadReq is, then one answer
// with all their bytes, or the first refusal.
void TcpChannel::Stream::answer_read_group() {
  uint32_t n = cur.region_id;
  FrameHeader h;
  h.type = FrameType::kReadGroupData;
  h.op_id = cur.op_id;
  h.region_id = n;
  std::vector<Segment> segments;
  std::vector<RegionSlot*> leases;
  segments.reserve(n);
  leases.reserve(n);
  uint64_t total = std::size_t{n} * core::kGroupEntrySize;
  Status refused;
  for (uint32_t i = 0; i < n && refused.ok(); ++i) {
    const core::GroupEntry& g = group_entries[i];
    uint8_t* addr = nullptr;
    RegionUse use;
    Status st = ch.host_.regions().acquire(g.region_id, g.key, g.offset, g.length,
                                           Access::kRemoteRead, &addr, use);
    total += g.length;
    if (!st.ok()) {
      refused = {st.code(), "read entry " + std::to_string(g.index) + ": " + st.message()};
    } else if (total > UINT32_MAX) {
      refused = {ErrorCode::kInvalidArgument, "read entries of more than 4 GiB in one group"};
    } else {
      segments.push_back({addr, g.length});
      leases.push_back(use.detach());
    }
  }
  if (!refused.ok()) {
    release_all(leases);
    respond(h, refused);
    return;
  }
  h.length = static_cast<uint32_t>(total);
  std::size_t table = std::size_t{n} * core::kGroupEntrySize;
  respond_group(h, std::vector<uint8_t>(group_table.begin(), group_table.begin() + table),
                std::move(segments), std::move(leases));
}

Status TcpChannel::Stream::end_frame() {
  switch (cur.type) {
    case FrameType::kWriteGroup:
    case FrameType::kWrite: {
      FrameHeader h;
      h.type = FrameType::kWriteAck;
      h.op_id = cur.op_id;
      if (cur.type == FrameType::kWriteGroup) {
        group_uses.clear();  // releases the entries' regions
        h.aux32 = cur.region_id;
        respond(h, frame_error);  // names the first refused entry
      } else {
        frame_use.release();
        respond(h, frame_error.ok()
                       ? frame_error
                       : Status(frame_error.code(), "write: " + frame_error.message()));
      }
      bool last = (cur.flags & core::kFlagLastOnStream) != 0;
      if ((cur.flags & core::kFlagImm) && (last || !frame_error.ok())) {
        return ch.imm_progress(cur.op_id, static_cast<uint32_t>(cur.aux64), cur.aux32, last,
                               !frame_error.ok());
      }
      return {};
    }
    case FrameType::kReadReq:
      return {};
    case FrameType::kReadGroupReq:
      answer_read_group();
      return {};
    case FrameType::kReadGroupData:
    case FrameType::kReadData:
    case FrameType::kWriteAck:
    case FrameType::kSendAck: {
      OpState* op = frame_op;
      if (cur.status != 0) {
        op->record_error({static_cast<ErrorCode>(cur.status),
                          std::string(frame_text.begin(), frame_text.end())});
      }
      if (cur.type == FrameType::kSendAck &&
          (cur.status == 0 || cur.status == static_cast<uint16_t>(ErrorCode::kTruncated))) {
        ch.link_->tcp_messages.sent.fetch_add(1, std::memory_order_relaxed);
      }
      int64_t slices = 1;  // a group's answer finishes each of its entries
      if (cur.type == FrameType::kReadGroupData) slices = cur.region_id;
      if (cur.type == FrameType::kWriteAck && cur.aux32 > 1) slices = cur.aux32;
      if (op->finish_slices(slices)) op->finish_posted();
      return {};
    }
    case FrameType::kSendCts:
      return {};
    case FrameType::kSend: {
      if (cur.flags & core::kFlagAnnounce) return {};  // answered when a receive takes it
      FrameHeader h;
      h.type = FrameType::kSendAck;
      h.op_id = cur.op_id;
      Status st = frame_error;
      if (frame_op != nullptr && cur.length > frame_op->entries[0].length) {
        st = Matcher::truncated_send(cur.key, frame_op->entries[0].length);
      }
      // The ack is queued before the receiver can run: anything it sends next goes out after it.
      respond(h, st);
      if (frame_op != nullptr || frame_error.ok()) {
        ch.link_->tcp_messages.received.fetch_add(1, std::memory_order_relaxed);
      }
      if (frame_op != nullptr) {
        Matcher::settle(frame_op, cur.length);
        frame_op->finish_posted();
      } else if (frame_counted) {
        frame_counted = false;
        ch.link_->matcher.commit(cur.key, std::move(frame_buffer));
        frame_buffer = {};
      }
      return {};
    }
    default:
      return {};
  }
}

namespace {
// An announced message waiting in the matcher for a receive.
struct Announced final : Rendezvous {
  Announced(std::weak_ptr<TcpChannel::Stream> stream, uint64_t sender_op)
      : stream(std::move(stream)), sender_op(sender_op) {}
  void matched(OpState* recv) override;
  std::weak_ptr<TcpChannel::Stream> stream;
  uint64_t sender_op;
};
}  // namespace

Status TcpChannel::Stream::on_announce() {
  if (announced.count(cur.op_id) != 0) {
    return {ErrorCode::kProtocol, "message " + std::to_string(cur.op_id) + " announced twice"};
  }
  auto message =
      std::make_shared<Announced>(ch.streams_[static_cast<std::size_t>(index)], cur.op_id);
  Status refused;
  // Only the announcement is held (counted like an empty message): its bytes stay with the
  // sender until a receive takes it.
  OpState* recv = ch.link_->matcher.announce(cur.key, 0, message, refused);
  if (!refused.ok()) {
    FrameHeader h;
    h.type = FrameType::kSendAck;
    h.op_id = cur.op_id;
    respond(h, refused);
  } else if (recv != nullptr) {
    clear_to_send(cur.op_id, recv);
  }
  return {};
}

void Announced::matched(OpState* recv) {
  // Without the stream the channel is gone: the receive fails with the peer.
  if (auto s = stream.lock()) s->taken_later(s, sender_op, recv);
}

void TcpChannel::Stream::taken_later(const std::shared_ptr<Stream>& self, uint64_t sender_op,
                                     OpState* recv) {
  ch.link_->matcher.release(0);
  ch.host_.reactor().post(loop, [self, sender_op, recv] {
    if (self->stopped) return;
    self->clear_to_send(sender_op, recv);
    self->on_event(0);  // sends the answer
  });
}

void TcpChannel::Stream::clear_to_send(uint64_t sender_op, OpState* recv) {
  announced.emplace(sender_op, recv);
  FrameHeader h;
  h.type = FrameType::kSendCts;
  h.op_id = sender_op;
  respond(h, {});
}

Status TcpChannel::Stream::on_clear_to_send() {
  OpState* op = ch.link_->pool->lookup(cur.op_id);
  if (op == nullptr || op->kind != OpKind::kSend || !rendezvous(*op) || op->peer_token != 0) {
    return {ErrorCode::kProtocol, "clear-to-send for no announced message"};
  }
  op->peer_token = 1;  // asked for once
  const OpEntry& e = op->entries[0];
  FrameHeader h;
  h.type = FrameType::kSend;
  h.flags = core::kFlagRendezvous;
  h.op_id = cur.op_id;
  h.key = op->tag;
  h.length = static_cast<uint32_t>(e.length);
  // The bytes hold the region as a read answer does, so that they never outlive it.
  RegionSlot* lease = op->leases.front();
  lease->users.fetch_add(1);
  respond(h, {}, e.local, lease);
  return {};
}

Status TcpChannel::Stream::read_some(bool& would_block) {
  would_block = false;
  if (in_payload && rpos == rend && group && sink_left > 0) {
    // A group's table alone (its entries' bytes then go straight to them), or many entries.
    if (!group_table_done) {
      std::size_t got = 0;
      Status st = recv_into(sink, sink_left, got, would_block);
      sank(got);
      return st;
    }
    return recv_group_direct(would_block);
  }
  // Receive straight into the destination when much of the payload is still to come.
  if (in_payload && rpos == rend && sink_left >= kDirectRecvMin) {
    std::size_t got = 0;
    Status st = recv_into(sink, sink_room(sink_left), got, would_block);
    sank(got);
    return st;
  }
  if (rpos == rend) {
    rpos = rend = 0;
  } else if (rpos > 0 && rbuf.size() - rend < core::kFrameHeaderSize) {
    std::memmove(rbuf.data(), rbuf.data() + rpos, rend - rpos);
    rend -= rpos;
    rpos = 0;
  }
  // After a large payload the next frame is likely large too: take just its header, so the
  // payload lands in its destination directly instead of being copied out of rbuf.
  std::size_t want = rbuf.size() - rend;
  if (!in_payload && last_payload_large && rend - rpos < core::kFrameHeaderSize) {
    want = core::kFrameHeaderSize - (rend - rpos);
  }
  std::size_t got = 0;
  Status st = recv_into(rbuf.data() + rend, want, got, would_block);
  rend += got;
  if (got > 0 && rend == rbuf.size() && rbuf.size() < kRecvBufferBytes) {
    std::size_t size = std::min(rbuf.size() * 2, kRecvBufferBytes);
    rbuf.reserve(size);
    rbuf.resize(size);
  }
  return st;
}

// Room at `sink` for up to `n` more bytes of the current frame's payload (n <= sink_left). An
// unmatched message's buffer grows only here, once it is full, as its bytes arrive.
std::size_t TcpChannel::Stream::sink_room(std::size_t n) {
  if (!sink_grows) return n;
  std::size_t room = frame_buffer.size() - frame_copied;
  if (room == 0) {
    std::size_t length = frame_copied + sink_left;  // announced by the header
    std::size_t size = std::min(std::max(frame_buffer.size() * 2, kMessageBufferInitial), length);
    frame_buffer.reserve(size);  // exactly this much: no doubling of capacity behind our back
    frame_buffer.resize(size);
    sink = frame_buffer.data() + frame_copied;
    room = size - frame_copied;
  }
  return n < room ? n : room;
}

// `n` bytes were placed at `sink`.
void TcpChannel::Stream::sank(std::size_t n) {
  sink += n;
  sink_left -= n;
  if (sink_grows) frame_copied += n;
}

Status TcpChannel::Stream::recv_into(uint8_t* dst, std::size_t len, std::size_t& got,
                                     bool& would_block) {
  std::size_t budget = kRecvBytesPerEvent - std::min(wake_bytes, kRecvBytesPerEvent - 1);
  ssize_t n = ::recv(fd.get(), dst, std::min(len, budget), MSG_DONTWAIT);
  if (n > 0) {
    got = static_cast<std::size_t>(n);
    wake_bytes += got;
    return {};
  }
  if (n == 0) return peer_lost("stream " + std::to_string(index) + ": connection closed by peer");
  if (errno == EAGAIN || errno == EINTR) {
    would_block = errno == EAGAIN;
    return {};
  }
  return core::sys_status("recv on stream " + std::to_string(index), errno, ErrorCode::kPeerLost);
}

// Handles the frames in the staging buffer, up to the per-wake budget; stops at a frame
// boundary while reading is paused.
Status TcpChannel::Stream::consume(int& frames) {
  Status st;
  while (st.ok()) {
    if (!in_payload) {
      if (rend - rpos < core::kFrameHeaderSize || read_paused.load()) break;
      if (frames == kFramesPerEvent) {
        post_resume();  // yield to the loop's other sockets; a task takes up what is left
        break;
      }
      st = core::decode_header(rbuf.data() + rpos, cur);
      if (!st.ok()) break;
      rpos += core::kFrameHeaderSize;
      ++frames;
      st = begin_frame();
      if (!st.ok()) break;
      in_payload = true;
      last_payload_large = core::payload_length(cur) >= kDirectRecvMin;
    }
    std::size_t avail = rend - rpos;
    while (sink_left > 0 && avail > 0) {
      std::size_t n = sink_room(avail < sink_left ? avail : static_cast<std::size_t>(sink_left));
      std::memcpy(sink, rbuf.data() + rpos, n);
      sank(n);
      rpos += n;
      avail -= n;
    }
    if (sink_left == 0 && discard_left > 0 && avail > 0) {
      std::size_t n = avail < discard_left ? avail : static_cast<std::size_t>(discard_left);
      discard_left -= n;
      rpos += n;
    }
    if (sink_left > 0 || discard_left > 0) break;  // wait for more bytes
    bool more = false;
    st = group_next_part(more);
    if (!st.ok() || more) continue;
    in_payload = false;
    st = end_frame();
  }
  return st;
}

void TcpChannel::Stream::on_event(uint32_t events) {
  if (stopped) return;
  Status st;
  wake_bytes = 0;
  if (events & EPOLLOUT) {
    std::lock_guard lock(send_mu);
    st = flush_locked();
  }
  int frames = 0;
  for (int calls = 0; st.ok(); ++calls) {
    // Frames already buffered first (left by a pause or the budget), then more bytes.
    st = consume(frames);
    if (!st.ok()) break;
    if (!in_payload && (read_paused.load() || frames == kFramesPerEvent)) break;
    // The socket stays readable: epoll calls again, after the loop's other sockets.
    if (calls == kRecvCallsPerEvent || wake_bytes >= kRecvBytesPerEvent) break;
    bool would_block = false;
    st = read_some(would_block);
    if (would_block) break;
  }
  if (st.ok() && need_flush) {
    need_flush = false;
    std::lock_guard lock(send_mu);
    st = flush_locked();
  }
  if (!st.ok()) {
    fail(st);
  } else if (events & (EPOLLERR | EPOLLHUP)) {
    fail(peer_lost("stream " + std::to_string(index) + ": connection reset"));
  }
}

void TcpChannel::Stream::fail(const Status& reason) {
  ch.close(reason);
  stop();
}

void TcpChannel::Stream::stop() {
  if (stopped || !attached) return;
  stopped = true;
  ch.host_.reactor().remove(loop, fd.get());
  {
    std::lock_guard lock(send_mu);
    closed = true;
    while (!responses.empty()) {
      if (responses.front().lease != nullptr) RegionTable::release(responses.front().lease);
      release_all(responses.front().leases);
      responses.pop_front();
    }
    for (; staged_count > 0; --staged_count) {
      Outbound& o = staged[staged_head];
      if (o.lease != nullptr) RegionTable::release(o.lease);
      o.lease = nullptr;
      release_all(o.leases);
      staged_head = (staged_head + 1) % kMaxStaged;
    }
    queue_head = queue_tail = nullptr;
  }
  frame_use.release();
  group_uses.clear();
  if (frame_counted) {  // its bytes will not come
    frame_counted = false;
    ch.link_->matcher.abandon(core::payload_length(cur));
  }
  ch.host_.reactor().retire(loop, std::move(keep_channel));
  ch.stream_stopped();
}

}  // namespace ferry::transport::tcp
