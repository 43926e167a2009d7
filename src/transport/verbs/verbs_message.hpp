// Tagged messages over verbs (docs/protocol.md, "Verbs messages"): every SEND starts with this
// fixed header; EAGER and CHUNK carry payload after it, ACK an error text.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ferry/error.hpp"

namespace ferry::transport::verbs {

enum class MsgType : uint8_t {
  kEager = 1,  // a whole message: tag, sender's op id, payload
  kAck = 2,    // the receiver took (or refused) a message: sender's op id, status, text
  kRts = 3,    // a large message is ready: tag, sender's op id, length
  kCts = 4,    // the receiver matched it: sender's op id, receiver's token, capacity, and the
               // address + rkey to write into (zero-copy) or address 0 (send it as CHUNKs)
  kChunk = 5,  // part of a large message: receiver's token, offset, payload
  kFin = 6,    // every byte of a large message was written or sent: receiver's token, length
};

struct MsgHeader {
  static constexpr std::size_t kSize = 48;
  MsgType type = MsgType::kEager;
  uint16_t status = 0;  // ErrorCode, on ACK
  uint32_t rkey = 0;    // CTS
  uint64_t tag = 0;     // EAGER, RTS
  uint64_t id = 0;      // the sender's op id (EAGER, RTS, CTS, ACK) or the receiver's token
  uint64_t a = 0;       // RTS, FIN: message length; CTS: address (0: chunks); CHUNK: offset
  uint64_t b = 0;       // CTS: the receiver's token
  uint64_t c = 0;       // CTS: bytes the receiver takes

  void encode(uint8_t* out) const;
  // Rejects short input, unknown types and a set reserved byte.
  static Status decode(std::span<const uint8_t> bytes, MsgHeader& out);
};

// The messages an ACK names: with status `ok`, up to kMaxIds by the sender's op id (id, then a,
// b, c up to the first 0; op ids are never 0) and the next `compact` compact messages (its tag
// field), at least one in all; with an error, exactly one.
struct AckNames {
  static constexpr std::size_t kMaxIds = 4;
  std::array<uint64_t, kMaxIds> ids{};
  std::size_t count = 0;  // of ids
  uint64_t compact = 0;
  // Rejects a list with a gap, one naming nothing, and an error naming more than one.
  static Status decode(const MsgHeader& ack, AckNames& out);
};

}  // namespace ferry::transport::verbs
