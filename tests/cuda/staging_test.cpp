// CUDA memory to and from host memory at a peer over the host transports (engine/stager.hpp):
// bounced through pinned buffers in chunks, byte-exact at odd sizes, offsets and scattered
// batches, write_with_imm's notification after every chunk, mixed batches, what stays refused,
// and operations ended by a close or a shutdown while chunks are in flight.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <vector>

#include "cuda_test_support.hpp"

namespace ferry::test {
namespace {

// Small chunks, few of them: every large operation is many chunks through a full pipeline.
Config staging_config(TransportKind kind) {
  Config c = test_config();
  c.transports = {kind};
  c.staging_chunk_bytes = 64 << 10;
  c.staging_chunks = 3;
  return c;
}

class Staging : public ::testing::TestWithParam<TransportKind> {};

TEST_P(Staging, WritesAndReadsBetweenDeviceAndPeerHostMemory) {
  Pair p(staging_config(GetParam()), staging_config(GetParam()));
  constexpr std::size_t kCap = (3 << 20) + 64;
  Region device = p.initiator.allocate(kCap, Access::kLocal, Memory::cuda(0));
  Buffer host(p.target, kCap, Access::kRemoteReadWrite, 2);
  Descriptor d = host.region.descriptor();
  for (uint64_t size : {uint64_t{1}, uint64_t{4099}, uint64_t{65536}, uint64_t{65537},
                        (uint64_t{1} << 20) + 13, uint64_t{3} << 20}) {
    SCOPED_TRACE(size);
    uint64_t loff = size % 7, roff = size % 13;
    auto bytes = pattern(size, static_cast<uint32_t>(size));
    put(device, bytes, loff);
    Transfer t{&device, loff, &d, roff, size};
    Future w = p.peer.write({&t, 1});
    ASSERT_TRUE(w.wait(kWait).ok()) << w.status().to_string();
    EXPECT_EQ(w.bytes(), size);
    ASSERT_TRUE(std::equal(bytes.begin(), bytes.end(), host.bytes.begin() + roff));
    fill_pattern(host.bytes.data() + roff, size, static_cast<uint32_t>(size) + 1);
    Future r = p.peer.read({&t, 1});
    ASSERT_TRUE(r.wait(kWait).ok()) << r.status().to_string();
    EXPECT_EQ(get(device, loff, size),
              std::vector<uint8_t>(host.bytes.begin() + roff, host.bytes.begin() + roff + size));
  }
}

TEST_P(Staging, ScatteredBatchesPackIntoChunksBothWays) {
  Pair p(staging_config(GetParam()), staging_config(GetParam()));
  constexpr std::size_t kEntries = 1000, kEntry = 333;
  Region device = p.initiator.allocate(kEntries * kEntry, Access::kLocal, Memory::cuda(0));
  Buffer host(p.target, 2 * kEntries * kEntry, Access::kRemoteReadWrite, 4);
  auto bytes = pattern(kEntries * kEntry, 9);
  put(device, bytes);
  Descriptor d = host.region.descriptor();
  std::vector<Transfer> batch;
  for (std::size_t i = 0; i < kEntries; ++i)
    batch.push_back({&device, i * kEntry, &d, (i * 7919 % kEntries) * 2 * kEntry, kEntry});
  ASSERT_TRUE(p.peer.write(batch).wait(kWait).ok());
  for (const Transfer& t : batch) {
    ASSERT_TRUE(std::equal(bytes.begin() + static_cast<long>(t.local_offset),
                           bytes.begin() + static_cast<long>(t.local_offset + kEntry),
                           host.bytes.begin() + static_cast<long>(t.remote_offset)))
        << t.local_offset;
  }
  for (const Transfer& t : batch)
    fill_pattern(host.bytes.data() + t.remote_offset, kEntry,
                 static_cast<uint32_t>(t.local_offset));
  ASSERT_TRUE(p.peer.read(batch).wait(kWait).ok());
  auto got = get(device, 0, kEntries * kEntry);
  for (const Transfer& t : batch) {
    ASSERT_TRUE(std::equal(got.begin() + static_cast<long>(t.local_offset),
                           got.begin() + static_cast<long>(t.local_offset + kEntry),
                           host.bytes.begin() + static_cast<long>(t.remote_offset)))
        << t.local_offset;
  }
}

// The notification of a write_with_imm of many chunks comes after its last byte.
TEST_P(Staging, WriteWithImmNotifiesAfterEveryChunk) {
  Pair p(staging_config(GetParam()), staging_config(GetParam()));
  constexpr std::size_t kBytes = 2 << 20;
  Region device = p.initiator.allocate(kBytes, Access::kLocal, Memory::cuda(0));
  Buffer host(p.target, kBytes, Access::kRemoteWrite, 0);
  Descriptor d = host.region.descriptor();
  for (uint32_t round = 1; round <= 3; ++round) {
    auto bytes = pattern(kBytes, round);
    put(device, bytes);
    Transfer t{&device, 0, &d, 0, kBytes};
    ASSERT_TRUE(p.peer.write_with_imm({&t, 1}, round).wait(kWait).ok());
    std::optional<ImmEvent> e = p.target.next_imm(kWait);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->imm, round);
    ASSERT_EQ(host.bytes, bytes);
  }
}

// A batch whose first entry is device memory is staged whole; its host entries go along.
TEST_P(Staging, ABatchMixingDeviceAndHostMemoryLandsWhole) {
  Pair p(staging_config(GetParam()), staging_config(GetParam()));
  Region device = p.initiator.allocate(1 << 20, Access::kLocal, Memory::cuda(0));
  Buffer local_host(p.initiator, 1 << 20, Access::kLocal, 6);
  Buffer host(p.target, 2 << 20, Access::kRemoteReadWrite, 0);
  auto bytes = pattern(1 << 20, 5);
  put(device, bytes);
  Descriptor d = host.region.descriptor();
  std::vector<Transfer> batch{{&device, 0, &d, 0, 1 << 20},
                              {&local_host.region, 0, &d, 1 << 20, 1 << 20}};
  ASSERT_TRUE(p.peer.write(batch).wait(kWait).ok());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), host.bytes.begin()));
  EXPECT_TRUE(
      std::equal(local_host.bytes.begin(), local_host.bytes.end(), host.bytes.begin() + (1 << 20)));
}

// What staging does not do: device memory at the peer, bad descriptors and offsets, a
// prepared operation. Each fails with its reason, as before.
TEST_P(Staging, WhatIsNotStagedFailsWithItsReason) {
  Pair p(staging_config(GetParam()), staging_config(GetParam()));
  Region device = p.initiator.allocate(1 << 16, Access::kLocal, Memory::cuda(0));
  Region target_device = p.target.allocate(1 << 16, Access::kRemoteReadWrite, Memory::cuda(0));
  Buffer host(p.target, 1 << 16, Access::kRemoteRead, 0);
  Descriptor to_device = target_device.descriptor();
  Descriptor read_only = host.region.descriptor();
  Transfer t{&device, 0, &to_device, 0, 4096};
  Status s = p.peer.write({&t, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("from cuda to cuda memory"), std::string::npos) << s.to_string();
  Transfer denied{&device, 0, &read_only, 0, 4096};
  s = p.peer.write({&denied, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kPermissionDenied) << s.to_string();
  EXPECT_NE(s.message().find("staged through host memory"), std::string::npos) << s.to_string();
  Transfer past{&device, 0, &read_only, (1 << 16) - 10, 4096};
  s = p.peer.read({&past, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds) << s.to_string();
  Transfer too_long{&device, (1 << 16) - 10, &read_only, 0, 4096};
  s = p.peer.read({&too_long, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds) << s.to_string();
  EXPECT_NE(s.message().find("read entry 0: local"), std::string::npos) << s.to_string();
  Transfer readable{&device, 0, &read_only, 0, 4096};
  EXPECT_THROW(p.peer.prepare_read({&readable, 1}), Error);
}

// A close or a shutdown while chunks are in flight ends every staged operation, and the
// device region deregisters after (its lease went with the last copy).
TEST_P(Staging, ClosingOrShuttingDownMidFlightEndsEveryOperation) {
  for (bool shutdown : {false, true}) {
    SCOPED_TRACE(shutdown ? "shutdown" : "close");
    Pair p(staging_config(GetParam()), staging_config(GetParam()));
    constexpr std::size_t kBytes = 4 << 20;
    Region device = p.initiator.allocate(kBytes, Access::kLocal, Memory::cuda(0));
    Buffer host(p.target, kBytes, Access::kRemoteReadWrite, 0);
    Descriptor d = host.region.descriptor();
    post_then_end(p, {&device, 0, &d, 0, kBytes}, 8, shutdown);
    auto gone = std::async(std::launch::async, [&] { device.deregister(); });
    EXPECT_EQ(gone.wait_for(kWait), std::future_status::ready);
  }
}

INSTANTIATE_TEST_SUITE_P(HostTransports, Staging,
                         ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(StagingSettings, OutOfRangeAreRefusedByName) {
  Config c = test_config();
  c.staging_chunks = 1;
  try {
    Engine e(c);
    ADD_FAILURE() << "staging_chunks 1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("staging_chunks must be 2..64"), std::string::npos);
  }
  c = test_config();
  c.staging_chunk_bytes = 1024;
  try {
    Engine e(c);
    ADD_FAILURE() << "staging_chunk_bytes 1024 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("staging_chunk_bytes must be 4 KiB..1 GiB"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace ferry::test
