// Which of a channel's two paths a write in its bounce window (Channel::BounceWrites) takes:
// bounced through the channel's own buffers, or its zero-copy path. Same-host writes of 256 KiB
// to 16 MiB either ride in the shared-memory rings (two copies, one per side, at once) or are
// pulled by the target with one process_vm_readv (one copy, and a page walk per 4 KiB). Which is
// faster depends on the host: 1 MiB writes, 8 in flight, moved 20-22 GB/s through the rings
// against 8-9 pulled on one 2-core VM (2026-11-25), and 8.5-9.8 against 10-11 on another,
// 16 MiB writes 8-8.8 against 11.5-12.3 there (2026-11-27, docs/performance.md). So the peer
// measures both: per size class it keeps the rate each path moved lately and sends writes the
// faster way, trying the other way with every kProbeEvery-th write of the class.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace ferry::transport {

class WritePathChooser {
 public:
  // Size classes by powers of two from 256 KiB (the rings' floor); larger writes share the last.
  static constexpr int kClasses = 8;
  static constexpr int kFirstClassLog2 = 18;
  // Every kProbePeriod writes of a class, a run of kProbeRun goes the way that measured slower,
  // so that a change of the host's load is seen: 4 of 128 (about 3 %) pay for the slower path.
  // A run, since a write only counts when the one before it went the same way: the first of a
  // run overlaps the other way's last (a write through the rings is copied into them while the
  // target still pulls the write before it), which would flatter the one and slow the other.
  static constexpr uint32_t kProbePeriod = 128;
  static constexpr uint32_t kProbeRun = 4;
  // Each path's rate is a moving average: a sample moves it by this share (1/4), so that one
  // descheduled copy moves the choice no further than a quarter of the way.
  static constexpr double kWeight = 0.25;
  // Samples of each path before the choice follows the rates; until then writes alternate in
  // runs of kProbeRun.
  static constexpr uint32_t kFirstSamples = 2;

  // Whether a write of `total` bytes goes through the bounce buffers. Any thread.
  bool bounce(uint64_t total);
  // A write the chooser routed finished: posted at `posted_ns` and done at `done_ns` (one
  // clock). Its service time is counted from the later of its posting and the previous routed
  // write's completion, as writes of one channel finish in order: with several in flight, each
  // one's share of the time, whatever the depth. It counts only if that previous write went the
  // same way. Any thread; takes the chooser's own lock.
  void finished(uint64_t total, bool bounced, int64_t posted_ns, int64_t done_ns);

  // What the chooser knows of a class: nanoseconds per MiB each way (0: not measured yet).
  struct Rates {
    double bounce_ns_per_mib = 0;
    double direct_ns_per_mib = 0;
  };
  Rates rates(uint64_t total) const;

  static int size_class(uint64_t total);
  // The clock of finished()'s times (steady_clock): two readings per routed write, of 256 KiB
  // or more, cost nothing measurable.
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  enum Prefer : uint8_t { kUnknown, kBounce, kDirect };
  struct Class {
    std::atomic<uint32_t> writes{0};
    std::atomic<uint8_t> prefer{kUnknown};
    // Under mu_.
    std::array<double, 2> ns_per_byte{};  // [0] bounced, [1] direct
    std::array<uint32_t, 2> samples{};
  };
  mutable std::mutex mu_;      // the rates; only writes that finish take it
  int64_t last_done_ns_ = 0;   // under mu_
  bool last_bounced_ = false;  // under mu_: the way of the write that finished last
  std::array<Class, kClasses> classes_;
};

}  // namespace ferry::transport
