#include "core/base64.hpp"

namespace ferry::core {
namespace {
// The two alphabets differ in their last two characters only.
struct Alphabet {
  char c62;
  char c63;
};
constexpr Alphabet kUrl{'-', '_'};
constexpr Alphabet kStandard{'+', '/'};

char char_of(uint32_t v, Alphabet a) {
  constexpr char kFirst62[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  return v < 62 ? kFirst62[v] : (v == 62 ? a.c62 : a.c63);
}

int value_of(char c, Alphabet a) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == a.c62) return 62;
  if (c == a.c63) return 63;
  return -1;
}

std::string encode(std::span<const uint8_t> in, Alphabet alphabet) {
  std::string out;
  out.reserve((in.size() * 4 + 2) / 3);
  uint32_t acc = 0;
  int bits = 0;
  for (uint8_t b : in) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += char_of((acc >> bits) & 63, alphabet);
    }
  }
  if (bits > 0) out += char_of((acc << (6 - bits)) & 63, alphabet);
  return out;
}

std::optional<std::vector<uint8_t>> decode(std::string_view in, Alphabet alphabet) {
  std::vector<uint8_t> out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v = value_of(c, alphabet);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  // Leftover bits must be padding zeros, and a single leftover character is impossible.
  if (bits >= 6 || (acc & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}
}  // namespace

std::string base64url_encode(std::span<const uint8_t> in) { return encode(in, kUrl); }

std::optional<std::vector<uint8_t>> base64url_decode(std::string_view in) {
  return decode(in, kUrl);
}

std::string base64_encode(std::span<const uint8_t> in) {
  std::string out = encode(in, kStandard);
  out.append((4 - out.size() % 4) % 4, '=');
  return out;
}

std::string base64_encode(std::string_view in) {
  return base64_encode(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(in.data()), in.size()));
}

std::optional<std::vector<uint8_t>> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::size_t pad = 0;
  while (pad < 2 && pad < in.size() && in[in.size() - 1 - pad] == '=') ++pad;
  // With the length a multiple of four, the padding left is right for the rest's length;
  // a '=' anywhere else is a foreign character to decode().
  return decode(in.substr(0, in.size() - pad), kStandard);
}

}  // namespace ferry::core
