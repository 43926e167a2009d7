// Region table, operation pool and tag matcher.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/ring.hpp"
#include "transport/matcher.hpp"
#include "transport/op.hpp"
#include "transport/region_table.hpp"

namespace ferry::transport {
namespace {

TEST(RegionTable, ValidatesEveryAccess) {
  RegionTable t;
  std::vector<uint8_t> mem(100);
  uint32_t id = t.insert(mem.data(), mem.size(), Access::kRemoteRead, 77);
  uint8_t* addr = nullptr;
  RegionUse use;
  ASSERT_TRUE(t.acquire(id, 77, 10, 90, Access::kRemoteRead, &addr, use).ok());
  EXPECT_EQ(addr, mem.data() + 10);
  use.release();
  EXPECT_EQ(t.acquire(id, 77, 10, 91, Access::kRemoteRead, &addr, use).code(),
            ErrorCode::kOutOfBounds);
  EXPECT_EQ(t.acquire(id, 77, 101, 0, Access::kRemoteRead, &addr, use).code(),
            ErrorCode::kOutOfBounds);
  EXPECT_EQ(t.acquire(id, 77, ~0ull, 2, Access::kRemoteRead, &addr, use).code(),
            ErrorCode::kOutOfBounds);
  EXPECT_EQ(t.acquire(id, 78, 0, 1, Access::kRemoteRead, &addr, use).code(), ErrorCode::kWrongKey);
  EXPECT_EQ(t.acquire(id, 77, 0, 1, Access::kRemoteWrite, &addr, use).code(),
            ErrorCode::kPermissionDenied);
  EXPECT_EQ(t.acquire(id + 1, 77, 0, 1, Access::kRemoteRead, &addr, use).code(),
            ErrorCode::kUnknownRegion);
  EXPECT_EQ(t.acquire(0, 0, 0, 1, Access::kRemoteRead, &addr, use).code(),
            ErrorCode::kUnknownRegion);
  EXPECT_FALSE(use.valid());

  t.revoke(
      id, std::chrono::seconds(1), [] {}, [] { ADD_FAILURE() << "nothing held the region"; });
  EXPECT_EQ(t.acquire(id, 77, 0, 1, Access::kRemoteRead, &addr, use).code(), ErrorCode::kRevoked);
  // The slot is reused under a new id; the old id stays dead.
  uint32_t id2 = t.insert(mem.data(), mem.size(), Access::kRemoteRead, 77);
  EXPECT_NE(id, id2);
  EXPECT_EQ(t.acquire(id, 77, 0, 1, Access::kRemoteRead, &addr, use).code(),
            ErrorCode::kUnknownRegion);
  EXPECT_TRUE(t.acquire(id2, 77, 0, 1, Access::kRemoteRead, &addr, use).ok());
}

// A region of 8 bytes with one access in progress.
struct HeldRegion {
  HeldRegion() {
    uint8_t* addr = nullptr;
    EXPECT_TRUE(t.acquire(id, 1, 0, 8, Access::kRemoteWrite, &addr, use).ok());
  }
  RegionTable t;
  std::vector<uint8_t> mem = std::vector<uint8_t>(8);
  uint32_t id = t.insert(mem.data(), mem.size(), Access::kRemoteWrite, 1);
  RegionUse use;
};

TEST(RegionTable, RevokeWaitsForAccessesInProgress) {
  HeldRegion r;
  auto& [t, mem, id, use] = r;
  std::atomic<bool> revoked{false};
  std::atomic<bool> asked{false};
  std::thread revoker([&] {
    t.revoke(
        id, std::chrono::hours(1),
        [&] {
          // Holders are asked to let go only once no new access can start.
          uint8_t* addr = nullptr;
          RegionUse late;
          EXPECT_EQ(t.acquire(id, 1, 0, 8, Access::kRemoteWrite, &addr, late).code(),
                    ErrorCode::kRevoked);
          asked = true;
        },
        [] { ADD_FAILURE() << "cut off before the timeout"; });
    revoked = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(revoked.load()) << "revoke returned while the region was in use";
  use.release();
  revoker.join();
  EXPECT_TRUE(asked.load());
  EXPECT_TRUE(revoked.load());
}

TEST(RegionTable, AnAccessHeldPastThePatienceIsCutOffOnce) {
  HeldRegion r;
  auto& [t, mem, id, use] = r;
  uint8_t* addr = nullptr;
  int cut_offs = 0;
  // The cut-off makes the holder let go, as closing a peer's channel does.
  t.revoke(
      id, std::chrono::milliseconds(10), [] {},
      [&] {
        ++cut_offs;
        use.release();
      });
  EXPECT_EQ(cut_offs, 1);
  EXPECT_EQ(t.acquire(id, 1, 0, 8, Access::kRemoteWrite, &addr, use).code(), ErrorCode::kRevoked);
}

TEST(OpState, LanesBeyondTheInlineOnesSpillOnceAndStayAcrossReuse) {
  auto pool = std::make_shared<OpPool>();
  OpState* op = pool->acquire();
  OpState::LaneCursor* inline_lanes = op->lanes;
  op->reserve_lanes(OpState::kInlineLanes);
  EXPECT_EQ(op->lanes, inline_lanes) << "16 lanes fit inline";
  op->reserve_lanes(OpState::kMaxLanes);
  OpState::LaneCursor* spilled = op->lanes;
  EXPECT_NE(spilled, inline_lanes);
  for (int i = 0; i < OpState::kMaxLanes; ++i) {
    op->lanes[i] = {static_cast<uint32_t>(i), 0, 1};
    op->lane_next[i] = nullptr;
  }
  EXPECT_EQ(op->lanes[OpState::kMaxLanes - 1].entry, static_cast<uint32_t>(OpState::kMaxLanes - 1));
  op->complete_with({});
  op->release();  // back to the pool, reset
  OpState* again = pool->acquire();
  ASSERT_EQ(again, op) << "the pool hands the same op out again";
  again->reserve_lanes(OpState::kMaxLanes);
  EXPECT_EQ(again->lanes, spilled) << "the spill is kept: no second allocation";
  again->complete_with({});
  again->release();
}

TEST(OpPool, IdsChangeOnReuseAndLookupNeedsPosted) {
  auto pool = std::make_shared<OpPool>();
  OpState* op = pool->acquire();
  uint64_t first_id = op->id.load();
  EXPECT_EQ(pool->lookup(first_id), nullptr) << "not posted yet";
  ASSERT_TRUE(pool->mark_posted(op));
  EXPECT_EQ(pool->lookup(first_id), op);
  op->finish_posted();
  EXPECT_TRUE(op->done.load());
  EXPECT_EQ(pool->lookup(first_id), nullptr) << "complete ops are not found";
  op->release();
  OpState* again = pool->acquire();
  EXPECT_EQ(again, op) << "the slot is recycled once unreferenced";
  EXPECT_NE(again->id.load(), first_id);
  ASSERT_TRUE(pool->mark_posted(again));
  EXPECT_EQ(pool->lookup(first_id), nullptr) << "a stale id never reaches the new op";
  auto collected = pool->close_and_collect();
  ASSERT_EQ(collected.size(), 1u);
  OpState* refused = pool->acquire();
  EXPECT_FALSE(pool->mark_posted(refused)) << "a closed pool refuses new work";
  refused->release();
  collected[0]->record_error({ErrorCode::kPeerLost, "x"});
  collected[0]->finish_posted();
  collected[0]->release();
  again->release();
}

TEST(OpState, CompletesOnceAndRunsCallback) {
  auto pool = std::make_shared<OpPool>();
  OpState* op = pool->acquire();
  ASSERT_TRUE(pool->mark_posted(op));
  int calls = 0;
  op->callback = [&](const Status& s) {
    ++calls;
    EXPECT_EQ(s.code(), ErrorCode::kOutOfBounds);
  };
  op->pending = 2;
  op->record_error({ErrorCode::kOutOfBounds, "first"});
  op->record_error({ErrorCode::kWrongKey, "second"});
  EXPECT_FALSE(op->finish_slices(1));
  EXPECT_TRUE(op->finish_slices(1));
  op->finish_posted();
  EXPECT_FALSE(op->complete());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(op->status.message(), "first");
  op->release();
}

TEST(Advance, WalksSlicesAcrossEntries) {
  auto pool = std::make_shared<OpPool>();
  OpState* op = pool->acquire();
  op->slice_bytes = 10;
  op->entries = {{nullptr, 25}, {nullptr, 5}, {nullptr, 10}};  // 3 + 1 + 1 slices
  LaneCursor c;
  advance(*op, c, 2);
  EXPECT_EQ(c.entry, 0u);
  EXPECT_EQ(c.offset, 20u);
  advance(*op, c, 1);
  EXPECT_EQ(c.entry, 1u);
  EXPECT_EQ(c.offset, 0u);
  advance(*op, c, 2);
  EXPECT_EQ(c.entry, 3u);
  op->release();
}

TEST(Matcher, MatchesInOrderBuffersAndLimits) {
  auto pool = std::make_shared<OpPool>();
  Matcher m(16 + Matcher::kUnexpectedOverheadBytes);
  std::vector<uint8_t> dst(8);
  // A message before any receive is buffered, then delivered on post.
  auto a = m.arrive(5, 4);
  ASSERT_TRUE(a.error.ok());
  ASSERT_EQ(a.recv, nullptr);
  m.commit(5, {1, 2, 3, 4});
  OpState* r = pool->acquire();
  r->tag = 5;
  r->entries = {{dst.data(), 8}};
  ASSERT_TRUE(pool->mark_posted(r));
  m.post(r);
  ASSERT_TRUE(r->done.load());
  EXPECT_TRUE(r->status.ok());
  EXPECT_EQ(r->bytes.load(), 4u);
  EXPECT_EQ(dst[3], 4);
  r->release();

  // Over the limit: refused, nothing buffered.
  EXPECT_EQ(m.arrive(6, 17).error.code(), ErrorCode::kResourceExhausted);

  // A posted receive smaller than the message: truncated.
  OpState* small = pool->acquire();
  small->tag = 7;
  small->entries = {{dst.data(), 2}};
  ASSERT_TRUE(pool->mark_posted(small));
  m.post(small);
  auto b = m.arrive(7, 4);
  ASSERT_EQ(b.recv, small);
  Matcher::deliver(small, std::vector<uint8_t>{9, 9, 9, 9}.data(), 4);
  small->finish_posted();
  EXPECT_EQ(small->status.code(), ErrorCode::kTruncated);
  EXPECT_EQ(small->bytes.load(), 2u);
  small->release();
}

// Buffers `n` messages of `length` bytes with `tag`; returns the first refusal, if any.
Status buffer_messages(Matcher& m, uint64_t tag, int n, std::size_t length) {
  for (int i = 0; i < n; ++i) {
    Matcher::Arrival a = m.arrive(tag, length);
    if (!a.error.ok()) return a.error;
    m.commit(tag, std::vector<uint8_t>(length, static_cast<uint8_t>(i)));
  }
  return {};
}

struct Announced final : Rendezvous {
  void matched(OpState*) override {}
};

// Takes one buffered message of `tag` (into a stand-alone op: nothing completes).
bool take_one(Matcher& m, uint64_t tag) {
  std::vector<uint8_t> dst(1 << 16);
  OpState r;
  r.tag = tag;
  r.entries = {{dst.data(), dst.size()}};
  return m.take_buffered(&r);
}

TEST(Matcher, EveryMessageCountsItsOverhead) {
  constexpr std::size_t kOverhead = Matcher::kUnexpectedOverheadBytes;
  Matcher m(10 * kOverhead);
  // Empty messages are not free: ten fill the limit.
  ASSERT_TRUE(buffer_messages(m, 1, 10, 0).ok());
  EXPECT_EQ(m.usage().messages, 10u);
  EXPECT_EQ(m.usage().bytes, 10 * kOverhead);
  Status s = buffer_messages(m, 1, 1, 0);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("limit"), std::string::npos) << s.message();
  ASSERT_TRUE(take_one(m, 1));
  EXPECT_TRUE(buffer_messages(m, 1, 1, 0).ok()) << "taking one made room";
  // A message exactly as long as the limit no longer fits: its overhead counts too.
  Matcher exact(1000);
  EXPECT_EQ(exact.arrive(2, 1000).error.code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(exact.arrive(2, 1000 - kOverhead).error.ok());
  // No length overflows the arithmetic.
  EXPECT_EQ(exact.arrive(2, UINT64_MAX).error.code(), ErrorCode::kResourceExhausted);
}

TEST(Matcher, MessagesPerPeerAreCapped) {
  auto budget = std::make_shared<UnexpectedBudget>(SIZE_MAX, 3);
  Matcher m(1 << 20, budget);
  ASSERT_TRUE(buffer_messages(m, 1, 3, 1).ok());
  Status s = buffer_messages(m, 2, 1, 1);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("3 messages"), std::string::npos) << s.message();
  // A message still arriving counts as well.
  ASSERT_TRUE(take_one(m, 1));
  ASSERT_TRUE(m.arrive(3, 100).error.ok());
  EXPECT_EQ(m.arrive(3, 100).error.code(), ErrorCode::kResourceExhausted);
  m.abandon(100);  // its bytes will not come
  EXPECT_EQ(m.usage().messages, 2u);
  EXPECT_TRUE(m.arrive(3, 100).error.ok());
  // A second peer of the same engine has its own count.
  Matcher other(1 << 20, budget);
  EXPECT_TRUE(buffer_messages(other, 1, 3, 1).ok());
}

TEST(Matcher, TheEngineWideLimitIsSharedByAllPeers) {
  constexpr std::size_t kMessage = 1000;
  constexpr std::size_t kCharge = kMessage + Matcher::kUnexpectedOverheadBytes;
  auto budget = std::make_shared<UnexpectedBudget>(3 * kCharge, 100);
  auto a = std::make_unique<Matcher>(2 * kCharge, budget);
  Matcher b(2 * kCharge, budget);
  ASSERT_TRUE(buffer_messages(*a, 1, 2, kMessage).ok());
  ASSERT_TRUE(buffer_messages(b, 1, 1, kMessage).ok());
  EXPECT_EQ(budget->used(), 3 * kCharge);
  // b is under its own limit, the engine is not.
  Status s = buffer_messages(b, 1, 1, kMessage);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("engine"), std::string::npos) << s.message();
  EXPECT_EQ(b.usage().messages, 1u) << "a refused message counts nowhere";
  EXPECT_EQ(budget->used(), 3 * kCharge);
  // Announced messages (verbs) take from the same budget, and give back on release().
  Status refused;
  EXPECT_EQ(b.announce(2, kMessage, std::make_shared<Announced>(), refused), nullptr);
  EXPECT_EQ(refused.code(), ErrorCode::kResourceExhausted);
  ASSERT_TRUE(take_one(*a, 1));
  refused = {};
  EXPECT_EQ(b.announce(2, kMessage, std::make_shared<Announced>(), refused), nullptr);
  ASSERT_TRUE(refused.ok()) << refused.to_string();
  EXPECT_EQ(budget->used(), 3 * kCharge);
  b.release(kMessage);
  EXPECT_EQ(budget->used(), 2 * kCharge);
  // A peer's matcher going away gives back what its messages held.
  a.reset();
  EXPECT_EQ(budget->used(), kCharge);
  EXPECT_TRUE(buffer_messages(b, 1, 1, kMessage).ok());
}

TEST(Ring, KeepsOrderWhileGrowing) {
  core::Ring<int> r;
  int next_out = 0;
  for (int i = 0; i < 1000; ++i) {
    r.push_back(i);
    if (i % 3 == 0) {
      EXPECT_EQ(r.front(), next_out++);
      r.pop_front();
    }
  }
  while (!r.empty()) {
    EXPECT_EQ(r.front(), next_out++);
    r.pop_front();
  }
  EXPECT_EQ(next_out, 1000);
}

}  // namespace
}  // namespace ferry::transport
