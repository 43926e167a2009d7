#include "transport/tcp/tcp_frame.hpp"

#include <string>

#include "core/bytes.hpp"

namespace ferry::transport::tcp {

using core::load_le;
using core::store_le;

uint32_t payload_length(const core::FrameHeader& h) {
  bool announce = h.type == TcpFrame::kSend && (h.flags & kFlagAnnounce) != 0;
  return h.type == TcpFrame::kReadReq || announce ? 0 : h.length;
}

Status check_data_header(const core::FrameHeader& h) {
  auto type = static_cast<uint8_t>(h.type);
  if (type < static_cast<uint8_t>(TcpFrame::kWrite) ||
      type > static_cast<uint8_t>(TcpFrame::kReadGroupData)) {
    return {ErrorCode::kProtocol, "frame: unknown type " + std::to_string(type)};
  }
  bool write = h.type == TcpFrame::kWrite || h.type == TcpFrame::kWriteGroup;
  uint8_t allowed_flags = write                       ? (kFlagImm | kFlagLastOnStream)
                          : h.type == TcpFrame::kSend ? (kFlagAnnounce | kFlagRendezvous)
                                                      : 0;
  if ((h.flags & ~allowed_flags) != 0 || h.flags == (kFlagAnnounce | kFlagRendezvous)) {
    return {ErrorCode::kProtocol, "frame: flags " + std::to_string(h.flags) + " not valid here"};
  }
  bool is_ack = h.type == TcpFrame::kWriteAck || h.type == TcpFrame::kSendAck;
  bool carries_error_text =
      is_ack || h.type == TcpFrame::kReadData || h.type == TcpFrame::kReadGroupData;
  if (carries_error_text && h.status != 0 && h.length > kMaxErrorText) {
    return {ErrorCode::kProtocol, "frame: error text of " + std::to_string(h.length) + " bytes"};
  }
  if (h.type == TcpFrame::kSendCts && h.length != 0) {
    return {ErrorCode::kProtocol, "frame: clear-to-send with a payload"};
  }
  if (is_ack && h.status == 0 && h.length != 0) {
    return {ErrorCode::kProtocol, "frame: successful ack with a payload"};
  }
  if (h.type == TcpFrame::kWriteAck && h.aux32 > kMaxGroupEntries) {
    return {ErrorCode::kProtocol, "frame: ack for " + std::to_string(h.aux32) + " entries"};
  }
  bool group = h.type == TcpFrame::kWriteGroup || h.type == TcpFrame::kReadGroupReq ||
               h.type == TcpFrame::kReadGroupData;
  if (group) {
    if (h.region_id == 0 || h.region_id > kMaxGroupEntries) {
      return {ErrorCode::kProtocol, "frame: group of " + std::to_string(h.region_id) + " entries"};
    }
    uint64_t table = uint64_t{h.region_id} * kGroupEntrySize;
    bool error_text = h.type == TcpFrame::kReadGroupData && h.status != 0;
    bool fits =
        h.type == TcpFrame::kReadGroupReq ? h.length == table : error_text || h.length >= table;
    if (!fits || (h.type != TcpFrame::kReadGroupData && h.status != 0)) {
      return {ErrorCode::kProtocol, "frame: group of " + std::to_string(h.region_id) +
                                        " entries in " + std::to_string(h.length) + " bytes"};
    }
  }
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

}  // namespace ferry::transport::tcp
