// TCP's data frames: their types, flags and group-frame entry tables, and the checks a stream
// applies to a data frame's header beyond core::decode_header (docs/protocol.md, "Data streams").
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/frame.hpp"
#include "ferry/error.hpp"

namespace ferry::transport::tcp {

// Data frame types (core::kFirstDataType and above).
struct TcpFrame {
  static constexpr core::FrameType kWrite{16};     // payload: bytes for region_id/key at offset
  static constexpr core::FrameType kWriteAck{17};  // status; payload: error text when status != ok
  static constexpr core::FrameType kReadReq{18};   // `length` bytes wanted from region_id/key
                                                   // at offset; no payload
  static constexpr core::FrameType kReadData{19};  // payload: data (or error text on error)
  static constexpr core::FrameType kSend{20};      // key = tag; payload: message
  static constexpr core::FrameType kSendAck{21};   // status; payload: error text on error
  static constexpr core::FrameType kSendCts{22};   // a receive took the announced message op_id
  // Groups: several small slices of one operation in one frame. region_id is the entry count
  // n (1..kMaxGroupEntries); the payload starts with n entry records.
  static constexpr core::FrameType kWriteGroup{23};     // n records, then the entries' bytes;
                                                        // flags as kWrite
  static constexpr core::FrameType kReadGroupReq{24};   // n records, nothing else
  static constexpr core::FrameType kReadGroupData{25};  // n records (echoed), then the bytes;
                                                        // or error text
};

// A type as a number, for switches over data frame types (not enumerators of core::FrameType).
constexpr uint8_t raw(core::FrameType type) { return static_cast<uint8_t>(type); }

enum FrameFlags : uint8_t {
  kFlagImm = 1,  // kWrite(Group) belongs to a write_with_imm: aux32 = imm, aux64 = streams used
  kFlagLastOnStream = 2,  // last kWrite of its operation on this stream
  kFlagAnnounce = 4,      // kSend: announces a large message of `length` bytes; no payload
  kFlagRendezvous = 8,    // kSend: the bytes of the announced message op_id, after kSendCts
};

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

// A data frame's header as decoded by core::decode_header: rejects types TCP does not use,
// flags not allowed for the type, over-long error texts and inconsistent group sizes.
Status check_data_header(const core::FrameHeader& h);
// Bytes of payload that follow this header on the wire. For a kWriteGroup or kReadGroupData
// these include the entry table.
uint32_t payload_length(const core::FrameHeader& h);

}  // namespace ferry::transport::tcp
