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
  o.request_poll = config.tcp.request_poll;
  return o;
}

// Checked by the engine against these ranges before it opens the transport.
std::unique_ptr<Transport> open(const Config& config, std::string&) {
  return std::make_unique<tcp::TcpTransport>(options_of(config));
}

// The most bytes one eager message or announcement may name: a frame's length is 32 bits.
constexpr int64_t kMaxEagerBytes = int64_t{1} << 32;
// TcpConfig::request_poll's ceiling: a progress thread that polls longer after each request is
// a busy-polling one (Config::busy_poll says so instead).
constexpr std::chrono::nanoseconds kMaxRequestPoll = std::chrono::seconds(1);
// Credits per socket: each unacknowledged slice holds a queued answer at the target.
constexpr int64_t kMaxSlicesInFlight = 1 << 16;

const Setting kSettings[] = {
    bound<&Config::tcp, &TcpConfig::streams>(
        {"streams", SettingType::kCount,
         "sockets per peer: 2 beat 1 at 64 MiB on loopback, 4 gained nothing more "
         "(docs/performance.md, settings table)",
         1, OpState::kMaxLanes}),
    bound<&Config::tcp, &TcpConfig::slices_in_flight_per_stream>(
        {"slices_in_flight_per_stream", SettingType::kCount,
         "unacknowledged slices per socket: bounds the target's queue of answers", 1,
         kMaxSlicesInFlight}),
    bound<&Config::tcp, &TcpConfig::eager_bytes>(
        {"eager_bytes", SettingType::kBytes,
         "a send() above this is announced and sent once the receiver's receive takes it; "
         "smaller ones go at once (docs/performance.md)",
         0, kMaxEagerBytes}),
    bound<&Config::tcp, &TcpConfig::request_poll>(
        {"request_poll", SettingType::kDuration,
         "how long the progress thread keeps polling the sockets for the next request after "
         "small ones (docs/performance.md, \"Small operations and wake-ups\")",
         0, kMaxRequestPoll.count()}),
};

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
                                    worst_case_channel_bytes,
                                    kSettings};
  return entry;
}

}  // namespace ferry::transport
