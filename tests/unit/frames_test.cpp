// The emulator's frames (tools/ferry/frames.hpp): CRC32C, headers, the checker fed a stream in
// pieces of any size, and the latency histogram.
#include "frames.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace ferry::cli {
namespace {

TEST(Crc32c, MatchesTheStandardCheckValueAndContinuesAcrossPieces) {
  const std::string check = "123456789";
  const auto* p = reinterpret_cast<const uint8_t*>(check.data());
  EXPECT_EQ(crc32c(p, check.size()), 0xE3069283u);  // RFC 3720's CRC32C check value
  EXPECT_EQ(crc32c(p + 4, check.size() - 4, crc32c(p, 4)), 0xE3069283u);
  EXPECT_EQ(crc32c(p, 0), 0u);
  // Lengths around the 8-byte steps of the instruction path, against a bytewise chain.
  std::vector<uint8_t> data(67);
  std::mt19937 random(1);
  for (auto& b : data) b = static_cast<uint8_t>(random());
  for (std::size_t n = 0; n <= data.size(); ++n) {
    uint32_t bytewise = 0;
    for (std::size_t i = 0; i < n; ++i) bytewise = crc32c(&data[i], 1, bytewise);
    EXPECT_EQ(crc32c(data.data(), n), bytewise) << n << " bytes";
  }
}

// Frames `first`..`first + count - 1`, each `payload` bytes, stamped `sent_ns`.
std::vector<uint8_t> frames(uint64_t first, int count, uint32_t payload, uint64_t sent_ns) {
  std::vector<uint8_t> out;
  for (int i = 0; i < count; ++i) {
    std::vector<uint8_t> body(payload);
    for (uint32_t k = 0; k < payload; ++k) body[k] = static_cast<uint8_t>(first + i + k);
    FrameHeader h;
    h.length = payload;
    h.sequence = first + static_cast<uint64_t>(i);
    h.sent_ns = sent_ns;
    h.crc = crc32c(body.data(), body.size());
    std::size_t at = out.size();
    out.resize(at + FrameHeader::kBytes);
    h.encode(out.data() + at);
    out.insert(out.end(), body.begin(), body.end());
  }
  return out;
}

TEST(FrameHeader, RoundTripsAndRefusesWhatIsNoHeader) {
  FrameHeader h;
  h.length = 1000;
  h.sequence = 0x0102030405060708;
  h.sent_ns = 42;
  h.crc = 0xdeadbeef;
  uint8_t bytes[FrameHeader::kBytes];
  h.encode(bytes);
  FrameHeader back;
  ASSERT_TRUE(back.decode(bytes));
  EXPECT_EQ(back.length, 1000u);
  EXPECT_EQ(back.sequence, h.sequence);
  EXPECT_EQ(back.sent_ns, 42u);
  EXPECT_EQ(back.crc, 0xdeadbeefu);
  bytes[0] ^= 1;
  EXPECT_FALSE(back.decode(bytes));
  bytes[0] ^= 1;
  h.length = FrameHeader::kMaxPayload + 1;
  h.encode(bytes);
  EXPECT_FALSE(back.decode(bytes));
}

TEST(FrameChecker, FollowsFramesSplitAnywhere) {
  std::vector<uint8_t> stream = frames(0, 50, 777, 1000);
  for (std::size_t piece : {1u, 7u, 32u, 809u, 4096u}) {
    FrameChecker checker(500);
    for (std::size_t at = 0; at < stream.size(); at += piece)
      checker.feed(stream.data() + at, std::min(piece, stream.size() - at), 1200);
    EXPECT_EQ(checker.frames(), 50u) << "pieces of " << piece;
    EXPECT_EQ(checker.lost() + checker.bad_crc() + checker.reordered(), 0u);
    EXPECT_FALSE(checker.mid_frame());
    EXPECT_TRUE(checker.broken().empty());
    EXPECT_EQ(checker.latency().count(), 50u);
    EXPECT_EQ(checker.latency().max(), 200u);  // 1200 - 1000
    EXPECT_EQ(checker.late(), 0u);
  }
}

TEST(FrameChecker, CountsGapsDamageReorderingAndLateness) {
  std::vector<uint8_t> stream = frames(10, 3, 100, 0);   // 10, 11, 12: the first sets the origin
  std::vector<uint8_t> gap = frames(15, 1, 100, 0);      // 13 and 14 lost
  std::vector<uint8_t> old = frames(11, 1, 100, 0);      // older than one seen
  std::vector<uint8_t> damaged = frames(16, 1, 100, 0);  // a payload bit flipped
  damaged.back() ^= 0x10;
  for (const auto* part : {&gap, &old, &damaged})
    stream.insert(stream.end(), part->begin(), part->end());
  FrameChecker checker(5000);
  checker.feed(stream.data(), stream.size(), 6000);
  EXPECT_EQ(checker.frames(), 6u);
  EXPECT_EQ(checker.lost(), 2u);
  EXPECT_EQ(checker.reordered(), 1u);
  EXPECT_EQ(checker.bad_crc(), 1u);
  EXPECT_EQ(checker.late(), 6u);  // 6000 ns after sending, late from 5000
}

TEST(FrameChecker, StopsWhereTheStreamHoldsNoFrameAndSeesAnEndInsideAFrame) {
  std::vector<uint8_t> stream = frames(0, 2, 64, 0);
  stream.resize(stream.size() - 10);
  FrameChecker cut(1);
  cut.feed(stream.data(), stream.size(), 0);
  EXPECT_EQ(cut.frames(), 1u);
  EXPECT_TRUE(cut.mid_frame());

  std::vector<uint8_t> junk(FrameHeader::kBytes, 0x55);
  FrameChecker broken(1);
  broken.feed(junk.data(), junk.size(), 0);
  EXPECT_NE(broken.broken().find("no frame header"), std::string::npos) << broken.broken();
  std::vector<uint8_t> good = frames(0, 1, 8, 0);
  broken.feed(good.data(), good.size(), 0);
  EXPECT_EQ(broken.frames(), 0u);  // checking stopped at the junk
}

TEST(LatencyHistogram, PercentilesWithinItsResolution) {
  LatencyHistogram h;
  EXPECT_EQ(h.percentile(0.5), 0u);
  for (uint64_t v = 1; v <= 1000; ++v) h.record(v * 1000);  // 1 us .. 1 ms
  EXPECT_EQ(h.count(), 1000u);
  EXPECT_EQ(h.max(), 1'000'000u);
  auto near = [](uint64_t got, double want) {
    return static_cast<double>(got) > want * 0.93 && static_cast<double>(got) < want * 1.07;
  };
  EXPECT_TRUE(near(h.percentile(0.5), 500'000)) << h.percentile(0.5);
  EXPECT_TRUE(near(h.percentile(0.99), 990'000)) << h.percentile(0.99);
  EXPECT_EQ(h.percentile(1.0), 1'000'000u);  // never above the largest recorded
  h.record(uint64_t{1} << 50);               // beyond the last bucket: counted there
  EXPECT_EQ(h.percentile(1.0), uint64_t{1} << 50);
  LatencyHistogram small;
  for (uint64_t v = 0; v < 16; ++v) small.record(v);  // exact below 16 ns
  EXPECT_EQ(small.percentile(0.0), 0u);
  EXPECT_EQ(small.percentile(1.0), 15u);
}

}  // namespace
}  // namespace ferry::cli
