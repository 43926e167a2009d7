// The fixed 48-byte frame header used on every Ferry TCP connection (docs/protocol.md).
// Control frames carry an encoded body as payload; data frames carry user bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/error.hpp"

namespace ferry::core {

enum class FrameType : uint8_t {
  // Control connection.
  kHello = 1,
  kHelloAck = 2,
  kAuth = 3,
  kAuthOk = 4,
  kJoin = 5,
  kJoinOk = 6,
  kError = 7,
  kPing = 8,
  kPong = 9,
  kBye = 10,
  kChannelAddresses = 11,  // each channel's transport address, during the handshake
  // Data streams.
  kWrite = 16,     // payload: bytes for region_id/key at offset
  kWriteAck = 17,  // status; payload: error text when status != ok
  kReadReq = 18,   // `length` bytes wanted from region_id/key at offset; no payload
  kReadData = 19,  // payload: data (or error text when status != ok)
  kSend = 20,      // key = tag; payload: message
  kSendAck = 21,   // status; payload: error text when status != ok
  kSendCts = 22,   // a receive took the announced message op_id: send its bytes
  // Groups: several small slices of one operation in one frame (docs/protocol.md). region_id
  // is the entry count n (1..kMaxGroupEntries); the payload starts with n entry records.
  kWriteGroup = 23,     // n records, then the entries' bytes in order; flags as kWrite
  kReadGroupReq = 24,   // n records, nothing else
  kReadGroupData = 25,  // n records (echoed), then the entries' bytes; or error text
};

enum FrameFlags : uint8_t {
  kFlagImm = 1,  // kWrite(Group) belongs to a write_with_imm: aux32 = imm, aux64 = streams used
  kFlagLastOnStream = 2,  // last kWrite of its operation on this stream
  kFlagAnnounce = 4,      // kSend: announces a large message of `length` bytes; no payload
  kFlagRendezvous = 8,    // kSend: the bytes of the announced message op_id, after kSendCts
};

struct FrameHeader {
  FrameType type{};
  uint8_t flags = 0;
  uint16_t status = 0;  // ErrorCode
  uint32_t region_id = 0;
  uint32_t length = 0;  // payload bytes that follow, or bytes requested by kReadReq
  uint32_t aux32 = 0;
  uint64_t op_id = 0;
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t aux64 = 0;
};

constexpr std::size_t kFrameHeaderSize = 48;
// Largest payload a control frame may announce; control bodies are tiny.
constexpr uint32_t kMaxControlPayload = 4096;
// Largest error text carried by an ack.
constexpr uint32_t kMaxErrorText = 1024;
// Entries of one group frame, and the size of each entry record.
constexpr uint32_t kMaxGroupEntries = 256;
constexpr uint32_t kGroupEntrySize = 32;

// One entry record of a group frame: where in the target the entry's bytes go (or come from),
// and the index of the batch entry it belongs to (error texts, read placement).
struct GroupEntry {
  uint32_t region_id = 0;
  uint32_t length = 0;
  uint64_t key = 0;
  uint64_t offset = 0;
  uint32_t index = 0;
};
void encode_group_entry(const GroupEntry& e, uint8_t* out);
// Decodes the n records of a group frame's table (`bytes` must be n * kGroupEntrySize, n at most
// kMaxGroupEntries, the reserved field zero) into out[0..n) and sums their lengths.
Status decode_group_table(const uint8_t* in, std::size_t bytes, uint32_t n, GroupEntry* out,
                          uint64_t& total_length);

void encode_header(const FrameHeader& h, uint8_t* out);
// Rejects unknown types, flags and status codes and over-long payloads; changes nothing on error.
Status decode_header(const uint8_t* in, FrameHeader& out);
// Bytes of payload that follow this header on the wire. For a kWriteGroup or kReadGroupData
// these include the entry table.
uint32_t payload_length(const FrameHeader& h);
bool is_control(FrameType t);

}  // namespace ferry::core
