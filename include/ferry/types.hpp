// Vocabulary types shared by every layer: access rights and transport kinds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.hpp"

namespace ferry {

// What a peer may do with a registered region. Local use is always allowed.
enum class Access : uint8_t {
  kLocal = 0,
  kRemoteRead = 1,
  kRemoteWrite = 2,
  kRemoteReadWrite = 3,
};

constexpr Access operator|(Access a, Access b) {
  return static_cast<Access>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}
constexpr bool allows(Access granted, Access wanted) {
  return (static_cast<uint8_t>(granted) & static_cast<uint8_t>(wanted)) ==
         static_cast<uint8_t>(wanted);
}

// Transport kinds, in order of preference when several are usable.
enum class TransportKind : uint8_t {
  kTcp = 1,
  kVerbs = 2,
  kShm = 3,
  kCudaIpc = 4,
};

FERRY_API std::string_view to_string(TransportKind kind) noexcept;
// The kind to_string() names `name`; none for a name no transport has.
FERRY_API std::optional<TransportKind> transport_named(std::string_view name) noexcept;

// Where a region's bytes live: routing (Peer::routes) picks a channel that moves both ends' kinds.
enum class MemoryKind : uint8_t {
  kHost = 0,
  kCuda = 1,
};
constexpr int kMemoryKinds = 2;
FERRY_API std::string_view to_string(MemoryKind kind) noexcept;

// A kind of memory and, for CUDA memory, its device (Engine::allocate, Region::location).
struct Memory {
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;  // the CUDA device ordinal
  static constexpr Memory host() { return {}; }
  static constexpr Memory cuda(int device = 0) { return {MemoryKind::kCuda, device}; }
  friend constexpr bool operator==(const Memory&, const Memory&) = default;
};
// "host", "cuda:1"
FERRY_API std::string to_string(const Memory& memory);
// The inverse: "host", "cuda" (device 0) or "cuda:N"; throws kInvalidArgument naming the text.
FERRY_API Memory parse_memory(std::string_view text);

// How far a peer is from this engine, as the handshake proved it (same kernel boot and the same
// process and network namespaces make the same host).
enum class Reach : uint8_t {
  kSameProcess = 0,
  kSameHost = 1,
  kOtherHost = 2,
};
FERRY_API std::string_view to_string(Reach reach) noexcept;

// One transport setting as Engine::settings() lists it (each is declared once, in its
// transport's folder).
struct SettingInfo {
  std::string name{};   // "tcp.streams": what Engine::set and `ferry bench --set` take
  std::string type{};   // "bool", "count", "bytes", "duration" (a unit: 20us) or "text"
  std::string value{};  // in the config listed, the environment applied
  std::string default_value{};
  std::string range{};        // "1..64" (empty for bool and text)
  std::string environment{};  // "FERRY_TCP_STREAMS"
  std::string help{};
};

// What Engine::transports() reports of one transport on this host.
struct TransportInfo {
  TransportKind kind{};
  bool usable = false;
  std::string detail{};                // why not, or what it found
  std::vector<std::string> devices{};  // e.g. "rxe0 port 1: Ethernet, mtu 1024, gid[1] ..."
};

// What Engine::gpus() reports of one CUDA device.
struct GpuInfo {
  int ordinal = 0;
  std::string name{};
  std::string pci{};  // "0000:19:00.0"
  uint64_t memory_bytes = 0;
  bool vmm_posix_fd = false;    // VMM allocations export as POSIX file descriptors
  bool gpudirect_rdma = false;  // the device supports GPUDirect RDMA (peer memory)
  bool dmabuf = false;          // its memory can be exported as a dmabuf
};

// What Engine::gpus() reports of CUDA on this host.
struct CudaInfo {
  bool driver = false;     // libcuda.so.1 loaded and cuInit succeeded
  std::string why{};       // why not
  int driver_version = 0;  // 12040 is 12.4
  std::vector<GpuInfo> gpus{};
  bool peer_memory_module = false;  // nvidia-peermem (or nv_peer_mem) is loaded
};

// How a peer's writes or messages of one size class went lately, where its channel copies
// them either through its own buffers or on its zero-copy path, whichever moved them faster
// (same host: the shared-memory rings or process_vm_readv, ShmConfig::measure_paths). A
// channel reports its own (Peer::stats()).
struct PathStats {
  std::string transfers;    // "write" or "send"
  uint64_t from_bytes = 0;  // the class: from_bytes up to twice that (the last class: and more)
  uint64_t bounced = 0;     // finished through the channel's buffers (the rings)
  uint64_t direct = 0;      // finished on its zero-copy path (pulled)
  // What each way moved lately, in MB/s; 0 until measured.
  double bounced_mb_per_s = 0;
  double direct_mb_per_s = 0;
};

}  // namespace ferry
