// When the receiver of `ferry stream` pauses between passes over its ring. Each pass wakes a
// thread and sends credits; while the sender has more ready than the transport takes, letting
// chunks gather between passes costs no throughput and saves most of those wake-ups. A stream
// paced by its source (an instrument) is not paused, nor one whose source got ahead for a
// moment (a burst): its frames keep their latency. Nor is a receiver that is itself the slowest
// part (its sink): a pause would leave the sink idle.
#pragma once

#include <chrono>
#include <cstdint>

namespace ferry::cli {

class Gathering {
 public:
  using Clock = std::chrono::steady_clock;

  // About this many chunks gather in one pause, at the rate they came lately: a TCP stream of
  // 64 KiB chunks on the 2-core VM moves one per 19 us, where fixed pauses of 200-400 us
  // (10-20 chunks) gave 0.82-1.12x ferry bench, 100 us 0.61-0.91x (docs/performance-history.md,
  // "Streaming"); over verbs in the Soft-RoCE guest one comes per ms, where 3 ms pauses gave
  // 0.85-1.10x against 0.77-0.94x without.
  static constexpr uint64_t kChunksPerPause = 12;
  // A ring of fewer slots never pauses: its passes would take a chunk or two.
  static constexpr uint64_t kFewestSlots = 8;

  // `longest`: the longest pause (0: never pause); `slots`: the ring's.
  Gathering(std::chrono::microseconds longest, uint64_t slots);

  // After a pass that ended at `now`, took `arrivals` chunks and spent `busy` handing them to
  // the sink, the newest `ahead_in_a_row` of them marked by the sender as written while it had
  // more ready: how long to pause before the next pass. A pause only once the sender was ahead
  // for as many chunks as one pause gathers; none after a pass of more than half the ring
  // (another as long could leave the sender waiting for credits), nor after one that kept the
  // receiver busy half the time since the last; never longer than a quarter ring of chunks takes
  // to come.
  std::chrono::nanoseconds after_pass(Clock::time_point now, uint64_t arrivals,
                                      uint64_t ahead_in_a_row, std::chrono::nanoseconds busy);

  // Nanoseconds between chunks lately (0 before two passes took any).
  double interval_ns() const { return interval_ns_; }

 private:
  std::chrono::nanoseconds longest_;
  uint64_t slots_;
  uint64_t per_pause_;
  Clock::time_point last_;  // the last pass that took chunks
  bool started_ = false;
  double interval_ns_ = 0;
};

}  // namespace ferry::cli
