// Counters of one channel's operations (Engine::metrics): bumped where an operation is posted
// and where it completes, whichever thread that is, with no lock and, on the threads that own a
// stripe, no locked instruction either.
#pragma once

#include <atomic>
#include <cstdint>

#include "ferry/error.hpp"
#include "ferry/metrics.hpp"

namespace ferry::transport {

// The stripe of ChannelMeter this thread counts in. The first kOwnedStripes threads alive at
// once that count own one each and bump it with plain loads and stores; later ones share the
// last stripe and bump it with atomic adds. A thread's stripe goes back to the pool when it ends.
struct MeterStripe {
  static constexpr int kOwnedStripes = 7;
  int index;
  bool owned;
  static MeterStripe of_this_thread();
};

class ChannelMeter {
 public:
  // Why stripes, and why owned ones: a waiting caller and a progress thread both complete a
  // peer's operations (a same-host or verbs channel lets the caller poll), and a locked add on
  // a thread that has just written the peer's ring waits for those stores to leave its core.
  // Busy-polled 8-byte shm write p50, alternated runs: counted on owned stripes as fast as
  // uncounted, with every thread on one stripe of atomic adds clearly slower
  // (bench/compare_stream.sh; docs/performance.md, "Metrics on and off").
  static constexpr int kStripes = MeterStripe::kOwnedStripes + 1;

  void posted(OperationKind kind) {
    MeterStripe s = MeterStripe::of_this_thread();
    add(stripes_[s.index][static_cast<int>(kind)].posted, 1, s.owned);
  }
  // A completed operation: `posted` when posted() counted it (it was in flight).
  void completed(OperationKind kind, ErrorCode code, uint64_t bytes, uint64_t latency_ns,
                 bool posted) {
    MeterStripe s = MeterStripe::of_this_thread();
    Kind& k = stripes_[s.index][static_cast<int>(kind)];
    if (code != ErrorCode::kOk) [[unlikely]] {
      failed_[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
      int c = static_cast<int>(code);
      errors_[c < kErrorCodes ? c : static_cast<int>(ErrorCode::kSystem)].fetch_add(
          1, std::memory_order_relaxed);
    } else {
      add(k.bytes, bytes, s.owned);
    }
    add(k.latency_sum_ns, latency_ns, s.owned);
    // Releases, last: a reader that sees the op out of flight sees its other counts and its
    // posted count; one that sees it in the histogram (its count of completions: succeeded
    // operations are that count less the failed ones) sees it out of flight.
    if (posted) add(k.finished, 1, s.owned, std::memory_order_release);
    add(k.latency[latency_bucket(latency_ns)], 1, s.owned, std::memory_order_release);
  }

  void read(TransportMetrics& out) const {
    for (int i = 0; i < kOperationKinds; ++i) {
      OperationMetrics& o = out.operations[static_cast<std::size_t>(i)];
      o = {};
      uint64_t finished = 0, posted = 0, completed = 0;
      for (const auto& stripe : stripes_) {
        const Kind& k = stripe[i];
        for (int b = 0; b < kLatencyBuckets; ++b) {
          uint64_t n = k.latency[b].load(std::memory_order_acquire);
          o.latency[static_cast<std::size_t>(b)] += n;
          completed += n;
        }
        finished += k.finished.load(std::memory_order_acquire);
        o.bytes += k.bytes.load(std::memory_order_relaxed);
        o.latency_sum_ns += k.latency_sum_ns.load(std::memory_order_relaxed);
      }
      // After the counts they bound: a count only grows, so neither difference goes below zero
      // (a failure whose histogram count is not read yet is not taken from the succeeded).
      for (const auto& stripe : stripes_)
        posted += stripe[i].posted.load(std::memory_order_relaxed);
      o.failed = failed_[i].load(std::memory_order_relaxed);
      o.succeeded = completed > o.failed ? completed - o.failed : 0;
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
  static constexpr int kErrorCodes = static_cast<int>(kLastErrorCode) + 1;
  // The counts most operations touch share the first cache line: the histogram's buckets below
  // 8 us follow the sum, the bytes and the two in-flight counts.
  struct alignas(64) Kind {
    std::atomic<uint64_t> latency_sum_ns{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> finished{0};  // of those posted() counted
    std::atomic<uint64_t> posted{0};
    std::atomic<uint64_t> latency[kLatencyBuckets] = {};
  };
  // An owned stripe has one writer: a plain load and store, no locked instruction.
  static void add(std::atomic<uint64_t>& counter, uint64_t n, bool owned,
                  std::memory_order order = std::memory_order_relaxed) {
    if (owned) {
      counter.store(counter.load(std::memory_order_relaxed) + n, order);
    } else {
      counter.fetch_add(n, order);
    }
  }

  Kind stripes_[kStripes][kOperationKinds];
  // Failures are rare: one copy.
  std::atomic<uint64_t> failed_[kOperationKinds] = {};
  std::atomic<uint64_t> errors_[kErrorCodes] = {};
};

}  // namespace ferry::transport
