#include "bench_session.hpp"

#include <algorithm>
#include <atomic>

namespace ferry::cli::bench {

uint8_t pattern_byte(uint64_t seed, uint64_t index) {
  uint64_t x = (index + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 29;
  return static_cast<uint8_t>(x * 0xBF58476D1CE4E5B9ull >> 56);
}

void fill(uint8_t* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i < n; ++i) p[i] = pattern_byte(seed, i);
}

bool matches(const uint8_t* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != pattern_byte(seed, i)) return false;
  }
  return true;
}

bool sampled_matches(const uint8_t* p, uint64_t n, uint64_t seed) {
  constexpr uint64_t kEdge = 64, kStride = 4093;
  for (uint64_t i = 0; i < n;
       i = (i < kEdge || i + kEdge >= n) ? i + 1 : std::min(i + kStride, n - kEdge)) {
    if (p[i] != pattern_byte(seed, i)) return false;
  }
  return true;
}

void check(const Status& s, const std::string& what) {
  if (!s.ok()) throw Error(s.code(), what + ": " + s.message());
}

namespace {
void await_round(const uint8_t* rx, uint64_t size, uint64_t round) {
  std::atomic_ref<const uint8_t> mark(rx[size - 1]);
  auto deadline = BenchClock::now() + kOpTimeout;
  for (unsigned i = 1; mark.load(std::memory_order_acquire) != round_mark(round); ++i) {
    // The clock now and then: under emulation a clock read costs more than the poll.
    if (i % 4096 == 0 && BenchClock::now() > deadline)
      throw Error(ErrorCode::kTimeout, "ping-pong: round " + std::to_string(round) + " never came");
  }
}
}  // namespace

void await_answer(Engine& engine, const Peer& from, const uint8_t* rx, uint64_t size,
                  uint64_t round, bool notify) {
  if (!notify) return await_round(rx, size, round);
  std::string which = "ping-pong: the notification of round " + std::to_string(round);
  std::optional<ImmEvent> e = engine.next_imm(kOpTimeout);
  if (!e) throw Error(ErrorCode::kTimeout, which + " never came");
  if (e->peer_engine_id != from.engine_id() || e->imm != PingPongWriter::kPingPongImm)
    throw Error(ErrorCode::kProtocol, which + " came from elsewhere or with another immediate");
  // write_with_imm notifies once every byte landed.
  if (std::atomic_ref<const uint8_t>(rx[size - 1]).load(std::memory_order_acquire) !=
      round_mark(round))
    throw Error(ErrorCode::kProtocol, which + " came before its bytes");
}

void pingpong_wait(Future&& f) {
  Future mine = std::move(f);
  if (Status s = mine.wait(kOpTimeout); !s.ok()) check(s, "ping-pong write");
}

Config engine_config(const BenchOptions& o, const Address& listen) {
  Config c;
  c.listen_host = listen.host;
  c.listen_port = listen.port;
  if (o.transport != "auto") {
    c.transports = {*transport_named(o.transport)};  // checked by options
    c.transports_from_environment = false;           // the command line names it
  }
  c.secret = o.secret;
  c.progress_threads = o.threads;
  if (o.metrics) c.metrics = *o.metrics;
  if (o.slice_bytes) c.slice_bytes = *o.slice_bytes;
  if (o.stripe_bytes) c.stripe_threshold = *o.stripe_bytes;
  if (o.busy_poll_us) c.busy_poll = std::chrono::microseconds(*o.busy_poll_us);
  if (o.wait_spin_us) c.wait_spin = std::chrono::microseconds(*o.wait_spin_us);
  for (const auto& [name, value] : o.settings) Engine::set(c, name, value);
  // The target's buffer holds only benchmark data, and its peer is this benchmark: large
  // send() messages land there zero-copy over verbs.
  c.verbs.zero_copy_receives = true;
  return c;
}

void require_transport(const BenchOptions& o) {
  if (o.transport == "auto") return;
  for (const auto& t : Engine::transports()) {
    if (to_string(t.kind) != o.transport) continue;
    if (t.usable) return;
    throw Error(ErrorCode::kUnsupported, "--transport " + o.transport +
                                             ": not available on this host: " + t.detail +
                                             " (see ferry info)");
  }
  throw Error(ErrorCode::kUnsupported,
              "--transport " + o.transport + ": not built into this version");
}

void refuse_if(bool bad, const std::string& what) {
  if (bad) throw Error(ErrorCode::kInvalidArgument, what);
}

}  // namespace ferry::cli::bench
