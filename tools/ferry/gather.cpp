#include "gather.hpp"

#include <algorithm>

namespace ferry::cli {

namespace {
// Weight of the newest pass in the interval between chunks: a few passes steady it, and a rate
// that changes is followed within about as many.
constexpr double kNewestWeight = 0.25;
}  // namespace

Gathering::Gathering(std::chrono::microseconds longest, uint64_t slots)
    : longest_(longest), slots_(slots), per_pause_(std::min(kChunksPerPause, slots / 4)) {}

std::chrono::nanoseconds Gathering::after_pass(Clock::time_point now, uint64_t arrivals,
                                               uint64_t ahead_in_a_row,
                                               std::chrono::nanoseconds busy) {
  if (arrivals == 0) return {};
  bool receiver_busy = true;  // until a rate is known
  if (started_) {
    auto since_last = now - last_;
    receiver_busy = 2 * busy >= since_last;
    // A wait for a source that stalled counts no longer than the longest pause, so that the
    // first pauses after it are not all that long.
    double sample = std::min(std::chrono::duration<double, std::nano>(since_last).count(),
                             static_cast<double>(longest_.count())) /
                    static_cast<double>(arrivals);
    interval_ns_ =
        interval_ns_ == 0 ? sample : interval_ns_ + kNewestWeight * (sample - interval_ns_);
  }
  started_ = true;
  last_ = now;
  if (ahead_in_a_row < per_pause_ || receiver_busy || longest_.count() == 0 ||
      slots_ < kFewestSlots || arrivals > slots_ / 2)
    return {};
  auto pause = std::chrono::nanoseconds(
      static_cast<int64_t>(interval_ns_ * static_cast<double>(per_pause_)));
  return std::min(pause, longest_);
}

}  // namespace ferry::cli
