// The table of transports built into Ferry (src/transport/transports.def): how the engine finds,
// opens and describes each one without naming it.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ferry/config.hpp"
#include "ferry/types.hpp"
#include "transport/contract.hpp"
#include "transport/settings.hpp"

namespace ferry::transport {

struct TransportEntry {
  TransportKind kind;     // its byte on the wire and in descriptors; unique
  std::string_view name;  // unique; what to_string(kind) gives
  uint32_t capabilities;  // Capability bits
  MemoryKinds memory;     // what it moves, on both ends
  // Opens the transport for an engine configured by `config`. Null, with `why`, when it cannot
  // be used on this host (the engine goes on without it); throws Error when the configuration
  // is invalid or names something (a device) that fails, which is never passed over silently.
  std::unique_ptr<Transport> (*open)(const Config& config, std::string& why);
  // Whether it could be used on this host, and what it found (ferry info).
  TransportInfo (*describe)();
  // The most memory one channel to a peer can hold whatever the peer sends (engine "Limits").
  std::size_t (*worst_case_channel_bytes)(const Config& config);
  // Its settings (transport/settings.hpp), declared in its folder.
  std::span<const Setting> settings{};
};

// In transports.def order.
std::span<const TransportEntry* const> registered_transports();
// Null when no transport of that kind is built in.
const TransportEntry* find_transport(TransportKind kind);

}  // namespace ferry::transport
