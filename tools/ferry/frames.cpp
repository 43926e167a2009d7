#include "frames.hpp"

#include <time.h>

#include <algorithm>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ferry::cli {
namespace {

constexpr uint32_t kCastagnoli = 0x82f63b78;  // reflected polynomial

struct Table {
  uint32_t entries[256];
  constexpr Table() : entries() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ kCastagnoli : c >> 1;
      entries[i] = c;
    }
  }
};
constexpr Table kTable;

uint32_t crc32c_table(const uint8_t* p, std::size_t n, uint32_t c) {
  for (std::size_t i = 0; i < n; ++i) c = kTable.entries[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, std::size_t n,
                                                        uint32_t c) {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c64 = _mm_crc32_u64(c64, word);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
  return c;
}
const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#endif

void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

uint32_t crc32c(const uint8_t* data, std::size_t n, uint32_t crc) {
  uint32_t c = ~crc;
#if defined(__x86_64__)
  c = kHaveSse42 ? crc32c_sse42(data, n, c) : crc32c_table(data, n, c);
#else
  c = crc32c_table(data, n, c);
#endif
  return ~c;
}

void FrameHeader::encode(uint8_t* out) const {
  put32(out, kMagic);
  put32(out + 4, length);
  put64(out + 8, sequence);
  put64(out + 16, sent_ns);
  put32(out + 24, crc);
  put32(out + 28, 0);
}

bool FrameHeader::decode(const uint8_t* in) {
  if (get32(in) != kMagic) return false;
  length = get32(in + 4);
  sequence = get64(in + 8);
  sent_ns = get64(in + 16);
  crc = get32(in + 24);
  return length <= kMaxPayload;
}

uint64_t wall_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

int LatencyHistogram::bucket_of(uint64_t ns) {
  if (ns < (1u << kSubBits)) return static_cast<int>(ns);
  int e = std::bit_width(ns) - 1;
  if (e > kMaxExponent) return kBuckets - 1;
  int sub = static_cast<int>((ns >> (e - kSubBits)) & ((1u << kSubBits) - 1));
  return ((e - kSubBits + 1) << kSubBits) + sub;
}

uint64_t LatencyHistogram::value_of(int bucket) {
  if (bucket < (1 << kSubBits)) return static_cast<uint64_t>(bucket);
  int e = (bucket >> kSubBits) - 1 + kSubBits;
  uint64_t sub = static_cast<uint64_t>(bucket & ((1 << kSubBits) - 1));
  uint64_t width = uint64_t{1} << (e - kSubBits);
  return ((uint64_t{1} << kSubBits) + sub) * width + width / 2;  // the bucket's middle
}

void LatencyHistogram::record(uint64_t ns) {
  ++counts_[static_cast<std::size_t>(bucket_of(ns))];
  ++count_;
  if (ns > max_) max_ = ns;
}

uint64_t LatencyHistogram::percentile(double q) const {
  if (count_ == 0) return 0;
  auto rank = static_cast<uint64_t>(q * static_cast<double>(count_ - 1)) + 1;
  if (rank >= count_) return max_;
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[static_cast<std::size_t>(b)];
    if (seen >= rank) return std::min(value_of(b), max_);
  }
  return max_;
}

void FrameChecker::feed(const uint8_t* data, std::size_t n, uint64_t now_ns) {
  while (n > 0 && broken_.empty()) {
    if (remaining_ == 0 && have_ < FrameHeader::kBytes) {
      std::size_t take = std::min(n, FrameHeader::kBytes - have_);
      std::memcpy(header_bytes_ + have_, data, take);
      have_ += take;
      data += take;
      n -= take;
      if (have_ < FrameHeader::kBytes) return;
      if (!current_.decode(header_bytes_)) {
        broken_ = "after frame " + std::to_string(frames_) + " the stream holds no frame header";
        return;
      }
      crc_ = 0;
      remaining_ = current_.length;
      if (remaining_ == 0) end_frame(now_ns);
      continue;
    }
    std::size_t take = static_cast<std::size_t>(std::min<uint64_t>(n, remaining_));
    crc_ = crc32c(data, take, crc_);
    data += take;
    n -= take;
    remaining_ -= take;
    if (remaining_ == 0) end_frame(now_ns);
  }
}

void FrameChecker::end_frame(uint64_t now_ns) {
  have_ = 0;
  ++frames_;
  if (crc_ != current_.crc) ++bad_crc_;
  if (!started_ || current_.sequence >= next_) {
    // The first frame sets the origin: a reader may join a stream that already ran.
    if (started_) lost_ += current_.sequence - next_;
    started_ = true;
    next_ = current_.sequence + 1;
  } else {
    ++reordered_;
  }
  uint64_t latency = now_ns > current_.sent_ns ? now_ns - current_.sent_ns : 0;
  latency_.record(latency);
  if (latency > late_ns_) ++late_;
}

}  // namespace ferry::cli
