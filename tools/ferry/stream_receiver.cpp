// `ferry stream`'s receiver: its ring, the sink and the credits back to the sender.
#include "stream_receiver.hpp"

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "endpoints.hpp"
#include "ferry/ferry.hpp"
#include "frames.hpp"
#include "gather.hpp"
#include "report.hpp"
#include "stream_wire.hpp"

namespace ferry::cli::stream {
namespace {

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
    if (type == Control::kDone) {
      // The stream is whole here; DONE tells the sender so. A sender that took it and left at
      // once may close before DONE's acknowledgement reaches us (the close and the
      // acknowledgement travel on different connections): that ends nothing here.
      Status s = previous.wait(kEndWait);
      if (s.code() != ErrorCode::kPeerLost) check(s, "confirm the end of the stream");
    }
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

int run_receiver(const StreamOptions& o, const std::atomic<bool>& stop) {
  return Receiver(o, stop).run();
}

}  // namespace ferry::cli::stream
