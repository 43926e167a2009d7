#include "transport/verbs/verbs_message.hpp"

#include <string>

#include "core/bytes.hpp"

namespace ferry::transport::verbs {

void MsgHeader::encode(uint8_t* out) const {
  out[0] = static_cast<uint8_t>(type);
  out[1] = 0;
  core::store_le(out + 2, status, 2);
  core::store_le(out + 4, rkey, 4);
  core::store_le(out + 8, tag, 8);
  core::store_le(out + 16, id, 8);
  core::store_le(out + 24, a, 8);
  core::store_le(out + 32, b, 8);
  core::store_le(out + 40, c, 8);
}

Status MsgHeader::decode(std::span<const uint8_t> bytes, MsgHeader& out) {
  if (bytes.size() < kSize) {
    return {ErrorCode::kProtocol,
            "verbs message of " + std::to_string(bytes.size()) + " bytes: shorter than a header"};
  }
  const uint8_t* p = bytes.data();
  if (p[0] < static_cast<uint8_t>(MsgType::kEager) || p[0] > static_cast<uint8_t>(MsgType::kFin)) {
    return {ErrorCode::kProtocol, "verbs message of unknown type " + std::to_string(p[0])};
  }
  if (p[1] != 0) return {ErrorCode::kProtocol, "verbs message: reserved byte set"};
  MsgHeader h;
  h.type = static_cast<MsgType>(p[0]);
  h.status = static_cast<uint16_t>(core::load_le(p + 2, 2));
  h.rkey = static_cast<uint32_t>(core::load_le(p + 4, 4));
  h.tag = core::load_le(p + 8, 8);
  h.id = core::load_le(p + 16, 8);
  h.a = core::load_le(p + 24, 8);
  h.b = core::load_le(p + 32, 8);
  h.c = core::load_le(p + 40, 8);
  out = h;
  return {};
}

Status AckNames::decode(const MsgHeader& ack, AckNames& out) {
  AckNames n;
  n.ids = {ack.id, ack.a, ack.b, ack.c};
  while (n.count < kMaxIds && n.ids[n.count] != 0) ++n.count;
  for (std::size_t i = n.count; i < kMaxIds; ++i) {
    if (n.ids[i] != 0) return {ErrorCode::kProtocol, "ACK with a gap in its list of messages"};
  }
  n.compact = ack.tag;
  bool ok = ack.status == static_cast<uint16_t>(ErrorCode::kOk);
  bool one = (n.count == 1 && n.compact == 0) || (n.count == 0 && n.compact == 1);
  if (ok ? n.count == 0 && n.compact == 0 : !one) {
    return {ErrorCode::kProtocol, ok ? "ACK naming no message"
                                     : "error ACK naming " + std::to_string(n.count) +
                                           " messages by id and " + std::to_string(n.compact) +
                                           " compact ones, not one"};
  }
  out = n;
  return {};
}

}  // namespace ferry::transport::verbs
