// Engine::allocate: regions whose memory the engine owns (a sealed memory file mapped shared),
// moved over by peers like any region and freed with their region.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

std::span<uint8_t> bytes_of(const Region& r) { return {static_cast<uint8_t*>(r.data()), r.size()}; }

// The descriptor of this process's region memory file of `size` bytes, or -1.
int region_file_of_size(off_t size) {
  for (int fd = 0; fd < 1024; ++fd) {
    char target[256] = {};
    std::string link = "/proc/self/fd/" + std::to_string(fd);
    if (::readlink(link.c_str(), target, sizeof target - 1) < 0) continue;
    struct stat st {};
    if (std::strstr(target, "memfd:ferry-region") != nullptr && ::fstat(fd, &st) == 0 &&
        st.st_size == size)
      return fd;
  }
  return -1;
}

// What a process holding a descriptor of the file (as a peer it was lent to does) can do once
// it reopens it for writing: 0 if it may write, else the errno that refused it.
int reopened_for_writing_refuses(int fd, std::size_t size) {
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  int rw = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (rw < 0) return errno;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
  int mapped = p == MAP_FAILED ? errno : 0;
  if (p != MAP_FAILED) {
    static_cast<uint8_t*>(p)[0] = 0x5a;
    ::munmap(p, size);
  }
  uint8_t byte = 0x5b;
  int written = ::pwrite(rw, &byte, 1, 1) == 1 ? 0 : errno;
  ::close(rw);
  return mapped != 0 && written != 0 ? mapped : 0;
}

TEST(Allocate, MemoryGrantingNoRemoteWriteIsWritableByNoOtherDescriptorOfItsFile) {
  Engine e(test_config());
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  Region read_only = e.allocate(3 * page, Access::kRemoteRead);
  Region writable = e.allocate(5 * page, Access::kRemoteReadWrite);
  int ro_fd = region_file_of_size(static_cast<off_t>(3 * page));
  int rw_fd = region_file_of_size(static_cast<off_t>(5 * page));
  ASSERT_GE(ro_fd, 0);
  ASSERT_GE(rw_fd, 0);

  EXPECT_EQ(reopened_for_writing_refuses(ro_fd, 3 * page), EPERM);
  EXPECT_EQ(bytes_of(read_only)[0], 0) << "a write reached the read-only region's memory";
  EXPECT_EQ(bytes_of(read_only)[1], 0);
  // A region peers may write is theirs to write, through its file too.
  EXPECT_EQ(reopened_for_writing_refuses(rw_fd, 5 * page), 0);
  EXPECT_EQ(bytes_of(writable)[0], 0x5a);

  // The owner writes its memory as before, and a read-only mapping (a peer's) sees it.
  bytes_of(read_only)[7] = 0x77;
  void* p = ::mmap(nullptr, 3 * page, PROT_READ, MAP_SHARED, ro_fd, 0);
  ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
  EXPECT_EQ(static_cast<uint8_t*>(p)[7], 0x77);
  ::munmap(p, 3 * page);

  // A process of another user that holds the file (a peer it was lent to) is refused the same.
  if (::geteuid() != 0) GTEST_SKIP() << "another user: needs root to become one";
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) _exit(99);
    _exit(reopened_for_writing_refuses(ro_fd, 3 * page) == EPERM ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: written; 99: could not become another user";
  EXPECT_EQ(bytes_of(read_only)[0], 0);
}

TEST(Allocate, AllocatedRegionsMoveBytesBothWays) {
  Pair p;
  // Odd sizes, one below and one above the size where huge pages are asked for.
  for (std::size_t size : {std::size_t{1000003}, (std::size_t{3} << 20) + 5}) {
    Region target = p.target.allocate(size, Access::kRemoteReadWrite);
    Region source = p.initiator.allocate(size, Access::kLocal);
    Region back = p.initiator.allocate(size, Access::kLocal);
    ASSERT_EQ(target.size(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(target.data()) % 4096, 0u) << "page-aligned";
    std::vector<uint8_t> zeros(size, 0);
    EXPECT_TRUE(std::equal(zeros.begin(), zeros.end(), bytes_of(target).begin())) << "zeroed";
    fill_pattern(bytes_of(source).data(), size, 41);
    Descriptor d = target.descriptor();
    Transfer w{&source, 0, &d, 0, size};
    ASSERT_TRUE(p.peer.write({&w, 1}).wait(kWait).ok());
    EXPECT_TRUE(
        std::equal(bytes_of(source).begin(), bytes_of(source).end(), bytes_of(target).begin()));
    Transfer r{&back, 0, &d, 0, size};
    ASSERT_TRUE(p.peer.read({&r, 1}).wait(kWait).ok());
    EXPECT_TRUE(
        std::equal(bytes_of(source).begin(), bytes_of(source).end(), bytes_of(back).begin()));
  }
}

TEST(Allocate, TheMemoryGoesWithItsRegion) {
  Engine e(test_config());
  int files = memory_files().all, descriptors = open_descriptors();
  {
    std::vector<Region> regions;
    for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{5} << 20})
      regions.push_back(e.allocate(size, Access::kRemoteWrite));
    EXPECT_EQ(memory_files().all, files + 3);
    EXPECT_EQ(open_descriptors(), descriptors + 3);
    regions[0].deregister();
    EXPECT_EQ(memory_files().all, files + 2);
  }
  EXPECT_EQ(memory_files().all, files);
  EXPECT_EQ(open_descriptors(), descriptors);
}

// Region::memory() keeps the bytes past deregistration, in private memory: the memory file is
// given up (no mapping of it left, its descriptor closed), the bytes stay where they were.
TEST(Allocate, KeptMemoryOutlivesItsRegionWithItsBytesAndWithoutItsFile) {
  Pair p;
  int files = memory_files().all, descriptors = open_descriptors();
  constexpr std::size_t kSize = (std::size_t{2} << 20) + 77;  // huge pages where reserved
  Region target = p.target.allocate(kSize, Access::kRemoteReadWrite);
  Region source = p.initiator.allocate(kSize, Access::kLocal);
  EXPECT_EQ(Region().memory(), nullptr);
  std::vector<uint8_t> user(64);
  EXPECT_EQ(p.initiator.register_memory(user.data(), user.size(), Access::kLocal).memory(),
            nullptr);
  fill_pattern(bytes_of(source).data(), kSize, 53);
  Descriptor d = target.descriptor();
  Transfer w{&source, 0, &d, 0, kSize};
  ASSERT_TRUE(p.peer.write({&w, 1}).wait(kWait).ok());  // over shm the region is lent now

  std::shared_ptr<void> kept = target.memory();
  ASSERT_EQ(kept.get(), target.data());
  target.deregister();
  EXPECT_EQ(target.data(), nullptr);
  const auto* bytes = static_cast<const uint8_t*>(kept.get());
  EXPECT_TRUE(std::equal(bytes, bytes + kSize, bytes_of(source).begin()));
  source.deregister();
  EXPECT_EQ(memory_files().all, files) << "no mapping of either file is left";
  EXPECT_EQ(open_descriptors(), descriptors);
  std::memset(kept.get(), 1, kSize);  // still ours to write
  kept.reset();
}

TEST(Allocate, WhatCannotBeAllocatedIsRefusedAndNamed) {
  Engine e(test_config());
  auto code_of = [&](std::size_t length, Access access, std::string& what) {
    try {
      e.allocate(length, access);
    } catch (const Error& err) {
      what = err.what();
      return err.code();
    }
    return ErrorCode::kOk;
  };
  std::string what;
  EXPECT_EQ(code_of(0, Access::kRemoteWrite, what), ErrorCode::kInvalidArgument);
  EXPECT_NE(what.find("allocate 0 bytes: zero length"), std::string::npos) << what;
  EXPECT_EQ(code_of(std::size_t{1} << 50, Access::kRemoteWrite, what),
            ErrorCode::kResourceExhausted);
  EXPECT_NE(what.find("memfd: Cannot allocate memory"), std::string::npos) << what;
  EXPECT_EQ(code_of(64, static_cast<Access>(0x80), what), ErrorCode::kInvalidArgument);
  EXPECT_NE(what.find("allocate: unknown access flags"), std::string::npos) << what;
  EXPECT_EQ(memory_files().all, 0) << "a refused allocation keeps nothing";
  e.shutdown();
  EXPECT_EQ(code_of(64, Access::kRemoteWrite, what), ErrorCode::kCancelled);
}

}  // namespace
}  // namespace ferry::test
