#include "core/frame.hpp"

#include <string>

#include "core/bytes.hpp"

namespace ferry::core {

void encode_header(const FrameHeader& h, uint8_t* out) {
  out[0] = static_cast<uint8_t>(h.type);
  out[1] = h.flags;
  store_le(out + 2, h.status, 2);
  store_le(out + 4, h.region_id, 4);
  store_le(out + 8, h.length, 4);
  store_le(out + 12, h.aux32, 4);
  store_le(out + 16, h.op_id, 8);
  store_le(out + 24, h.key, 8);
  store_le(out + 32, h.offset, 8);
  store_le(out + 40, h.aux64, 8);
}

bool is_control(FrameType t) { return static_cast<uint8_t>(t) < 16; }

uint32_t payload_length(const FrameHeader& h) {
  bool announce = h.type == FrameType::kSend && (h.flags & kFlagAnnounce) != 0;
  return h.type == FrameType::kReadReq || announce ? 0 : h.length;
}

Status decode_header(const uint8_t* in, FrameHeader& out) {
  FrameHeader h;
  uint8_t type = in[0];
  bool known = (type >= 1 && type <= 11) || (type >= 16 && type <= 25);
  if (!known) return {ErrorCode::kProtocol, "frame: unknown type " + std::to_string(type)};
  h.type = static_cast<FrameType>(type);
  h.flags = in[1];
  h.status = static_cast<uint16_t>(load_le(in + 2, 2));
  h.region_id = static_cast<uint32_t>(load_le(in + 4, 4));
  h.length = static_cast<uint32_t>(load_le(in + 8, 4));
  h.aux32 = static_cast<uint32_t>(load_le(in + 12, 4));
  h.op_id = load_le(in + 16, 8);
  h.key = load_le(in + 24, 8);
  h.offset = load_le(in + 32, 8);
  h.aux64 = load_le(in + 40, 8);

  bool write = h.type == FrameType::kWrite || h.type == FrameType::kWriteGroup;
  uint8_t allowed_flags = write                        ? (kFlagImm | kFlagLastOnStream)
                          : h.type == FrameType::kSend ? (kFlagAnnounce | kFlagRendezvous)
                                                       : 0;
  if ((h.flags & ~allowed_flags) != 0 || h.flags == (kFlagAnnounce | kFlagRendezvous)) {
    return {ErrorCode::kProtocol, "frame: flags " + std::to_string(h.flags) + " not valid here"};
  }
  if (h.status > static_cast<uint16_t>(ErrorCode::kUnsupported)) {
    return {ErrorCode::kProtocol, "frame: unknown status " + std::to_string(h.status)};
  }
  if (is_control(h.type) && h.length > kMaxControlPayload) {
    return {ErrorCode::kProtocol,
            "frame: control payload of " + std::to_string(h.length) + " bytes"};
  }
  bool is_ack = h.type == FrameType::kWriteAck || h.type == FrameType::kSendAck;
  bool carries_error_text =
      is_ack || h.type == FrameType::kReadData || h.type == FrameType::kReadGroupData;
  if (carries_error_text && h.status != 0 && h.length > kMaxErrorText) {
    return {ErrorCode::kProtocol, "frame: error text of " + std::to_string(h.length) + " bytes"};
  }
  if (h.type == FrameType::kSendCts && h.length != 0) {
    return {ErrorCode::kProtocol, "frame: clear-to-send with a payload"};
  }
  if (is_ack && h.status == 0 && h.length != 0) {
    return {ErrorCode::kProtocol, "frame: successful ack with a payload"};
  }
  if (h.type == FrameType::kWriteAck && h.aux32 > kMaxGroupEntries) {
    return {ErrorCode::kProtocol, "frame: ack for " + std::to_string(h.aux32) + " entries"};
  }
  bool group = h.type == FrameType::kWriteGroup || h.type == FrameType::kReadGroupReq ||
               h.type == FrameType::kReadGroupData;
  if (group) {
    if (h.region_id == 0 || h.region_id > kMaxGroupEntries) {
      return {ErrorCode::kProtocol, "frame: group of " + std::to_string(h.region_id) + " entries"};
    }
    uint64_t table = uint64_t{h.region_id} * kGroupEntrySize;
    bool error_text = h.type == FrameType::kReadGroupData && h.status != 0;
    bool fits =
        h.type == FrameType::kReadGroupReq ? h.length == table : error_text || h.length >= table;
    if (!fits || (h.type != FrameType::kReadGroupData && h.status != 0)) {
      return {ErrorCode::kProtocol, "frame: group of " + std::to_string(h.region_id) +
                                        " entries in " + std::to_string(h.length) + " bytes"};
    }
  }
  out = h;
  return {};
}

void encode_group_entry(const GroupEntry& e, uint8_t* out) {
  store_le(out, e.region_id, 4);
  store_le(out + 4, e.length, 4);
  store_le(out + 8, e.key, 8);
  store_le(out + 16, e.offset, 8);
  store_le(out + 24, e.index, 4);
  store_le(out + 28, 0, 4);
}

Status decode_group_table(const uint8_t* in, std::size_t bytes, uint32_t n, GroupEntry* out,
                          uint64_t& total_length) {
  if (n == 0 || n > kMaxGroupEntries || bytes != std::size_t{n} * kGroupEntrySize) {
    return {ErrorCode::kProtocol, "group: " + std::to_string(bytes) + " bytes of table for " +
                                      std::to_string(n) + " entries"};
  }
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* r = in + std::size_t{i} * kGroupEntrySize;
    if (load_le(r + 28, 4) != 0) {
      return {ErrorCode::kProtocol, "group: entry " + std::to_string(i) + " reserved field set"};
    }
  }
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* r = in + std::size_t{i} * kGroupEntrySize;
    GroupEntry& e = out[i];
    e.region_id = static_cast<uint32_t>(load_le(r, 4));
    e.length = static_cast<uint32_t>(load_le(r + 4, 4));
    e.key = load_le(r + 8, 8);
    e.offset = load_le(r + 16, 8);
    e.index = static_cast<uint32_t>(load_le(r + 24, 4));
    total += e.length;
  }
  total_length = total;
  return {};
}

}  // namespace ferry::core
