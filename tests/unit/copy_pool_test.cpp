// The same-host transport's copy pool: a large process_vm_readv split into parts copied at once
// (read from this process itself, which every check but seccomp's allows).
#include "transport/shm/copy_pool.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

namespace ferry::transport::shm {
namespace {

// Pieces of odd lengths (one empty) covering `from`, and the same pieces of `to`.
struct Pieces {
  Pieces(std::vector<uint8_t>& from, std::vector<uint8_t>& to) {
    std::size_t at = 0;
    for (std::size_t len : {std::size_t{1}, std::size_t{0}, std::size_t{300001}, kMinPartBytes + 7,
                            std::size_t{4093}, std::size_t{2} << 20}) {
      local.push_back({to.data() + at, len});
      remote.push_back({from.data() + at, len});
      at += len;
    }
    local.push_back({to.data() + at, from.size() - at});
    remote.push_back({from.data() + at, from.size() - at});
  }
  std::vector<iovec> local, remote;
};

TEST(CopyPool, SplitPullsLandEveryByteWhereAskedWithAnyNumberOfHelpers) {
  std::vector<uint8_t> from(5 << 20), to(from.size());
  for (std::size_t i = 0; i < from.size(); ++i) from[i] = static_cast<uint8_t>(i * 13 + i / 4099);
  Pieces p(from, to);
  for (int helpers : {0, 1, 3}) {
    CopyPool pool(helpers);
    for (int round = 0; round < 3; ++round) {
      std::memset(to.data(), 0, to.size());
      ASSERT_TRUE(
          pool.pull(getpid(), p.local.data(), p.remote.data(), p.local.size(), from.size()).ok());
      ASSERT_EQ(0, std::memcmp(from.data(), to.data(), from.size())) << helpers;
    }
  }
}

TEST(CopyPool, LargeCopiesWithinTheProcessAreSplitToo) {
  std::vector<uint8_t> from((std::size_t{3} * kMinMemcpyPartBytes) + 11), to(from.size() + 2);
  for (std::size_t i = 0; i < from.size(); ++i) from[i] = static_cast<uint8_t>(i * 7 + i / 65537);
  for (int helpers : {0, 2}) {
    CopyPool pool(helpers);
    std::memset(to.data(), 0, to.size());
    pool.copy(to.data() + 1, from.data(), from.size());
    EXPECT_EQ(0, std::memcmp(from.data(), to.data() + 1, from.size())) << helpers;
    EXPECT_EQ(to.front(), 0) << "nothing before";
    EXPECT_EQ(to.back(), 0) << "nothing after";
  }
}

TEST(CopyPool, CallersFromManyThreadsShareItAndAFailedPartFailsItsCall) {
  CopyPool pool(2);
  constexpr std::size_t kSize = 3 << 20;
  std::vector<std::thread> callers;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      std::vector<uint8_t> from(kSize, static_cast<uint8_t>(t + 1)), to(kSize);
      for (int round = 0; round < 20; ++round) {
        iovec local{to.data(), kSize}, remote{from.data(), kSize};
        if (pool.pull(getpid(), &local, &remote, 1, kSize).ok() && to == from) ++ok[t];
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 20) << t;

  // The second half of the source is not mapped: the call fails and says how much it read.
  long page = sysconf(_SC_PAGESIZE);
  std::vector<uint8_t> to(kSize);
  std::vector<uint8_t> from(kSize / 2);
  iovec local[2] = {{to.data(), kSize / 2}, {to.data() + kSize / 2, kSize / 2}};
  iovec remote[2] = {{from.data(), kSize / 2},
                     {reinterpret_cast<void*>(static_cast<uintptr_t>(page)), kSize / 2}};
  Status s = pool.pull(getpid(), local, remote, 2, kSize);
  EXPECT_EQ(s.code(), ErrorCode::kSystem) << s.to_string();
  EXPECT_NE(s.message().find("process_vm_readv"), std::string::npos) << s.to_string();
}

// Starts one helper, then fails as std::thread does when the system has no threads left.
std::atomic<int> starts{0};
std::thread start_one_then_fail(std::function<void()> body) {
  if (starts.fetch_add(1) > 0) throw std::system_error(EAGAIN, std::generic_category(), "thread");
  return std::thread(std::move(body));
}

std::thread never_start(std::function<void()>) {
  throw std::system_error(EAGAIN, std::generic_category(), "thread");
}

TEST(CopyPool, HelpersThatCannotStartLeaveTheirPartsToTheCaller) {
  std::vector<uint8_t> from(9 << 20), to(from.size());
  for (std::size_t i = 0; i < from.size(); ++i) from[i] = static_cast<uint8_t>(i * 31 + i / 8191);
  Pieces p(from, to);
  for (CopyPool::StartThread start : {&start_one_then_fail, &never_start}) {
    starts = 0;
    CopyPool pool(4, start);
    for (int round = 0; round < 3; ++round) {
      std::memset(to.data(), 0, to.size());
      ASSERT_TRUE(
          pool.pull(getpid(), p.local.data(), p.remote.data(), p.local.size(), from.size()).ok());
      ASSERT_EQ(0, std::memcmp(from.data(), to.data(), from.size()));
      std::memset(to.data(), 0, to.size());
      pool.copy(to.data(), from.data(), from.size());
      ASSERT_EQ(0, std::memcmp(from.data(), to.data(), from.size()));
    }
  }
}

}  // namespace
}  // namespace ferry::transport::shm
