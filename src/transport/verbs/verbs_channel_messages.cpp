// VerbsChannel, tagged messages (docs/architecture.md, "Verbs specifics"): eager sends copied
// out of the shared receive queue, large ones announced (RTS) and moved as CHUNKs or, into a
// receive that allows it, written by the sender (zero-copy), each ended by FIN.
#include <algorithm>
#include <cstring>
#include <string>

#include "transport/verbs/verbs_channel.hpp"
#include "transport/verbs/verbs_channel_parts.hpp"

namespace ferry::transport::verbs {

// ---------------------------------------------------------------------------------------------
// Messages

void VerbsChannel::send_message(OutMsg msg) {
  Lane& lane = *lanes_[0];
  std::lock_guard lock(lane.mu);
  if (lane.dead) return;  // closing: the close path fails what waits on it
  // ACKs due go first: whatever this side sends after taking a message follows its ACK.
  if (lane.acks_due_count > 0 || lane.compact_acks_due > 0) queue_acks_locked(lane);
  lane.outbox.push_back(std::move(msg));
  pump_locked(lane, 0);
}

void VerbsChannel::post_send_op(OpState* op) {
  const OpEntry& e = op->entries.front();
  OutMsg msg;
  msg.header.tag = op->tag;
  msg.header.id = op->id.load(std::memory_order_relaxed);
  op->pending.store(1);  // the receiver's ACK, or for an announced message the FIN's delivery
  ack_due(*op).store(true);
  if (e.length <= kMessagePayload) {
    msg.header.type = MsgType::kEager;
    msg.payload = e.local;
    msg.payload_length = static_cast<uint32_t>(e.length);
    msg.payload_lkey = dev_.lkey(e.local_region);
    msg.compact = op->tag <= UINT32_MAX;
  } else {
    msg.header.type = MsgType::kRts;
    msg.header.a = e.length;
    std::lock_guard lock(msg_mu_);
    awaiting_cts_.insert(msg.header.id);
  }
  send_message(std::move(msg));
}

void VerbsChannel::ack(uint64_t sender_op, const Status& status) {
  if (status.ok()) {
    Lane& lane = *lanes_[0];
    std::lock_guard lock(lane.mu);
    if (lane.dead) return;
    if (sender_op == kCompactMessage) {
      ++lane.compact_acks_due;
    } else {
      lane.acks_due[lane.acks_due_count++] = sender_op;
    }
    if (lane.acks_due_count + lane.compact_acks_due < kAckBatch) {
      acks_waiting_.store(true, std::memory_order_relaxed);
      return;
    }
    queue_acks_locked(lane);
    pump_locked(lane, 0);
    return;
  }
  OutMsg msg;
  msg.header.type = MsgType::kAck;
  msg.header.id = sender_op;  // or the next compact message:
  msg.header.tag = sender_op == kCompactMessage ? 1 : 0;
  msg.header.status = static_cast<uint16_t>(status.code());
  msg.text = status.message();
  send_message(std::move(msg));
}

void VerbsChannel::queue_acks_locked(Lane& lane) {
  OutMsg msg;
  msg.header.type = MsgType::kAck;
  msg.header.tag = lane.compact_acks_due;
  const auto& ids = lane.acks_due;
  std::size_t n = lane.acks_due_count;
  msg.header.id = n > 0 ? ids[0] : 0;
  msg.header.a = n > 1 ? ids[1] : 0;
  msg.header.b = n > 2 ? ids[2] : 0;
  msg.header.c = n > 3 ? ids[3] : 0;
  lane.outbox.push_back(std::move(msg));
  lane.acks_due_count = 0;
  lane.compact_acks_due = 0;
  acks_waiting_.store(false, std::memory_order_relaxed);
}

void VerbsChannel::send_acks() {
  Lane& lane = *lanes_[0];
  std::lock_guard lock(lane.mu);
  if (lane.dead || (lane.acks_due_count == 0 && lane.compact_acks_due == 0)) return;
  queue_acks_locked(lane);
  pump_locked(lane, 0);
}

void VerbsChannel::protocol_error(const std::string& what) {
  close({ErrorCode::kProtocol, "verbs message from the peer: " + what});
}

void VerbsChannel::handle_message(const MsgHeader& h, const uint8_t* payload, uint32_t length) {
  switch (h.type) {
    case MsgType::kEager:
      return on_eager(h, payload, length);
    case MsgType::kRts:
      return on_rts(h);
    case MsgType::kCts:
      return on_cts(h);
    case MsgType::kChunk:
      return on_chunk(h, payload, length);
    case MsgType::kFin:
      return on_fin(h);
    case MsgType::kAck:
      return on_ack(h, payload, length);
  }
}

void VerbsChannel::on_eager(const MsgHeader& h, const uint8_t* payload, uint32_t length) {
  if (h.id == kCompactMessage) return protocol_error("EAGER without the sender's op id");
  take_eager(h.tag, h.id, payload, length);
}

void VerbsChannel::on_compact(uint32_t tag, const uint8_t* payload, uint32_t length) {
  if (length > kMessagePayload) {
    return protocol_error("compact message of " + std::to_string(length) + " bytes");
  }
  messages.compact.fetch_add(1, std::memory_order_relaxed);
  take_eager(tag, kCompactMessage, payload, length);
}

void VerbsChannel::take_eager(uint64_t tag, uint64_t sender_op, const uint8_t* payload,
                              uint32_t length) {
  Matcher::Arrival a = link_->matcher.arrive(tag, length);
  if (!a.error.ok()) {
    ack(sender_op, a.error);
    return;
  }
  messages.received.fetch_add(1, std::memory_order_relaxed);
  if (a.recv == nullptr) {
    std::vector<uint8_t> buffer(payload, payload + length);  // the bytes are here: copied now
    ack(sender_op, {});
    link_->matcher.commit(tag, std::move(buffer));
    return;
  }
  uint64_t capacity = a.recv->entries[0].length;
  // The ACK goes out before the receiver can run: anything it sends next follows it.
  ack(sender_op, length > capacity ? Matcher::truncated_send(tag, capacity) : Status());
  Matcher::deliver(a.recv, payload, length);
  a.recv->finish_posted();
}

void VerbsChannel::on_rts(const MsgHeader& h) {
  if (h.id == kCompactMessage) return protocol_error("RTS without the sender's op id");
  if (h.a <= kMessagePayload || h.a > UINT32_MAX) {
    return protocol_error("RTS for a message of " + std::to_string(h.a) + " bytes");
  }
  auto staged = std::make_shared<Staged>();
  Status refused;
  OpState* recv = link_->matcher.announce(h.tag, h.a, staged, refused);
  if (!refused.ok()) {
    ack(h.id, refused);
  } else if (recv != nullptr) {
    start_incoming(recv, nullptr, h.id, h.a);
  } else {
    // Bounded by max_unexpected_bytes, as over TCP. A receive matching it now waits for FIN,
    // which comes only after CTS: nothing reads `data` before it is sized.
    staged->data.resize(h.a);
    start_incoming(nullptr, std::move(staged), h.id, h.a);
  }
}

void VerbsChannel::start_incoming(OpState* recv, std::shared_ptr<Staged> staged, uint64_t sender_op,
                                  uint64_t length) {
  uint64_t capacity = length;
  bool zero_copy = false;
  OutMsg cts;
  cts.header.type = MsgType::kCts;
  cts.header.id = sender_op;
  if (recv != nullptr) {
    const OpEntry& dst = recv->entries[0];
    capacity = std::min(length, dst.length);
    // Zero-copy only where the user allowed it (the peer learns the region's rkey) and into a
    // region whose owner granted remote write: the NIC refuses others.
    uint32_t rkey = dev_.rkey(dst.local_region);
    zero_copy = zero_copy_receives_ && !recv->leases.empty() &&
                allows(recv->leases.front()->access, Access::kRemoteWrite) && rkey != 0;
    if (zero_copy) {
      cts.header.a = reinterpret_cast<uint64_t>(dst.local);
      cts.header.rkey = rkey;
    }
  }
  {
    std::lock_guard lock(msg_mu_);
    cts.header.b = ++next_token_;
    incoming_[cts.header.b] = Incoming{recv, std::move(staged), length, capacity, 0, zero_copy};
  }
  cts.header.c = capacity;
  send_message(std::move(cts));
}

void VerbsChannel::on_cts(const MsgHeader& h) {
  {
    std::lock_guard lock(msg_mu_);
    if (awaiting_cts_.erase(h.id) == 0) return protocol_error("CTS for no announced message");
  }
  OpState* op = link_->pool->lookup(h.id);
  if (op == nullptr || op->kind != OpKind::kSend) return protocol_error("CTS for no send");
  OpEntry& e = op->entries.front();
  if (h.c > e.length) return protocol_error("CTS capacity beyond the message");
  // The receiver took the message: it sends no ACK (one now is a protocol error), the FIN's
  // delivery completes the send (finish_announced).
  ack_due(*op).store(false);
  verbs_area(*op).peer_token = h.b;
  verbs_area(*op).zero_copy = h.a != 0;
  e.length = h.c;  // the receiver takes no more; FIN tells it the whole length
  e.remote_addr = h.a;
  e.remote_key = h.rkey;
  op->slice_bytes = verbs_area(*op).zero_copy ? kZeroCopySlice : kMessagePayload;
  uint64_t slices = h.c > 0 ? slice_count(h.c, op->slice_bytes) : 0;
  op->pending.fetch_add(static_cast<int64_t>(slices));
  op->lane_count = 1;
  op->first_lane = 0;
  op->lanes[0] = {0, 0, slices};
  Lane& lane = *lanes_[0];
  std::lock_guard lock(lane.mu);
  if (lane.dead) return;
  if (slices == 0) {
    lane.outbox.push_back(fin_of(op));
  } else {
    append_locked(lane, 0, op);
  }
  pump_locked(lane, 0);
}

void VerbsChannel::finish_announced(OpState* op) {
  // The FIN is delivered: RC placed every byte before it. A smaller receive took a prefix (CTS
  // said how much), which the receiver reports as truncated too.
  uint64_t taken = op->entries.front().length;
  uint64_t length = op->bytes.load(std::memory_order_relaxed);
  if (taken < length) op->record_error(Matcher::truncated_send(op->tag, taken));
  messages.sent.fetch_add(1, std::memory_order_relaxed);
  op->finish_posted();
}

void VerbsChannel::on_chunk(const MsgHeader& h, const uint8_t* payload, uint32_t length) {
  std::lock_guard lock(msg_mu_);
  auto it = incoming_.find(h.id);
  if (it == incoming_.end() || it->second.zero_copy) {
    return protocol_error("CHUNK for no message being received");
  }
  Incoming& in = it->second;
  if (h.a > in.capacity || length > in.capacity - h.a) {
    return protocol_error("CHUNK beyond the receive buffer");
  }
  uint8_t* dst = in.recv != nullptr ? in.recv->entries[0].local : in.staged->data.data();
  std::memcpy(dst + h.a, payload, length);
  in.received += length;
}

void VerbsChannel::on_fin(const MsgHeader& h) {
  Incoming in{};
  {
    std::lock_guard lock(msg_mu_);
    auto it = incoming_.find(h.id);
    if (it == incoming_.end()) return protocol_error("FIN for no message being received");
    in = it->second;
    incoming_.erase(it);
  }
  if (h.a != in.length || (!in.zero_copy && in.received != in.capacity)) {
    return protocol_error("FIN does not match the message");
  }
  messages.received.fetch_add(1, std::memory_order_relaxed);
  if (in.staged) return finish_staged(in);
  if (in.zero_copy) messages.zero_copy.fetch_add(1, std::memory_order_relaxed);
  // No ACK: the sender learnt any truncation from CTS, and its FIN's delivery completes it.
  Matcher::settle(in.recv, in.length);
  in.recv->finish_posted();
}

void VerbsChannel::finish_staged(const Incoming& in) {
  Staged& st = *in.staged;
  OpState* recv;
  {
    std::lock_guard lock(st.mu);
    st.complete = true;
    recv = st.recv;
  }
  // Still queued: it becomes a buffered message. Taken meanwhile: matched() saw `complete` and
  // delivers (or already waits for it, here). Either way its reservation ends.
  if (recv == nullptr && link_->matcher.fulfil(&st, st.data)) return;
  link_->matcher.release(in.length);
  if (recv != nullptr) {
    Matcher::deliver(recv, st.data.data(), st.data.size());
    recv->finish_posted();
  }
}

void VerbsChannel::on_ack(const MsgHeader& h, const uint8_t* payload, uint32_t length) {
  AckNames names;
  if (Status s = AckNames::decode(h, names); !s.ok()) return protocol_error(s.message());
  auto code = static_cast<ErrorCode>(h.status);
  for (std::size_t i = 0; i < names.count; ++i) {
    if (!take_ack(names.ids[i], code, payload, length)) return;
  }
  Lane& lane = *lanes_[0];
  for (uint64_t i = 0; i < names.compact; ++i) {
    uint64_t id = 0;
    {
      std::lock_guard lock(lane.mu);
      if (!lane.compact_sent.empty()) {
        id = lane.compact_sent.front();
        lane.compact_sent.pop_front();
      }
    }
    // Completed outside the lock: a callback may send.
    if (id == kCompactMessage) return protocol_error("ACK for no message sent");
    if (!take_ack(id, code, payload, length)) return;
  }
}

bool VerbsChannel::take_ack(uint64_t id, ErrorCode code, const uint8_t* text, uint32_t length) {
  {
    std::lock_guard lock(msg_mu_);
    awaiting_cts_.erase(id);  // refused before it was fetched
  }
  OpState* op = link_->pool->lookup(id);
  // One ACK per message: a second one would complete an op that may still be posting.
  if (op == nullptr || op->kind != OpKind::kSend || !ack_due(*op).exchange(false)) {
    protocol_error("ACK for no message sent");
    return false;
  }
  if (code != ErrorCode::kOk) {
    op->record_error({code, std::string(reinterpret_cast<const char*>(text), length)});
  }
  if (code == ErrorCode::kOk || code == ErrorCode::kTruncated) {
    messages.sent.fetch_add(1, std::memory_order_relaxed);
  }
  if (op->finish_slices(1)) op->finish_posted();
  return true;
}

}  // namespace ferry::transport::verbs
