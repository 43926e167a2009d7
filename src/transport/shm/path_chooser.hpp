// Which of a channel's two paths a write or a message in its bounce window
// (ShmChannel::shape_write) takes: bounced through the channel's own buffers, or its zero-copy
// path. Same-host writes of 256 KiB to 16 MiB, and messages to 2 MiB, either ride in the
// shared-memory rings (two copies, one per side, at once) or are pulled by the target with
// process_vm_readv (one copy, and a page walk per 4 KiB). Which is faster depends on the host:
// on one 2-core VM the rings moved 1 MiB writes well ahead of pulls; on another pulls were ahead
// for 1 and 16 MiB writes and 1 MiB messages (docs/performance.md, "Each transfer the faster
// way"). So the peer measures both: per size class it keeps the rate each path moved lately and
// sends the next write (or message: a chooser of their own) the faster way, trying the other way
// in runs.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace ferry::transport::shm {

class PathChooser {
 public:
  // Size classes by powers of two from 256 KiB (the rings' floor); larger transfers share the
  // last.
  static constexpr int kClasses = 8;
  static constexpr int kFirstClassLog2 = 18;
  // Transfers are timed in runs of kRun one way: a run's sample is its bytes over the time
  // from the later of its first transfer's routing and the previous transfer's completion to
  // its last one's completion, as those of one channel finish in order. So with several in
  // flight each run gets its share of the time, whatever the depth, and completions that come
  // in bursts (a waking progress thread takes several answers at once) are timed whole; the
  // first of a run, which overlaps the other way's last (a write is copied into the rings while
  // the target still pulls the one before it), is an eighth of the sample. A run cut short by
  // the other way is not counted.
  static constexpr uint32_t kRun = 8;
  // Every kProbePeriod transfers of a class, a run goes the way that measured slower, so that a
  // change of the host's load is seen: 8 of 256 (about 3 %) pay for the slower path.
  static constexpr uint32_t kProbePeriod = 256;
  // Each way's rate is a moving average of its runs: a run moves it by this share (1/4), and a
  // run counts as at most twice the average, so that one descheduled copy moves a way's time
  // up by a quarter at most.
  static constexpr double kWeight = 0.25;

  // Whether a transfer of `total` bytes goes through the bounce buffers: until each way has a
  // run timed, runs alternate. Any thread.
  bool bounce(uint64_t total);
  // A transfer the chooser routed finished: routed at `routed_ns` and done at `done_ns` (one
  // clock). Any thread; takes the chooser's own lock.
  void finished(uint64_t total, bool bounced, int64_t routed_ns, int64_t done_ns);

  // What the chooser knows of a class: transfers finished each way, and nanoseconds per MiB
  // each way lately (0: not measured yet).
  struct ClassState {
    uint64_t bounced = 0;
    uint64_t direct = 0;
    double bounce_ns_per_mib = 0;
    double direct_ns_per_mib = 0;
  };
  ClassState state(int size_class) const;
  ClassState state_for(uint64_t total) const { return state(size_class(total)); }

  static int size_class(uint64_t total);
  // The least size of a class.
  static uint64_t class_floor(int size_class) {
    return uint64_t{1} << (kFirstClassLog2 + size_class);
  }
  // The clock of finished()'s times (steady_clock): two readings per routed transfer, of 256
  // KiB or more, cost nothing measurable.
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  enum Prefer : uint8_t { kUnknown, kBounce, kDirect };
  struct Class {
    std::atomic<uint32_t> routed{0};
    std::atomic<uint8_t> prefer{kUnknown};
    // Under mu_.
    std::array<double, 2> ns_per_byte{};  // [0] bounced, [1] direct
    std::array<uint64_t, 2> finished{};
    // The run being timed: its way, start, bytes and transfers so far (0: none).
    std::size_t run_way = 0;
    int64_t run_start_ns = 0;
    uint64_t run_bytes = 0;
    uint32_t run_count = 0;
  };
  mutable std::mutex mu_;     // the rates; only transfers that finish take it
  int64_t last_done_ns_ = 0;  // under mu_
  std::array<Class, kClasses> classes_;
};

}  // namespace ferry::transport::shm
