// Little-endian encoding for wire frames and descriptors. The reader never reads past its
// input: every get fails softly and sets ok() to false, so decoders check once at the end.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::core {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(std::span<const uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  // u16 length + bytes
  void str(std::string_view s) {
    u16(static_cast<uint16_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t>& out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
  uint8_t u8() { return static_cast<uint8_t>(get(1)); }
  uint16_t u16() { return static_cast<uint16_t>(get(2)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  bool bytes(uint8_t* dst, std::size_t n) {
    if (!take(n)) return false;
    if (n > 0) std::memcpy(dst, in_.data() + pos_ - n, n);  // an empty vector's data() is null
    return true;
  }
  // The next n bytes, in place; empty (and not ok) when fewer remain.
  std::span<const uint8_t> view(std::size_t n) {
    if (!take(n)) return {};
    return in_.subspan(pos_ - n, n);
  }
  std::string str(std::size_t max_len) {
    std::size_t n = u16();
    if (n > max_len || !take(n)) {
      ok_ = false;
      return {};
    }
    return {reinterpret_cast<const char*>(in_.data() + pos_ - n), n};
  }
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == in_.size(); }
  std::size_t remaining() const { return in_.size() - pos_; }

 private:
  bool take(std::size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  uint64_t get(int n) {
    if (!take(static_cast<std::size_t>(n))) return 0;
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(in_[pos_ - n + i]) << (8 * i);
    return v;
  }
  std::span<const uint8_t> in_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

// Fixed-offset stores/loads for the hot-path frame header.
inline void store_le(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t load_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace ferry::core
