// Group frames over TCP: many small entries of one operation travel in one frame per stream
// (docs/protocol.md, "Groups"). Every check here would fail if grouping lost, misplaced or
// duplicated a byte, validated less than single frames do, or notified early.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

// Entries at shuffled, non-adjacent slots on both sides.
struct Scatter {
  std::vector<uint64_t> local, remote, length;
};

Scatter scatter(const std::vector<uint64_t>& lengths, uint64_t slot, uint32_t seed) {
  Scatter s;
  std::vector<uint64_t> a(lengths.size()), b(lengths.size());
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(a.begin(), a.end(), rng);
  std::shuffle(b.begin(), b.end(), rng);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    s.local.push_back(a[i] * slot);
    s.remote.push_back(b[i] * slot);
    s.length.push_back(lengths[i]);
  }
  return s;
}

std::vector<Transfer> batch_of(const Scatter& s, const Region& local, const Descriptor& d) {
  std::vector<Transfer> batch;
  for (std::size_t i = 0; i < s.length.size(); ++i)
    batch.push_back({&local, s.local[i], &d, s.remote[i], s.length[i]});
  return batch;
}

// Bytes of `buf` covered by no entry (at `at` offsets) equal `before`.
void expect_only_entries_changed(const std::vector<uint8_t>& buf,
                                 const std::vector<uint8_t>& before,
                                 const std::vector<uint64_t>& at,
                                 const std::vector<uint64_t>& length) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (std::size_t i = 0; i < at.size(); ++i) ranges.emplace_back(at[i], at[i] + length[i]);
  std::sort(ranges.begin(), ranges.end());
  ranges.emplace_back(buf.size(), buf.size());
  uint64_t from = 0;
  for (auto [begin, end] : ranges) {
    if (begin > from) {
      ASSERT_EQ(0, std::memcmp(buf.data() + from, before.data() + from, begin - from))
          << "bytes in [" << from << ", " << begin << ") outside every entry changed";
    }
    from = std::max(from, end);
  }
}

void write_then_read(Pair& p, const std::vector<uint64_t>& lengths, uint64_t slot) {
  Scatter s = scatter(lengths, slot, 11);
  std::size_t bytes = lengths.size() * slot;
  Buffer local(p.initiator, bytes, Access::kLocal, 1);
  Buffer remote(p.target, bytes, Access::kRemoteReadWrite, 2);
  Descriptor d = remote.region.descriptor();
  std::vector<Transfer> batch = batch_of(s, local.region, d);
  std::vector<uint8_t> remote_before = remote.bytes;

  Future w = p.peer.write(batch);
  ASSERT_TRUE(w.wait(kWait).ok()) << w.status().to_string();
  uint64_t total = std::accumulate(lengths.begin(), lengths.end(), uint64_t{0});
  EXPECT_EQ(w.bytes(), total);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(local.bytes.data() + s.local[i], remote.bytes.data() + s.remote[i],
                             lengths[i]))
        << "entry " << i << " of " << lengths[i] << " bytes";
  }
  expect_only_entries_changed(remote.bytes, remote_before, s.remote, s.length);

  // Read them back into a cleared buffer: the entries return, nothing else is touched.
  std::vector<uint8_t> sent = local.bytes;
  std::fill(local.bytes.begin(), local.bytes.end(), 0);
  Future r = p.peer.read(batch);
  ASSERT_TRUE(r.wait(kWait).ok()) << r.status().to_string();
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(local.bytes.data() + s.local[i], sent.data() + s.local[i], lengths[i]))
        << "entry " << i;
  }
  expect_only_entries_changed(local.bytes, std::vector<uint8_t>(bytes, 0), s.local, s.length);
}

TEST(Groups, TenThousandScattered4KAnd16KEntries) {
  Pair p;
  write_then_read(p, std::vector<uint64_t>(10000, 4096), 8192);
  write_then_read(p, std::vector<uint64_t>(10000, 16384), 20480);
}

TEST(Groups, MixedSizesWithEmptyEntriesAndEntriesOverASlice) {
  Config c = test_config();
  c.slice_bytes = 64 << 10;  // entries of 100 KB and 300 KB are cut into slices
  for (std::size_t stripe : {std::size_t{1} << 30, std::size_t{64} << 10}) {  // one lane, all
    c.stripe_threshold = stripe;
    Pair p(c, c);
    std::vector<uint64_t> lengths;
    const uint64_t kSizes[] = {0, 1, 4096, 16384, 7, 65535, 65536, 100000, 0, 300000, 333, 65537};
    for (int i = 0; i < 400; ++i) lengths.push_back(kSizes[i % std::size(kSizes)]);
    write_then_read(p, lengths, 300000 + 4096);
  }
}

// A descriptor that claims more than the target granted passes the initiator's checks; inside a
// group the target refuses exactly the entry outside the region, names it, and writes nowhere
// outside the region. The group's other entries are written, as separate frames would be.
TEST(Groups, TargetRefusesTheEntryOutsideTheRegionAndNamesIt) {
  Pair p;
  constexpr uint64_t kRegion = 64 << 10, kEntry = 1024, kEntries = 40, kBad = 13;
  std::vector<uint8_t> target_mem(2 * kRegion);
  fill_pattern(target_mem, 5);
  std::vector<uint8_t> before = target_mem;
  Region region = p.target.register_memory(target_mem.data(), kRegion, Access::kRemoteReadWrite);
  Descriptor forged = region.descriptor();
  forged.length = 2 * kRegion;
  Buffer local(p.initiator, kEntries * kEntry, Access::kLocal, 6);
  std::vector<Transfer> batch;
  for (uint64_t i = 0; i < kEntries; ++i) {
    uint64_t remote = i == kBad ? kRegion + 4096 : (kEntries - 1 - i) * kEntry;
    batch.push_back({&local.region, i * kEntry, &forged, remote, kEntry});
  }
  Status w = p.peer.write(batch).wait(kWait);
  EXPECT_EQ(w.code(), ErrorCode::kOutOfBounds) << w.to_string();
  EXPECT_NE(w.message().find("write entry 13:"), std::string::npos) << w.message();
  EXPECT_TRUE(std::equal(target_mem.begin() + kRegion, target_mem.end(), before.begin() + kRegion))
      << "bytes outside the region changed";
  for (uint64_t i = 0; i < kEntries; ++i) {
    if (i == kBad) continue;
    uint64_t remote = (kEntries - 1 - i) * kEntry;
    EXPECT_EQ(0, std::memcmp(target_mem.data() + remote, local.bytes.data() + i * kEntry, kEntry))
        << "entry " << i;
  }

  Status r = p.peer.read(batch).wait(kWait);
  EXPECT_EQ(r.code(), ErrorCode::kOutOfBounds) << r.to_string();
  EXPECT_NE(r.message().find("read entry 13:"), std::string::npos) << r.message();
  // The peer is still there for well-formed operations.
  batch.erase(batch.begin() + kBad);
  EXPECT_TRUE(p.peer.write(batch).wait(kWait).ok());
}

// The immediate of a grouped write_with_imm arrives once, after every byte of it is in place,
// on one lane and striped over all of them.
TEST(Groups, WriteWithImmNotifiesOnceAfterEveryByte) {
  Pair p;
  constexpr uint64_t kEntry = 4096, kSlot = 6000;
  Buffer remote(p.target, 2000 * kSlot, Access::kRemoteReadWrite, 7);
  Descriptor d = remote.region.descriptor();
  uint32_t imm = 100;
  for (uint64_t entries : {100, 2000}) {  // 400 KB on one stream; 8 MB striped
    Scatter s = scatter(std::vector<uint64_t>(entries, kEntry), kSlot, static_cast<uint32_t>(imm));
    Buffer local(p.initiator, entries * kSlot, Access::kLocal, imm);
    std::vector<Transfer> batch = batch_of(s, local.region, d);
    Future w = p.peer.write_with_imm(batch, imm);
    std::optional<ImmEvent> e = p.target.next_imm(kWait);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->imm, imm);
    for (std::size_t i = 0; i < entries; ++i) {
      ASSERT_EQ(0, std::memcmp(remote.bytes.data() + s.remote[i], local.bytes.data() + s.local[i],
                               kEntry))
          << "entry " << i << " not in place when the immediate came";
    }
    ASSERT_TRUE(w.wait(kWait).ok()) << w.status().to_string();
    ++imm;
  }
  // Exactly one notification per operation: the next one is a later operation's.
  Buffer one(p.initiator, 64, Access::kLocal, 9);
  Transfer t{&one.region, 0, &d, 0, 64};
  ASSERT_TRUE(p.peer.write_with_imm({&t, 1}, 999).wait(kWait).ok());
  std::optional<ImmEvent> e = p.target.next_imm(kWait);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->imm, 999u);
}

}  // namespace
}  // namespace ferry::test
