// What an engine's operations did, per peer and transport (Engine::metrics(), Peer::metrics()),
// and its Prometheus text form. Counting happens where operations are posted and complete, in
// counters of the peer's channel striped by thread: no lock, no allocation, two readings of the
// cycle counter per operation. An operation is counted just after its Future completes (so that
// a caller spinning on it goes on at once): a read right after Future::wait may miss it for
// that moment, never longer than the completing thread takes to count it; a callback (then())
// sees it counted. Config::metrics turns counting off.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/export.hpp"
#include "ferry/types.hpp"

namespace ferry {

// Operations as metrics count them: write_with_imm apart from write.
enum class OperationKind : uint8_t { kWrite, kRead, kWriteWithImm, kSend, kRecv };
constexpr int kOperationKinds = 5;
// "write", "read", "write_with_imm", "send", "recv".
FERRY_API const char* to_string(OperationKind kind) noexcept;

// Latency from the call that started an operation to its completion, in buckets that double:
// bucket i counts operations that took less than latency_bucket_bound_ns(i) and at least the
// bound below it; the last bucket has no bound (it holds everything slower, 2^35 ns = 34 s up).
constexpr int kLatencyBuckets = 27;
constexpr uint64_t latency_bucket_bound_ns(int bucket) { return uint64_t{1} << (bucket + 10); }
// The bucket of a latency of `ns`.
constexpr int latency_bucket(uint64_t ns) {
  int width = 0;
  for (uint64_t v = ns >> 10; v != 0; v >>= 1) ++width;
  return width < kLatencyBuckets - 1 ? width : kLatencyBuckets - 1;
}

// Operations of one kind on one transport of one peer, since the peer connected.
struct OperationMetrics {
  uint64_t succeeded = 0;
  uint64_t failed = 0;     // errors by code are in TransportMetrics::errors
  uint64_t bytes = 0;      // moved by the operations that succeeded (recv: the messages' lengths)
  uint64_t in_flight = 0;  // posted and not yet complete (recv: waiting for their messages)
  // Of succeeded and failed operations alike.
  std::array<uint64_t, kLatencyBuckets> latency{};
  uint64_t latency_sum_ns = 0;
};

struct TransportMetrics {
  TransportKind transport{};
  std::array<OperationMetrics, kOperationKinds> operations{};
  const OperationMetrics& operation(OperationKind kind) const {
    return operations[static_cast<int>(kind)];
  }
  // Failures by code, the codes that occurred only. An operation refused before it reached a
  // channel (a bad local region, say) counts on the channel it was routed to, else the first.
  std::vector<std::pair<ErrorCode, uint64_t>> errors;
};

struct PeerMetrics {
  uint64_t engine_id = 0;
  std::string address;
  std::vector<TransportMetrics> transports;  // in the peer's channel order
  // write_with_imm notifications that arrived from the peer (the target's view of its writes).
  uint64_t imms_received = 0;
};

// The peers connected now (a peer's counts go with it when it closes) and the engine's
// admission counts.
struct FERRY_API EngineMetrics {
  std::vector<PeerMetrics> peers;
  uint64_t peers_admitted = 0;
  uint64_t refused_connections = 0;
  // The Prometheus text exposition format (version 0.0.4), metric names starting "ferry_":
  // counters of operations, bytes and errors, a latency histogram per operation kind, gauges of
  // operations in flight, all labelled by peer (engine id, hex), address and transport.
  std::string prometheus() const;
};

}  // namespace ferry
