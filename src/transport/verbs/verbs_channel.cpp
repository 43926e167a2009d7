// VerbsChannel: one-sided posting (chains of work requests per queue pair) and completions.
// Its address, set-up and closing are in verbs_channel_setup.cpp, tagged messages in
// verbs_channel_messages.cpp.
#include "transport/verbs/verbs_channel.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "transport/verbs/verbs_channel_parts.hpp"

namespace ferry::transport::verbs {

namespace {
// Work requests chained into one ibv_post_send (one doorbell); the last one is signaled, so this
// is also the longest run of unsignaled requests. Chains of 16-32 reached line rate in the
// anchors' measurements (shared/field-notes.md).
constexpr int kMaxChain = 32;
// Receive completions handled per wake-up before the loop's other channels get their turn: a
// peer flooding messages would otherwise keep the thread here. 256 eager messages copy at most
// 2 MiB (well under a millisecond).
constexpr int kReceivesPerEvent = 256;
}  // namespace

// ---------------------------------------------------------------------------------------------
// Posting

PostResult VerbsChannel::post(OpState* op) {
  if (op->kind == OpKind::kSend) {
    post_send_op(op);
    return PostResult::kAccepted;
  }
  PostResult result = PostResult::kAccepted;
  int n = lanes();
  if (op->lane_count == 1 && op->lanes[0].remaining == 1 && op->entries.size() == 1) {
    Lane& lane = *lanes_[static_cast<std::size_t>(op->first_lane)];
    std::lock_guard lock(lane.mu);
    if (lane.dead) return result;  // closing: the close path fails the op
    if (lane.head == nullptr && lane.outbox.empty() && lane.imm_pending.empty() &&
        lane.sq_free > 0) {
      post_single_locked(lane, op->first_lane, op);
      return result;
    }
    append_locked(lane, op->first_lane, op);
    pump_locked(lane, op->first_lane);
    return lane.head != nullptr ? PostResult::kQueued : result;
  }
  for (int k = 0; k < op->lane_count; ++k) {
    int index = (op->first_lane + k) % n;
    Lane& lane = *lanes_[static_cast<std::size_t>(index)];
    std::lock_guard lock(lane.mu);
    if (lane.dead) continue;  // closing: the close path fails the op
    append_locked(lane, index, op);
    pump_locked(lane, index);
    if (lane.head != nullptr) result = PostResult::kQueued;
  }
  // Small operations count on their waiter to poll; a large one may run for long with nobody
  // polling, and its completions drive the rest of its slices: let them wake the progress
  // thread (the cost of arming is nothing beside the transfer).
  if (op->lane_count > 1) {
    spinners_.fetch_add(1);
    leave_spin();
  }
  return result;
}

void VerbsChannel::append_locked(Lane& lane, int index, OpState* op) {
  int n = lanes();
  op->lane_next[(index - op->first_lane + n) % n] = nullptr;
  if (lane.tail == nullptr) {
    lane.head = lane.tail = op;
  } else {
    lane.tail->lane_next[(index - lane.tail->first_lane + n) % n] = op;
    lane.tail = op;
  }
}

void VerbsChannel::fill_slice(const OpState& op, const OpEntry& e, uint64_t offset, uint64_t len,
                              ibv_send_wr& wr, ibv_sge& sge) const {
  bool is_write = op.kind != OpKind::kRead;
  sge.addr = reinterpret_cast<uint64_t>(e.local + offset);
  sge.length = static_cast<uint32_t>(len);
  sge.lkey = dev_.lkey(e.local_region);
  wr.opcode = is_write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
  wr.wr.rdma.remote_addr = e.remote_addr + offset;
  wr.wr.rdma.rkey = static_cast<uint32_t>(e.remote_key);
  if (is_write && len <= max_inline_) wr.send_flags |= IBV_SEND_INLINE;
}

void VerbsChannel::post_single_locked(Lane& lane, int index, OpState* op) {
  const OpEntry& e = op->entries[0];
  ibv_send_wr& wr = lane.single_wr;
  wr.send_flags = IBV_SEND_SIGNALED;
  fill_slice(*op, e, 0, e.length, wr, lane.single_sge);
  if (op->with_imm) {
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(op->imm);
  }
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(lane.qp, &wr, &bad); rc != 0) {
    fail_post(lane, index, rc);
    return;
  }
  lane.posted += 1;
  lane.sq_free -= 1;
  lane.signaled.push_back({op, 1, 1, op->with_imm});
  outstanding_.fetch_add(1);
}

VerbsChannel::OutMsg VerbsChannel::fin_of(OpState* op) {
  OutMsg fin;
  fin.header.type = MsgType::kFin;
  fin.header.id = verbs_area(*op).peer_token;
  fin.header.a = op->bytes.load(std::memory_order_relaxed);  // the whole message
  fin.completes = op;
  return fin;
}

void VerbsChannel::post_imm_locked(Lane& lane, int index, OpState* op) {
  if (lane.dead) return;  // closing: the op fails with the channel
  const OpEntry& e = op->entries.front();
  ibv_send_wr wr{};
  wr.wr_id = wr_id(kWrImm, index);
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(op->imm);
  wr.wr.rdma.remote_addr = e.remote_addr;
  wr.wr.rdma.rkey = static_cast<uint32_t>(e.remote_key);
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(lane.qp, &wr, &bad); rc != 0) {
    fail_post(lane, index, rc);
    return;
  }
  --lane.sq_free;
  ++lane.posted;
  lane.signaled.push_back({op, 1, 1, true});
  outstanding_.fetch_add(1);
}

void VerbsChannel::build_message(int index, uint64_t seq, const OutMsg& msg, ibv_send_wr& wr,
                                 ibv_sge* sges) {
  if (msg.compact) {
    wr = {};
    wr.wr_id = wr_id(kWrMsg, index);
    wr.sg_list = sges;
    wr.num_sge = msg.payload_length > 0 ? 1 : 0;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htonl(static_cast<uint32_t>(msg.header.tag));
    sges[0].addr = reinterpret_cast<uint64_t>(msg.payload);
    sges[0].length = msg.payload_length;
    sges[0].lkey = msg.payload_lkey;
    if (msg.payload_length > 0 && msg.payload_length <= max_inline_) {
      wr.send_flags |= IBV_SEND_INLINE;
    }
    return;
  }
  auto slot = static_cast<std::size_t>(seq % static_cast<uint64_t>(send_depth_));
  uint8_t* hdr =
      headers_.get() + (static_cast<std::size_t>(index) * send_depth_ + slot) * kHeaderSlot;
  msg.header.encode(hdr);
  uint32_t text =
      static_cast<uint32_t>(std::min<std::size_t>(msg.text.size(), kHeaderSlot - MsgHeader::kSize));
  // The text travels with its length (the message's), not NUL-terminated.
  std::copy_n(msg.text.data(), text, hdr + MsgHeader::kSize);
  sges[0].addr = reinterpret_cast<uint64_t>(hdr);
  sges[0].length = static_cast<uint32_t>(MsgHeader::kSize) + text;
  sges[0].lkey = headers_mr_->lkey;
  wr = {};
  wr.wr_id = wr_id(kWrMsg, index);
  wr.sg_list = sges;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  if (msg.payload_length > 0) {
    sges[1].addr = reinterpret_cast<uint64_t>(msg.payload);
    sges[1].length = msg.payload_length;
    sges[1].lkey = msg.payload_lkey;
    wr.num_sge = 2;
  }
  if (sges[0].length + msg.payload_length <= max_inline_) wr.send_flags |= IBV_SEND_INLINE;
}

void VerbsChannel::pump_locked(Lane& lane, int index) {
  if (lane.dead || (lane.head == nullptr && lane.imm_pending.empty() && lane.outbox.empty())) {
    return;
  }
  while (!lane.imm_pending.empty() && lane.sq_free > 0) {
    OpState* op = lane.imm_pending.back();
    lane.imm_pending.pop_back();
    post_imm_locked(lane, index, op);
    if (lane.dead) return;
  }
  ibv_send_wr wrs[kMaxChain];
  ibv_sge sges[2 * kMaxChain];
  Lane::Signaled records[kMaxChain];
  int n = 0, nrec = 0;
  int budget = std::min(lane.sq_free, kMaxChain);
  auto chain = [&](ibv_send_wr& wr) {
    if (n > 0) wrs[n - 1].next = &wr;
    ++n;
  };
  // Messages first: acks and answers are small and unblock the peer. Each is signaled alone.
  while (n < budget && !lane.outbox.empty()) {
    ibv_send_wr& wr = wrs[n];
    const OutMsg& msg = lane.outbox.front();
    build_message(index, lane.posted + static_cast<uint64_t>(n), msg, wr, &sges[2 * n]);
    // In wire order, and only once posted: an ACK names no compact message still queued.
    if (msg.compact) lane.compact_sent.push_back(msg.header.id);
    wr.send_flags |= IBV_SEND_SIGNALED;
    chain(wr);
    OpState* completes = lane.outbox.front().completes;
    records[nrec++] = {completes, completes != nullptr ? 1u : 0u, 1, false};
    lane.outbox.pop_front();
  }
  uint32_t run_slices = 0;
  int lanes_total = lanes();
  while (n < budget && lane.head != nullptr) {
    OpState* op = lane.head;
    int li = (index - op->first_lane + lanes_total) % lanes_total;
    LaneCursor& c = op->lanes[li];
    const OpEntry& e = op->entries[c.entry];
    uint64_t offset = c.offset;
    uint64_t len = std::min<uint64_t>(op->slice_bytes, e.length - offset);
    ibv_send_wr& wr = wrs[n];
    ibv_sge* sge = &sges[2 * n];
    if (op->kind == OpKind::kSend && !verbs_area(*op).zero_copy) {
      OutMsg chunk;
      chunk.header.type = MsgType::kChunk;
      chunk.header.id = verbs_area(*op).peer_token;
      chunk.header.a = offset;
      chunk.payload = e.local + offset;
      chunk.payload_length = static_cast<uint32_t>(len);
      chunk.payload_lkey = dev_.lkey(e.local_region);
      build_message(index, lane.posted + static_cast<uint64_t>(n), chunk, wr, sge);
    } else {
      // A large message's zero-copy slices are RDMA WRITEs like a write's.
      wr = {};
      wr.wr_id = wr_id(kWrOp, index);
      wr.sg_list = sge;
      wr.num_sge = 1;
      fill_slice(*op, e, offset, len, wr, *sge);
    }
    chain(wr);
    ++run_slices;
    --c.remaining;
    advance(*op, c, static_cast<uint64_t>(op->lane_count));
    bool op_done_here = c.remaining == 0;
    // On one queue pair the target sees the immediate only after every earlier write landed
    // (RC order), so an unstriped op carries it on its last slice. Striped ops send it once all
    // lanes completed.
    bool carries_imm = op_done_here && op->with_imm && op->lane_count == 1;
    if (carries_imm) {
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = htonl(op->imm);
    }
    if (op_done_here || n == budget) {
      wr.send_flags |= IBV_SEND_SIGNALED;
      records[nrec++] = {op, run_slices, run_slices, carries_imm};  // one request per slice
      run_slices = 0;
    }
    if (op_done_here) {
      lane.head = op->lane_next[li];
      if (lane.head == nullptr) lane.tail = nullptr;
      if (op->kind == OpKind::kSend) {
        // FIN follows the message's last slice on this queue pair: RC delivers it after every
        // byte was placed, and its completion completes the send. Queued when the chain is
        // full; the outbox goes out before anything posted later.
        OutMsg fin = fin_of(op);
        if (n < budget) {
          ibv_send_wr& fwr = wrs[n];
          build_message(index, lane.posted + static_cast<uint64_t>(n), fin, fwr, &sges[2 * n]);
          fwr.send_flags |= IBV_SEND_SIGNALED;
          chain(fwr);
          records[nrec++] = {op, 1, 1, false};
        } else {
          lane.outbox.push_back(std::move(fin));
        }
      }
    }
  }
  if (n == 0) return;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(lane.qp, wrs, &bad); rc != 0) {
    fail_post(lane, index, rc);
    return;
  }
  lane.posted += static_cast<uint64_t>(n);
  lane.sq_free -= n;
  for (int r = 0; r < nrec; ++r) lane.signaled.push_back(records[r]);
  outstanding_.fetch_add(nrec);
}

void VerbsChannel::fail_post(Lane& lane, int index, int err) {
  lane.dead = true;
  close({ErrorCode::kSystem,
         "ibv_post_send on queue pair " + std::to_string(index) + ": " + std::strerror(err)});
}

// ---------------------------------------------------------------------------------------------
// Completions

Status VerbsChannel::error_of(const ibv_wc& wc) const {
  std::string what =
      std::string("work completion: ") + api_.wc_status_str(wc.status) + " (" + dev_.name() + ")";
  switch (wc.status) {
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
      return {ErrorCode::kPermissionDenied, what};
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_WR_FLUSH_ERR:
      return {ErrorCode::kPeerLost, what};
    default:
      return {ErrorCode::kSystem, what};
  }
}

void VerbsChannel::progress() {
  // Holding a reference: a completion callback may drop the last other one.
  std::shared_ptr<VerbsChannel> self = weak_from_this().lock();
  if (!self || polling_.held_here() || !polling_.try_lock()) return;
  if (!stopped_.load()) poll_both();
  // What the poll posted (a large message's slices after its CTS) completes with nobody
  // polling unless the send queue is armed.
  poll_and_arm_locked();
  polling_.unlock();
}

std::shared_ptr<void> VerbsChannel::watch_begin() {
  std::shared_ptr<VerbsChannel> self = weak_from_this().lock();
  if (self) spinners_.fetch_add(1);
  return self;
}

void VerbsChannel::watch_poll(bool messages) {
  // A wait inside a completion callback cannot poll: the poll it runs in holds the right.
  if (polling_.held_here() || !polling_.try_lock()) return;
  // A write or read completes on the send queue alone: one poll per turn keeps its completion
  // as close as perftest's loop does (the progress thread handles receives).
  if (!stopped_.load(std::memory_order_relaxed)) {
    poll_send();
    if (messages) poll_recv();
  }
  polling_.unlock();
}

void VerbsChannel::watch_end() { leave_spin(); }

void VerbsChannel::leave_spin() {
  if (spinners_.fetch_sub(1) != 1) return;
  // The last spinner: completions still to come must wake the progress thread. (A thread that
  // holds the polling right, a callback waiting inside a poll, leaves this to that poll; an op
  // posted after the check below has a waiter of its own, or arms as a large op does.)
  if (outstanding_.load() == 0 || polling_.held_here()) return;
  polling_.lock();
  poll_and_arm_locked();
  polling_.unlock();
}

void VerbsChannel::poll_and_arm_locked() {
  if (stopped_.load()) return;
  poll_send();
  if (spinners_.load() == 0 && outstanding_.load() > 0) {
    ibv_req_notify_cq(send_cq_, 0);
    poll_send();
  }
}

void VerbsChannel::ack_events() {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (api_.get_cq_event(comp_, &cq, &ctx) == 0) api_.ack_cq_events(cq, 1);
}

void VerbsChannel::on_event(uint32_t) {
  // An event the loop fetched in the round whose task quiesced the channel: its completion
  // channel went to the teardown thread (which acknowledges what is left).
  if (stopped_.load()) return;
  ack_events();
  // Receives: always armed (a waiter may poll them too).
  ibv_req_notify_cq(recv_cq_, 0);
  polling_.lock();
  if (poll_recv(kReceivesPerEvent) >= kReceivesPerEvent) {
    // More may wait, and the queue was armed before them: no event would come for them.
    std::shared_ptr<VerbsChannel> self = shared_from_this();
    host_.reactor().post(loop_, [self] { self->on_event(0); });
  }
  poll_and_arm_locked();
  // Busy: keep polling until `busy_poll` passed without a completion.
  auto last = std::chrono::steady_clock::now();
  while (busy_poll_.count() > 0 && !stopped_.load() &&
         std::chrono::steady_clock::now() - last < busy_poll_) {
    if (poll_both() > 0) last = std::chrono::steady_clock::now();
  }
  poll_and_arm_locked();  // the loop may have posted work (after a CTS) since the arm above
  polling_.unlock();
}

int VerbsChannel::drain(ibv_cq* cq, void (VerbsChannel::*handle)(const ibv_wc&), int budget) {
  ibv_wc wcs[kPollBatch];
  int handled = 0;
  while (handled < budget) {
    int n = ibv_poll_cq(cq, std::min(kPollBatch, budget - handled), wcs);
    if (n <= 0) break;
    handled += n;
    for (int i = 0; i < n; ++i) (this->*handle)(wcs[i]);
    if (n < kPollBatch) break;   // the queue was empty: a second poll would find little
    if (stopped_.load()) break;  // a callback closed the channel: `cq` went to the teardown
  }
  return handled;
}

int VerbsChannel::poll_send() { return drain(send_cq_, &VerbsChannel::handle_send_completion); }
int VerbsChannel::poll_recv(int budget) {
  int handled = drain(recv_cq_, &VerbsChannel::handle_recv_completion, budget);
  // The ACKs of the eager messages just taken go out together, one SEND for up to kAckBatch.
  if (acks_waiting_.load(std::memory_order_relaxed)) send_acks();
  return handled;
}
int VerbsChannel::poll_both() { return poll_send() + poll_recv(); }

void VerbsChannel::handle_send_completion(const ibv_wc& wc) {
  int index = lane_of(wc.wr_id);
  if (index >= lanes()) return;
  Lane& lane = *lanes_[static_cast<std::size_t>(index)];
  if (wc.status != IBV_WC_SUCCESS) {
    // The queue pair is in error now; everything after this flushes. The first error names
    // the cause; the drain accounts for the rest.
    Status s = error_of(wc);
    {
      std::lock_guard lock(lane.mu);
      if (!lane.signaled.empty() && lane.signaled.front().op != nullptr) {
        lane.signaled.front().op->record_error(s);
      }
      lane.dead = true;
    }
    close(s);
    return;
  }
  Lane::Signaled rec{};
  {
    std::lock_guard lock(lane.mu);
    if (lane.signaled.empty()) return;
    rec = lane.signaled.front();
    lane.signaled.pop_front();
    lane.sq_free += static_cast<int>(rec.wrs);
    // The freed slots go to waiting slices before the op completes: its callback may post.
    pump_locked(lane, index);
  }
  outstanding_.fetch_sub(1);
  OpState* op = rec.op;
  if (op == nullptr) return;  // a message: its op (if any) completes with the receiver's ACK
  if (op->finish_slices(static_cast<int64_t>(rec.slices))) {
    if (op->kind == OpKind::kSend) return finish_announced(op);
    bool notify = op->with_imm && !rec.imm;
    if (notify) {
      std::lock_guard lock(op->mu);
      notify = !op->has_error;
    }
    if (notify) {
      // Every slice of the operation is in the target's memory (RC completions); the
      // notification follows on the op's first lane.
      op->pending.store(1);
      Lane& first = *lanes_[static_cast<std::size_t>(op->first_lane)];
      std::lock_guard lock(first.mu);
      if (first.sq_free > 0 && first.imm_pending.empty()) {
        post_imm_locked(first, op->first_lane, op);
      } else {
        first.imm_pending.push_back(op);
      }
    } else {
      op->finish_posted();
    }
  }
}

void VerbsChannel::handle_recv_completion(const ibv_wc& wc) {
  int slot = dev_.slot_of_wr(wc.wr_id);
  if (slot < 0) return;
  if (wc.status != IBV_WC_SUCCESS) {
    // Flushed or failed: its buffer holds nothing; it goes back to the shared queue.
    Status reposted = dev_.repost_srq(slot);
    if (!latch_.closing()) close(reposted.ok() ? error_of(wc) : reposted);
    return;
  }
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    host_.deliver_imm(*link_, ntohl(wc.imm_data));
  } else if (wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
    on_compact(ntohl(wc.imm_data), dev_.slot_data(slot), wc.byte_len);
  } else if (wc.opcode == IBV_WC_RECV) {
    const uint8_t* data = dev_.slot_data(slot);
    uint32_t length = std::min(wc.byte_len, VerbsDevice::kRecvSlotBytes);
    MsgHeader h;
    if (Status s = MsgHeader::decode({data, length}, h); !s.ok()) {
      protocol_error(s.message());
    } else {
      handle_message(h, data + MsgHeader::kSize, length - static_cast<uint32_t>(MsgHeader::kSize));
    }
  }
  // Handled (payload copied out): the buffer goes back to the shared queue.
  if (Status s = dev_.repost_srq(slot); !s.ok()) close(s);
}

}  // namespace ferry::transport::verbs
