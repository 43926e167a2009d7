// The same-host channel beyond what every transport's conformance cases check: the mapped path
// (regions from Engine::allocate are lent to the peer, which maps their memory file and copies
// with memcpy; deregistration takes the mapping back first), and large messages held by the
// receiver until a receive is posted.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

Config shm_config() {
  Config c = test_config();
  c.transports = {TransportKind::kShm};
  // A deregistration must end because the peer gave the mapping back, not because it was cut off.
  c.revoke_timeout = std::chrono::hours(1);
  return c;
}

uint8_t* bytes_of(const Region& r) { return static_cast<uint8_t*>(r.data()); }

struct MappedPair : Pair {
  MappedPair() : Pair(shm_config(), shm_config()) {}
  // Writes `n` bytes of `source` at `offset` of `d`.
  Status write(const Region& source, const Descriptor& d, uint64_t offset, uint64_t n) {
    Transfer t{&source, 0, &d, offset, n};
    return peer.write({&t, 1}).wait(kWait);
  }
  Status read(const Region& into, const Descriptor& d, uint64_t offset, uint64_t n) {
    Transfer t{&into, 0, &d, offset, n};
    return peer.read({&t, 1}).wait(kWait);
  }
};

TEST(ShmMapped, AnAllocatedRegionIsMappedOnFirstUseAndMovesBytesExactly) {
  MappedPair p;
  constexpr std::size_t kSize = (std::size_t{3} << 20) + 5;
  Region target = p.target.allocate(kSize, Access::kRemoteReadWrite);
  Region source = p.initiator.allocate(kSize, Access::kLocal);
  Region back = p.initiator.allocate(kSize, Access::kLocal);
  Descriptor d = target.descriptor();
  MemoryFiles before = memory_files();
  // The first access goes through the target, which lends the file with its answer.
  fill_pattern(bytes_of(source), kSize, 3);
  ASSERT_TRUE(p.write(source, d, 0, 7).ok());
  MemoryFiles after = memory_files();
  EXPECT_EQ(after.all, before.all + 1) << "the initiator maps the target's region";
  EXPECT_EQ(after.writable, before.writable + 1);
  EXPECT_EQ(0, std::memcmp(bytes_of(target), bytes_of(source), 7));

  // Odd sizes and offsets, both ways, through the mapping.
  for (uint64_t n : {uint64_t{1}, uint64_t{4097}, uint64_t{65537}, kSize - 13}) {
    uint64_t offset = (kSize - n) / 3;
    fill_pattern(bytes_of(source), n, static_cast<uint32_t>(n));
    ASSERT_TRUE(p.write(source, d, offset, n).ok()) << n;
    ASSERT_EQ(0, std::memcmp(bytes_of(target) + offset, bytes_of(source), n)) << n;
    fill_pattern(bytes_of(target) + offset, n, static_cast<uint32_t>(n) + 1);
    ASSERT_TRUE(p.read(back, d, offset, n).ok()) << n;
    ASSERT_EQ(0, std::memcmp(bytes_of(target) + offset, bytes_of(back), n)) << n;
  }
  // Beyond the region: refused by the target, which the op then reaches; nothing changes.
  std::vector<uint8_t> snapshot(bytes_of(target), bytes_of(target) + kSize);
  EXPECT_EQ(p.write(source, d, kSize - 3, 4).code(), ErrorCode::kOutOfBounds);
  EXPECT_EQ(0, std::memcmp(snapshot.data(), bytes_of(target), kSize));
  EXPECT_EQ(memory_files().all, after.all);
}

TEST(ShmMapped, ScatteredBatchesAndNotificationsThroughTheMapping) {
  MappedPair p;
  constexpr std::size_t kSize = 1 << 20;
  Region target = p.target.allocate(kSize, Access::kRemoteReadWrite);
  Region source = p.initiator.allocate(kSize, Access::kLocal);
  Descriptor d = target.descriptor();
  ASSERT_TRUE(p.write(source, d, 0, 1).ok());  // lent
  fill_pattern(bytes_of(source), kSize, 9);
  // 10,000 entries of 61 bytes, every third 61-byte piece of the region, in reverse order.
  std::vector<Transfer> batch;
  for (uint64_t i = 0; i < 10000; ++i) {
    uint64_t piece = 9999 - i;
    batch.push_back({&source, piece * 61, &d, piece * 61 * 3 % (kSize - 61), 61});
  }
  for (uint32_t round = 0; round < 3; ++round) {
    std::memset(bytes_of(target), 0, kSize);
    Future f = p.peer.write_with_imm(batch, 700 + round);
    std::optional<ImmEvent> imm = p.target.next_imm(kWait);
    ASSERT_TRUE(imm.has_value());
    EXPECT_EQ(imm->imm, 700 + round);
    // Every byte landed before the notification was seen.
    for (const Transfer& t : batch) {
      ASSERT_EQ(0, std::memcmp(bytes_of(target) + t.remote_offset,
                               bytes_of(source) + t.local_offset, 61));
    }
    ASSERT_TRUE(f.wait(kWait).ok());
  }
  EXPECT_FALSE(p.target.next_imm(std::chrono::milliseconds(50)).has_value());
}

TEST(ShmMapped, DeregisteringTakesTheMappingBackFirst) {
  MappedPair p;
  constexpr std::size_t kSize = 1 << 20;
  Region source = p.initiator.allocate(kSize, Access::kLocal);
  int before = memory_files().all;
  Region target = p.target.allocate(kSize, Access::kRemoteReadWrite);
  Descriptor d = target.descriptor();
  ASSERT_TRUE(p.write(source, d, 0, kSize).ok());
  ASSERT_TRUE(p.write(source, d, 0, kSize).ok());
  EXPECT_EQ(memory_files().all, before + 2) << "the target's own mapping and the initiator's";
  // revoke_timeout is an hour: this returns because the initiator unmapped and said so.
  target.deregister();
  EXPECT_EQ(memory_files().all, before) << "no mapping of the region is left in either engine";
  ErrorCode code = p.write(source, d, 0, 8).code();
  EXPECT_TRUE(code == ErrorCode::kRevoked || code == ErrorCode::kUnknownRegion) << to_string(code);
  // The peer is still served.
  Region again = p.target.allocate(kSize, Access::kRemoteReadWrite);
  Descriptor d2 = again.descriptor();
  fill_pattern(bytes_of(source), kSize, 5);
  ASSERT_TRUE(p.write(source, d2, 0, kSize).ok());
  ASSERT_TRUE(p.write(source, d2, 0, kSize).ok());
  EXPECT_EQ(0, std::memcmp(bytes_of(again), bytes_of(source), kSize));
}

TEST(ShmMapped, ARegionIsLentOnlyAsItsAccessAllows) {
  MappedPair p;
  constexpr std::size_t kSize = 64 << 10;
  Region source = p.initiator.allocate(kSize, Access::kLocal);
  fill_pattern(bytes_of(source), kSize, 1);
  MemoryFiles start = memory_files();
  Region read_only = p.target.allocate(kSize, Access::kRemoteRead);
  Region write_only = p.target.allocate(kSize, Access::kRemoteWrite);
  fill_pattern(bytes_of(read_only), kSize, 2);
  Descriptor r = read_only.descriptor(), w = write_only.descriptor();

  // Read-only: mapped read-only; a write is still refused by the target.
  ASSERT_TRUE(p.read(source, r, 0, kSize).ok());
  ASSERT_TRUE(p.read(source, r, 0, kSize).ok());
  EXPECT_EQ(0, std::memcmp(bytes_of(source), bytes_of(read_only), kSize));
  MemoryFiles now = memory_files();
  EXPECT_EQ(now.all, start.all + 3) << "two own mappings, one lent";
  EXPECT_EQ(now.writable, start.writable + 2) << "the lent one is read-only";
  fill_pattern(bytes_of(source), kSize, 3);
  EXPECT_EQ(p.write(source, r, 0, kSize).code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(0, std::memcmp(bytes_of(source), bytes_of(read_only), kSize));

  // Write-only: a mapping would let the peer read it, so it is not lent.
  ASSERT_TRUE(p.write(source, w, 0, kSize).ok());
  ASSERT_TRUE(p.write(source, w, 0, kSize).ok());
  EXPECT_EQ(0, std::memcmp(bytes_of(source), bytes_of(write_only), kSize));
  EXPECT_EQ(memory_files().all, now.all);
  EXPECT_EQ(p.read(source, w, 0, kSize).code(), ErrorCode::kPermissionDenied);
}

TEST(ShmMapped, MoreRegionsThanMappingsEvictTheLeastRecentlyUsed) {
  MappedPair p;
  constexpr int kRegions = 40;  // beyond the 32 a peer maps at once
  constexpr std::size_t kSize = 4096;
  Region source = p.initiator.allocate(kSize, Access::kLocal);
  int before = memory_files().all;
  std::vector<Region> targets;
  std::vector<Descriptor> ds;
  for (int i = 0; i < kRegions; ++i) {
    targets.push_back(p.target.allocate(kSize, Access::kRemoteReadWrite));
    ds.push_back(targets.back().descriptor());
  }
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kRegions; ++i) {
      fill_pattern(bytes_of(source), kSize, static_cast<uint32_t>(round * 100 + i));
      ASSERT_TRUE(p.write(source, ds[i], 0, kSize).ok()) << i;
      ASSERT_EQ(0, std::memcmp(bytes_of(source), bytes_of(targets[i]), kSize)) << i;
    }
  }
  int lent = memory_files().all - before - kRegions;
  EXPECT_GT(lent, 0);
  EXPECT_LE(lent, 32);
  // Every region goes, lent or given back.
  targets.clear();
  EXPECT_EQ(memory_files().all, before);
}

// A pulled read takes one grant for up to 8 MiB of consecutive slices of one entry; a refusal
// answers every slice its range covered, so the op completes with the error, never hangs.
TEST(ShmReads, ConsecutiveSlicesShareAGrantAndARefusalAnswersThemAll) {
  MappedPair p;
  constexpr std::size_t kSize = 4 << 20;
  std::vector<uint8_t> remote(kSize), local(3 * kSize);
  fill_pattern(remote.data(), kSize, 12);
  Region r = p.target.register_memory(remote.data(), kSize, Access::kRemoteRead);
  Region l = p.initiator.register_memory(local.data(), local.size(), Access::kLocal);
  Descriptor d = r.descriptor();
  constexpr uint64_t kRead = (3 << 20) + 5;
  ASSERT_TRUE(p.read(l, d, 7, kRead).ok());
  EXPECT_EQ(0, std::memcmp(local.data(), remote.data() + 7, kRead));
  // Beyond the region (a forged length): the first record's 8 slices and the second's one are
  // all refused.
  Descriptor forged = d;
  forged.length = 64 << 20;
  Status s = p.read(l, forged, 0, (9 << 20) + 1);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds) << s.to_string();
  ASSERT_TRUE(p.read(l, d, 0, kSize).ok()) << "the channel still serves";
  EXPECT_EQ(0, std::memcmp(local.data(), remote.data(), kSize));
}

// More large messages than requests in flight (32), each beyond the unexpected-message limit,
// with no receive posted: each is held (only its announcement counts), the sender's other
// requests go on, and posted receives then take them whole.
TEST(ShmMessages, LargeSendsWithNoReceivePostedWaitWithoutBufferingOrBlocking) {
  Config c = shm_config();
  c.max_unexpected_bytes = 64 << 10;
  Pair p(c, c);
  constexpr int kSends = 40;
  constexpr std::size_t kSize = 256 << 10;
  Region source = p.initiator.allocate(kSize * kSends, Access::kLocal);
  fill_pattern(bytes_of(source), kSize * kSends, 8);
  std::vector<Future> sends;
  for (int i = 0; i < kSends; ++i) sends.push_back(p.peer.send(7, source, i * kSize, kSize));
  // A write behind them completes: the held sends gave their credits back.
  Region target = p.target.allocate(kSize, Access::kRemoteReadWrite);
  Descriptor d = target.descriptor();
  Transfer w{&source, 0, &d, 0, kSize};
  ASSERT_TRUE(p.peer.write({&w, 1}).wait(kWait).ok());
  for (const Future& f : sends) EXPECT_FALSE(f.test()) << "no receive was posted";
  // Only the announcements count (128 bytes each), not the bytes.
  EXPECT_LE(p.target_peer.stats().unexpected_bytes, kSends * 128u);

  Region into = p.target.allocate(kSize * kSends, Access::kLocal);
  std::vector<Future> recvs;
  for (int i = 0; i < kSends; ++i) recvs.push_back(p.target_peer.recv(7, into, i * kSize, kSize));
  for (int i = 0; i < kSends; ++i) {
    ASSERT_TRUE(recvs[i].wait(kWait).ok()) << i;
    ASSERT_TRUE(sends[i].wait(kWait).ok()) << i;
    EXPECT_EQ(recvs[i].bytes(), kSize);
  }
  EXPECT_EQ(0, std::memcmp(bytes_of(source), bytes_of(into), kSize * kSends)) << "in tag order";
  EXPECT_EQ(p.target_peer.stats().unexpected_bytes, 0u);
}

}  // namespace
}  // namespace ferry::test
