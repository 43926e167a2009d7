#include "emulate.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "flags.hpp"
#include "frames.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A frame that starts this much after its time counts as late (the reader held the emulator
// back, or this host could not keep the pace).
constexpr auto kLateAfter = std::chrono::milliseconds(1);

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A decimal number of `text` from 0 to `hi`; `-1` when it is none.
double decimal(const std::string& text, double hi) {
  try {
    std::size_t used = 0;
    double v = std::stod(text, &used);
    if (used == text.size() && v >= 0 && v <= hi) return v;
  } catch (const std::exception&) {
  }
  return -1;
}

double fraction_value(const std::string& flag, const std::string& text) {
  double v = decimal(text, 1);
  if (v < 0) throw CLI::ValidationError(flag, "'" + text + "' must be between 0 and 1");
  return v;
}

double seconds_value(const std::string& flag, const std::string& text) {
  double v = decimal(text, 1e6);
  if (v < 0) {
    throw CLI::ValidationError(flag, "'" + text + "' must be a number of seconds (0 to 1000000)");
  }
  return v;
}

// What the emulator did since it started, or since the last progress line.
struct Tally {
  uint64_t frames = 0, bytes = 0, late = 0;
  uint64_t blocked_ns = 0;  // time the reader kept the emulator waiting
  uint64_t max_lag_ns = 0;  // the latest a frame started after its time
};

// `t` over `seconds` (since the last line, or in all), at `elapsed` since the start.
void report(const char* kind, const Tally& t, double seconds, double elapsed, const Tally& total,
            bool json, std::ostream& out) {
  ReportLine line("emulate", kind, elapsed);
  line.number("mb_per_s", "", seconds > 0 ? static_cast<double>(t.bytes) / seconds / 1e6 : 0, 1,
              "MB/s")
      .count("frames", "frames", t.frames)
      .count("total_bytes", "total", total.bytes, "bytes")
      .count("late", "late", t.late)
      .number("max_lag_ms", "max lag", static_cast<double>(t.max_lag_ns) / 1e6, 3, "ms")
      .number("reader_blocked_ms", "reader kept us waiting",
              static_cast<double>(t.blocked_ns) / 1e6, 1, "ms");
  line.print(out, json);
}

}  // namespace

double rate_value(const std::string& flag, const std::string& text) {
  if (text == "max") return 0;
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit;
  for (std::size_t i = used; i < text.size(); ++i)
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  if (unit.ends_with("/s")) unit.resize(unit.size() - 2);
  if (unit.ends_with('b')) unit.pop_back();
  double scale = unit.empty()  ? 1
                 : unit == "k" ? 1e3
                 : unit == "m" ? 1e6
                 : unit == "g" ? 1e9
                 : unit == "t" ? 1e12
                               : -1;
  if (used == 0 || scale < 0 || !(v >= 0)) {
    throw CLI::ValidationError(
        flag,
        "'" + text + "' is not a rate (use bytes per second with K, M, G: 2GB/s, 500MB/s, or max)");
  }
  return v * scale;
}

void add_emulate_options(CLI::App& app, EmulateOptions& o) {
  auto* listen = app.add_option_function<std::string>(
                        "--listen",
                        [&o](const std::string& v) {
                          (void)endpoint_value("--listen", v, Role::kListen);
                          o.listen = v;
                        },
                        "Serve one reader on tcp:HOST:PORT or unix:PATH (port 0: a free one)")
                     ->type_name("ENDPOINT")
                     ->default_str(o.listen);
  app.add_option_function<std::string>(
         "--out",
         [&o](const std::string& v) {
           if (endpoint_value("--out", v, Role::kSink).kind == Endpoint::Kind::kDiscard)
             throw CLI::ValidationError("--out",
                                        "'discard' is no reader (use a file or /dev/null)");
           o.out = v;
         },
         "Write to this instead: a file, - (standard output, a pipe), tcp:HOST:PORT or unix:PATH "
         "(connects)")
      ->type_name("SINK")
      ->excludes(listen);
  add(app, "--rate", o.rate, rate_value, "Bytes per second (decimal units: 2GB/s), or max")
      ->type_name("RATE")
      ->default_str("max");
  add(app, "--frame", o.frame,
      bytes(FrameHeader::kBytes + 1, FrameHeader::kBytes + FrameHeader::kMaxPayload),
      "Bytes per frame, its 32-byte header included")
      ->type_name("SIZE")
      ->default_str(human_size(o.frame));
  add(app, "--jitter", o.jitter, fraction_value,
      "Each burst starts up to this share of its period early or late (0 to 1)")
      ->type_name("FRACTION")
      ->default_str("0");
  add(app, "--burst", o.burst, count(1, 1 << 20), "Frames sent back to back, then a pause")
      ->type_name("N")
      ->default_str("1");
  add(app, "--frames", o.frames, bytes(1, kNoMaxSize), "Stop after this many frames")
      ->type_name("N");
  add(app, "--duration", o.duration, seconds_value, "Stop after this many seconds")
      ->type_name("SECONDS");
  add(app, "--interval", o.interval, seconds_value, "Seconds between progress lines (0: none)")
      ->type_name("SECONDS")
      ->default_str("1");
  app.add_flag("--json", o.json, "Progress and summary as one JSON object per line");
}

int run_emulate(const EmulateOptions& o) {
  const std::atomic<bool>& stop = stop_on_signals();
  Endpoint sink_at = o.out.empty() ? endpoint_value("--listen", o.listen, Role::kListen)
                                   : endpoint_value("--out", o.out, Role::kSink);
  // Reports go where the frames do not.
  std::ostream& out = sink_at.kind == Endpoint::Kind::kStdio ? std::cerr : std::cout;
  OwnedFd fd;
  if (o.out.empty()) {
    Endpoint bound;
    OwnedFd listener = listen_endpoint(sink_at, bound);
    out << "listening on " << bound.to_string() << std::endl;
    fd = accept_one(listener.get(), stop);
    if (fd.get() < 0) return 0;  // stopped before a reader came
  } else {
    fd = open_endpoint(sink_at, true);
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);

  // Payloads are windows into one random block, at an offset that moves with the sequence
  // number: no two neighbouring frames carry the same bytes.
  const std::size_t payload = o.frame - FrameHeader::kBytes;
  std::vector<uint8_t> block(payload * 2 + 4096);
  std::mt19937_64 random(42);
  for (auto& b : block) b = static_cast<uint8_t>(random());
  std::vector<uint8_t> frame(o.frame);
  std::uniform_real_distribution<double> jitter(-o.jitter, o.jitter);

  const auto period = o.rate > 0
                          ? std::chrono::duration<double>(static_cast<double>(o.frame) / o.rate)
                          : std::chrono::duration<double>(0);
  const auto start = Clock::now();
  auto last_report = start;
  Tally total, since;
  bool reader_gone = false;
  std::string gone_why;
  Clock::time_point due = start;
  for (uint64_t seq = 0; !stop.load(); ++seq) {
    if (o.frames != 0 && seq >= o.frames) break;
    auto now = Clock::now();
    if (o.duration > 0 && seconds_between(start, now) >= o.duration) break;
    if (period.count() > 0) {
      if (seq % static_cast<uint64_t>(o.burst) == 0) {
        auto burst_period = period * o.burst;
        uint64_t burst_index = seq / static_cast<uint64_t>(o.burst);
        due = start +
              std::chrono::duration_cast<Clock::duration>(
                  burst_period * static_cast<double>(burst_index) + burst_period * jitter(random));
        if (due > now) std::this_thread::sleep_until(due);
        now = Clock::now();
      }
      if (now > due) {
        auto lag = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - due).count());
        since.max_lag_ns = std::max(since.max_lag_ns, lag);
        total.max_lag_ns = std::max(total.max_lag_ns, lag);
        if (now - due > kLateAfter) {
          ++since.late;
          ++total.late;
        }
      }
    }
    FrameHeader h;
    h.length = static_cast<uint32_t>(payload);
    h.sequence = seq;
    const uint8_t* body = block.data() + (seq * 4099) % (block.size() - payload);
    std::copy(body, body + payload, frame.data() + FrameHeader::kBytes);
    h.crc = crc32c(body, payload);
    h.sent_ns = wall_ns();
    h.encode(frame.data());
    try {
      uint64_t waited = write_all(fd.get(), frame.data(), frame.size(), stop);
      since.blocked_ns += waited;
      total.blocked_ns += waited;
    } catch (const std::exception& e) {
      reader_gone = true;
      gone_why = e.what();
      break;
    }
    ++since.frames;
    ++total.frames;
    since.bytes += frame.size();
    total.bytes += frame.size();
    now = Clock::now();
    if (o.interval > 0 && seconds_between(last_report, now) >= o.interval) {
      report("progress", since, seconds_between(last_report, now), seconds_between(start, now),
             total, o.json, out);
      since = Tally{};
      last_report = now;
    }
  }
  double elapsed = seconds_between(start, Clock::now());
  report("summary", total, elapsed, elapsed, total, o.json, out);
  if (reader_gone) {
    std::cerr << "ferry emulate: the reader went away after " << total.frames << " frames ("
              << gone_why << ")" << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace ferry::cli
