// The TCP transport's line in the registry (transports.def).
#include "transport/registry.hpp"
#include "transport/tcp/tcp_channel.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace ferry::transport {
namespace {

tcp::TcpOptions options_of(const Config& config) {
  tcp::TcpOptions o;
  o.streams = config.tcp.streams;
  o.slices_in_flight_per_stream = config.tcp.slices_in_flight_per_stream;
  o.eager_bytes = config.tcp.eager_bytes;
  return o;
}

std::unique_ptr<Transport> open(const Config& config, std::string&) {
  if (config.tcp.streams < 1 || config.tcp.streams > OpState::kMaxLanes) {
    throw Error(ErrorCode::kInvalidArgument,
                "config: tcp.streams must be 1.." + std::to_string(OpState::kMaxLanes));
  }
  if (config.tcp.slices_in_flight_per_stream < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "config: tcp.slices_in_flight_per_stream must be >= 1");
  }
  return std::make_unique<tcp::TcpTransport>(options_of(config));
}

TransportInfo describe() {
  return {TransportKind::kTcp, true, "built in; works on every host", {}};
}

std::size_t worst_case_channel_bytes(const Config& config) {
  return tcp::TcpChannel::worst_case_bytes(options_of(config));
}

}  // namespace

const TransportEntry& tcp_entry() {
  static const TransportEntry entry{TransportKind::kTcp,
                                    "tcp",
                                    kCapCrossHost | kCapCrossProcess | kCapMessages | kCapImm,
                                    memory_bit(MemoryKind::kHost),
                                    open,
                                    describe,
                                    worst_case_channel_bytes};
  return entry;
}

}  // namespace ferry::transport
