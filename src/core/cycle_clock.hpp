// The clock that times operations for metrics. Where the CPU has an invariant time-stamp
// counter, a plain RDTSC: steady_clock reads the counter serialised (the VM's pvclock too),
// which waits for the loads in flight, and at the end of a same-host write those are the peer's
// ring lines: two readings per operation clearly slowed the busy-polled 8-byte shm write p50,
// the plain counter cost nothing measurable (docs/performance.md, "Metrics on and off").
// Elsewhere, steady_clock.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace ferry::core {

class CycleClock {
 public:
  // Measures the counter's rate against steady_clock, once per process (about 5 ms, the first
  // call only); before it, and without an invariant counter, ticks are steady_clock nanoseconds.
  static void calibrate();

  static uint64_t now() noexcept {
#if defined(__x86_64__)
    if (tsc_) return __rdtsc();
#endif
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  // Ticks between two readings of now(), in nanoseconds.
  static uint64_t to_ns(uint64_t ticks) noexcept {
    if (!tsc_) return ticks;
    return static_cast<uint64_t>((static_cast<unsigned __int128>(ticks) * ns_per_tick_q32_) >> 32);
  }

 private:
  static inline bool tsc_ = false;
  static inline uint64_t ns_per_tick_q32_ = 0;  // nanoseconds per tick, times 2^32
};

}  // namespace ferry::core
