// The TCP channel's private parts, shared by its two halves: tcp_channel.cpp (the channel and
// the send side of a stream) and tcp_receive.cpp (the receive side: frames, groups, messages).
// Private to the TCP transport.
#pragma once

#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/frame.hpp"
#include "core/ring.hpp"
#include "transport/tcp/tcp_channel.hpp"
#include "transport/tcp/tcp_frame.hpp"

namespace ferry::transport::tcp {

using core::FrameHeader;
using core::FrameType;

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
// up to a slice per call): with 16 calls of up to 1 MiB per wake-up on one progress thread, a
// peer flooding 8 MiB writes held another peer's 8-byte writes at a p99 several times the one
// they have with this budget (docs/performance-history.md, "Beside hostile peers").
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
constexpr std::size_t kGroupTableBytes = std::size_t{kMaxGroupEntries} * kGroupEntrySize;
// Bytes a caller's post() stages and sends itself, over all the op's streams, before it leaves
// the rest to the progress thread (EPOLLOUT); whole frames, at least the first: an operation of
// one slice goes out without a thread hop, as before, and a large batch's write() returns after
// its first frame (one group), not after its whole transfer.
constexpr std::size_t kCallerSendBytes = 64 << 10;
// Pieces handed to one sendmsg / recvmsg (Linux's IOV_MAX is 1024).
constexpr int kMaxSendIov = 1024;
constexpr int kMaxRecvIov = static_cast<int>(kMaxGroupEntries);  // a whole group
// One of them: the map's node (key, value, link, allocator header) and its bucket.
constexpr std::size_t kImmProgressBytes = 64;

inline Status peer_lost(const std::string& what) { return {ErrorCode::kPeerLost, what}; }

// Group answers a stream queues for its peer before it stops reading from it: twice the group
// requests a peer of our configuration keeps in flight (each is one request).
inline std::size_t group_answers_allowed(const TcpOptions& options) {
  return 2 * static_cast<std::size_t>(std::max(options.slices_in_flight_per_stream, 1));
}

// A piece of a group frame's payload: one entry's bytes.
// What a TCP channel keeps in each op (OpState::transport_area).
struct TcpOpArea {
  bool cleared_to_send;  // an announced message's receiver asked for it (once only)
};

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

inline void release_all(std::vector<RegionSlot*>& leases) {
  for (RegionSlot* l : leases) RegionTable::release(l);
  leases.clear();
}

// Where a group frame's entry goes: null `addr` discards its bytes.
struct GroupDst {
  uint8_t* addr;
  uint64_t length;
};

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
  bool attached = false;                     // set once under the channel's latch lock
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
  std::vector<uint8_t> frame_text;    // error text: at most kMaxErrorText bytes
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
  std::vector<GroupEntry> group_entries;
  std::vector<GroupDst> group_dst;
  std::vector<RegionUse> group_uses;  // target of a kWriteGroup: its entries' regions
  bool need_flush = false;
  bool last_payload_large = false;
  std::size_t wake_bytes = 0;  // received in this wake-up (kRecvBytesPerEvent)
  // Announced messages a receive took, by the sender's op id, until their bytes come.
  std::unordered_map<uint64_t, OpState*> announced;
  // Announced messages still waiting in the matcher for a receive, by the sender's op id: as
  // many as the matcher's unexpected-message limit lets it hold.
  std::unordered_set<uint64_t> held;
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
  // Starts taking the frame `cur` heads: where its payload goes (sink), or what it answers.
  Status begin_frame();
  // begin_frame's handlers, one per frame type; `payload`: the bytes that follow the header.
  Status begin_read_group_data(uint64_t payload);
  void begin_write(uint64_t payload);
  void answer_read_request();
  Status begin_read_data(uint64_t payload);
  Status begin_ack(uint64_t payload);
  Status begin_send(uint64_t payload);
  // The payload is an error text (a failed read's data, an ack's), taken into frame_text.
  void sink_error_text(uint64_t payload);
  // A message's bytes go into the receive `recv`; what does not fit is discarded (truncated).
  void sink_message(OpState* recv, uint64_t payload);
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

}  // namespace ferry::transport::tcp
