#include "transport/shm/copy_pool.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/sys.hpp"

namespace ferry::transport::shm {
namespace {

// Spins while `busy()`, for kCopySpin at most.
template <typename Busy>
void spin_while(Busy busy) {
  auto until = std::chrono::steady_clock::now() + kCopySpin;
  for (unsigned i = 0; busy(); ++i) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 63 && std::chrono::steady_clock::now() >= until) return;
  }
}

}  // namespace

Status pull_once(pid_t pid, const iovec* local, const iovec* remote, std::size_t n,
                 uint64_t total) {
  ssize_t got = ::process_vm_readv(pid, local, n, remote, n, 0);
  if (got == static_cast<ssize_t>(total)) return {};
  if (got < 0) {
    return core::sys_status("process_vm_readv", errno,
                            errno == ESRCH ? ErrorCode::kPeerLost : ErrorCode::kSystem);
  }
  // The kernel stops at the first piece it cannot read whole.
  return {ErrorCode::kSystem, "process_vm_readv: " + std::to_string(got) + " of " +
                                  std::to_string(total) +
                                  " bytes (the peer named memory it does not have)"};
}

CopyPool::~CopyPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void CopyPool::start_locked() {
  if (started_) return;
  started_ = true;
  // A helper that cannot start (no threads or memory left) leaves fewer slots: the callers copy
  // what no helper takes, so a copy never fails for want of helpers, it only goes slower.
  try {
    threads_.reserve(static_cast<std::size_t>(helpers_));  // a started thread is never dropped
    for (int i = 0; i < helpers_; ++i) threads_.push_back(start_([this] { run(); }));
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): fewer helpers, see above
  }
  try {
    parts_ = std::vector<Part>(2 * threads_.size());
  } catch (const std::bad_alloc&) {  // NOLINT(bugprone-empty-catch): no slots, callers copy all
  }
}

Status CopyPool::pull(pid_t pid, const iovec* local, const iovec* remote, std::size_t n,
                      uint64_t total) {
  return split(pid, local, remote, n, total, kMinPartBytes);
}

void CopyPool::copy(void* dst, const void* src, std::size_t n) {
  iovec to{dst, n}, from{const_cast<void*>(src), n};
  (void)split(0, &to, &from, 1, n, kMinMemcpyPartBytes);  // a memcpy does not fail
}

Status CopyPool::run_part(const Part& part) noexcept {
  try {
    if (part.pid != 0) {
      return pull_once(part.pid, part.local.data(), part.remote.data(), part.n, part.bytes);
    }
  } catch (const std::bad_alloc&) {  // a failure's message could not be made: still a failure
    return {ErrorCode::kSystem, "out of memory"};  // short enough to need no allocation
  }
  for (std::size_t i = 0; i < part.n; ++i) {
    std::memcpy(part.local[i].iov_base, part.remote[i].iov_base, part.local[i].iov_len);
  }
  return {};
}

Status CopyPool::split(pid_t pid, const iovec* local, const iovec* remote, std::size_t n,
                       uint64_t total, std::size_t min_part) {
  auto wanted =
      static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(helpers_) + 1, total / min_part));
  if (wanted < 2 || n + static_cast<std::size_t>(wanted) > kMaxPieces) {
    if (pid != 0) return pull_once(pid, local, remote, n, total);
    for (std::size_t i = 0; i < n; ++i)
      std::memcpy(local[i].iov_base, remote[i].iov_base, local[i].iov_len);
    return {};
  }
  Call call;
  Part mine;
  std::array<Part*, kMaxCopyThreads> queued{};
  int count = 0;
  {
    std::unique_lock lock(mu_);
    start_locked();
    for (Part& p : parts_) {
      if (count + 1 == wanted) break;
      if (p.call == nullptr) queued[static_cast<std::size_t>(count++)] = &p;
    }
    // Cut the pieces into count + 1 parts of about equal bytes; the first is the caller's.
    const int parts = count + 1;
    std::size_t i = 0;
    uint64_t at = 0;  // bytes of piece i already given to a part
    uint64_t left = total;
    for (int k = 0; k < parts; ++k) {
      Part& part = k == 0 ? mine : *queued[static_cast<std::size_t>(k - 1)];
      uint64_t want = k + 1 == parts ? left : total / static_cast<uint64_t>(parts);
      left -= want;
      part.pid = pid;
      part.n = 0;
      part.bytes = want;
      while (want > 0 && i < n) {
        uint64_t take = std::min<uint64_t>(local[i].iov_len - at, want);
        if (take > 0) {
          part.local[part.n] = {static_cast<uint8_t*>(local[i].iov_base) + at, take};
          part.remote[part.n] = {static_cast<uint8_t*>(remote[i].iov_base) + at, take};
          ++part.n;
        }
        want -= take;
        at += take;
        if (at == local[i].iov_len) {
          ++i;
          at = 0;
        }
      }
      if (k > 0) {
        part.taken = false;
        part.call = &call;
      }
    }
    call.left = count;
    untaken_ += count;
  }
  work_.notify_all();
  Status status = run_part(mine);
  // Parts no helper took yet (all busy with other channels' copies): copied here.
  for (int k = 0; k < count; ++k) {
    Part& part = *queued[static_cast<std::size_t>(k)];
    {
      std::lock_guard lock(mu_);
      if (part.call != &call || part.taken) continue;
      part.taken = true;
      --untaken_;
    }
    copy(part);
  }
  spin_while([&] { return call.left.load(std::memory_order_acquire) != 0; });
  // Taken even when the spin saw every part done: a helper lets go of `call` only with mu_.
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return call.left == 0; });
  return status.ok() ? call.failed : status;
}

void CopyPool::copy(Part& part) {
  Status s = run_part(part);
  {
    std::lock_guard lock(mu_);
    if (!s.ok() && part.call->failed.ok()) part.call->failed = std::move(s);
    --part.call->left;
    part.call = nullptr;
  }
  done_.notify_all();
}

void CopyPool::run() {
  std::unique_lock lock(mu_);
  bool spun = false;  // since its last part
  for (;;) {
    Part* next = nullptr;
    for (Part& p : parts_) {
      if (p.call != nullptr && !p.taken) {
        next = &p;
        break;
      }
    }
    if (next == nullptr) {
      if (stop_) return;
      if (!spun) {
        spun = true;
        lock.unlock();
        spin_while([&] { return untaken_.load(std::memory_order_acquire) == 0; });
        lock.lock();
        continue;
      }
      work_.wait(lock);
      continue;
    }
    spun = false;
    next->taken = true;
    --untaken_;
    lock.unlock();
    copy(*next);
    lock.lock();
  }
}

}  // namespace ferry::transport::shm
