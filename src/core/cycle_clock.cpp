#include "core/cycle_clock.hpp"

#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ferry::core {

namespace {
#if defined(__x86_64__)
// CPUID 0x80000007 EDX bit 8: the counter ticks at one rate in every power state and on every
// core (the kernel's "nonstop_tsc").
bool invariant_tsc() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (static_cast<unsigned>(__get_cpuid_max(0x80000000, nullptr)) < 0x80000007u) return false;
  __get_cpuid(0x80000007, &a, &b, &c, &d);
  return (d & (1u << 8)) != 0;
}

// A counter reading and the steady_clock time it was taken at: the tightest of a few
// steady_clock brackets around it, so that a preemption inside one bracket does not count.
struct Reading {
  uint64_t ticks;
  double ns;
};
Reading read_both() {
  using Clock = std::chrono::steady_clock;
  Reading best{0, 0};
  double narrowest = 1e300;
  for (int i = 0; i < 8; ++i) {
    auto before = Clock::now();
    uint64_t ticks = __rdtsc();
    auto after = Clock::now();
    double width = std::chrono::duration<double, std::nano>(after - before).count();
    if (width < narrowest) {
      narrowest = width;
      double mid =
          std::chrono::duration<double, std::nano>(before.time_since_epoch()).count() + width / 2;
      best = {ticks, mid};
    }
  }
  return best;
}
#endif
}  // namespace

void CycleClock::calibrate() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__x86_64__)
    if (!invariant_tsc()) return;
    Reading first = read_both();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    Reading last = read_both();
    double ns = last.ns - first.ns;
    double ticks = static_cast<double>(last.ticks - first.ticks);
    // A rate outside 100 MHz .. 20 GHz is no counter to trust.
    if (ticks <= 0 || ns / ticks > 10.0 || ns / ticks < 0.05) return;
    ns_per_tick_q32_ = static_cast<uint64_t>(ns / ticks * 4294967296.0);
    tsc_ = true;
#endif
  });
}

}  // namespace ferry::core
