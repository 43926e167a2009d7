// Engine::allocate: regions whose memory the engine owns (a sealed memory file mapped shared),
// moved over by peers like any region and freed with their region.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

std::span<uint8_t> bytes_of(const Region& r) { return {static_cast<uint8_t*>(r.data()), r.size()}; }

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
