#include "stream.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "emulate.hpp"  // rate_value
#include "endpoints.hpp"
#include "ferry/ferry.hpp"
#include "flags.hpp"
#include "frames.hpp"
#include "gather.hpp"
#include "gauge.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

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
// While the sender is ahead it writes up to this many slots as one write_with_imm, at most a
// quarter of its window: one notification, one completion and (over verbs) one doorbell for
// them all. Over verbs in the Soft-RoCE guest, where each costs the emulated CPU, a stream of
// 64 KiB chunks against ferry bench write (16 in flight) went from 0.81-1.00x, 1.25x the
// bench's CPU time per byte, to 0.83-1.16x (median 1.00), 1.10x the CPU time, in five rounds.
constexpr uint64_t kMaxRun = 4;

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
constexpr int kMaxGatherMicroseconds = 1'000'000;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

uint64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

void check(const Status& s, const std::string& what) {
  if (!s.ok()) throw std::runtime_error(what + ": " + s.to_string());
}

Config engine_config(const StreamOptions& o) {
  Config c;
  if (o.listen) {
    c.listen_host = o.listen->host;
    c.listen_port = o.listen->port;
  }
  if (o.transport != "auto") {
    c.transports = {*transport_named(o.transport)};
    c.transports_from_environment = false;
  }
  c.secret = o.secret;
  return c;
}

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
                  const char* wait_label) {
    auto now = Clock::now();
    double s = seconds_between(since_last ? last : start, now);
    uint64_t b = since_last ? bytes - bytes_at_last : bytes;
    uint64_t w = since_last ? waited_ns - waited_at_last : waited_ns;
    ReportLine r(who, kind, seconds_between(start, now));
    r.number("mb_per_s", "", s > 0 ? static_cast<double>(b) / s / 1e6 : 0, 1, "MB/s")
        .count("total_bytes", "total", bytes, "bytes")
        .count("chunks", "chunks", chunks)
        .number(std::string(wait_label) + "_ms", wait_label, static_cast<double>(w) / 1e6, 1, "ms");
    if (since_last) {
      last = now;
      bytes_at_last = bytes;
      waited_at_last = waited_ns;
    }
    return r;
  }
};

// ---------------------------------------------------------------------------------------------
// Sender

// Where the sender's bytes come from: a file descriptor, or frames made here.
class Source {
 public:
  Source(const StreamOptions& o, uint8_t* staging, uint64_t slots, uint64_t slot_bytes)
      : at_(endpoint_value("--source", o.source, Role::kSource)), frame_(o.frame) {
    uint64_t room = slot_bytes - sizeof(SlotHeader);
    if (at_.kind == Endpoint::Kind::kGenerator) {
      if (frame_ > room) {
        throw std::runtime_error("--frame " + human_size(frame_) +
                                 " is larger than a slot holds (" + human_size(room) +
                                 "; the receiver's --slot-bytes)");
      }
      // Every slot holds the same frames; a fill writes only their headers.
      frames_per_slot_ = room / frame_;
      std::vector<uint8_t> payload(frame_ - FrameHeader::kBytes);
      std::mt19937_64 random(7);
      for (auto& b : payload) b = static_cast<uint8_t>(random());
      crc_ = crc32c(payload.data(), payload.size());
      for (uint64_t s = 0; s < slots; ++s) {
        uint8_t* p = staging + s * slot_bytes + sizeof(SlotHeader);
        for (uint64_t f = 0; f < frames_per_slot_; ++f)
          std::memcpy(p + f * frame_ + FrameHeader::kBytes, payload.data(), payload.size());
      }
      return;
    }
    fd_ = open_endpoint(at_, false);
    flags_ = ::fcntl(fd_.get(), F_GETFL);
    ::fcntl(fd_.get(), F_SETFL, flags_ | O_NONBLOCK);
  }
  ~Source() {
    if (fd_.get() >= 0) ::fcntl(fd_.get(), F_SETFL, flags_);  // a shared stdin is left as found
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  std::string name() const { return at_.to_string(); }
  bool ended() const { return ended_; }
  // Whether the last fill found its bytes waiting: the generator always does; a descriptor did
  // when it filled all the room without waiting for the source.
  bool ahead() const { return ahead_; }
  uint64_t waited_ns() const { return waited_ns_; }

  // Fills up to `room` bytes at `p`: at least one unless the source ended, `stop` was set, or
  // none was ready and `wait` is false.
  uint64_t fill(uint8_t* p, uint64_t room, const std::atomic<bool>& stop, bool wait) {
    if (at_.kind == Endpoint::Kind::kGenerator) {
      uint64_t frames = std::min(frames_per_slot_, room / frame_);
      if (frames == 0) ended_ = true;  // --bytes leaves no room for a whole frame
      ahead_ = true;
      for (uint64_t f = 0; f < frames; ++f) {
        FrameHeader h;
        h.length = static_cast<uint32_t>(frame_ - FrameHeader::kBytes);
        h.sequence = next_frame_++;
        h.crc = crc_;
        h.sent_ns = wall_ns();
        h.encode(p + f * frame_);
      }
      return frames * frame_;
    }
    uint64_t got = 0;
    bool waited = false;
    while (got < room && !ended_) {
      ssize_t n = ::read(fd_.get(), p + got, room - got);
      if (n > 0) {
        got += static_cast<uint64_t>(n);
        continue;
      }
      if (n == 0) {
        ended_ = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN) throw std::runtime_error("read " + name() + ": " + std::strerror(errno));
      if (got > 0 || stop.load() || !wait) break;  // what is here goes now: latency first
      auto from = Clock::now();
      waited = true;
      pollfd pfd{fd_.get(), POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(kPoll.count()));
      waited_ns_ += ns_between(from, Clock::now());
    }
    ahead_ = got == room && !waited;
    return got;
  }

 private:
  Endpoint at_;
  OwnedFd fd_;
  int flags_ = 0;
  bool ended_ = false;
  bool ahead_ = false;
  uint64_t waited_ns_ = 0;
  // The generator's frames.
  uint64_t frame_;
  uint64_t frames_per_slot_ = 0;
  uint64_t next_frame_ = 0;
  uint32_t crc_ = 0;
};

class Sender {
 public:
  Sender(const StreamOptions& o, const std::atomic<bool>& stop)
      : o_(o), stop_(stop), engine_(engine_config(o)) {}

  int run() {
    peer_ = engine_.connect(o_.connect->to_string());
    control_ = engine_.allocate(kHelloBytes + kControlBuffers * sizeof(Control), Access::kLocal);
    read_hello();
    staging_ = engine_.allocate(slots_ * slot_bytes_, Access::kLocal);
    Source source(o_, static_cast<uint8_t*>(staging_.data()), slots_, slot_bytes_);
    std::cout << "streaming " << source.name() << " to " << peer_.address() << " over "
              << to_string(peer_.transport()) << ": " << slots_ << " slots of "
              << human_size(slot_bytes_) << ", " << window_ << " in flight at most" << std::endl;
    for (int i = 0; i < kControlBuffers; ++i) post_control_receive(i);
    writes_.resize(slots_);
    run_.reserve(max_run_);
    meter_.restart();
    meter_.show_on(o_.web, "ferry stream to " + peer_.address(), engine_, std::cout);
    std::string ended_by;
    try {
      ended_by = stream(source);
      finish();
    } catch (const std::exception&) {
      summary(source, "failed");
      throw;
    }
    summary(source, ended_by);
    return 0;
  }

 private:
  // Moves the source until it ends or something stops it; says which.
  std::string stream(Source& source) {
    for (;;) {
      take_controls();
      meter_.tick();
      if (stop_.load()) return "stopped (signal)";
      if (receiver_stopped_) return "the receiver asked to stop";
      if (o_.limit_bytes != 0 && meter_.bytes >= o_.limit_bytes) return "--bytes reached";
      if (o_.duration > 0 && seconds_between(meter_.start, Clock::now()) >= o_.duration)
        return "--duration reached";
      if (!wait_for_slot(Clock::time_point::max())) continue;  // stopped meanwhile
      // A run of slots while the source is ahead and the next slot is free, neither waited for:
      // the run's first chunk never waits for a later one.
      do {
        uint64_t slot = sent_ % slots_;
        uint64_t room = slot_bytes_ - sizeof(SlotHeader);
        if (o_.limit_bytes != 0) room = std::min(room, o_.limit_bytes - meter_.bytes);
        uint64_t n = source.fill(slot_at(slot) + sizeof(SlotHeader), room, stop_, run_.empty());
        if (n == 0) break;
        add_slot(slot, n, source.ahead() ? kSenderAhead : 0);
        meter_.bytes += n;
      } while (run_.size() < max_run_ && source.ahead() &&
               (o_.limit_bytes == 0 || meter_.bytes < o_.limit_bytes) && slot_free_now());
      if (run_.empty()) {
        if (source.ended()) return "the source ended";
        continue;  // stopped, or nothing yet
      }
      post_run();
      if (meter_.due(o_.interval)) progress();
    }
  }

  void summary(const Source& source, const std::string& ended_by) {
    ReportLine line = meter_.line("stream send", "summary", false, "credit_wait");
    line.number("source_wait_ms", "source wait", static_cast<double>(source.waited_ns()) / 1e6, 1,
                "ms")
        .text("ended", "ended", ended_by);
    line.print(std::cout, o_.json);
  }

  uint8_t* slot_at(uint64_t slot) const {
    return static_cast<uint8_t*>(staging_.data()) + slot * slot_bytes_;
  }

  void read_hello() {
    Future f = peer_.recv(kHelloTag, control_, 0, kHelloBytes);
    wait(f, Clock::now() + kHelloWait, "the receiver's hello");
    check(f.status(), "receive the receiver's hello");
    Hello h;
    if (f.bytes() < sizeof h) throw std::runtime_error("the receiver's hello is too short");
    std::memcpy(&h, control_.data(), sizeof h);
    if (h.magic != kHelloMagic) throw std::runtime_error("the peer is not a ferry stream receiver");
    if (h.version != kVersion) {
      throw std::runtime_error("the receiver speaks stream version " + std::to_string(h.version) +
                               ", this sender " + std::to_string(kVersion));
    }
    if (h.slots == 0 || h.slots > kMaxSlots || h.slot_bytes <= sizeof(SlotHeader) ||
        sizeof h + h.descriptor_bytes > f.bytes()) {
      throw std::runtime_error("the receiver's hello is malformed");
    }
    slots_ = h.slots;
    slot_bytes_ = h.slot_bytes;
    window_ = o_.window > 0 ? std::min<uint64_t>(static_cast<uint64_t>(o_.window), slots_) : slots_;
    max_run_ = std::clamp<uint64_t>(window_ / 4, 1, kMaxRun);
    ring_ = Descriptor::decode(
        {static_cast<const uint8_t*>(control_.data()) + sizeof h, h.descriptor_bytes});
    if (ring_.length < slots_ * slot_bytes_)
      throw std::runtime_error("the receiver's ring is too small");
  }

  // Waits for `f` until `deadline` (a progress thread completes it; Ctrl-C is looked at by the
  // caller after).
  static void wait(const Future& f, Clock::time_point deadline, const std::string& what) {
    while (!f.test()) {
      if (Clock::now() >= deadline) throw std::runtime_error("no " + what + " in time");
      (void)f.wait(kPoll);
    }
  }

  void post_control_receive(int i) {
    controls_[i] =
        peer_.recv(kControlTag, control_, kHelloBytes + i * sizeof(Control), sizeof(Control));
  }

  // Handles the control messages that arrived, in order; waits up to `timeout` for the first.
  void take_controls(std::chrono::milliseconds timeout = 0ms) {
    // Nothing follows DONE: the receiver may be gone already, failing the receives still posted.
    while (!done_) {
      Future& f = controls_[next_control_];
      if (!f.test() && (timeout.count() == 0 || f.wait(timeout).code() == ErrorCode::kTimeout))
        return;
      timeout = 0ms;
      check(f.status(), "the receiver's control message");
      Control c;
      std::memcpy(
          &c,
          static_cast<uint8_t*>(control_.data()) + kHelloBytes + next_control_ * sizeof(Control),
          sizeof c);
      if (c.consumed > sent_) throw std::runtime_error("the receiver credits chunks never sent");
      consumed_ = std::max(consumed_, c.consumed);
      if (c.type == Control::kStop) receiver_stopped_ = true;
      if (c.type == Control::kDone) done_ = true;
      post_control_receive(next_control_);
      next_control_ = (next_control_ + 1) % kControlBuffers;
    }
  }

  // Waits until the next slot is free (its chunk consumed, its write complete). False when
  // Ctrl-C came meanwhile; throws when the receiver is gone or `deadline` passed.
  bool wait_for_slot(Clock::time_point deadline) {
    auto from = Clock::now();
    while (sent_ - consumed_ >= slots_) {
      if (stop_.load() && deadline == Clock::time_point::max()) break;
      if (Clock::now() >= deadline) throw std::runtime_error("no credit from the receiver in time");
      take_controls(kPoll);
      meter_.tick();
    }
    meter_.waited_ns += ns_between(from, Clock::now());  // back-pressure: credits
    if (sent_ - consumed_ >= slots_) return false;
    for (Future* w : writes_before_next())
      if (w != nullptr) check(w->wait(kEndWait), "write_with_imm to the receiver");
    return true;
  }

  // The writes the next slot waits for, null where none: the one that last filled it (its chunk
  // consumed, so complete or about to be), and with window_ chunks in flight, the oldest of them.
  std::array<Future*, 2> writes_before_next() {
    return {sent_ >= slots_ ? &writes_[sent_ % slots_] : nullptr,
            window_ < slots_ && sent_ >= window_ ? &writes_[(sent_ - window_) % slots_] : nullptr};
  }

  // Whether the next slot is free now: consumed, and the writes it waits for complete.
  bool slot_free_now() {
    if (sent_ - consumed_ >= slots_) return false;
    for (Future* w : writes_before_next())
      if (w != nullptr && !w->test()) return false;
    return true;
  }

  // The chunk in `slot` joins the run that post_run writes.
  void add_slot(uint64_t slot, uint64_t length, uint32_t flags) {
    SlotHeader h{static_cast<uint32_t>(length), flags, sent_};
    std::memcpy(slot_at(slot), &h, sizeof h);
    run_.push_back({&staging_, slot * slot_bytes_, &ring_, slot * slot_bytes_, sizeof h + length});
    ++sent_;
    ++meter_.chunks;
  }

  // The run as one write_with_imm: each of its slots waits on the same write.
  void post_run() {
    uint64_t first = (sent_ - run_.size()) % slots_;
    auto imm = static_cast<uint32_t>(first | (run_.size() - 1) << kImmRunShift);
    Future f = peer_.write_with_imm(run_, imm);
    for (uint64_t i = 0; i < run_.size(); ++i) writes_[(first + i) % slots_] = f;
    run_.clear();
  }

  // The end-of-stream chunk, then the receiver's confirmation.
  void finish() {
    auto deadline = Clock::now() + kEndWait;
    while (!wait_for_slot(deadline)) {
    }
    add_slot(sent_ % slots_, 0, kEndOfStream);
    post_run();
    while (!done_) {
      if (Clock::now() >= deadline)
        throw std::runtime_error("the receiver did not confirm the end of the stream");
      take_controls(kPoll);
    }
    for (uint64_t i = 0; i < std::min(sent_, slots_); ++i)
      check(writes_[i].wait(kEndWait), "write_with_imm to the receiver");
  }

  void progress() {
    meter_.line("stream send", "progress", true, "credit_wait").print(std::cout, o_.json);
  }

  const StreamOptions& o_;
  const std::atomic<bool>& stop_;
  Engine engine_;
  Peer peer_;
  Region control_, staging_;
  Descriptor ring_;
  uint64_t slots_ = 0, slot_bytes_ = 0, window_ = 0;
  Future controls_[kControlBuffers];
  int next_control_ = 0;
  std::vector<Future> writes_;
  std::vector<Transfer> run_;  // slots filled, not yet written
  uint64_t max_run_ = 1;
  uint64_t sent_ = 0, consumed_ = 0;
  bool receiver_stopped_ = false, done_ = false;
  Meter meter_;
};

// ---------------------------------------------------------------------------------------------
// Receiver

class Receiver {
 public:
  Receiver(const StreamOptions& o, const std::atomic<bool>& stop)
      : o_(o),
        stop_(stop),
        sink_at_(endpoint_value("--sink", o.sink, Role::kSink)),
        out_(sink_at_.kind == Endpoint::Kind::kStdio ? std::cerr : std::cout),
        engine_(engine_config(o)),
        checker_(static_cast<uint64_t>(o.late_ms * 1e6)) {}

  ~Receiver() {
    if (sink_.get() >= 0) ::fcntl(sink_.get(), F_SETFL, sink_flags_);
  }
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  int run() {
    out_ << "listening on " << engine_.address() << std::endl;
    while (!peer_.valid()) {
      if (stop_.load()) return 0;
      if (auto p = engine_.accept(kPoll)) peer_ = *p;
    }
    out_ << "sender " << peer_.address() << " connected over " << to_string(peer_.transport())
         << std::endl;
    uint64_t slots = static_cast<uint64_t>(o_.slots);
    ring_ = engine_.allocate(slots * o_.slot_bytes, Access::kRemoteWrite);
    control_ = engine_.allocate(kHelloBytes + kControlBuffers * sizeof(Control), Access::kLocal);
    if (sink_at_.kind != Endpoint::Kind::kDiscard) {
      sink_ = open_endpoint(sink_at_, true);
      sink_flags_ = ::fcntl(sink_.get(), F_GETFL);
      ::fcntl(sink_.get(), F_SETFL, sink_flags_ | O_NONBLOCK);
    }
    send_hello();
    arrived_.assign(slots, false);
    arrived_ns_.assign(slots, 0);
    events_.resize(slots);
    credit_every_ = std::max<uint64_t>(1, slots / 4);
    gathering_.emplace(std::chrono::microseconds(o_.gather_us), slots);
    meter_.restart();
    meter_.show_on(o_.web, "ferry stream from " + peer_.address(), engine_, out_);
    try {
      receive();
    } catch (const std::exception& e) {
      (void)summary();
      if (peer_.connected()) throw;
      throw std::runtime_error("the sender " + peer_.address() +
                               " went away before the end of its stream (" + e.what() + ")");
    }
    return summary();
  }

 private:
  uint8_t* slot_at(uint64_t slot) const {
    return static_cast<uint8_t*>(ring_.data()) + slot * o_.slot_bytes;
  }

  // Hands chunks to the sink in order until the end of the stream (or a stop the sender did not
  // answer in time), returning credits.
  void receive() {
    const uint64_t slots = arrived_.size();
    bool ended = false;
    Clock::time_point stop_deadline = Clock::time_point::max();
    while (!ended) {
      if (stop_.load() && stop_deadline == Clock::time_point::max()) {
        send_control(Control::kStop);
        stop_deadline = Clock::now() + kStopWait;
      }
      if (Clock::now() >= stop_deadline) {
        std::cerr << "ferry stream: the sender did not end its stream within "
                  << std::chrono::duration_cast<std::chrono::seconds>(kStopWait).count()
                  << " s of the stop" << std::endl;
        return;
      }
      // Every notification already queued, then one pass over the slots and one credit, rather
      // than a credit per chunk.
      uint64_t arrivals = take_arrivals();
      if (arrivals == 0 && !peer_.connected()) throw std::runtime_error("its connection closed");
      auto pass_start = Clock::now();
      while (!ended && arrived_[consumed_ % slots]) ended = consume(consumed_ % slots);
      auto pass_end = Clock::now();
      // A credit per quarter ring, not one per pass (a receiver that keeps up would send one for
      // nearly every chunk). None is owed sooner: the sender is short of slots only while more
      // than three quarters of the ring is sent and not consumed, and those chunks bring it.
      if (consumed_ - credited_ >= credit_every_ || (ended && consumed_ > credited_))
        send_control(ended ? Control::kDone : Control::kCredit);
      meter_.tick();
      if (meter_.due(o_.interval)) progress();
      if (ended) continue;
      auto pause =
          gathering_->after_pass(pass_end, arrivals, ahead_in_a_row_, pass_end - pass_start);
      if (pause.count() > 0) {
        auto from = Clock::now();
        std::this_thread::sleep_for(pause);
        gathered_ns_ += ns_between(from, Clock::now());
      }
    }
  }

  // Marks the slots that notifications name: those queued, waiting up to kPoll for the first.
  // Returns how many.
  uint64_t take_arrivals() {
    uint64_t arrivals = 0;
    for (std::size_t got = engine_.next_imms(events_, kPoll); got > 0;
         got = got < events_.size() ? 0 : engine_.next_imms(events_, 0ms)) {
      for (const ImmEvent& ev : std::span(events_).first(got)) {
        if (ev.peer.valid() && ev.peer.engine_id() != peer_.engine_id()) continue;
        uint64_t first = ev.imm & (kMaxSlots - 1);
        uint64_t run = (ev.imm >> kImmRunShift) + 1;
        if (first >= arrived_.size() || run > arrived_.size()) {
          throw std::runtime_error("the sender named a run of " + std::to_string(run) +
                                   " from slot " + std::to_string(first) + " in a ring of " +
                                   std::to_string(arrived_.size()));
        }
        uint64_t now = wall_ns();
        for (uint64_t i = 0; i < run; ++i) {
          arrived_[(first + i) % arrived_.size()] = true;
          arrived_ns_[(first + i) % arrived_.size()] = now;
        }
        arrivals += run;
      }
    }
    return arrivals;
  }

  void send_hello() {
    std::vector<uint8_t> desc = ring_.descriptor().encode();
    Hello h;
    h.descriptor_bytes = static_cast<uint16_t>(desc.size());
    h.slots = static_cast<uint32_t>(o_.slots);
    h.slot_bytes = static_cast<uint32_t>(o_.slot_bytes);
    if (sizeof h + desc.size() > kHelloBytes)
      throw std::logic_error("the ring's descriptor does not fit the hello");
    auto* p = static_cast<uint8_t*>(control_.data());
    std::memcpy(p, &h, sizeof h);
    std::memcpy(p + sizeof h, desc.data(), desc.size());
    check(peer_.send(kHelloTag, control_, 0, sizeof h + desc.size()).wait(kHelloWait),
          "send the hello to the sender");
  }

  // Hands the chunk in `slot` to the sink; true at the end of the stream.
  bool consume(uint64_t slot) {
    SlotHeader h;
    std::memcpy(&h, slot_at(slot), sizeof h);
    if (h.sequence != consumed_) {
      throw std::runtime_error("slot " + std::to_string(slot) + " holds chunk " +
                               std::to_string(h.sequence) + " where chunk " +
                               std::to_string(consumed_) + " was due");
    }
    if (h.length > o_.slot_bytes - sizeof h)
      throw std::runtime_error("a chunk claims more bytes than its slot holds");
    ahead_in_a_row_ = (h.flags & kSenderAhead) != 0 ? ahead_in_a_row_ + 1 : 0;
    const uint8_t* payload = slot_at(slot) + sizeof h;
    if (o_.verify) checker_.feed(payload, h.length, arrived_ns_[slot]);
    if (sink_.get() >= 0) {
      meter_.waited_ns += write_all(sink_.get(), payload, h.length, never_stop_);
      if (o_.sink_rate > 0) {
        // A slow sink on purpose: no faster than --sink-rate since the first byte.
        auto due = meter_.start +
                   std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                       static_cast<double>(meter_.bytes + h.length) / o_.sink_rate));
        auto now = Clock::now();
        if (due > now) {
          std::this_thread::sleep_until(due);
          meter_.waited_ns += ns_between(now, Clock::now());
        }
      }
    }
    meter_.bytes += h.length;
    ++meter_.chunks;
    arrived_[slot] = false;
    ++consumed_;
    return (h.flags & kEndOfStream) != 0;
  }

  void send_control(Control::Type type) {
    Future& previous = sends_[next_send_];
    if (sends_made_++ >= kControlBuffers)
      check(previous.wait(kEndWait), "send a control message to the sender");
    Control c;
    c.type = type;
    c.consumed = consumed_;
    uint64_t offset = kHelloBytes + next_send_ * sizeof(Control);
    std::memcpy(static_cast<uint8_t*>(control_.data()) + offset, &c, sizeof c);
    previous = peer_.send(kControlTag, control_, offset, sizeof c);
    next_send_ = (next_send_ + 1) % kControlBuffers;
    credited_ = consumed_;
    if (type == Control::kDone) check(previous.wait(kEndWait), "confirm the end of the stream");
  }

  ReportLine line(const char* kind, bool since_last) {
    ReportLine r = meter_.line("stream receive", kind, since_last, "sink_wait");
    r.number("gather_ms", "gathering", static_cast<double>(gathered_ns_) / 1e6, 1, "ms")
        .count("credits", "credits", sends_made_);
    if (o_.verify) {
      const LatencyHistogram& l = checker_.latency();
      r.count("frames", "frames", checker_.frames())
          .count("lost", "lost", checker_.lost())
          .count("bad_crc", "bad CRC", checker_.bad_crc())
          .count("reordered", "reordered", checker_.reordered())
          .count("late", "late", checker_.late())
          .number("latency_p50_us", "latency p50", static_cast<double>(l.percentile(0.5)) / 1e3, 1,
                  "us")
          .number("latency_p99_us", "p99", static_cast<double>(l.percentile(0.99)) / 1e3, 1, "us")
          .number("latency_max_us", "max", static_cast<double>(l.max()) / 1e3, 1, "us");
    }
    return r;
  }

  void progress() { line("progress", true).print(out_, o_.json); }

  int summary() {
    ReportLine r = line("summary", false);
    std::string problem;
    if (o_.verify) {
      if (!checker_.broken().empty()) {
        problem = checker_.broken();
      } else if (checker_.lost() + checker_.bad_crc() + checker_.reordered() > 0) {
        problem = "frames lost, damaged or out of order";
      } else if (checker_.mid_frame()) {
        problem = "the stream ended inside a frame";
      }
      r.text("problem", "problem", problem.empty() ? "none" : problem);
    }
    r.print(out_, o_.json);
    if (problem.empty()) return 0;
    std::cerr << "ferry stream: " << problem << std::endl;
    return 1;
  }

  const StreamOptions& o_;
  const std::atomic<bool>& stop_;
  const std::atomic<bool> never_stop_{false};  // the sink gets every byte, even after Ctrl-C
  Endpoint sink_at_;
  std::ostream& out_;
  Engine engine_;
  Peer peer_;
  Region ring_, control_;
  OwnedFd sink_;
  int sink_flags_ = 0;
  std::vector<bool> arrived_;
  std::vector<uint64_t> arrived_ns_;
  std::vector<ImmEvent> events_;  // what next_imms took, a ring's worth at most per call
  std::optional<Gathering> gathering_;
  uint64_t ahead_in_a_row_ = 0;  // the newest chunks consumed that the sender marked ahead
  uint64_t gathered_ns_ = 0;     // paused between passes, in all
  uint64_t consumed_ = 0, credited_ = 0, credit_every_ = 1;
  Future sends_[kControlBuffers];
  int next_send_ = 0;
  uint64_t sends_made_ = 0;  // credits, and the stop or the end's confirmation
  FrameChecker checker_;
  Meter meter_;
};

}  // namespace

void add_stream_options(CLI::App& app, StreamOptions& o) {
  auto* listen = add(app, "--listen", o.listen, address(true),
                     "Receive: wait for one sender on HOST:PORT (port 0: a free one)")
                     ->type_name("HOST:PORT");
  auto* connect =
      add(app, "--connect", o.connect, address(false), "Send: to the receiver at HOST:PORT")
          ->type_name("HOST:PORT");
  listen->excludes(connect);
  app.add_option_function<std::string>(
         "--source",
         [&o](const std::string& v) {
           (void)endpoint_value("--source", v, Role::kSource);
           o.source = v;
         },
         "Send: what to read: tcp:HOST:PORT or unix:PATH (connects, e.g. to ferry emulate), a "
         "file, - (standard input), or gen (frames made here, as fast as they go)")
      ->type_name("SOURCE")
      ->default_str(o.source)
      ->needs(connect);
  app.add_option_function<std::string>(
         "--sink",
         [&o](const std::string& v) {
           (void)endpoint_value("--sink", v, Role::kSink);
           o.sink = v;
         },
         "Receive: where the stream goes: a file, - (standard output), tcp:HOST:PORT or "
         "unix:PATH (connects), or discard")
      ->type_name("SINK")
      ->default_str(o.sink)
      ->needs(listen);
  add(app, "--window", o.window, count(1, 1024),
      "Send: chunks in flight at most (default: the receiver's slots); a deeper ring with a "
      "window keeps the receiver's credits off the critical path")
      ->type_name("N");
  add(app, "--slots", o.slots, count(2, 1024), "Receive: slots in the ring")
      ->type_name("N")
      ->default_str(std::to_string(o.slots));
  add(app, "--slot-bytes", o.slot_bytes, bytes(4096, 1u << 30),
      "Receive: bytes per slot, its 16-byte header included")
      ->type_name("SIZE")
      ->default_str(human_size(o.slot_bytes));
  add(app, "--frame", o.frame,
      bytes(FrameHeader::kBytes + 1, FrameHeader::kBytes + FrameHeader::kMaxPayload),
      "Send, with --source gen: bytes per generated frame, its header included")
      ->type_name("SIZE")
      ->default_str(human_size(o.frame));
  add(app, "--bytes", o.limit_bytes, bytes(1, kNoMaxSize), "Send: stop after this many bytes")
      ->type_name("SIZE");
  app.add_option("--duration", o.duration, "Send: stop after this many seconds")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 1e6));
  app.add_flag("--verify", o.verify,
               "Receive: check the frames of ferry emulate or gen (sequence, CRC32C, latency)");
  app.add_option("--late-ms", o.late_ms, "Receive, --verify: frames slower than this are late")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  add(app, "--gather-us", o.gather_us, count(0, kMaxGatherMicroseconds),
      "Receive: while the sender has more ready than the transport takes, pause between "
      "passes over the ring for a quarter ring's or 12 chunks' time, whichever is less, so "
      "that one wake-up takes many; at most this long (the latency it may add; 0: never pause)")
      ->type_name("US")
      ->default_str(std::to_string(o.gather_us))
      ->needs(listen);
  add(app, "--sink-rate", o.sink_rate, rate_value,
      "Receive: write to the sink no faster than this (a slow sink; decimal units)")
      ->type_name("RATE");
  app.add_option("--interval", o.interval, "Seconds between progress lines (0: none)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  add(app, "--transport", o.transport, transport_value, "auto or one transport by name")
      ->type_name("NAME")
      ->default_str(o.transport);
  add(app, "--web", o.web, address(true),
      "Serve a live gauge of the stream's rate on HOST:PORT (a page for the browser)")
      ->type_name("HOST:PORT");
  app.add_option("--secret", o.secret, "Shared secret for peer authentication");
  app.add_flag("--json", o.json, "Progress and summary as one JSON object per line");
}

void check_stream_options(const StreamOptions& o) {
  if (!o.listen && !o.connect) {
    throw CLI::ValidationError("--listen/--connect",
                               "give --listen HOST:PORT to receive or --connect HOST:PORT to send");
  }
  if (o.listen && static_cast<uint64_t>(o.slots) * o.slot_bytes > physical_memory()) {
    throw CLI::ValidationError("--slots", "a ring of " + std::to_string(o.slots) + " slots of " +
                                              human_size(o.slot_bytes) +
                                              " is more than this host's memory");
  }
}

int run_stream(const StreamOptions& o) {
  const std::atomic<bool>& stop = stop_on_signals();
  if (o.listen) return Receiver(o, stop).run();
  return Sender(o, stop).run();
}

}  // namespace ferry::cli
