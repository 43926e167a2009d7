// `ferry stream`, what its two sides share: the wire format (the hello, the slots' headers, the
// control messages, the immediate's packing), its waits, the engine's configuration and the
// progress lines. The sender is in stream_sender.cpp, the receiver in stream_receiver.cpp.
#pragma once

#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "ferry/ferry.hpp"
#include "gauge.hpp"
#include "report.hpp"
#include "stream.hpp"

namespace ferry::cli::stream {

static_assert(std::endian::native == std::endian::little, "the stream's headers are little-endian");

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Tagged messages between the two sides: the receiver's hello (its ring), then its control
// messages (credits, stop, done).
constexpr uint64_t kHelloTag = 0x4652595300000001;  // "FRYS"
constexpr uint64_t kControlTag = kHelloTag + 1;
constexpr uint32_t kHelloMagic = 0x52545346;  // "FSTR"
constexpr uint16_t kVersion = 2;              // 2: an immediate names a run of slots
constexpr std::size_t kHelloBytes = 4096;     // the hello and the ring's descriptor fit in this

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kVersion;
  uint16_t descriptor_bytes = 0;  // the ring's Descriptor::encode() follows
  uint32_t slots = 0;
  uint32_t slot_bytes = 0;
};

// In front of every slot's payload.
struct SlotHeader {
  uint32_t length = 0;  // payload bytes
  uint32_t flags = 0;
  uint64_t sequence = 0;  // of the chunk: 0, 1, 2, ...
};
constexpr uint32_t kEndOfStream = 1;
// The sender had more of its source ready when it wrote this chunk: the source does not set the
// pace, and the receiver may let chunks gather (gather.hpp).
constexpr uint32_t kSenderAhead = 2;

// The immediate of a write: the first slot it filled in its low 16 bits, how many slots after
// it (in ring order) in the high 16.
constexpr uint32_t kImmRunShift = 16;
constexpr uint64_t kMaxSlots = uint64_t{1} << kImmRunShift;

struct Control {
  enum Type : uint32_t { kCredit = 1, kStop = 2, kDone = 3 };
  uint32_t type = kCredit;
  uint32_t reserved = 0;
  uint64_t consumed = 0;  // chunks the receiver has handed to its sink
};

// Receives the sender keeps posted for control messages, and send buffers the receiver turns
// through: credits are coalesced (one per quarter ring), so a few suffice.
constexpr int kControlBuffers = 8;
constexpr auto kHelloWait = 30s;  // for the receiver's hello after connecting
constexpr auto kEndWait = 10s;    // for the receiver to confirm the end of the stream
constexpr auto kStopWait = 5s;    // for the sender to end its stream after a stop
constexpr auto kPoll = 100ms;     // how often waits look at Ctrl-C and the peer

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline uint64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

// Throws `what` and why it failed unless `s` is ok.
void check(const Status& s, const std::string& what);

// The engine either side runs: --listen, --transport, --secret.
Config engine_config(const StreamOptions& o);

// Progress lines: what moved since the last one, and in all.
struct Meter {
  Clock::time_point start = Clock::now(), last = start;
  uint64_t bytes = 0, chunks = 0, bytes_at_last = 0;
  uint64_t waited_ns = 0, waited_at_last = 0;  // back-pressure: credits (sender), sink (receiver)

  bool due(double interval) const {
    return interval > 0 && seconds_between(last, Clock::now()) >= interval;
  }
  // From now on: the stream's start.
  void restart() {
    start = last = Clock::now();
    bytes = chunks = bytes_at_last = waited_ns = waited_at_last = 0;
  }
  // A gauge on HOST:PORT (--web) that tick() feeds.
  void show_on(const std::optional<Address>& web, const std::string& title, const Engine& engine,
               std::ostream& out) {
    if (!web) return;
    gauge = std::make_unique<GaugeServer>(*web, title, &engine);
    out << "gauge on " << gauge->url() << std::endl;
  }
  void tick() {
    double rate = 0;
    if (gauge && window.sample(bytes, rate)) gauge->publish(rate);
  }
  std::unique_ptr<GaugeServer> gauge;
  RateWindow window;
  // The line's common fields; `since_last` for progress, else the whole run.
  ReportLine line(const std::string& who, const std::string& kind, bool since_last,
                  const char* wait_label);
};

}  // namespace ferry::cli::stream
