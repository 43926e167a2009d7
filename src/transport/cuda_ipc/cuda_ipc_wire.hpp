// The CUDA IPC transport's wire: a region's key in its descriptor, the channel address the
// engine carries, and the frames the two ends exchange over the channel's side connection.
// Every decoder takes untrusted bytes (the peer may be hostile) and rejects what it cannot use.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/cuda.hpp"
#include "ferry/error.hpp"
#include "ferry/types.hpp"

namespace ferry::transport::cuda_ipc {

// A region's key: the legacy IPC handle of the allocation holding it, where in the allocation
// the region starts, the allocation's size, and the region table's key, which the target checks
// before it lets the peer map the allocation.
struct Key {
  core::cuda::CUipcMemHandle handle{};
  uint64_t offset = 0;  // of the region's first byte in the allocation
  uint64_t allocation_bytes = 0;
  uint64_t table_key = 0;
};
constexpr std::size_t kKeyBytes = core::cuda::kIpcHandleBytes + 3 * sizeof(uint64_t);
std::array<uint8_t, kKeyBytes> encode(const Key& key);
Status decode(std::span<const uint8_t> in, Key& out);

// What one side tells the other to connect (Channel::local_address): a version and the pid,
// which says whether the peer is this process (its memory needs no IPC handle).
constexpr uint8_t kAddressVersion = 1;
std::vector<uint8_t> encode_address(uint32_t pid);
Status decode_address(std::span<const uint8_t> in, uint32_t& pid);

enum class FrameType : uint8_t {
  kOpen = 1,    // initiator -> target: may I map `region` (key `value`) for `access`?
  kOpened = 2,  // target -> initiator: `code` answers the kOpen of `region`
  kClosed = 3,  // initiator -> target: I hold no mapping of `region` any more
  kRevoke = 4,  // target -> initiator: give `region` back
  kImm = 5,     // initiator -> target: a write_with_imm's bytes landed: deliver `value`
};
struct Frame {
  FrameType type{};
  ErrorCode code = ErrorCode::kOk;  // kOpened
  Access access = Access::kLocal;   // kOpen
  uint32_t region = 0;
  uint64_t value = 0;  // kOpen: the region table's key; kImm: the immediate
};
constexpr std::size_t kFrameBytes = 16;
void encode(const Frame& frame, std::span<uint8_t, kFrameBytes> out);
Status decode(std::span<const uint8_t, kFrameBytes> in, Frame& out);

}  // namespace ferry::transport::cuda_ipc
