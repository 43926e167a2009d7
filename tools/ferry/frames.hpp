// The frames of `ferry emulate` and their checks on the receiving side of `ferry stream`:
// CRC32C, the frame header, a latency histogram and a checker fed the byte stream in pieces.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry::cli {

// CRC32C (Castagnoli) of `n` bytes, continuing from `crc` (0 to start): the SSE4.2 instruction
// where the CPU has it, a table otherwise.
uint32_t crc32c(const uint8_t* data, std::size_t n, uint32_t crc = 0);

// An emulated instrument's frame: this header, little-endian, then `length` payload bytes.
struct FrameHeader {
  static constexpr uint32_t kMagic = 0x31595246;  // "FRY1"
  static constexpr std::size_t kBytes = 32;
  // Refused above this: a reader never buffers more for one frame.
  static constexpr uint32_t kMaxPayload = 64u << 20;

  uint32_t length = 0;    // payload bytes
  uint64_t sequence = 0;  // 0, 1, 2, ... per stream
  uint64_t sent_ns = 0;   // wall_ns() when the source sent it
  uint32_t crc = 0;       // crc32c of the payload

  void encode(uint8_t* out) const;
  // False when `in` holds no frame header (wrong magic, length over kMaxPayload).
  bool decode(const uint8_t* in);
};

// CLOCK_REALTIME in nanoseconds: the frame timestamps. Latencies between two hosts mean only
// as much as their clocks agree (PTP, NTP).
uint64_t wall_ns();

// Latencies in nanoseconds, 16 buckets per power of two (within 6 %), up to ~18 minutes.
class LatencyHistogram {
 public:
  void record(uint64_t ns);
  uint64_t count() const { return count_; }
  uint64_t max() const { return max_; }
  // The value at fraction `q` (0.5, 0.99) of the recorded ones; 0 when none.
  uint64_t percentile(double q) const;

 private:
  static constexpr int kSubBits = 4;
  static constexpr int kMaxExponent = 40;  // 2^40 ns: larger values count as the largest
  static constexpr int kBuckets = (kMaxExponent - kSubBits + 2) << kSubBits;
  static int bucket_of(uint64_t ns);
  static uint64_t value_of(int bucket);
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t count_ = 0;
  uint64_t max_ = 0;
};

// Follows an emulator's frames through a byte stream that arrives in pieces of any size:
// sequence, CRC and latency of each frame.
class FrameChecker {
 public:
  explicit FrameChecker(uint64_t late_ns) : late_ns_(late_ns) {}
  // `now_ns`: wall_ns() when these bytes arrived.
  void feed(const uint8_t* data, std::size_t n, uint64_t now_ns);

  uint64_t frames() const { return frames_; }        // complete frames seen
  uint64_t lost() const { return lost_; }            // sequence numbers skipped
  uint64_t bad_crc() const { return bad_crc_; }      // payloads whose CRC differs
  uint64_t reordered() const { return reordered_; }  // frames older than one already seen
  uint64_t late() const { return late_; }            // frames slower than `late_ns`
  // Set once the stream held something that is not a frame header: checking stopped there.
  const std::string& broken() const { return broken_; }
  // Bytes inside a frame that has not ended yet.
  bool mid_frame() const { return have_ != 0 || remaining_ != 0; }
  const LatencyHistogram& latency() const { return latency_; }

 private:
  void end_frame(uint64_t now_ns);

  uint64_t late_ns_;
  uint8_t header_bytes_[FrameHeader::kBytes] = {};
  std::size_t have_ = 0;    // header bytes collected
  uint64_t remaining_ = 0;  // payload bytes still to come
  FrameHeader current_;
  uint32_t crc_ = 0;
  bool started_ = false;
  uint64_t next_ = 0;  // the sequence number expected next
  uint64_t frames_ = 0, lost_ = 0, bad_crc_ = 0, reordered_ = 0, late_ = 0;
  std::string broken_;
  LatencyHistogram latency_;
};

}  // namespace ferry::cli
