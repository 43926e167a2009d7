// Across the process boundary: byte-exact transfers, a killed target, a hung one; the same cases
// for every transport that reaches another process (tests/conformance/conformance.hpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "conformance/conformance.hpp"
#include "support/target_process.hpp"

namespace ferry::test {
namespace {

// A target process offering `kind`, and an engine connected to it over that transport.
struct AcrossProcesses {
  AcrossProcesses(std::size_t size, TransportKind kind, const Config& c)
      : target(size, std::string(to_string(kind))),
        engine(c),
        peer(engine.connect(target.address)) {
    if (peer.transport() != kind)
      throw Error(ErrorCode::kUnsupported, "the peer did not take the transport under test");
  }
  TargetProcess target;
  Engine engine;
  Peer peer;
};

TEST_P(Conformance, ByteExactAcrossTheProcessBoundary) {
  if (!crosses_processes()) GTEST_SKIP() << "stays in one process";
  constexpr std::size_t kSize = 16 << 20;
  AcrossProcesses x(kSize, GetParam(), config());
  std::vector<uint8_t> buf(kSize), back(kSize);
  Region local = x.engine.register_memory(buf.data(), kSize, Access::kLocal);
  Region check = x.engine.register_memory(back.data(), kSize, Access::kLocal);

  // Reads see what the target process wrote itself.
  Transfer whole{&local, 0, &x.target.descriptor, 0, kSize};
  ASSERT_TRUE(x.peer.read({&whole, 1}).wait(kWait).ok());
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(buf[i], target_byte(i)) << i;

  for (uint64_t size :
       {uint64_t{1}, uint64_t{3}, uint64_t{4097}, uint64_t{999999}, uint64_t{5} << 20}) {
    uint64_t off = (size * 13) % (kSize - size);
    fill_pattern(buf.data() + off, size, static_cast<uint32_t>(size));
    Transfer w{&local, off, &x.target.descriptor, off, size};
    ASSERT_TRUE(x.peer.write({&w, 1}).wait(kWait).ok()) << size;
    Transfer r{&check, off, &x.target.descriptor, off, size};
    ASSERT_TRUE(x.peer.read({&r, 1}).wait(kWait).ok()) << size;
    ASSERT_EQ(0, std::memcmp(buf.data() + off, back.data() + off, size)) << size;
  }
}

TEST_P(Conformance, KilledTargetFailsInFlightOperationsWithinTheTimeout) {
  if (!crosses_processes()) GTEST_SKIP() << "stays in one process";
  constexpr std::size_t kSize = 16 << 20;
  Config c = config();
  c.peer_timeout = std::chrono::seconds(3);
  AcrossProcesses x(kSize, GetParam(), c);
  // Reads land in one buffer, writes come from another: the two never touch the same bytes.
  std::vector<uint8_t> in(kSize), out(kSize);
  Region read_into = x.engine.register_memory(in.data(), kSize, Access::kLocal);
  Region write_from = x.engine.register_memory(out.data(), kSize, Access::kLocal);
  Transfer t{&write_from, 0, &x.target.descriptor, 0, kSize};
  Transfer r{&read_into, 0, &x.target.descriptor, 0, kSize};
  std::vector<Future> futures;
  for (int i = 0; i < 64; ++i)
    futures.push_back(i % 2 ? x.peer.write({&t, 1}) : x.peer.read({&r, 1}));
  ASSERT_TRUE(futures[0].wait(kWait).ok());
  x.target.kill_now();
  auto start = Clock::now();
  int lost = 0;
  for (auto& f : futures) {
    Status s = f.wait(c.peer_timeout + std::chrono::seconds(2));
    ASSERT_NE(s.code(), ErrorCode::kTimeout) << "an operation hung after the target died";
    if (s.code() == ErrorCode::kPeerLost)
      ++lost;
    else
      EXPECT_TRUE(s.ok()) << s.to_string();
  }
  if (!nic_served()) {
    // Over RDMA (the Soft-RoCE guest) the kernel finishes the DMA already in flight before the
    // killed process is gone, so there every operation may succeed; none may hang.
    EXPECT_GT(lost, 0);
  }
  EXPECT_LT(Clock::now() - start, c.peer_timeout + std::chrono::seconds(2));
  EXPECT_EQ(x.peer.write({&t, 1}).wait(kWait).code(), ErrorCode::kPeerLost);
  EXPECT_FALSE(x.peer.connected());
}

TEST_P(Conformance, HungTargetIsDetectedByLiveness) {
  if (!crosses_processes()) GTEST_SKIP() << "stays in one process";
  Config c = config();
  c.peer_timeout = std::chrono::seconds(1);
  AcrossProcesses x(1 << 20, GetParam(), c);
  std::vector<uint8_t> buf(1 << 20);
  Region local = x.engine.register_memory(buf.data(), buf.size(), Access::kLocal);
  Transfer t{&local, 0, &x.target.descriptor, 0, buf.size()};
  ASSERT_TRUE(x.peer.read({&t, 1}).wait(kWait).ok());
  kill(x.target.pid, SIGSTOP);  // alive for the kernel, silent for us
  ASSERT_TRUE(wait_until_stopped(x.target.pid));
  Future read = x.peer.read({&t, 1});
  // Nobody receives: the message waits for the target's engine to buffer and acknowledge it.
  Future sent = x.peer.send(1, local, 0, 64);
  auto start = Clock::now();
  Status s = sent.wait(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), ErrorCode::kPeerLost) << s.to_string();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(s.message().find("no sign of life"), std::string::npos) << s.message();
  EXPECT_FALSE(x.peer.connected());
  Status r = read.wait(std::chrono::seconds(1));
  if (!nic_served()) {
    EXPECT_EQ(r.code(), ErrorCode::kPeerLost) << r.to_string();
  } else {
    // Over RDMA (the Soft-RoCE guest) the stopped target's kernel still serves the read.
    EXPECT_TRUE(r.ok() || r.code() == ErrorCode::kPeerLost) << r.to_string();
  }
}

}  // namespace
}  // namespace ferry::test
