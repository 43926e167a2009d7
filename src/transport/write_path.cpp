#include "transport/write_path.hpp"

#include <algorithm>
#include <bit>

namespace ferry::transport {

int WritePathChooser::size_class(uint64_t total) {
  int log2 = total == 0 ? 0 : std::bit_width(total) - 1;
  return std::clamp(log2 - kFirstClassLog2, 0, kClasses - 1);
}

bool WritePathChooser::bounce(uint64_t total) {
  Class& c = classes_[static_cast<std::size_t>(size_class(total))];
  uint32_t n = c.writes.fetch_add(1, std::memory_order_relaxed);
  auto prefer = static_cast<Prefer>(c.prefer.load(std::memory_order_relaxed));
  if (prefer == kUnknown) return n / kProbeRun % 2 == 0;
  bool faster_bounces = prefer == kBounce;
  return n % kProbePeriod < kProbeRun ? !faster_bounces : faster_bounces;
}

void WritePathChooser::finished(uint64_t total, bool bounced, int64_t posted_ns, int64_t done_ns) {
  if (total == 0) return;
  Class& c = classes_[static_cast<std::size_t>(size_class(total))];
  std::lock_guard lock(mu_);
  int64_t start = std::max(posted_ns, last_done_ns_);
  bool follows_its_way = last_bounced_ == bounced && last_done_ns_ != 0;
  if (done_ns <= start) return;  // finished out of order: no share of its own to count
  last_done_ns_ = done_ns;
  last_bounced_ = bounced;
  if (!follows_its_way) return;
  double sample = static_cast<double>(done_ns - start) / static_cast<double>(total);
  std::size_t way = bounced ? 0 : 1;
  double& avg = c.ns_per_byte[way];
  avg = c.samples[way] == 0 ? sample : avg + kWeight * (sample - avg);
  ++c.samples[way];
  if (c.samples[0] >= kFirstSamples && c.samples[1] >= kFirstSamples) {
    c.prefer.store(c.ns_per_byte[0] <= c.ns_per_byte[1] ? kBounce : kDirect,
                   std::memory_order_relaxed);
  }
}

WritePathChooser::Rates WritePathChooser::rates(uint64_t total) const {
  const Class& c = classes_[static_cast<std::size_t>(size_class(total))];
  std::lock_guard lock(mu_);
  constexpr double kMiB = 1 << 20;
  return {c.ns_per_byte[0] * kMiB, c.ns_per_byte[1] * kMiB};
}

}  // namespace ferry::transport
