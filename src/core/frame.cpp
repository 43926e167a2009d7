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

bool is_control(FrameType t) { return static_cast<uint8_t>(t) <= kLastControlType; }

Status decode_header(const uint8_t* in, FrameHeader& out) {
  FrameHeader h;
  uint8_t type = in[0];
  bool known = (type >= 1 && type <= kLastControlType && type != kRetiredControlType) ||
               (type >= kFirstDataType && type <= kLastDataType);
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

  if (h.status > static_cast<uint16_t>(kLastErrorCode)) {
    return {ErrorCode::kProtocol, "frame: unknown status " + std::to_string(h.status)};
  }
  if (is_control(h.type) && h.flags != 0) {
    return {ErrorCode::kProtocol, "frame: flags " + std::to_string(h.flags) + " not valid here"};
  }
  if (is_control(h.type) && h.length > kMaxControlPayload) {
    return {ErrorCode::kProtocol,
            "frame: control payload of " + std::to_string(h.length) + " bytes"};
  }
  out = h;
  return {};
}

}  // namespace ferry::core
