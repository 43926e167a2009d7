// The loopback transport's line in the registry (transports.def).
#include "transport/loopback/loopback.hpp"
#include "transport/registry.hpp"

namespace ferry::transport {
namespace {

constexpr std::string_view kName = "loopback";

// A setting kept by name (it has no field in Config): how long the keys this transport
// registers are, for the engine's path of keys longer than 8 bytes (a CUDA IPC handle is 64).
// Every byte is checked at the target.
const Setting kSettings[] = {
    {"key_bytes", SettingType::kCount,
     "length of the keys it registers (tests: 64 stands for a CUDA IPC handle)", 8,
     static_cast<int64_t>(kMaxKeyBytes), nullptr, nullptr, "8"},
};

std::unique_ptr<Transport> open(const Config& config, std::string&) {
  int rails = loopback::faults().rails.load();
  if (rails < 1 || rails > kMaxRails) {
    throw Error(ErrorCode::kInvalidArgument, "loopback: " + std::to_string(rails) +
                                                 " rails (1 to " + std::to_string(kMaxRails) + ")");
  }
  auto key_bytes = static_cast<std::size_t>(number_setting(config, kName, kSettings[0]));
  return std::make_unique<loopback::LoopbackTransport>(rails, key_bytes);
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
                                    kName,
                                    kCapMessages | kCapImm,
                                    memory_bit(MemoryKind::kHost),
                                    open,
                                    describe,
                                    worst_case_channel_bytes,
                                    kSettings};
  return entry;
}

}  // namespace ferry::transport
