// The fixed 48-byte frame header used on every Ferry TCP connection (docs/protocol.md).
// Control frames (the engine's handshake and liveness) carry an encoded body as payload. Data
// frames, types kFirstDataType and above, belong to the transport that owns the connection
// (TCP's: transport/tcp/tcp_frame.hpp), which checks their fields itself.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/error.hpp"

namespace ferry::core {

enum class FrameType : uint8_t {
  kHello = 1,
  kHelloAck = 2,
  kAuth = 3,
  // 4 was AUTH_OK (protocol version 8 and before): now an unknown type.
  kJoin = 5,
  kJoinOk = 6,
  kError = 7,
  kPing = 8,
  kPong = 9,
  kBye = 10,
  kChannelAddresses = 11,  // each channel's transport address, during the handshake
};
constexpr uint8_t kLastControlType = 11;
constexpr uint8_t kRetiredControlType = 4;
// Types a transport may give its data frames.
constexpr uint8_t kFirstDataType = 16;
constexpr uint8_t kLastDataType = 63;

struct FrameHeader {
  FrameType type{};
  uint8_t flags = 0;
  uint16_t status = 0;  // ErrorCode
  uint32_t region_id = 0;
  uint32_t length = 0;  // payload bytes that follow (a data frame may say otherwise)
  uint32_t aux32 = 0;
  uint64_t op_id = 0;
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t aux64 = 0;
};

constexpr std::size_t kFrameHeaderSize = 48;
// Largest payload a control frame may announce; control bodies are tiny.
constexpr uint32_t kMaxControlPayload = 4096;

void encode_header(const FrameHeader& h, uint8_t* out);
// Rejects types that are neither control nor data, unknown status codes, and control frames
// with flags or an over-long payload; changes nothing on error.
Status decode_header(const uint8_t* in, FrameHeader& out);
bool is_control(FrameType t);

}  // namespace ferry::core
