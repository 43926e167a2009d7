#include "core/fork.hpp"

#include <pthread.h>

#include <atomic>
#include <string>

namespace ferry::core {

namespace {
std::atomic<uint64_t> forks{0};
void count_fork() { forks.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

uint64_t fork_generation() noexcept {
  static const bool counting = ::pthread_atfork(nullptr, nullptr, count_fork) == 0;
  (void)counting;
  return forks.load(std::memory_order_relaxed);
}

Status forked_child_refusal(uint64_t born, const char* call) {
  if (fork_generation() == born) return {};
  return {ErrorCode::kInvalidArgument,
          std::string(call) +
              ": this process was forked from the one that made the engine, whose threads and "
              "connections it does not have; make a new Engine here"};
}

void refuse_in_forked_child(uint64_t born, const char* call) {
  Status refusal = forked_child_refusal(born, call);
  if (!refusal.ok()) throw Error(refusal);
}

}  // namespace ferry::core
