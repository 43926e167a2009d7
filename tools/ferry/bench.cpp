#include "bench.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>

#include "ferry/ferry.hpp"
#include "gauge.hpp"
#include "info.hpp"

extern char** environ;

namespace ferry::cli {
namespace {

using namespace std::chrono_literals;
using BenchClock = std::chrono::steady_clock;

// Tags of the bench's own control messages between initiator and target.
constexpr uint64_t kTagSetup = 1;
constexpr uint64_t kTagDescriptor = 2;
constexpr uint64_t kTagData = 3;
constexpr uint64_t kTagReport = 4;
constexpr uint64_t kTagFailure = 5;  // why the sender stops (Mailbox)
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

// Checks both ends and a prime stride of a message: cheap enough that the target keeps up
// with the sender (a full check of every 1 MiB message took longer than sending it).
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

// Ping-pong (as perftest's ib_write_lat): each side writes `size` bytes into the other's
// receive area, whose last byte counts the rounds, and waits for that byte before it answers.
// Areas: receive at [0, size), send from [size, 2 size) of each side's buffer.
uint8_t round_mark(uint64_t round) { return static_cast<uint8_t>(round % 255 + 1); }

void await_round(const uint8_t* rx, uint64_t size, uint64_t round) {
  std::atomic_ref<const uint8_t> mark(rx[size - 1]);
  auto deadline = BenchClock::now() + kOpTimeout;
  for (unsigned i = 1; mark.load(std::memory_order_acquire) != round_mark(round); ++i) {
    // The clock now and then: under emulation a clock read costs more than the poll.
    if (i % 4096 == 0 && BenchClock::now() > deadline)
      throw Error(ErrorCode::kTimeout, "ping-pong: round " + std::to_string(round) + " never came");
  }
}

// One side's rounds: each writes the send area (last byte marked) into the peer's receive area;
// the caller waits for the write to complete, as ib_write_lat does. `prepared`: the write is
// prepared once and posted every round, as ib_write_lat reposts one work request.
class PingPongWriter {
 public:
  PingPongWriter(const Peer& peer, const Region& local, uint8_t* buf, const Descriptor& remote,
                 uint64_t size, bool prepared)
      : peer_(peer), buf_(buf), size_(size), t_{&local, size, &remote, 0, size} {
    if (prepared) prepared_ = peer.prepare_write({&t_, 1});
  }
  Future post(uint64_t round) {
    buf_[2 * size_ - 1] = round_mark(round);
    return prepared_.valid() ? prepared_.post() : peer_.write({&t_, 1});
  }

 private:
  const Peer& peer_;
  uint8_t* buf_;
  uint64_t size_;
  Transfer t_;
  Prepared prepared_;
};
// Takes the Future: its release belongs before the wait for the answer, not after it.
void pingpong_wait(Future&& f) {
  Future mine = std::move(f);
  if (Status s = mine.wait(kOpTimeout); !s.ok()) check(s, "ping-pong write");
}

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
  if (o.streams) c.tcp.streams = *o.streams;
  if (o.qps) c.verbs.qps = *o.qps;
  if (o.cross_memory) c.shm.cross_memory = *o.cross_memory;
  if (o.ring_copies) c.shm.ring_copies_up_to = *o.ring_copies;
  if (o.metrics) c.metrics = *o.metrics;
  if (o.slice_bytes) c.slice_bytes = *o.slice_bytes;
  if (o.stripe_bytes) c.stripe_threshold = *o.stripe_bytes;
  if (o.eager_bytes) c.tcp.eager_bytes = *o.eager_bytes;
  if (o.busy_poll_us) c.busy_poll = std::chrono::microseconds(*o.busy_poll_us);
  if (o.wait_spin_us) c.wait_spin = std::chrono::microseconds(*o.wait_spin_us);
  // The target's buffer holds only benchmark data, and its peer is this benchmark: large
  // send() messages land there zero-copy over verbs.
  c.verbs.zero_copy_receives = true;
  return c;
}

// --transport naming one this host cannot use (verbs without RDMA) fails here, before a target
// starts or a connection.
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

// The fields of a control message, all of it. A malformed one fails the session, and the other
// side hears why.
template <class... T>
void read_fields(const std::string& message, T&... fields) {
  std::istringstream in(message);
  ((in >> fields), ...);
  if (in.fail() || !(in >> std::ws).eof())
    throw Error(ErrorCode::kProtocol, "malformed control message '" + message + "'");
}

void refuse_if(bool bad, const std::string& what) {
  if (bad) throw Error(ErrorCode::kInvalidArgument, what);
}

// ---------------------------------------------------------------------------------------------
// Target: registers what an initiator asks for and serves it until told to stop.

// One initiator's session; `imms` counts its immediates.
void serve(Engine& engine, Mailbox& mail, const std::atomic<uint64_t>& imms) {
  const Peer& peer = mail.peer();
  // Setup: "<bytes> <allocate> 0": the buffer's size, and 1 for memory from Engine::allocate.
  uint64_t bytes = 0, allocate = 0, unused = 0;
  read_fields(mail.recv(kTagSetup), bytes, allocate, unused);
  refuse_if(bytes == 0 || bytes > physical_memory(), "setup: a buffer of " + std::to_string(bytes) +
                                                         " bytes asked for; this host has " +
                                                         human_memory(physical_memory()));
  std::vector<uint8_t> owned;
  Region region;
  if (allocate == 1) {
    region = engine.allocate(bytes, Access::kRemoteReadWrite);
  } else {
    try {
      owned.resize(bytes);
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::kResourceExhausted, "setup: cannot allocate " + human_memory(bytes));
    }
  }
  std::span<uint8_t> buf =
      allocate == 1 ? std::span(static_cast<uint8_t*>(region.data()), bytes) : std::span(owned);
  fill(buf.data(), bytes, bytes);
  if (allocate != 1) region = engine.register_memory(buf.data(), bytes, Access::kRemoteReadWrite);
  mail.send(kTagDescriptor, region.descriptor().to_string());

  // Serve send(): keep receives posted into rotating slots and check every message.
  uint64_t bad_messages = 0;
  for (;;) {
    // Between commands the initiator may run one-sided operations for long: its liveness, not
    // this wait, tells whether it is still there.
    std::string cmd = mail.recv(kTagSetup, kIdleTimeout);
    if (cmd == "done") break;
    if (cmd.starts_with("pingpong ")) {
      // "pingpong <rounds> <size> <initiator's descriptor> <prepared>": answer every round.
      std::string word, desc;
      uint64_t rounds = 0, size = 0;
      bool prepared = false;
      read_fields(cmd, word, rounds, size, desc, prepared);
      refuse_if(size == 0 || size > bytes / 2,
                "ping-pong: size " + std::to_string(size) + " does not fit twice in the buffer");
      Descriptor initiator = Descriptor::parse(desc);
      fill(buf.data() + size, size, size);
      PingPongWriter writer(peer, region, buf.data(), initiator, size, prepared);
      for (uint64_t r = 0; r < rounds; ++r) {
        await_round(buf.data(), size, r);
        pingpong_wait(writer.post(r));
      }
      continue;
    }
    // "<count> <size> <window> <same area>": receive `count` messages, `window` receives
    // posted, each into its own slot or (same area, as ib_send_bw posts them) all into the first.
    uint64_t count = 0, size = 0, window = 0;
    bool same_area = false;
    read_fields(cmd, count, size, window, same_area);
    refuse_if(size == 0 || size > bytes || window == 0, "send: size " + std::to_string(size) +
                                                            " or window " + std::to_string(window) +
                                                            " out of range");
    uint64_t slots = same_area ? 1 : std::min(window, bytes / size);
    std::deque<std::pair<Future, uint64_t>> posted;
    uint64_t next = 0;
    for (uint64_t done = 0; done < count;) {
      while (next < count && posted.size() < (same_area ? window : slots)) {
        uint64_t slot = next % slots;
        posted.emplace_back(peer.recv(kTagData, region, slot * size, size), slot);
        ++next;
      }
      auto [f, slot] = posted.front();
      posted.pop_front();
      check(f.wait(kOpTimeout), "recv");
      if (f.bytes() != size || !sampled_matches(buf.data() + slot * size, size, size))
        ++bad_messages;
      ++done;
    }
    mail.send(kTagReport, std::to_string(bad_messages));
  }
  mail.send(kTagReport, std::to_string(imms.load()) + " " + std::to_string(bad_messages));
}

// Serves one initiator; false if the session failed. A listener reports every failure; the
// target `ferry bench` started (--once) leaves that to its initiator, which prints its own
// failure or the one we told it.
bool serve_one(Engine& engine, const Peer& peer, const std::atomic<uint64_t>& imms, bool once) {
  Mailbox mail(engine, peer);
  try {
    serve(engine, mail, imms);
    return true;
  } catch (const std::exception& e) {
    std::optional<std::string> theirs = mail.their_failure();
    if (!theirs) mail.tell_failure(e.what());
    if (!once) {
      std::cerr << "ferry bench: initiator " << peer.address()
                << (theirs ? " failed: " + *theirs : ": " + std::string(e.what())) << std::endl;
    }
    return false;
  }
}

// After "listening on": the addresses a remote host can use when listening on every interface.
void print_reachable(const Address& listen, uint16_t port) {
  bool v4 = listen.host == "0.0.0.0", v6 = listen.host == "::";  // [::] takes IPv4 too
  if (!v4 && !v6) return;
  std::vector<InterfaceAddress> all = interface_addresses();
  std::stable_partition(all.begin(), all.end(), [](const auto& a) { return !a.loopback; });
  for (const auto& a : all) {
    if (!a.up || a.link_local || (a.ipv6 && !v6)) continue;
    std::cout << "reachable at " << Address{a.address, port}.to_string() << " (" << a.name
              << (a.loopback ? ", this host only" : "") << ")\n";
  }
  std::cout << std::flush;
}

int run_target(const BenchOptions& o) {
  Engine engine(engine_config(o, *o.listen));
  std::atomic<uint64_t> initiator{0}, imms{0};
  engine.on_imm([&](const ImmEvent& e) {
    if (e.peer_engine_id == initiator.load()) imms.fetch_add(1);
  });
  // The first line as it is: the initiator that started this target reads it.
  std::cout << "listening on " << engine.address() << std::endl;
  print_reachable(*o.listen, engine.port());
  for (;;) {
    std::optional<Peer> accepted = engine.accept(kIdleTimeout);
    if (!accepted) {
      if (o.once) return 1;
      continue;
    }
    imms = 0;
    initiator = accepted->engine_id();
    bool ok = serve_one(engine, *accepted, imms, o.once);
    if (o.once) return ok ? 0 : 1;
  }
}

// ---------------------------------------------------------------------------------------------
// Initiator

struct Row {
  std::string op;
  uint64_t size;
  int batch, concurrency, iters;
  double p50_us, p99_us, mb_per_s, ops_per_s;
  bool prepared;  // posted batches prepared once
  bool verified;
};

// While one size runs longer than a second, a line on stderr that says how far it is, redrawn
// at most ten times a second and erased before the size's row is printed. Only on terminals.
class Progress {
 public:
  Progress(bool shown, std::string what, uint64_t total)
      : shown_(shown), what_(std::move(what)), total_(total), start_(BenchClock::now()) {}
  ~Progress() {
    if (drawn_) std::fputs("\r\033[K", stderr);
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  // `now`: the caller's clock reading, so that the measured loop reads no clock for us.
  void update(uint64_t done, BenchClock::time_point now) {
    if (!shown_ || now - start_ < 1s || (drawn_ && now - drawn_at_ < 100ms)) return;
    std::fprintf(stderr, "\r%s %3d%%", what_.c_str(), static_cast<int>(100 * done / total_));
    drawn_ = true;
    drawn_at_ = now;
  }

 private:
  bool shown_;
  std::string what_;
  uint64_t total_;
  BenchClock::time_point start_, drawn_at_;
  bool drawn_ = false;
};

struct Initiator {
  const BenchOptions& o;
  Engine& engine;
  Peer peer;
  Descriptor remote;
  uint64_t bytes;
  std::span<uint8_t> buf, check_buf;  // in `region` and `check_region`
  Region region, check_region;
  Mailbox& mail;
  bool progress;  // a terminal shows Progress
  uint64_t imms_sent = 0;
  GaugeServer* gauge = nullptr;  // --web
  RateWindow window;
  uint64_t bytes_moved = 0;

  // `n` more bytes moved: the gauge's rate, where there is one.
  void moved(uint64_t n) {
    bytes_moved += n;
    double rate = 0;
    if (gauge != nullptr && window.sample(bytes_moved, rate)) gauge->publish(rate);
  }

  uint64_t slot_offset(uint64_t size, int slot) const {
    if (o.same_area) return 0;
    uint64_t per_op = size * static_cast<uint64_t>(o.batch);
    return (static_cast<uint64_t>(slot) * per_op) % (bytes - per_op + 1);
  }

  std::vector<Prepared> prepared;  // --prepared: one per slot

  // The batch of one slot: `o.batch` entries of `size` bytes, at the same offsets both sides.
  void fill_batch(uint64_t size, int slot, std::vector<Transfer>& batch) {
    uint64_t base = slot_offset(size, slot);
    batch.resize(static_cast<std::size_t>(o.batch));
    for (int i = 0; i < o.batch; ++i) {
      uint64_t off = base + static_cast<uint64_t>(i) * size;
      batch[static_cast<std::size_t>(i)] = Transfer{&region, off, &remote, off, size};
    }
  }

  void prepare(const std::string& op, uint64_t size) {
    std::vector<Transfer> batch;
    for (int slot = 0; slot < o.concurrency; ++slot) {
      fill_batch(size, slot, batch);
      prepared.push_back(op == "write" ? peer.prepare_write(batch)
                         : op == "read"
                             ? peer.prepare_read(batch)
                             : peer.prepare_write_with_imm(batch, static_cast<uint32_t>(size)));
    }
  }

  Future start(const std::string& op, uint64_t size, int slot, std::vector<Transfer>& batch) {
    if (!prepared.empty()) {
      if (op == "write_imm") ++imms_sent;
      return prepared[static_cast<std::size_t>(slot)].post();
    }
    fill_batch(size, slot, batch);
    if (op == "write") return peer.write(batch);
    if (op == "read") return peer.read(batch);
    if (op == "write_imm") {
      ++imms_sent;
      return peer.write_with_imm(batch, static_cast<uint32_t>(size));
    }
    return peer.send(kTagData, region, slot_offset(size, slot), size);
  }

  bool verify(const std::string& op, uint64_t size) {
    uint64_t n = std::min<uint64_t>(size * static_cast<uint64_t>(o.batch), bytes);
    Transfer t{&check_region, 0, &remote, 0, n};
    if (op == "read") {
      // The target filled its buffer with pattern(seed = buffer size); we must have read it.
      return matches(buf.data(), n, bytes);
    }
    if (op == "send") return true;  // the target checks every message and reports at the end
    // write / write_imm: write a fresh pattern, read it back through a separate region.
    fill(buf.data(), n, size ^ 0x5a5a);
    Transfer w{&region, 0, &remote, 0, n};
    check(peer.write({&w, 1}).wait(kOpTimeout), "verify write");
    std::fill(check_buf.begin(), check_buf.begin() + static_cast<long>(n), 0);
    check(peer.read({&t, 1}).wait(kOpTimeout), "verify read");
    return std::memcmp(check_buf.data(), buf.data(), n) == 0;
  }

  Row run(const std::string& op, uint64_t size) {
    uint64_t per_op = size * static_cast<uint64_t>(o.batch);
    int iters = o.iters.value_or(
        static_cast<int>(std::clamp<uint64_t>(kBytesPerSize / per_op, kMinIters, kMaxIters)));
    if (op == "pingpong") return pingpong(size, iters);
    if (op == "send") {
      mail.send(kTagSetup, std::to_string(iters + kWarmupIters) + " " + std::to_string(size) + " " +
                               std::to_string(o.concurrency) + " " + (o.same_area ? "1" : "0"));
      fill(buf.data(), size, size);
      // Sends reuse one source slot, so every message carries the pattern the target checks.
    }
    if (op == "read") {
      // Give the remote bytes a known pattern, then clear ours, so verify() proves the reads.
      uint64_t n = std::min<uint64_t>(size * static_cast<uint64_t>(o.batch), bytes);
      fill(buf.data(), n, bytes);
      Transfer w{&region, 0, &remote, 0, n};
      check(peer.write({&w, 1}).wait(kOpTimeout), "prepare read");
      std::fill(buf.begin(), buf.begin() + static_cast<long>(n), 0);
    }
    prepared.clear();
    if (o.prepared && op != "send") prepare(op, size);
    std::vector<std::vector<Transfer>> batches(static_cast<std::size_t>(o.concurrency));
    std::vector<double> lat_us;
    lat_us.reserve(static_cast<std::size_t>(iters));
    std::deque<std::pair<Future, BenchClock::time_point>> inflight;
    auto slot_for = [&](int i) { return op == "send" ? 0 : i % o.concurrency; };

    for (int i = 0; i < kWarmupIters; ++i) {
      check(start(op, size, slot_for(i), batches[0]).wait(kOpTimeout), op + " warm-up");
    }
    Progress shown(progress, op + " " + human_size(size), static_cast<uint64_t>(iters));
    auto t0 = BenchClock::now();
    int issued = 0;
    while (issued < iters || !inflight.empty()) {
      while (issued < iters && static_cast<int>(inflight.size()) < o.concurrency) {
        int slot = slot_for(issued);
        auto ts = BenchClock::now();
        inflight.emplace_back(
            start(op, size, slot, batches[static_cast<std::size_t>(issued % o.concurrency)]), ts);
        ++issued;
      }
      auto [f, ts] = inflight.front();
      inflight.pop_front();
      check(f.wait(kOpTimeout), op + " " + human_size(size));
      auto now = BenchClock::now();
      lat_us.push_back(std::chrono::duration<double, std::micro>(now - ts).count());
      shown.update(lat_us.size(), now);
      moved(per_op);
    }
    double secs = std::chrono::duration<double>(BenchClock::now() - t0).count();
    if (op == "send") {
      std::string bad = mail.recv(kTagReport);
      if (bad != "0")
        throw Error(ErrorCode::kProtocol, "target saw corrupted send() messages: " + bad);
    }
    bool verified = verify(op, size);
    if (!verified)
      throw Error(ErrorCode::kProtocol, op + " " + human_size(size) + ": data mismatch");
    return finish(op, size, o.batch, o.concurrency, iters, secs, lat_us, !prepared.empty());
  }

  // --scatter: `n` entries of `size` bytes in slots of 2 x size (never adjacent), local and
  // remote slots each shuffled, one batch per iteration; beside it one contiguous transfer of
  // the same n x size bytes, timed the same way. Both verified byte for byte.
  struct ScatterResult {
    Row contiguous, scattered;
    double submit_ns_per_entry;
    double submit_cpu_ns_per_entry;  // the calling thread's CPU time in the call
  };
  ScatterResult scatter(const std::string& op, uint64_t size) {
    const uint64_t n = static_cast<uint64_t>(*o.scatter), stride = 2 * size, span = n * size;
    std::vector<uint64_t> local_slot(n), remote_slot(n);
    std::iota(local_slot.begin(), local_slot.end(), 0);
    std::iota(remote_slot.begin(), remote_slot.end(), 0);
    std::mt19937_64 rng(size);
    std::shuffle(local_slot.begin(), local_slot.end(), rng);
    std::shuffle(remote_slot.begin(), remote_slot.end(), rng);
    std::vector<Transfer> scattered(n);
    for (uint64_t i = 0; i < n; ++i)
      scattered[i] =
          Transfer{&region, local_slot[i] * stride, &remote, remote_slot[i] * stride, size};
    Transfer contiguous{&region, 0, &remote, 0, span};
    int iters = o.iters.value_or(
        static_cast<int>(std::clamp<uint64_t>(kBytesPerSize / span, kMinIters, kMaxIters)));
    bool write = op == "write";
    auto post = [&](std::span<const Transfer> b) { return write ? peer.write(b) : peer.read(b); };
    // The remote buffer gets a known pattern (reads must return it; writes must leave it alone
    // outside their entries).
    Transfer whole{&region, 0, &remote, 0, bytes};
    auto prepare_remote = [&] {
      fill(buf.data(), bytes, bytes);
      check(peer.write({&whole, 1}).wait(kOpTimeout), "scatter: prepare remote");
    };
    prepare_remote();
    if (write) fill(buf.data(), bytes, size ^ 0x5a5a);
    double submit_s = 0, submit_cpu_s = 0;
    auto thread_cpu = [] {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
    };
    struct Timed {
      double secs = 0;  // in the transfers: from each post to its completion
      std::vector<double> lat_us;
    } contiguous_t, scattered_t;
    contiguous_t.lat_us.reserve(static_cast<std::size_t>(iters));
    scattered_t.lat_us.reserve(static_cast<std::size_t>(iters));
    auto once = [&](std::span<const Transfer> b, bool count_submit, Timed& t) {
      double cpu0 = count_submit ? thread_cpu() : 0;
      auto ts = BenchClock::now();
      Future f = post(b);
      auto tp = BenchClock::now();
      if (count_submit) {
        submit_cpu_s += thread_cpu() - cpu0;
        submit_s += std::chrono::duration<double>(tp - ts).count();
      }
      check(f.wait(kOpTimeout), op + " " + human_size(size));
      auto now = BenchClock::now();
      t.secs += std::chrono::duration<double>(now - ts).count();
      t.lat_us.push_back(std::chrono::duration<double, std::micro>(now - ts).count());
      return now;
    };
    for (int i = 0; i < kWarmupIters; ++i) {
      check(post({&contiguous, 1}).wait(kOpTimeout), op + " warm-up");
      check(post(scattered).wait(kOpTimeout), op + " warm-up");
    }
    // Alternated, so that the host's slow and fast spells fall on both: their ratio is the
    // figure, and it swung by 0.15 between runs when each ran its iterations in one stretch.
    Progress shown(progress, op + " " + human_size(size) + " contiguous and scattered",
                   2 * static_cast<uint64_t>(iters));
    for (int i = 0; i < iters; ++i) {
      once({&contiguous, 1}, false, contiguous_t);
      shown.update(2 * static_cast<uint64_t>(i + 1), once(scattered, true, scattered_t));
    }
    auto& [csecs, clat] = contiguous_t;
    auto& [ssecs, slat] = scattered_t;
    // Verify: one more scattered batch of fresh bytes, then the remote buffer read back whole.
    if (write) {
      prepare_remote();  // the contiguous writes covered part of it
      fill(buf.data(), bytes, size ^ 0xa5a5);
      check(post(scattered).wait(kOpTimeout), "scatter: verify write");
      Transfer back{&check_region, 0, &remote, 0, bytes};
      check(peer.read({&back, 1}).wait(kOpTimeout), "scatter: verify read-back");
      std::vector<bool> used(n, false);
      for (uint64_t i = 0; i < n; ++i) {
        used[remote_slot[i]] = true;
        if (std::memcmp(check_buf.data() + remote_slot[i] * stride,
                        buf.data() + local_slot[i] * stride, size) != 0)
          throw Error(ErrorCode::kProtocol,
                      "scatter write: entry " + std::to_string(i) + " differs at the target");
      }
      for (uint64_t at = 0; at < bytes; ++at) {  // nothing else changed
        if ((at / stride < n && used[at / stride] && at % stride < size)) continue;
        if (check_buf[at] != pattern_byte(bytes, at))
          throw Error(ErrorCode::kProtocol, "scatter write: target byte " + std::to_string(at) +
                                                " outside every entry "
                                                "changed");
      }
    } else {
      std::fill(buf.begin(), buf.end(), 0);
      check(post(scattered).wait(kOpTimeout), "scatter: verify read");
      for (uint64_t i = 0; i < n; ++i) {
        const uint8_t* p = buf.data() + local_slot[i] * stride;
        for (uint64_t j = 0; j < size; ++j) {
          if (p[j] != pattern_byte(bytes, remote_slot[i] * stride + j))
            throw Error(ErrorCode::kProtocol,
                        "scatter read: entry " + std::to_string(i) + " holds the wrong bytes");
        }
        std::memset(buf.data() + local_slot[i] * stride, 0, size);
      }
      if (std::any_of(buf.begin(), buf.end(), [](uint8_t b) { return b != 0; }))
        throw Error(ErrorCode::kProtocol, "scatter read: a byte outside every entry changed");
      fill(buf.data(), bytes, 7);
    }
    return {finish(op, span, 1, 1, iters, csecs, clat, false),
            finish(op, size, static_cast<int>(n), 1, iters, ssecs, slat, false),
            submit_s * 1e9 / (static_cast<double>(iters) * static_cast<double>(n)),
            submit_cpu_s * 1e9 / (static_cast<double>(iters) * static_cast<double>(n))};
  }

  // Half round trips of ping-pong writes, with the target answering each one.
  Row pingpong(uint64_t size, int iters) {
    if (2 * size > bytes) throw Error(ErrorCode::kInvalidArgument, "ping-pong: size too large");
    // Allocated, the target may be lent it (a mapping needs remote read too); registered, it
    // only needs remote write.
    std::vector<uint8_t> owned;
    if (!o.allocate) owned.resize(2 * size);
    Region pp_region =
        o.allocate ? engine.allocate(2 * size, Access::kRemoteReadWrite)
                   : engine.register_memory(owned.data(), owned.size(), Access::kRemoteWrite);
    std::span<uint8_t> pp(static_cast<uint8_t*>(pp_region.data()), 2 * size);
    fill(pp.data() + size, size, size + 1);
    auto rounds = static_cast<uint64_t>(iters) + kWarmupIters;
    mail.send(kTagSetup, "pingpong " + std::to_string(rounds) + " " + std::to_string(size) + " " +
                             pp_region.descriptor().to_string() + " " + (o.prepared ? "1" : "0"));
    std::vector<double> lat_us;
    lat_us.reserve(static_cast<std::size_t>(iters));
    // A round is the time between two posts, as perftest's ib_write_lat takes it; the clock is
    // read just after posting, while the write is in flight, not before it.
    auto t0 = BenchClock::now();
    auto ts = t0;
    PingPongWriter writer(peer, pp_region, pp.data(), remote, size, o.prepared);
    Progress shown(progress, "pingpong " + human_size(size), rounds);
    for (uint64_t r = 0; r < rounds; ++r) {
      Future f = writer.post(r);
      auto te = BenchClock::now();
      if (r > static_cast<uint64_t>(kWarmupIters)) {
        lat_us.push_back(std::chrono::duration<double, std::micro>(te - ts).count() / 2);
      } else {
        t0 = te;
      }
      ts = te;
      shown.update(r, te);
      pingpong_wait(std::move(f));
      await_round(pp.data(), size, r);
    }
    double secs = std::chrono::duration<double>(BenchClock::now() - t0).count();
    // The target's answers carried its pattern (all but the round mark).
    if (size > 1 && !matches(pp.data(), size - 1, size))
      throw Error(ErrorCode::kProtocol, "ping-pong: data mismatch");
    return finish("pingpong", size, 1, 1, iters, secs, lat_us, o.prepared);
  }

  // A verified row from the latencies and the elapsed time of `iters` operations.
  static Row finish(const std::string& op, uint64_t size, int batch, int concurrency, int iters,
                    double secs, std::vector<double>& lat_us, bool prepared) {
    std::sort(lat_us.begin(), lat_us.end());
    auto pct = [&](double q) {
      return lat_us[static_cast<std::size_t>(q * static_cast<double>(lat_us.size() - 1))];
    };
    double moved = static_cast<double>(size) * batch * iters;
    return Row{op,           size,     batch,     concurrency,
               iters,        pct(0.5), pct(0.99), moved / secs / 1e6,
               iters / secs, prepared, true};
  }
};

// The route a benchmark operation takes (Peer::routes): its transport and why.
struct OpRoute {
  std::string transport;
  std::string why;
};

OpRoute route_of(const Peer& peer, const std::string& op) {
  std::string_view operations = op == "write_imm" ? "write_with_imm"
                                : op == "send"    ? "send/recv"
                                                  : "write/read";  // write, read, pingpong
  for (const RouteInfo& r : peer.routes()) {
    if (r.operations == operations && r.local == MemoryKind::kHost &&
        r.remote == MemoryKind::kHost) {
      return {r.transport ? std::string(to_string(*r.transport)) : "none", r.why};
    }
  }
  return {"none", "no route"};
}

void print_row(const Row& r, bool json, const OpRoute& route) {
  const std::string& transport = route.transport;
  char line[320];
  if (json) {
    std::snprintf(
        line, sizeof line,
        "{\"transport\":\"%s\",\"op\":\"%s\",\"size\":%llu,\"batch\":%d,\"concurrency\":%d,"
        "\"iters\":%d,\"p50_us\":%.2f,\"p99_us\":%.2f,\"mb_per_s\":%.1f,\"ops_per_s\":%.0f,"
        "\"prepared\":%s,\"verified\":%s,\"why\":",
        transport.c_str(), r.op.c_str(), static_cast<unsigned long long>(r.size), r.batch,
        r.concurrency, r.iters, r.p50_us, r.p99_us, r.mb_per_s, r.ops_per_s,
        r.prepared ? "true" : "false", r.verified ? "true" : "false");
    std::cout << line << json_string(route.why) << "}" << std::endl;
    return;
  }
  std::snprintf(line, sizeof line, "%-9s %-9s %7s %6d %5d %10.1f %10.1f %10.1f %11.0f",
                transport.c_str(), r.op.c_str(), human_size(r.size).c_str(), r.batch, r.concurrency,
                r.p50_us, r.p99_us, r.mb_per_s, r.ops_per_s);
  std::cout << line << std::endl;
}

// One connection's whole benchmark, after the connection.
void run_session(const BenchOptions& o, Engine& engine, Mailbox& mail) {
  const Peer& peer = mail.peer();
  if (o.transport != "auto" && to_string(peer.transport()) != o.transport) {
    throw Error(ErrorCode::kUnsupported,
                o.transport + " is not available between these peers (see ferry info)");
  }
  uint64_t bytes = buffer_bytes(o);
  Descriptor remote = Descriptor::parse(mail.request(
      kTagSetup, std::to_string(bytes) + (o.allocate ? " 1 0" : " 0 0"), kTagDescriptor));

  bool progress = !o.json && isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
  std::vector<uint8_t> owned, owned_check;  // outlive the regions registered on them
  Initiator ini{o, engine, peer, remote, bytes, {}, {}, {}, {}, mail, progress};
  std::unique_ptr<GaugeServer> gauge;
  if (o.web) {
    gauge = std::make_unique<GaugeServer>(*o.web, "ferry bench to " + peer.address(), &engine);
    ini.gauge = gauge.get();
    std::cerr << "gauge on " << gauge->url() << std::endl;  // stdout may be --json rows
  }
  if (o.allocate) {
    ini.region = engine.allocate(bytes, Access::kLocal);
    ini.check_region = engine.allocate(bytes, Access::kLocal);
  } else {
    owned.resize(bytes);
    owned_check.resize(bytes);
    ini.region = engine.register_memory(owned.data(), bytes, Access::kLocal);
    ini.check_region = engine.register_memory(owned_check.data(), bytes, Access::kLocal);
  }
  ini.buf = {static_cast<uint8_t*>(ini.region.data()), bytes};
  ini.check_buf = {static_cast<uint8_t*>(ini.check_region.data()), bytes};
  fill(ini.buf.data(), bytes, 7);

  if (!o.json) {
    std::cout << "memory: "
              << (o.allocate ? "allocated by the engines (Engine::allocate)"
                             : "the bench's own, registered")
              << "\nroutes to the peer (" << to_string(peer.reach()) << "):\n";
    print_routes(std::cout, peer.routes(), "  ");
    std::printf("\n%-9s %-9s %7s %6s %5s %10s %10s %10s %11s\n", "transport", "op", "size", "batch",
                "conc", "p50_us", "p99_us", "MB/s", "ops/s");
    std::fflush(stdout);  // a reader of a pipe sees the run start
  }
  for (const auto& op : o.ops) {
    OpRoute route = route_of(peer, op);
    const std::string& transport = route.transport;
    for (uint64_t size : o.sizes) {
      if (!o.scatter) {
        print_row(ini.run(op, size), o.json, route);
        continue;
      }
      Initiator::ScatterResult r = ini.scatter(op, size);
      print_row(r.contiguous, o.json, route);
      print_row(r.scattered, o.json, route);
      double ratio = r.scattered.mb_per_s / r.contiguous.mb_per_s;
      char line[256];
      if (o.json) {
        std::snprintf(line, sizeof line,
                      "{\"transport\":\"%s\",\"op\":\"%s\",\"size\":%llu,\"scatter\":%d,"
                      "\"ratio\":%.3f,\"submit_ns_per_entry\":%.1f,"
                      "\"submit_cpu_ns_per_entry\":%.1f}",
                      transport.c_str(), op.c_str(), static_cast<unsigned long long>(size),
                      *o.scatter, ratio, r.submit_ns_per_entry, r.submit_cpu_ns_per_entry);
      } else {
        std::snprintf(line, sizeof line,
                      "  scattered %s %s x %d: %.2f x contiguous, %s() call %.1f ns per entry "
                      "(%.1f ns of its thread's CPU time)",
                      op.c_str(), human_size(size).c_str(), *o.scatter, ratio, op.c_str(),
                      r.submit_ns_per_entry, r.submit_cpu_ns_per_entry);
      }
      std::cout << line << std::endl;
    }
  }
  uint64_t imms = 0, bad = 0;
  read_fields(mail.request(kTagSetup, "done", kTagReport), imms, bad);
  if (imms != ini.imms_sent) {
    throw Error(ErrorCode::kProtocol, "target got " + std::to_string(imms) + " immediates, " +
                                          std::to_string(ini.imms_sent) + " were sent");
  }
}

void run_initiator(const BenchOptions& o, const std::string& address) {
  Engine engine(engine_config(o, Address{"127.0.0.1", 0}));
  Mailbox mail(engine, engine.connect(address));
  try {
    run_session(o, engine, mail);
  } catch (const std::exception& e) {
    if (std::optional<std::string> theirs = mail.their_failure())
      throw std::runtime_error("target: " + *theirs);
    mail.tell_failure(e.what());
    throw;
  }
  mail.await_close();
}

// Starts `ferry bench --listen 127.0.0.1:0 --once` and returns the address it prints.
pid_t spawn_target(const BenchOptions& o, const std::string& self, std::string& address) {
  int out[2];
  if (pipe(out) != 0) throw Error(ErrorCode::kSystem, "pipe failed");
  std::vector<std::string> args = {
      self, "bench", "--listen", "127.0.0.1:0", "--once", "--threads", std::to_string(o.threads)};
  if (!o.secret.empty()) args.insert(args.end(), {"--secret", o.secret});
  // Named on the command line, it holds on both ends, whatever FERRY_TRANSPORTS says.
  if (o.transport != "auto") args.insert(args.end(), {"--transport", o.transport});
  auto pass = [&](const char* flag, const auto& value) {
    if (value) args.insert(args.end(), {flag, std::to_string(*value)});
  };
  pass("--streams", o.streams);
  pass("--qps", o.qps);
  pass("--cross-memory", o.cross_memory);
  pass("--metrics", o.metrics);
  pass("--slice", o.slice_bytes);
  pass("--stripe", o.stripe_bytes);
  pass("--eager", o.eager_bytes);
  pass("--ring-copies", o.ring_copies);
  pass("--busy-poll-us", o.busy_poll_us);
  pass("--wait-spin-us", o.wait_spin_us);
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  if (rc != 0)
    throw Error(ErrorCode::kSystem, std::string("posix_spawn ") + self + ": " + std::strerror(rc));
  std::string line;
  char c;
  while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
  close(out[0]);
  const std::string prefix = "listening on ";
  if (line.rfind(prefix, 0) != 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw Error(ErrorCode::kSystem, "bench target did not start: '" + line + "'");
  }
  address = line.substr(prefix.size());
  return pid;
}

}  // namespace

int run_bench(const BenchOptions& o, const std::string& self_path) {
  require_transport(o);
  if (o.listen) return run_target(o);
  if (o.connect) {
    run_initiator(o, o.connect->to_string());
    return 0;
  }
  std::string address;
  pid_t pid = spawn_target(o, self_path, address);
  try {
    run_initiator(o, address);
  } catch (...) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::cerr << "ferry bench: target process failed" << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace ferry::cli
