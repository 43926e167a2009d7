// What the parts of VerbsChannel share: verbs_channel_setup.cpp (its address, set-up,
// closing), verbs_channel.cpp (one-sided posting, completions) and verbs_channel_messages.cpp
// (tagged messages: eager, compact, rendezvous, zero-copy). Private to the verbs transport.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/ring.hpp"
#include "transport/matcher.hpp"
#include "transport/verbs/verbs_channel.hpp"
#include "transport/verbs/verbs_device.hpp"
#include "transport/verbs/verbs_message.hpp"

namespace ferry::transport::verbs {

// Payload one eager SEND or CHUNK carries: what fits a receive buffer after the header.
constexpr uint32_t kMessagePayload = VerbsDevice::kRecvSlotBytes - MsgHeader::kSize;
// Zero-copy slices of a large message: the engine's default slice, which reached line rate for
// writes (docs/performance.md), and within every device's largest message (rxe: 8 MiB).
constexpr uint64_t kZeroCopySlice = 1 << 20;

// Eager messages the receiver lets wait for one ACK (AckNames: by op id, compact ones by
// count). Batching the ACKs of eager messages taken in one sweep of receive completions saves a
// SEND and its RC ACK per message: at 64 KiB, where a message is 16 packets, each saved pair is
// worth ~10% of send bandwidth under Soft-RoCE.
constexpr std::size_t kAckBatch = AckNames::kMaxIds;

// Completions taken from a queue per ibv_poll_cq.
constexpr int kPollBatch = 32;
// A message header plus the longest error text an ACK carries.
constexpr uint32_t kHeaderSlot = 256;
// What a work request's id says: its kind and queue pair (lane).
enum WrKind : uint64_t { kWrOp = 1, kWrImm = 2, kWrMsg = 3, kWrDrain = 4 };
inline uint64_t wr_id(WrKind kind, int lane) {
  return (static_cast<uint64_t>(kind) << 56) | (static_cast<uint64_t>(lane) << 48);
}
inline int lane_of(uint64_t id) { return static_cast<int>((id >> 48) & 0xff); }
inline WrKind kind_of(uint64_t id) { return static_cast<WrKind>(id >> 56); }

// Op ids are never 0: a compact message's sender op, which the message does not carry (the
// receiver names such messages by count, in order).
constexpr uint64_t kCompactMessage = 0;

// A message waiting for a send-queue slot on lane 0.
struct VerbsChannel::OutMsg {
  MsgHeader header;
  const uint8_t* payload = nullptr;  // EAGER: the user's bytes (registered)
  uint32_t payload_length = 0;
  uint32_t payload_lkey = 0;
  // EAGER whose tag fits the immediate: the payload alone, as SEND_WITH_IMM (docs/protocol.md,
  // "Verbs messages"). A 64 KiB payload is then 16 packets of a 4 KiB MTU, not 17.
  bool compact = false;
  std::string text;              // ACK: the error's text
  OpState* completes = nullptr;  // FIN: the send its delivery completes
};

// A large message arriving while no receive is posted: its bytes go into `data`; a receive
// that matches it meanwhile waits for them.
struct VerbsChannel::Staged final : Rendezvous {
  void matched(OpState* r) override {
    {
      std::lock_guard lock(mu);
      if (!complete) {
        recv = r;  // FIN delivers
        return;
      }
    }
    Matcher::deliver(r, data.data(), data.size());
    r->finish_posted();
  }
  std::mutex mu;
  bool complete = false;      // guarded by mu
  OpState* recv = nullptr;    // guarded by mu
  std::vector<uint8_t> data;  // sized before CTS, filled by CHUNKs
};

struct VerbsChannel::Lane {
  // No member initialisers: pump_locked keeps an array of these on the stack per post.
  struct Signaled {
    OpState* op;
    uint32_t slices;  // op slices this completion accounts for
    uint32_t wrs;     // send-queue slots it frees
    bool imm;         // carried the op's immediate: the op is complete, nothing follows
  };
  ibv_qp* qp = nullptr;
  std::mutex mu;
  int sq_free = 0;
  OpState* head = nullptr;  // ops with slices still to post on this lane
  OpState* tail = nullptr;
  std::vector<OpState*> imm_pending;  // ops whose notification waits for a free slot
  core::Ring<OutMsg> outbox;          // messages waiting for a free slot (lane 0)
  // Lane 0: the sender op ids of eager messages taken without error whose ACK is not queued,
  // and how many compact ones.
  std::array<uint64_t, AckNames::kMaxIds> acks_due{};
  std::size_t acks_due_count = 0;
  uint64_t compact_acks_due = 0;
  // Lane 0: the op ids of our compact messages, in the order they went out, until ACKed. The
  // receiver takes them in that order and names them by count.
  core::Ring<uint64_t> compact_sent;
  core::Ring<Signaled> signaled;  // in posting order; RC completes them in that order
  uint64_t posted = 0;            // requests posted so far: picks the next header slot
  bool dead = false;              // in error or draining: post nothing more
  // The template for a lone small operation (post_single_locked): built once, only the
  // operation's own fields change per post.
  ibv_send_wr single_wr{};
  ibv_sge single_sge{};
};

}  // namespace ferry::transport::verbs
