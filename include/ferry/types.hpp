// Vocabulary types shared by every layer: access rights and transport kinds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.hpp"

namespace ferry {

// What a peer may do with a registered region. Local use is always allowed.
enum class Access : uint8_t {
  kLocal = 0,
  kRemoteRead = 1,
  kRemoteWrite = 2,
  kRemoteReadWrite = 3,
};

constexpr Access operator|(Access a, Access b) {
  return static_cast<Access>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}
constexpr bool allows(Access granted, Access wanted) {
  return (static_cast<uint8_t>(granted) & static_cast<uint8_t>(wanted)) ==
         static_cast<uint8_t>(wanted);
}

// Transport kinds, in order of preference when several are usable.
enum class TransportKind : uint8_t {
  kTcp = 1,
  kVerbs = 2,
  kShm = 3,
  kCudaIpc = 4,
};

FERRY_API std::string_view to_string(TransportKind kind) noexcept;

// What Engine::transports() reports of one transport on this host.
struct TransportInfo {
  TransportKind kind{};
  bool usable = false;
  std::string detail{};                // why not, or what it found
  std::vector<std::string> devices{};  // e.g. "rxe0 port 1: Ethernet, mtu 1024, gid[1] ..."
};

}  // namespace ferry
