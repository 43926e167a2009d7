// Matches incoming tagged messages with posted receives of one peer, in arrival order per tag.
// A message that finds no receive is buffered until one is posted, within limits: the peer's
// bytes and message count, and the bytes of all peers of the engine together. A large message
// over verbs is announced before its bytes arrive (rendezvous): with no receive posted, its
// place in the queue is held while the transport fetches the bytes into a buffer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/op.hpp"

namespace ferry::transport {

// What the matchers of all peers of one engine may buffer together, and the number of messages
// each of them may hold: one object per engine, shared by its peers' matchers.
class UnexpectedBudget {
 public:
  UnexpectedBudget(std::size_t max_total_bytes, std::size_t max_messages_per_peer)
      : max_total_bytes_(max_total_bytes), max_messages_per_peer_(max_messages_per_peer) {}
  UnexpectedBudget(const UnexpectedBudget&) = delete;
  UnexpectedBudget& operator=(const UnexpectedBudget&) = delete;

  // Takes `bytes` of the budget unless that would pass its limit.
  bool try_reserve(std::size_t bytes) {
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > max_total_bytes_ - used) return false;  // never above the limit: no overflow
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  void release(std::size_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  std::size_t used() const { return used_.load(std::memory_order_relaxed); }
  std::size_t max_total_bytes() const { return max_total_bytes_; }
  std::size_t max_messages_per_peer() const { return max_messages_per_peer_; }

 private:
  const std::size_t max_total_bytes_;
  const std::size_t max_messages_per_peer_;
  std::atomic<std::size_t> used_{0};
};

// An announced message whose bytes are still arriving (see Matcher::announce).
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // A receive (posted, holding the transport's reference) takes the message; the transport
  // fills and completes it once the bytes are in.
  virtual void matched(OpState* recv) = 0;
};

class Matcher {
 public:
  // What each buffered message counts against the byte limits besides its payload: its queue
  // record (Unexpected, 56 bytes), the allocator's headers of its data block and its share of
  // the queue's blocks. Without it a peer could park unlimited zero-byte messages, each costing
  // memory while counting nothing.
  static constexpr std::size_t kUnexpectedOverheadBytes = 128;

  // `budget`: the engine's, shared with its other peers; none: no engine-wide limit and no
  // limit on the number of messages.
  explicit Matcher(std::size_t max_unexpected_bytes,
                   std::shared_ptr<UnexpectedBudget> budget = nullptr);
  // Gives what the peer's messages still hold back to the engine's budget.
  ~Matcher();
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // A receive (entries[0] = destination and capacity, tag set). If a buffered message matches,
  // it is copied and the op completed here; else the op waits for a message.
  void post(OpState* recv);
  // Fills the receive from a message buffered earlier, if one has its tag; does not complete
  // it. Messages that arrived before a peer was lost stay receivable this way.
  bool take_buffered(OpState* recv);

  // A message of `length` bytes with `tag` starts arriving. Either `recv` is a posted receive to
  // fill directly, or the message was counted against the limits and the caller collects its
  // bytes, as they arrive, into a buffer of its own (then commit(), or abandon() if they stop
  // coming); `error` says it must be refused. Nothing is allocated here: `length` is the
  // peer's word, not bytes it sent.
  struct Arrival {
    OpState* recv = nullptr;
    Status error;
  };
  Arrival arrive(uint64_t tag, uint64_t length);
  // The buffered message is complete (`buffer` holds all the bytes arrive() was told of): hand
  // it to a receive posted meanwhile, or queue it.
  void commit(uint64_t tag, std::vector<uint8_t> buffer);
  // The bytes of a message of `length` bytes that arrive() counted will not come (its stream
  // stopped): it no longer counts.
  void abandon(uint64_t length);
  // A message of `length` bytes is announced: returns the posted receive that takes it (the
  // caller fetches the bytes into it), or holds the message's place, reserving `length` bytes
  // of the limit, and returns null (the caller fetches the bytes into a buffer, then fulfil()).
  // `error` when over the limit.
  OpState* announce(uint64_t tag, uint64_t length, std::shared_ptr<Rendezvous> message,
                    Status& error);
  // The bytes of an announced message are in `data`: it becomes a buffered message, unless a
  // receive took it meanwhile (then returns false and leaves `data` alone).
  bool fulfil(const Rendezvous* message, std::vector<uint8_t>& data);
  // A receive took an announced message of `length` bytes (matched()) and its bytes are in:
  // what was reserved for it no longer counts.
  void release(std::size_t length);

  // Messages buffered or arriving without a receive, and what they count against the byte
  // limits (payload plus kUnexpectedOverheadBytes each).
  struct Usage {
    std::size_t messages = 0;
    std::size_t bytes = 0;
  };
  Usage usage() const;

  // Removes every posted receive (the peer is gone); each still holds the transport reference.
  // Announced messages still arriving go too: their bytes will not come.
  std::vector<OpState*> take_posted();
  // Removes the posted receives into region `region_id` (it is being deregistered); each still
  // holds the transport reference. A receive already being filled is not among them.
  std::vector<OpState*> take_posted_into(uint32_t region_id);

  // Fills a receive from a complete message: copies up to its capacity, then settle().
  static void deliver(OpState* recv, const uint8_t* data, uint64_t length);
  // Records the bytes a receive got from a message of `length` bytes, and truncation.
  static void settle(OpState* recv, uint64_t length);
  // The sender's status when a receive of `capacity` bytes took only part of its message.
  static Status truncated_send(uint64_t tag, uint64_t capacity);

 private:
  struct Unexpected {
    uint64_t tag;
    std::vector<uint8_t> data;
    std::shared_ptr<Rendezvous> announced;  // set while the bytes are still arriving
    std::size_t reserved = 0;               // counted in unexpected_bytes_ (charge(length))
  };
  // The record plus the allocator's header (16 bytes) and rounding (up to 16) of the data block.
  static_assert(sizeof(Unexpected) + 32 <= kUnexpectedOverheadBytes);
  static std::size_t charge(uint64_t length) {
    return static_cast<std::size_t>(length) + kUnexpectedOverheadBytes;
  }
  OpState* take_posted_locked(uint64_t tag);
  // Counts one more message of `length` bytes against every limit, or says which refuses it
  // (mu_ held).
  Status reserve_locked(uint64_t tag, uint64_t length);
  void unreserve_locked(std::size_t reserved);
  bool take_unexpected_locked(uint64_t tag, bool data_only, Unexpected& out);

  mutable std::mutex mu_;
  std::deque<OpState*> posted_;
  std::deque<Unexpected> unexpected_;
  std::size_t unexpected_bytes_ = 0;     // of reservations: buffered, arriving, announced
  std::size_t unexpected_messages_ = 0;  // the same messages, counted
  std::size_t max_unexpected_;
  std::shared_ptr<UnexpectedBudget> budget_;
};

}  // namespace ferry::transport
