// `ferry stream`'s sender: its source (a descriptor or generated frames) and the writes into
// the receiver's ring.
#include "stream_sender.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "endpoints.hpp"
#include "ferry/ferry.hpp"
#include "frames.hpp"
#include "options.hpp"
#include "stream_wire.hpp"

namespace ferry::cli::stream {
namespace {

// While the sender is ahead it writes up to this many slots as one write_with_imm, at most a
// quarter of its window: one notification, one completion and (over verbs) one doorbell for
// them all. Over verbs in the Soft-RoCE guest, where each costs the emulated CPU, a stream of
// 64 KiB chunks against ferry bench write (16 in flight) went from 0.81-1.00x, 1.25x the
// bench's CPU time per byte, to 0.83-1.16x (median 1.00), 1.10x the CPU time, in five rounds.
constexpr uint64_t kMaxRun = 4;

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

}  // namespace

int run_sender(const StreamOptions& o, const std::atomic<bool>& stop) {
  return Sender(o, stop).run();
}

}  // namespace ferry::cli::stream
