// Matches incoming tagged messages with posted receives of one peer, in arrival order per tag.
// A message that finds no receive is buffered (up to a byte limit) until one is posted. A large
// message over verbs is announced before its bytes arrive (rendezvous): with no receive posted,
// its place in the queue is held while the transport fetches the bytes into a buffer.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/op.hpp"

namespace ferry::transport {

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
  explicit Matcher(std::size_t max_unexpected_bytes) : max_unexpected_(max_unexpected_bytes) {}

  // A receive (entries[0] = destination and capacity, tag set). If a buffered message matches,
  // it is copied and the op completed here; else the op waits for a message.
  void post(OpState* recv);
  // Fills the receive from a message buffered earlier, if one has its tag; does not complete
  // it. Messages that arrived before a peer was lost stay receivable this way.
  bool take_buffered(OpState* recv);

  // A message of `length` bytes with `tag` starts arriving. Either `recv` is a posted receive to
  // fill directly, or `buffer` was sized to hold the message; `error` says it must be refused.
  struct Arrival {
    OpState* recv = nullptr;
    std::vector<uint8_t> buffer;
    Status error;
  };
  Arrival arrive(uint64_t tag, uint64_t length);
  // The buffered message is complete: hand it to a receive posted meanwhile, or queue it.
  void commit(uint64_t tag, std::vector<uint8_t> buffer);
  // A message of `length` bytes is announced: returns the posted receive that takes it (the
  // caller fetches the bytes into it), or holds the message's place, reserving `length` bytes
  // of the limit, and returns null (the caller fetches the bytes into a buffer, then fulfil()).
  // `error` when over the limit.
  OpState* announce(uint64_t tag, uint64_t length, std::shared_ptr<Rendezvous> message,
                    Status& error);
  // The bytes of an announced message are in `data`: it becomes a buffered message, unless a
  // receive took it meanwhile (then returns false and leaves `data` alone).
  bool fulfil(const Rendezvous* message, std::vector<uint8_t>& data);
  // A receive took an announced message (matched()) and its bytes are in: the `length` bytes
  // reserved for it no longer count.
  void release(std::size_t bytes);

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
    std::size_t reserved = 0;               // counted in unexpected_bytes_
  };
  OpState* take_posted_locked(uint64_t tag);
  // Over the buffered-bytes limit (mu_ held).
  Status refusal(uint64_t tag) const;
  bool take_unexpected_locked(uint64_t tag, bool data_only, Unexpected& out);

  std::mutex mu_;
  std::deque<OpState*> posted_;
  std::deque<Unexpected> unexpected_;
  std::size_t unexpected_bytes_ = 0;
  std::size_t max_unexpected_;
};

}  // namespace ferry::transport
