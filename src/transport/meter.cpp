#include "transport/meter.hpp"

#include <mutex>

namespace ferry::transport {

namespace {

// Which owned stripes a live thread holds.
std::mutex stripes_mu;
bool stripe_taken[MeterStripe::kOwnedStripes] = {};

// A thread's claim on a stripe, given back when the thread ends: the next thread to take that
// stripe writes it after this one stopped (the mutex orders the two).
struct Claim {
  MeterStripe stripe{MeterStripe::kOwnedStripes, false};
  Claim() {
    std::lock_guard lock(stripes_mu);
    for (int i = 0; i < MeterStripe::kOwnedStripes; ++i) {
      if (!stripe_taken[i]) {
        stripe_taken[i] = true;
        stripe = {i, true};
        return;
      }
    }
  }
  ~Claim() {
    if (!stripe.owned) return;
    std::lock_guard lock(stripes_mu);
    stripe_taken[stripe.index] = false;
  }
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;
};

}  // namespace

MeterStripe MeterStripe::of_this_thread() {
  thread_local const Claim claim;
  return claim.stripe;
}

}  // namespace ferry::transport
