// base64url without padding, for the printable descriptor form; standard base64 with padding,
// for services that speak it (etcd's JSON gateway).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::core {

std::string base64url_encode(std::span<const uint8_t> in);
std::optional<std::vector<uint8_t>> base64url_decode(std::string_view in);

// RFC 4648 section 4: '+' and '/', padded with '=' to a multiple of four characters.
std::string base64_encode(std::span<const uint8_t> in);
std::string base64_encode(std::string_view in);
// Refuses missing, misplaced or extra padding, as it refuses foreign characters.
std::optional<std::vector<uint8_t>> base64_decode(std::string_view in);

}  // namespace ferry::core
