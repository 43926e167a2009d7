// A TCP stream's receive side: frames parsed out of the staging buffer or received straight into
// their destination, target-side validation, group frames, tagged messages and their rendezvous,
// and the per-wake budgets.
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
#include "transport/tcp/tcp_channel.hpp"
#include "transport/tcp/tcp_stream.hpp"

namespace ferry::transport::tcp {

// ---------------------------------------------------------------------------------------------
// Receive side

void TcpChannel::Stream::respond(FrameHeader h, const Status& status, const uint8_t* payload,
                                 RegionSlot* lease) {
  Response r;
  h.status = static_cast<uint16_t>(status.code());
  if (!status.ok()) {
    r.text = status.message().substr(0, kMaxErrorText);
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
  group = false;
  uint64_t payload = payload_length(cur);
  switch (raw(cur.type)) {
    case raw(TcpFrame::kWriteGroup):
    case raw(TcpFrame::kReadGroupReq):
      return begin_group();
    case raw(TcpFrame::kReadGroupData):
      return begin_read_group_data(payload);
    case raw(TcpFrame::kWrite):
      begin_write(payload);
      return {};
    case raw(TcpFrame::kReadReq):
      answer_read_request();
      return {};
    case raw(TcpFrame::kReadData):
      return begin_read_data(payload);
    case raw(TcpFrame::kWriteAck):
    case raw(TcpFrame::kSendAck):
      return begin_ack(payload);
    case raw(TcpFrame::kSendCts):
      return on_clear_to_send();
    case raw(TcpFrame::kSend):
      return begin_send(payload);
    default:
      return {ErrorCode::kProtocol, "unexpected frame type " +
                                        std::to_string(static_cast<int>(cur.type)) +
                                        " on a data stream"};
  }
}

void TcpChannel::Stream::sink_error_text(uint64_t payload) {
  frame_text.resize(payload);  // decode_header allows at most kMaxErrorText
  sink = frame_text.data();
  sink_left = payload;
}

void TcpChannel::Stream::sink_message(OpState* recv, uint64_t payload) {
  frame_op = recv;
  const OpEntry& dst = recv->entries[0];
  sink = dst.local;
  sink_left = payload < dst.length ? payload : dst.length;
  discard_left = payload - sink_left;
}

Status TcpChannel::Stream::begin_read_group_data(uint64_t payload) {
  if (Status st = lookup_reply_op(OpKind::kRead); !st.ok()) return st;
  if (cur.region_id > frame_op->pending.load(std::memory_order_relaxed)) {
    return {ErrorCode::kProtocol, "read data for " + std::to_string(cur.region_id) +
                                      " entries, more than were asked for"};
  }
  if (cur.status != 0 && payload > 0) {
    sink_error_text(payload);
    return {};
  }
  return begin_group();
}

void TcpChannel::Stream::begin_write(uint64_t payload) {
  uint8_t* addr = nullptr;
  frame_error = ch.host_.regions().acquire(cur.region_id, cur.key, cur.offset, cur.length,
                                           Access::kRemoteWrite, &addr, frame_use);
  if (frame_error.ok()) {
    sink = addr;
    sink_left = payload;
  } else {
    discard_left = payload;
  }
}

void TcpChannel::Stream::answer_read_request() {
  uint8_t* addr = nullptr;
  RegionUse use;
  Status st = ch.host_.regions().acquire(cur.region_id, cur.key, cur.offset, cur.length,
                                         Access::kRemoteRead, &addr, use);
  FrameHeader h;
  h.type = TcpFrame::kReadData;
  h.op_id = cur.op_id;
  h.aux32 = cur.aux32;
  h.aux64 = cur.aux64;
  if (st.ok()) {
    h.length = cur.length;
    respond(h, st, addr, use.detach());
  } else {
    respond(h, Status(st.code(), "read: " + st.message()));
  }
}

Status TcpChannel::Stream::begin_read_data(uint64_t payload) {
  if (Status st = lookup_reply_op(OpKind::kRead); !st.ok()) return st;
  if (cur.status != 0 && payload > 0) {
    sink_error_text(payload);
    return {};
  }
  if (cur.aux32 >= frame_op->entries.size()) {
    return {ErrorCode::kProtocol, "read data for entry " + std::to_string(cur.aux32) + " of " +
                                      std::to_string(frame_op->entries.size())};
  }
  const OpEntry& e = frame_op->entries[cur.aux32];
  if (cur.aux64 > e.length || payload > e.length - cur.aux64 || payload > frame_op->slice_bytes) {
    return {ErrorCode::kProtocol, "read data outside the requested range"};
  }
  sink = e.local + cur.aux64;
  sink_left = payload;
  return {};
}

Status TcpChannel::Stream::begin_ack(uint64_t payload) {
  OpKind kind = cur.type == TcpFrame::kWriteAck ? OpKind::kWrite : OpKind::kSend;
  if (Status st = lookup_reply_op(kind); !st.ok()) return st;
  if (cur.aux32 > 1 && cur.aux32 > frame_op->pending.load(std::memory_order_relaxed)) {
    return {ErrorCode::kProtocol,
            "ack for " + std::to_string(cur.aux32) + " entries, more than were sent"};
  }
  sink_error_text(payload);  // an ack's payload is its error text, if any
  return {};
}

Status TcpChannel::Stream::begin_send(uint64_t payload) {
  if (cur.flags & kFlagAnnounce) return on_announce();
  if (cur.flags & kFlagRendezvous) {
    auto it = announced.find(cur.op_id);
    if (it == announced.end()) {
      return {ErrorCode::kProtocol,
              "message bytes nobody asked for (op " + std::to_string(cur.op_id) + ")"};
    }
    OpState* recv = it->second;
    announced.erase(it);
    sink_message(recv, payload);
    return {};
  }
  Matcher::Arrival a = ch.link_->matcher.arrive(cur.key, payload);
  if (!a.error.ok()) {
    frame_error = a.error;
    discard_left = payload;
  } else if (a.recv != nullptr) {
    sink_message(a.recv, payload);
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

// A group frame's table comes first, into a buffer of the largest table's size.
Status TcpChannel::Stream::begin_group() {
  if (group_table.size() < kGroupTableBytes) {
    group_table.resize(kGroupTableBytes);
    group_entries.resize(kMaxGroupEntries);
    group_dst.reserve(kMaxGroupEntries);
    group_uses.reserve(kMaxGroupEntries);
  }
  group = true;
  group_table_done = false;
  group_next = 0;
  group_dst.clear();
  sink = group_table.data();
  sink_left = std::size_t{cur.region_id} * kGroupEntrySize;  // decode_header: <= length
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
    std::size_t table = std::size_t{n} * kGroupEntrySize;
    if (Status st = decode_group_table(group_table.data(), table, n, group_entries.data(), total);
        !st.ok()) {
      return st;
    }
    if (cur.type == TcpFrame::kReadGroupReq) return {};  // answered by end_frame
    if (total != cur.length - table) {
      return {ErrorCode::kProtocol, "group of " + std::to_string(total) + " bytes in a frame of " +
                                        std::to_string(cur.length - table)};
    }
    for (uint32_t i = 0; i < n; ++i) {
      const GroupEntry& g = group_entries[i];
      if (cur.type == TcpFrame::kWriteGroup) {
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
  h.type = TcpFrame::kReadGroupData;
  h.op_id = cur.op_id;
  h.region_id = n;
  std::vector<Segment> segments;
  std::vector<RegionSlot*> leases;
  segments.reserve(n);
  leases.reserve(n);
  uint64_t total = std::size_t{n} * kGroupEntrySize;
  Status refused;
  for (uint32_t i = 0; i < n && refused.ok(); ++i) {
    const GroupEntry& g = group_entries[i];
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
  std::size_t table = std::size_t{n} * kGroupEntrySize;
  respond_group(h, std::vector<uint8_t>(group_table.begin(), group_table.begin() + table),
                std::move(segments), std::move(leases));
}

Status TcpChannel::Stream::end_frame() {
  switch (raw(cur.type)) {
    case raw(TcpFrame::kWriteGroup):
    case raw(TcpFrame::kWrite): {
      FrameHeader h;
      h.type = TcpFrame::kWriteAck;
      h.op_id = cur.op_id;
      if (cur.type == TcpFrame::kWriteGroup) {
        group_uses.clear();  // releases the entries' regions
        h.aux32 = cur.region_id;
        respond(h, frame_error);  // names the first refused entry
      } else {
        frame_use.release();
        respond(h, frame_error.ok()
                       ? frame_error
                       : Status(frame_error.code(), "write: " + frame_error.message()));
      }
      bool last = (cur.flags & kFlagLastOnStream) != 0;
      if ((cur.flags & kFlagImm) && (last || !frame_error.ok())) {
        return ch.imm_progress(cur.op_id, static_cast<uint32_t>(cur.aux64), cur.aux32, last,
                               !frame_error.ok());
      }
      return {};
    }
    case raw(TcpFrame::kReadReq):
      return {};
    case raw(TcpFrame::kReadGroupReq):
      answer_read_group();
      return {};
    case raw(TcpFrame::kReadGroupData):
    case raw(TcpFrame::kReadData):
    case raw(TcpFrame::kWriteAck):
    case raw(TcpFrame::kSendAck): {
      OpState* op = frame_op;
      if (cur.status != 0) {
        op->record_error({static_cast<ErrorCode>(cur.status),
                          std::string(frame_text.begin(), frame_text.end())});
      }
      if (cur.type == TcpFrame::kSendAck &&
          (cur.status == 0 || cur.status == static_cast<uint16_t>(ErrorCode::kTruncated))) {
        ch.messages.sent.fetch_add(1, std::memory_order_relaxed);
      }
      int64_t slices = 1;  // a group's answer finishes each of its entries
      if (cur.type == TcpFrame::kReadGroupData) slices = cur.region_id;
      if (cur.type == TcpFrame::kWriteAck && cur.aux32 > 1) slices = cur.aux32;
      if (op->finish_slices(slices)) op->finish_posted();
      return {};
    }
    case raw(TcpFrame::kSendCts):
      return {};
    case raw(TcpFrame::kSend): {
      if (cur.flags & kFlagAnnounce) return {};  // answered when a receive takes it
      FrameHeader h;
      h.type = TcpFrame::kSendAck;
      h.op_id = cur.op_id;
      Status st = frame_error;
      if (frame_op != nullptr && cur.length > frame_op->entries[0].length) {
        st = Matcher::truncated_send(cur.key, frame_op->entries[0].length);
      }
      // The ack is queued before the receiver can run: anything it sends next goes out after it.
      respond(h, st);
      if (frame_op != nullptr || frame_error.ok()) {
        ch.messages.received.fetch_add(1, std::memory_order_relaxed);
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
  if (announced.count(cur.op_id) != 0 || held.count(cur.op_id) != 0) {
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
    h.type = TcpFrame::kSendAck;
    h.op_id = cur.op_id;
    respond(h, refused);
  } else if (recv != nullptr) {
    clear_to_send(cur.op_id, recv);
  } else {
    held.insert(cur.op_id);
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
  held.erase(sender_op);
  announced.emplace(sender_op, recv);
  FrameHeader h;
  h.type = TcpFrame::kSendCts;
  h.op_id = sender_op;
  respond(h, {});
}

Status TcpChannel::Stream::on_clear_to_send() {
  OpState* op = ch.link_->pool->lookup(cur.op_id);
  if (op == nullptr || op->kind != OpKind::kSend || !rendezvous(*op) ||
      op->transport_area<TcpOpArea>().cleared_to_send) {
    return {ErrorCode::kProtocol, "clear-to-send for no announced message"};
  }
  op->transport_area<TcpOpArea>().cleared_to_send = true;
  const OpEntry& e = op->entries[0];
  FrameHeader h;
  h.type = TcpFrame::kSend;
  h.flags = kFlagRendezvous;
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
      if (st.ok() && core::is_control(cur.type)) {
        st = {ErrorCode::kProtocol, "frame: control frame on a data stream"};
      }
      if (st.ok()) st = check_data_header(cur);
      if (!st.ok()) break;
      rpos += core::kFrameHeaderSize;
      ++frames;
      st = begin_frame();
      if (!st.ok()) break;
      in_payload = true;
      last_payload_large = payload_length(cur) >= kDirectRecvMin;
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
    // Requests served (answers owed), or queued operations given credits: after small ones
    // the next is polled for.
    if (wake_bytes <= kRequestPollWakeBytes) {
      ch.host_.reactor().poll_for_requests(loop, ch.options_.request_poll);
    }
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
    ch.link_->matcher.abandon(payload_length(cur));
  }
  ch.host_.reactor().retire(loop, std::move(keep_channel));
  ch.stream_stopped();
}

}  // namespace ferry::transport::tcp
