// Randomness and HMAC-SHA256 (OpenSSL's libcrypto) for ids, keys and the handshake.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace ferry::core {

using Mac = std::array<uint8_t, 32>;

void random_bytes(std::span<uint8_t> out);
uint64_t random_u64();
Mac hmac_sha256(std::string_view key, std::span<const uint8_t> message);
// Constant-time comparison, so a forger learns nothing from timing.
bool mac_equal(const Mac& a, const Mac& b);

}  // namespace ferry::core
