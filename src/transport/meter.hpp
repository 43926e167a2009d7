// Counters of one channel's operations (Engine::metrics): bumped where an operation is posted
// and where it completes, whichever thread that is, with relaxed atomic adds, no lock.
#pragma once

#include <atomic>
#include <cstdint>

#include "ferry/error.hpp"
#include "ferry/metrics.hpp"

namespace ferry::transport {

class ChannelMeter {
 public:
  // Completions are counted in one of kStripes copies, chosen by thread: a waiting caller and a
  // progress thread both complete a peer's operations (a same-host or verbs channel lets the
  // caller poll), and counters they shared moved between their cores with every operation:
  // busy-polled 8-byte shm write p50 1.24 us counted so, 1.17 uncounted (one run, alternated);
  // striped, 0.44 against 0.43 (bench/compare_stream.sh; docs/performance.md, "Metrics").
  static constexpr int kStripes = 4;

  void posted(OperationKind kind) {
    posted_[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
  }
  // A completed operation: `posted` when posted() counted it (it was in flight).
  void completed(OperationKind kind, ErrorCode code, uint64_t bytes, uint64_t latency_ns,
                 bool posted) {
    Kind& k = stripes_[stripe()][static_cast<int>(kind)];
    if (code != ErrorCode::kOk) [[unlikely]] {
      failed_[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
      int c = static_cast<int>(code);
      errors_[c < kErrorCodes ? c : static_cast<int>(ErrorCode::kSystem)].fetch_add(
          1, std::memory_order_relaxed);
    } else {
      k.bytes.fetch_add(bytes, std::memory_order_relaxed);
    }
    // Succeeded operations are the histogram's count less the failed ones.
    k.latency[latency_bucket(latency_ns)].fetch_add(1, std::memory_order_relaxed);
    k.latency_sum_ns.fetch_add(latency_ns, std::memory_order_relaxed);
    // Release: a reader that sees this count sees the operation's other counts.
    if (posted) k.finished.fetch_add(1, std::memory_order_release);
  }

  void read(TransportMetrics& out) const {
    for (int i = 0; i < kOperationKinds; ++i) {
      OperationMetrics& o = out.operations[static_cast<std::size_t>(i)];
      o = {};
      uint64_t finished = 0, completed = 0;
      for (const auto& stripe : stripes_) {
        const Kind& k = stripe[i];
        finished += k.finished.load(std::memory_order_acquire);
        o.bytes += k.bytes.load(std::memory_order_relaxed);
        o.latency_sum_ns += k.latency_sum_ns.load(std::memory_order_relaxed);
        for (int b = 0; b < kLatencyBuckets; ++b) {
          uint64_t n = k.latency[b].load(std::memory_order_relaxed);
          o.latency[static_cast<std::size_t>(b)] += n;
          completed += n;
        }
      }
      // Read after the counts they bound: a count only grows, so neither goes below zero (a
      // failure whose histogram count is not read yet is not taken from the succeeded).
      o.failed = failed_[i].load(std::memory_order_relaxed);
      o.succeeded = completed > o.failed ? completed - o.failed : 0;
      uint64_t posted = posted_[i].load(std::memory_order_relaxed);
      o.in_flight = posted > finished ? posted - finished : 0;
    }
    out.errors.clear();
    for (int c = 0; c < kErrorCodes; ++c) {
      if (uint64_t n = errors_[c].load(std::memory_order_relaxed); n != 0) {
        out.errors.emplace_back(static_cast<ErrorCode>(c), n);
      }
    }
  }

 private:
  // The codes counted one by one (a later code counts as kSystem).
  static constexpr int kErrorCodes = static_cast<int>(ErrorCode::kUnsupported) + 1;
  // The counts most operations touch share the first cache line: the sum, the bytes, the
  // finished count and the histogram's buckets below 16 us.
  struct alignas(64) Kind {
    std::atomic<uint64_t> latency_sum_ns{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> finished{0};  // of those posted() counted
    std::atomic<uint64_t> latency[kLatencyBuckets] = {};
  };
  // This thread's stripe: threads take them in turn, once.
  static int stripe() {
    static std::atomic<unsigned> next{0};
    thread_local const int mine =
        static_cast<int>(next.fetch_add(1, std::memory_order_relaxed) % kStripes);
    return mine;
  }
  alignas(64) std::atomic<uint64_t> posted_[kOperationKinds] = {};
  Kind stripes_[kStripes][kOperationKinds];
  // Failures are rare: one copy.
  std::atomic<uint64_t> failed_[kOperationKinds] = {};
  std::atomic<uint64_t> errors_[kErrorCodes] = {};
};

}  // namespace ferry::transport
