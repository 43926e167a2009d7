// The loopback transport's line in the registry (transports.def).
#include "transport/loopback/loopback.hpp"
#include "transport/registry.hpp"

namespace ferry::transport {
namespace {

std::unique_ptr<Transport> open(const Config&, std::string&) {
  int rails = loopback::faults().rails.load();
  if (rails < 1 || rails > kMaxRails) {
    throw Error(ErrorCode::kInvalidArgument, "loopback: " + std::to_string(rails) +
                                                 " rails (1 to " + std::to_string(kMaxRails) + ")");
  }
  int key_bytes = loopback::faults().key_bytes.load();
  if (key_bytes < 8 || key_bytes > static_cast<int>(kMaxKeyBytes)) {
    throw Error(ErrorCode::kInvalidArgument, "loopback: keys of " + std::to_string(key_bytes) +
                                                 " bytes (8 to " + std::to_string(kMaxKeyBytes) +
                                                 ")");
  }
  return std::make_unique<loopback::LoopbackTransport>(rails, static_cast<std::size_t>(key_bytes));
}

TransportInfo describe() {
  return {loopback::kKind,
          true,
          "engines of one process only: a test transport with fault injection; never offered "
          "unless Config::transports names it",
          {}};
}

// Messages it buffers count against the peer's unexpected-message limits.
std::size_t worst_case_channel_bytes(const Config&) { return sizeof(loopback::LoopbackChannel); }

}  // namespace

const TransportEntry& loopback_entry() {
  static const TransportEntry entry{loopback::kKind,
                                    "loopback",
                                    kCapMessages | kCapImm,
                                    memory_bit(MemoryKind::kHost),
                                    open,
                                    describe,
                                    worst_case_channel_bytes};
  return entry;
}

}  // namespace ferry::transport
