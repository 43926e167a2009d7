// Where this process runs, as peers compare it in the handshake: same process, same host or
// another host (Reach). Transports that cannot cross a boundary (shared memory, loopback) are
// offered only to peers inside it.
#pragma once

#include <array>
#include <cstdint>

#include "ferry/types.hpp"

namespace ferry::core {

struct Locality {
  // Same value for every process of one kernel boot that shares the pid and network namespaces
  // (so each can see the other's processes and abstract sockets); a one-way hash, so it tells a
  // peer nothing else about the host. Random (matching no one) when the boot id is unreadable.
  std::array<uint8_t, 16> host{};
  uint32_t process = 0;  // pid in those namespaces
};

Locality this_locality();
Reach reach_between(const Locality& us, const Locality& them);

}  // namespace ferry::core
