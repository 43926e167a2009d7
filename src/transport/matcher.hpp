// Matches incoming tagged messages with posted receives of one peer, in arrival order per tag.
// A message that finds no receive is buffered (up to a byte limit) until one is posted.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "transport/op.hpp"

namespace ferry::transport {

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

  // Removes every posted receive (the peer is gone); each still holds the transport reference.
  std::vector<OpState*> take_posted();

  // Fills a receive from a complete message: copies up to its capacity, then settle().
  static void deliver(OpState* recv, const uint8_t* data, uint64_t length);
  // Records the bytes a receive got from a message of `length` bytes, and truncation.
  static void settle(OpState* recv, uint64_t length);

 private:
  struct Unexpected {
    uint64_t tag;
    std::vector<uint8_t> data;
  };
  OpState* take_posted_locked(uint64_t tag);
  bool take_unexpected_locked(uint64_t tag, std::vector<uint8_t>& out);

  std::mutex mu_;
  std::deque<OpState*> posted_;
  std::deque<Unexpected> unexpected_;
  std::size_t unexpected_bytes_ = 0;
  std::size_t max_unexpected_;
};

}  // namespace ferry::transport
