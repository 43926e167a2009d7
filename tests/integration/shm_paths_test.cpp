// Same-host writes and messages of the rings' window (ShmConfig::ring_copies_up_to) go through
// the rings or are pulled, whichever moved them faster (ShmConfig::measure_paths), and
// Peer::stats says how many went each way (PathStats).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "support/pair.hpp"
#include "transport/shm/path_chooser.hpp"

namespace ferry::test {
namespace {

constexpr std::size_t kSize = 1 << 20;  // in the window, a class of its own
constexpr int kRun = static_cast<int>(transport::shm::PathChooser::kRun);

Config shm_config(bool measure_paths) {
  Config c = test_config();
  c.transports = {TransportKind::kShm};
  c.shm.measure_paths = measure_paths;
  return c;
}

std::optional<PathStats> path_of(const Peer& peer, const std::string& transfers) {
  for (const PathStats& p : peer.stats().paths) {
    if (p.transfers == transfers && p.from_bytes == kSize) return p;
  }
  return std::nullopt;
}

// One at a time, so that the first run of each kind bounces and the second is pulled (the
// chooser alternates runs until it has timed each way); every one's bytes land.
void write_and_send(Pair& p, int count) {
  Buffer src(p.initiator, kSize, Access::kLocal, 1);
  Buffer dst(p.target, kSize, Access::kRemoteReadWrite, 2);
  Descriptor d = dst.region.descriptor();
  for (int i = 0; i < count; ++i) {
    fill_pattern(src.bytes, 10 + static_cast<uint32_t>(i));
    Transfer t{&src.region, 0, &d, 0, kSize};
    ASSERT_TRUE(p.peer.write({&t, 1}).wait(kWait).ok()) << i;
    ASSERT_EQ(src.bytes, dst.bytes) << "write " << i;
  }
  for (int i = 0; i < count; ++i) {
    fill_pattern(src.bytes, 100 + static_cast<uint32_t>(i));
    Future received = p.target_peer.recv(7, dst.region, 0, kSize);
    ASSERT_TRUE(p.peer.send(7, src.region, 0, kSize).wait(kWait).ok()) << i;
    ASSERT_TRUE(received.wait(kWait).ok()) << i;
    EXPECT_EQ(received.bytes(), kSize);
    ASSERT_EQ(src.bytes, dst.bytes) << "message " << i;
  }
}

TEST(ShmPaths, WritesAndMessagesGoBothWaysUntilTimedAndStatsSayHowMany) {
  Pair p(shm_config(true), shm_config(true));
  ASSERT_EQ(p.peer.transport(), TransportKind::kShm);
  write_and_send(p, 2 * kRun);
  for (const char* transfers : {"write", "send"}) {
    std::optional<PathStats> s = path_of(p.peer, transfers);
    ASSERT_TRUE(s.has_value()) << transfers;
    EXPECT_EQ(s->bounced, static_cast<uint64_t>(kRun)) << transfers;
    EXPECT_EQ(s->direct, static_cast<uint64_t>(kRun)) << transfers;
    EXPECT_GT(s->bounced_mb_per_s, 0) << transfers;
    EXPECT_GT(s->direct_mb_per_s, 0) << transfers;
  }
  EXPECT_FALSE(path_of(p.target_peer, "write").has_value()) << "the initiator chooses";
}

// A pulled message that finds no receive posted waits for one: that wait is the receiver's, not
// the way's, so the message is not counted.
TEST(ShmPaths, AMessageHeldForItsReceiveIsNotCounted) {
  Pair p(shm_config(true), shm_config(true));
  Buffer src(p.initiator, kSize, Access::kLocal, 1);
  Buffer dst(p.target, kSize, Access::kLocal, 2);
  for (int i = 0; i < kRun; ++i) {  // the first run: through the rings
    Future received = p.target_peer.recv(7, dst.region, 0, kSize);
    ASSERT_TRUE(p.peer.send(7, src.region, 0, kSize).wait(kWait).ok()) << i;
    ASSERT_TRUE(received.wait(kWait).ok()) << i;
  }
  // The second run's first: pulled, and held until its receive comes.
  fill_pattern(src.bytes, 3);
  Future sent = p.peer.send(7, src.region, 0, kSize);
  EXPECT_FALSE(sent.wait(std::chrono::milliseconds(50)).ok()) << "no receive is posted yet";
  Future received = p.target_peer.recv(7, dst.region, 0, kSize);
  ASSERT_TRUE(sent.wait(kWait).ok());
  ASSERT_TRUE(received.wait(kWait).ok());
  EXPECT_EQ(src.bytes, dst.bytes);
  std::optional<PathStats> s = path_of(p.peer, "send");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->bounced, static_cast<uint64_t>(kRun));
  EXPECT_EQ(s->direct, 0u);
}

TEST(ShmPaths, UnmeasuredTheyAllGoThroughTheRingsAndNoneIsCounted) {
  Pair p(shm_config(false), shm_config(false));
  ASSERT_EQ(p.peer.transport(), TransportKind::kShm);
  write_and_send(p, 2 * kRun);
  EXPECT_TRUE(p.peer.stats().paths.empty());
}

}  // namespace
}  // namespace ferry::test
