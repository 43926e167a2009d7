// base64url without padding, for the printable descriptor form.
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

}  // namespace ferry::core
