#include "transport/shm/path_chooser.hpp"

#include <algorithm>
#include <bit>

namespace ferry::transport::shm {

int PathChooser::size_class(uint64_t total) {
  int log2 = total == 0 ? 0 : std::bit_width(total) - 1;
  return std::clamp(log2 - kFirstClassLog2, 0, kClasses - 1);
}

bool PathChooser::bounce(uint64_t total) {
  Class& c = classes_[static_cast<std::size_t>(size_class(total))];
  uint32_t n = c.routed.fetch_add(1, std::memory_order_relaxed);
  auto prefer = static_cast<Prefer>(c.prefer.load(std::memory_order_relaxed));
  if (prefer == kUnknown) return n / kRun % 2 == 0;
  bool faster_bounces = prefer == kBounce;
  return n % kProbePeriod < kRun ? !faster_bounces : faster_bounces;
}

void PathChooser::finished(uint64_t total, bool bounced, int64_t routed_ns, int64_t done_ns) {
  Class& c = classes_[static_cast<std::size_t>(size_class(total))];
  std::size_t way = bounced ? 0 : 1;
  std::lock_guard lock(mu_);
  ++c.finished[way];
  int64_t start = std::max(routed_ns, last_done_ns_);
  last_done_ns_ = std::max(last_done_ns_, done_ns);
  if (c.run_count > 0 && c.run_way != way) c.run_count = 0;  // cut short: not counted
  if (c.run_count == 0) {
    c.run_way = way;
    c.run_start_ns = start;
    c.run_bytes = 0;
  }
  c.run_bytes += total;
  if (++c.run_count < kRun) return;
  c.run_count = 0;
  if (done_ns <= c.run_start_ns || c.run_bytes == 0) return;
  double sample = static_cast<double>(done_ns - c.run_start_ns) / static_cast<double>(c.run_bytes);
  double& avg = c.ns_per_byte[way];
  avg = avg == 0 ? sample : avg + kWeight * (std::min(sample, 2 * avg) - avg);
  if (c.ns_per_byte[0] > 0 && c.ns_per_byte[1] > 0) {
    c.prefer.store(c.ns_per_byte[0] <= c.ns_per_byte[1] ? kBounce : kDirect,
                   std::memory_order_relaxed);
  }
}

PathChooser::ClassState PathChooser::state(int size_class) const {
  const Class& c = classes_[static_cast<std::size_t>(std::clamp(size_class, 0, kClasses - 1))];
  std::lock_guard lock(mu_);
  constexpr double kMiB = 1 << 20;
  return {c.finished[0], c.finished[1], c.ns_per_byte[0] * kMiB, c.ns_per_byte[1] * kMiB};
}

}  // namespace ferry::transport::shm
