// Verbs RC transport: one-sided WRITE / READ / WRITE_WITH_IMM over reliable-connected queue
// pairs ("lanes"), posted from the caller's thread in chains (one ibv_post_send per lane per
// batch), selectively signaled. Tagged messages travel on lane 0 (one queue pair keeps them in
// order): small ones as one eager SEND into the device's shared receive buffers (compact: the
// payload alone, the tag in the immediate, where the tag fits 32 bits), large ones by
// rendezvous (RTS, the receiver's CTS, then RDMA WRITEs straight into a posted receive buffer
// that grants remote write, or CHUNK sends copied into any other receive buffer, or into a
// buffer of the receiver's while no receive is posted, then FIN). The receiver answers an eager
// message or a refused announcement with an ACK carrying its status; an announced message it
// took needs none (CTS told the sender what fits, and RC delivers the FIN after the bytes).
// Sends complete as over TCP: once the receiver took or buffered the message. Send completions
// go to a queue that waiting callers poll (Future::wait spins on it); it wakes the progress
// thread through the completion channel only when no caller spins and completions are
// outstanding, since each wake-up costs more than the round trip of a small write. Receives
// (messages, WRITE_WITH_IMM) come from the device's shared receive queue into a second queue,
// always armed for the progress thread, which waiting callers poll too (an eager send completes
// with the receiver's ACK). The progress thread keeps polling for `busy_poll` after the last
// completion before it sleeps again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/polling_right.hpp"
#include "core/ring.hpp"
#include "transport/close_latch.hpp"
#include "transport/contract.hpp"
#include "transport/verbs/verbs_device.hpp"
#include "transport/verbs/verbs_message.hpp"

namespace ferry::transport::verbs {

// What a peer needs to connect its queue pairs to ours; exchanged on the control connection.
struct VerbsAddress {
  static constexpr std::size_t kMaxQps = ferry::kMaxLanes;
  uint8_t gid[16] = {};
  uint16_t lid = 0;
  uint8_t mtu = 0;  // enum ibv_mtu
  uint32_t psn = 0;
  std::vector<uint32_t> qpns;

  std::vector<uint8_t> encode() const;
  // Rejects truncated or trailing input, no or too many queue pairs, queue pair numbers over
  // 24 bits, unknown MTUs.
  static Status decode(std::span<const uint8_t> bytes, VerbsAddress& out);
};

// What a verbs channel keeps in each op (OpState::transport_area).
struct VerbsOpArea {
  // A large message once the receiver answered: its handle for the message, and whether the
  // slices are RDMA WRITEs into its buffer (else CHUNK sends).
  uint64_t peer_token;
  bool zero_copy;
  // A message whose receiver's one ACK is still to come: set by the poster, taken by whichever
  // thread handles the ACK or the CTS (std::atomic_ref).
  bool ack_due;
};
inline VerbsOpArea& verbs_area(OpState& op) { return op.transport_area<VerbsOpArea>(); }
inline std::atomic_ref<bool> ack_due(OpState& op) {
  return std::atomic_ref<bool>(verbs_area(op).ack_due);
}

class VerbsChannel final : public Channel,
                           public ProgressSource,
                           public core::Reactor::Handler,
                           public std::enable_shared_from_this<VerbsChannel> {
 public:
  struct Options {
    int qps = 2;
    std::chrono::nanoseconds busy_poll{0};
    bool zero_copy_receives = false;  // Config::verbs.zero_copy_receives
  };
  // Creates the completion queues and the queue pairs in INIT; connect() finishes the set-up.
  static std::shared_ptr<VerbsChannel> create(Host& host, VerbsDevice& device,
                                              std::shared_ptr<PeerLink> link,
                                              const Options& options,
                                              std::function<void(const Status&)> on_closed);
  ~VerbsChannel() override;

  // Memory one channel holds for its lanes and send headers, whatever the peer sends (the
  // messages it stages count against the peer's unexpected-message limits).
  static std::size_t worst_case_bytes(int qps);

  TransportKind kind() const override { return TransportKind::kVerbs; }
  // The address is VerbsAddress::encode(): GID, MTU, PSN and the queue pair numbers.
  std::vector<uint8_t> local_address() const override { return queue_pairs().encode(); }
  // Moves every queue pair to RTR and RTS against the peer's and starts completion handling.
  Status connect(std::span<const uint8_t> remote) override;

  int lanes() const override { return static_cast<int>(lanes_.size()); }
  PostResult post(OpState* op) override;
  void close(const Status& reason) override;
  bool closed() const override { return latch_.closing(); }
  // The NIC serves the peer's accesses without holding the region: ibv_dereg_mr ends them.
  void cut_off(const uint8_t*, uint64_t, const Status&) override {}
  bool quiesced() const override { return latch_.quiesced(); }
  // Stops the queue pairs on the calling thread; only once the reactor has stopped.
  void stop_after_reactor() override;

  void on_event(uint32_t events) override;
  // ProgressSource: polls the send completion queue (and, for messages, the receive one) unless
  // another thread is polling it.
  void progress() override;
  std::shared_ptr<void> watch_begin() override;
  void watch_poll(bool messages) override;
  void watch_end() override;

 private:
  struct Lane;
  struct OutMsg;
  struct Staged;
  // A large message being received: into a posted receive, or into a buffer (staged) until a
  // receive takes it; how far it got.
  struct Incoming {
    OpState* recv;
    std::shared_ptr<Staged> staged;
    uint64_t length;    // the whole message
    uint64_t capacity;  // what the receive (or buffer) takes of it
    uint64_t received;  // CHUNK bytes so far
    bool zero_copy;
  };
  VerbsChannel(Host& host, VerbsDevice& device, std::shared_ptr<PeerLink> link,
               std::function<void(const Status&)> on_closed);
  Status init(int qps);
  VerbsAddress queue_pairs() const;
  // Queues `op` behind the lane's waiting ops (lane.mu held); its slices go as credits allow.
  void append_locked(Lane& lane, int index, OpState* op);
  void pump_locked(Lane& lane, int index);
  // The RDMA part of a write or read request for [offset, offset + len) of entry `e`: opcode,
  // addresses, keys, inline flag (added to `wr.send_flags`).
  void fill_slice(const OpState& op, const OpEntry& e, uint64_t offset, uint64_t len,
                  ibv_send_wr& wr, ibv_sge& sge) const;
  // Posts a lone single-slice write or read on an idle lane (lane.mu held).
  void post_single_locked(Lane& lane, int index, OpState* op);
  // Builds the SEND for `msg` into `wr` (header into the lane's next header slot, payload
  // into `sges`; a compact message: SEND_WITH_IMM of the payload alone); `seq` is the
  // request's position in the lane's sequence of requests.
  void build_message(int index, uint64_t seq, const OutMsg& msg, ibv_send_wr& wr, ibv_sge* sges);
  // The FIN that follows a large message's last byte; its delivery completes `op`.
  static OutMsg fin_of(OpState* op);
  // Queues a message on lane 0 and posts what credits allow.
  void send_message(OutMsg msg);
  void post_send_op(OpState* op);
  void handle_message(const MsgHeader& h, const uint8_t* payload, uint32_t length);
  void on_eager(const MsgHeader& h, const uint8_t* payload, uint32_t length);
  // A SEND_WITH_IMM: an eager message's payload alone, its tag in the immediate.
  void on_compact(uint32_t tag, const uint8_t* payload, uint32_t length);
  // Matches, buffers or refuses an eager message; `sender_op` names it in the ACK
  // (kCompactMessage: the next compact one).
  void take_eager(uint64_t tag, uint64_t sender_op, const uint8_t* payload, uint32_t length);
  void on_rts(const MsgHeader& h);
  void on_cts(const MsgHeader& h);
  void on_chunk(const MsgHeader& h, const uint8_t* payload, uint32_t length);
  void on_fin(const MsgHeader& h);
  // An announced message's FIN was delivered: its send completes.
  void finish_announced(OpState* op);
  void on_ack(const MsgHeader& h, const uint8_t* payload, uint32_t length);
  // Completes the send `id` an ACK names; false (the channel closing) if there is none.
  bool take_ack(uint64_t id, ErrorCode code, const uint8_t* text, uint32_t length);
  // Answers an announced message with CTS: its bytes go into `recv` or `staged`.
  void start_incoming(OpState* recv, std::shared_ptr<Staged> staged, uint64_t sender_op,
                      uint64_t length);
  void finish_staged(const Incoming& in);
  // Answers an eager message or a refused announcement. A message taken without error is
  // acknowledged with others (up to kAckBatch in one ACK): after the receive completions being
  // handled, or before any other message this side sends, whichever comes first.
  void ack(uint64_t sender_op, const Status& status);
  void queue_acks_locked(Lane& lane);
  void send_acks();
  void protocol_error(const std::string& what);
  void post_imm_locked(Lane& lane, int index, OpState* op);
  // Completions handled.
  int poll_send();
  int poll_recv(int budget = std::numeric_limits<int>::max());
  // Both queues: what Future::test and a waiter for a message poll.
  int poll_both();
  // Polls `cq` until a poll comes back short of a full batch or `budget` completions were
  // handled, passing each completion to `handle`; returns how many.
  int drain(ibv_cq* cq, void (VerbsChannel::*handle)(const ibv_wc&),
            int budget = std::numeric_limits<int>::max());
  // With the polling right held: polls the send queue and, unless a caller spins, arms it for
  // an event if completions are outstanding (and polls again: one that landed before the arm
  // raises no event).
  void poll_and_arm_locked();
  // Acknowledges every pending completion-channel event.
  void ack_events();
  // A spinner leaves; the last one arms the send queue if completions are outstanding.
  void leave_spin();
  void handle_send_completion(const ibv_wc& wc);
  void handle_recv_completion(const ibv_wc& wc);
  void fail_post(Lane& lane, int index, int err);
  // What the device holds for this channel. Destroying it can block in the kernel until the wire
  // gave back the queue pairs' packets, so a closed channel hands it to Host::teardown().
  struct Resources {
    const VerbsApi* api = nullptr;
    std::vector<ibv_qp*> qps;
    ibv_comp_channel* comp = nullptr;
    bool events_armed = false;  // the completion channel may hold unacknowledged events
    ibv_cq* send_cq = nullptr;
    ibv_cq* recv_cq = nullptr;
    ibv_mr* headers_mr = nullptr;
    std::unique_ptr<uint8_t[]> headers;
    void destroy();
  };
  // Marks every lane dead and moves the device's objects out of the channel.
  Resources take_resources();
  // Moves every queue pair to the error state, then waits (up to kDrainWait) for the flush of a
  // marker request posted behind all others: once it completes, the device is done with every
  // request of ours, so their memory is the caller's again (docs/architecture.md).
  void stop_queue_pairs();
  // Where the channel closes (its loop thread, or shutdown's once the reactor stopped): stops
  // the queue pairs, reports the channel closed, and hands what is left to the teardown thread.
  void quiesce();
  // Handles what is left in our receive queue (a delivered FIN must not be lost), returning
  // each slot to the shared receive queue.
  void drain_receives();
  Status error_of(const ibv_wc& wc) const;

  Host& host_;
  VerbsDevice& dev_;
  const VerbsApi& api_;
  std::shared_ptr<PeerLink> link_;
  CloseLatch latch_;
  ibv_comp_channel* comp_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  std::vector<std::unique_ptr<Lane>> lanes_;
  int send_depth_ = 0;
  std::unique_ptr<uint8_t[]> headers_;  // per lane, send_depth_ slots of kHeaderSlot bytes
  ibv_mr* headers_mr_ = nullptr;
  uint32_t psn_ = 0;
  uint32_t max_inline_ = 0;
  int loop_ = 0;
  bool registered_ = false;
  std::shared_ptr<VerbsChannel> keep_alive_;  // while registered with the reactor
  std::chrono::nanoseconds busy_poll_{0};
  bool zero_copy_receives_ = false;
  // Serialises completion-queue polling (callers and the progress thread): completions of one
  // queue pair are handled in order. A wait inside a completion callback does not poll.
  core::PollingRight polling_;
  std::atomic<bool> acks_waiting_{false};  // lane 0 holds ACKs not yet queued
  std::atomic<int> spinners_{0};           // callers polling the send queue
  std::atomic<int64_t> outstanding_{0};    // signaled work requests not yet completed

  std::mutex msg_mu_;                                // incoming_, awaiting_cts_
  std::unordered_map<uint64_t, Incoming> incoming_;  // by token
  uint64_t next_token_ = 0;
  std::unordered_set<uint64_t> awaiting_cts_;  // our large sends' op ids

  // The queue pairs are stopping or stopped: no completion queue may be polled any more.
  std::atomic<bool> stopped_{false};
};

}  // namespace ferry::transport::verbs
