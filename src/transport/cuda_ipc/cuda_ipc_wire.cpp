#include "transport/cuda_ipc/cuda_ipc_wire.hpp"

#include <cstring>
#include <string>

#include "core/bytes.hpp"

namespace ferry::transport::cuda_ipc {

namespace {

// Little-endian, in place (the host is little-endian: op.hpp asserts it): frames go out on the
// data path, where nothing is allocated.
template <typename T>
void put(uint8_t* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
template <typename T>
T get(const uint8_t* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

}  // namespace

std::array<uint8_t, kKeyBytes> encode(const Key& key) {
  std::array<uint8_t, kKeyBytes> out{};
  std::memcpy(out.data(), key.handle.reserved, core::cuda::kIpcHandleBytes);
  uint8_t* at = out.data() + core::cuda::kIpcHandleBytes;
  put(at, key.offset);
  put(at + 8, key.allocation_bytes);
  put(at + 16, key.table_key);
  return out;
}

Status decode(std::span<const uint8_t> in, Key& out) {
  if (in.size() != kKeyBytes) {
    return {ErrorCode::kWrongKey, "cuda_ipc: a key of " + std::to_string(in.size()) +
                                      " bytes, not " + std::to_string(kKeyBytes)};
  }
  std::memcpy(out.handle.reserved, in.data(), core::cuda::kIpcHandleBytes);
  const uint8_t* at = in.data() + core::cuda::kIpcHandleBytes;
  out.offset = get<uint64_t>(at);
  out.allocation_bytes = get<uint64_t>(at + 8);
  out.table_key = get<uint64_t>(at + 16);
  if (out.allocation_bytes == 0 || out.offset >= out.allocation_bytes)
    return {ErrorCode::kWrongKey, "cuda_ipc: a key whose region lies outside its allocation"};
  return {};
}

std::vector<uint8_t> encode_address(uint32_t pid) {
  std::vector<uint8_t> out;
  core::ByteWriter w(out);
  w.u8(kAddressVersion);
  w.u32(pid);
  return out;
}

Status decode_address(std::span<const uint8_t> in, uint32_t& pid) {
  core::ByteReader r(in);
  uint8_t version = r.u8();
  pid = r.u32();
  if (!r.ok() || !r.at_end()) return {ErrorCode::kProtocol, "cuda_ipc address: malformed"};
  if (version != kAddressVersion) {
    return {ErrorCode::kVersionMismatch, "cuda_ipc address: version " + std::to_string(version) +
                                             ", this build speaks " +
                                             std::to_string(kAddressVersion)};
  }
  return {};
}

// type u8, code u8, access u8, reserved u8 (0), region u32, value u64.
void encode(const Frame& frame, std::span<uint8_t, kFrameBytes> out) {
  out[0] = static_cast<uint8_t>(frame.type);
  out[1] = static_cast<uint8_t>(frame.code);
  out[2] = static_cast<uint8_t>(frame.access);
  out[3] = 0;
  put(out.data() + 4, frame.region);
  put(out.data() + 8, frame.value);
}

Status decode(std::span<const uint8_t, kFrameBytes> in, Frame& out) {
  uint8_t type = in[0];
  if (type < static_cast<uint8_t>(FrameType::kOpen) || type > static_cast<uint8_t>(FrameType::kImm))
    return {ErrorCode::kProtocol, "cuda_ipc: unknown frame type " + std::to_string(type)};
  if (in[1] > static_cast<uint8_t>(kLastErrorCode))
    return {ErrorCode::kProtocol, "cuda_ipc: unknown error code " + std::to_string(in[1])};
  if (in[2] > static_cast<uint8_t>(Access::kRemoteReadWrite) || in[3] != 0)
    return {ErrorCode::kProtocol, "cuda_ipc: malformed frame"};
  out.type = static_cast<FrameType>(type);
  out.code = static_cast<ErrorCode>(in[1]);
  out.access = static_cast<Access>(in[2]);
  out.region = get<uint32_t>(in.data() + 4);
  out.value = get<uint64_t>(in.data() + 8);
  if (out.type == FrameType::kOpen && out.access == Access::kLocal)
    return {ErrorCode::kProtocol, "cuda_ipc: a mapping asked for no access"};
  return {};
}

}  // namespace ferry::transport::cuda_ipc
