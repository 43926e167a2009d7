// `ferry bench`, what its two sides share: the control messages between initiator and target
// (Mailbox), the data pattern both check, the ping-pong rounds and the engine's configuration.
// The target is in bench_target.cpp, the initiator in bench.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "options.hpp"

namespace ferry::cli::bench {

using namespace std::chrono_literals;
using BenchClock = std::chrono::steady_clock;

// Tags of the bench's own control messages between initiator and target.
constexpr uint64_t kTagSetup = 1;
constexpr uint64_t kTagDescriptor = 2;
constexpr uint64_t kTagData = 3;
constexpr uint64_t kTagReport = 4;
constexpr uint64_t kTagFailure = 5;  // why the sender stops (Mailbox)
constexpr uint64_t kTagCredit = 6;   // send: the target consumed kSendCreditEvery more messages
// Sends complete once the target's engine took them, consumed or buffered; the target's loop
// consumes slower than shm delivers (600k 8-byte messages/s), so without credits the sender
// filled the target's 4096 buffered messages (Config::max_unexpected_messages) and failed. It
// runs at most two credits ahead.
constexpr uint64_t kSendCreditEvery = 1024;
constexpr std::size_t kControlBytes = 4096;
constexpr Duration kOpTimeout = 60s;
constexpr Duration kIdleTimeout = 24h;
// A failing side waits this long for the other to take its reason.
constexpr Duration kFailureTimeout = 5s;
// Each size moves about this much (or kMinIters operations) unless --iters says otherwise.
constexpr uint64_t kBytesPerSize = 512ull << 20;
constexpr int kMinIters = 20;
constexpr int kMaxIters = 20000;
constexpr int kWarmupIters = 3;

// The bench's data: byte `index` of the pattern `seed` names, written by fill and checked by
// matches (every byte) or sampled_matches.
uint8_t pattern_byte(uint64_t seed, uint64_t index);
void fill(uint8_t* p, uint64_t n, uint64_t seed);
bool matches(const uint8_t* p, uint64_t n, uint64_t seed);

// Checks both ends and a prime stride of a message: cheap enough that the target keeps up
// with the sender (a full check of every 1 MiB message took longer than sending it).
bool sampled_matches(const uint8_t* p, uint64_t n, uint64_t seed);

// Throws a failed status as an Error that names `what` failed.
void check(const Status& s, const std::string& what);

// Ping-pong (as perftest's ib_write_lat): each side writes `size` bytes into the other's
// receive area, whose last byte counts the rounds, and waits for that byte (or, imm_pingpong,
// the write_with_imm's notification) before it answers.
// Areas: receive at [0, size), send from [size, 2 size) of each side's buffer.
inline uint8_t round_mark(uint64_t round) { return static_cast<uint8_t>(round % 255 + 1); }

// One side's rounds: each writes the send area (last byte marked) into the peer's receive area;
// the caller waits for the write to complete, as ib_write_lat does. `prepared`: the write is
// prepared once and posted every round, as ib_write_lat reposts one work request.
class PingPongWriter {
 public:
  // `notify`: write_with_imm, its immediate kPingPongImm, for the other side's next_imm.
  PingPongWriter(const Peer& peer, const Region& local, uint8_t* buf, const Descriptor& remote,
                 uint64_t size, bool prepared, bool notify)
      : peer_(peer), buf_(buf), size_(size), notify_(notify), t_{&local, size, &remote, 0, size} {
    if (prepared) {
      prepared_ = notify ? peer.prepare_write_with_imm({&t_, 1}, kPingPongImm)
                         : peer.prepare_write({&t_, 1});
    }
  }
  Future post(uint64_t round) {
    buf_[2 * size_ - 1] = round_mark(round);
    if (prepared_.valid()) return prepared_.post();
    return notify_ ? peer_.write_with_imm({&t_, 1}, kPingPongImm) : peer_.write({&t_, 1});
  }
  static constexpr uint32_t kPingPongImm = 0x50494e47;  // "PING"

 private:
  const Peer& peer_;
  uint8_t* buf_;
  uint64_t size_;
  bool notify_;
  Transfer t_;
  Prepared prepared_;
};
// The other side's answer to `round` of a ping-pong: its write (the round's mark polled in `rx`)
// or, with `notify`, its write_with_imm taken from next_imm (and its mark checked).
void await_answer(Engine& engine, const Peer& from, const uint8_t* rx, uint64_t size,
                  uint64_t round, bool notify);
// Takes the Future: its release belongs before the wait for the answer, not after it.
void pingpong_wait(Future&& f);

// The bench's own messages with one peer, in a small registered buffer. A side that fails sends
// its reason (kTagFailure) before it closes the connection, so that the other side, which sees
// the connection drop, prints the cause instead.
class Mailbox {
 public:
  Mailbox(Engine& e, Peer peer)
      : peer_(std::move(peer)),
        buf_(kAreas * kControlBytes),
        region_(e.register_memory(buf_.data(), buf_.size(), Access::kLocal)),
        their_failure_(peer_.recv(kTagFailure, region_, kTheirFailure, kControlBytes)) {}
  // The receive for the other side's failure holds the region until the connection ends.
  ~Mailbox() { peer_.close(); }
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  const Peer& peer() const { return peer_; }
  void send(uint64_t tag, const std::string& text) {
    check(peer_.send(tag, region_, put(kOut, text), text.size()).wait(kOpTimeout),
          "send control message");
  }
  std::string recv(uint64_t tag, Duration timeout = kOpTimeout) { return wait(post(tag), timeout); }
  // A message and the answer to it. The answer's receive is posted first: a receive posted
  // after the connection ends fails, even if the answer came before the end.
  std::string request(uint64_t tag, const std::string& text, uint64_t answer_tag) {
    Future answer = post(answer_tag);
    send(tag, text);
    return wait(answer, kOpTimeout);
  }
  // The other side's reason, if it failed. It sends the reason before it closes, so once the
  // connection is gone the receive holds the reason or the loss.
  std::optional<std::string> their_failure() const {
    Status s = peer_.connected() ? their_failure_.status() : their_failure_.wait(kOpTimeout);
    if (!s.ok()) return std::nullopt;
    return text(kTheirFailure, their_failure_.bytes());
  }
  // Tells the other side why we stop, as far as it still listens, and closes the connection.
  void tell_failure(const std::string& reason) {
    std::string text = reason.substr(0, kControlBytes);
    (void)peer_.send(kTagFailure, region_, put(kOurFailure, text), text.size())
        .wait(kFailureTimeout);
    peer_.close();
  }
  // Waits until the other side closes the connection. A side that closes first may lose the
  // acknowledgement of the last message it took: the sender of that message would fail.
  void await_close() const { (void)their_failure_.wait(kOpTimeout); }

 private:
  // Areas of the buffer: a receive may still be posted in one when another is written.
  static constexpr uint64_t kOut = 0, kIn = kControlBytes, kTheirFailure = 2 * kControlBytes,
                            kOurFailure = 3 * kControlBytes, kAreas = 4;
  Future post(uint64_t tag) { return peer_.recv(tag, region_, kIn, kControlBytes); }
  std::string wait(const Future& f, Duration timeout) const {
    check(f.wait(timeout), "receive control message");
    return text(kIn, f.bytes());
  }
  uint64_t put(uint64_t area, const std::string& text) {
    if (text.size() > kControlBytes)
      throw Error(ErrorCode::kInvalidArgument,
                  "control message of " + std::to_string(text.size()) + " bytes");
    std::memcpy(buf_.data() + area, text.data(), text.size());
    return area;
  }
  std::string text(uint64_t area, uint64_t bytes) const {
    return std::string(reinterpret_cast<const char*>(buf_.data() + area), bytes);
  }

  Peer peer_;
  std::vector<uint8_t> buf_;
  Region region_;
  Future their_failure_;
};

// The engine either side runs: the transport, limits and tuning the options name.
Config engine_config(const BenchOptions& o, const Address& listen);

// --transport naming one this host cannot use (verbs without RDMA) fails here, before a target
// starts or a connection.
void require_transport(const BenchOptions& o);

// The fields of a control message, all of it. A malformed one fails the session, and the other
// side hears why.
template <class... T>
void read_fields(const std::string& message, T&... fields) {
  std::istringstream in(message);
  ((in >> fields), ...);
  if (in.fail() || !(in >> std::ws).eof())
    throw Error(ErrorCode::kProtocol, "malformed control message '" + message + "'");
}

void refuse_if(bool bad, const std::string& what);

// `ferry bench --listen`: serves initiators until killed (or one, with --once).
int run_target(const BenchOptions& o);

}  // namespace ferry::cli::bench
