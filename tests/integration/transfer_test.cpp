// Byte-exact one-sided transfers between two engines over loopback TCP.
#include <gtest/gtest.h>

#include <thread>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

struct Buffers {
  Buffers(Pair& p, std::size_t n, Access target_access = Access::kRemoteReadWrite)
      : local_buf(n), remote_buf(n) {
    local = p.initiator.register_memory(local_buf.data(), n, Access::kLocal);
    remote = p.target.register_memory(remote_buf.data(), n, target_access);
    desc = Descriptor::parse(remote.descriptor().to_string());
  }
  std::vector<uint8_t> local_buf, remote_buf;
  Region local, remote;
  Descriptor desc;
};

TEST(Transfer, WriteAndReadAcrossSizesAndOddOffsets) {
  Pair p;
  const std::size_t cap = (64u << 20) + 64;
  Buffers b(p, cap);
  for (std::size_t size :
       {std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{65537}, std::size_t{1} << 20,
        (std::size_t{3} << 20) + 13, std::size_t{64} << 20}) {
    SCOPED_TRACE(size);
    uint64_t loff = size % 7, roff = size % 13;
    fill_pattern(b.local_buf.data() + loff, size, static_cast<uint32_t>(size));
    Transfer t{&b.local, loff, &b.desc, roff, size};
    Status s = p.peer.write({&t, 1}).wait(kWait);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(0, std::memcmp(b.local_buf.data() + loff, b.remote_buf.data() + roff, size));

    std::memset(b.local_buf.data() + loff, 0, size);
    fill_pattern(b.remote_buf.data() + roff, size, static_cast<uint32_t>(size) + 1);
    Future f = p.peer.read({&t, 1});
    s = f.wait(kWait);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(size, f.bytes());
    ASSERT_EQ(0, std::memcmp(b.local_buf.data() + loff, b.remote_buf.data() + roff, size));
  }
}

}  // namespace
}  // namespace ferry::test
