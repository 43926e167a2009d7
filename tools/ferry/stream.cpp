#include "stream.hpp"

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdint>
#include <string>

#include "emulate.hpp"  // rate_value
#include "endpoints.hpp"
#include "flags.hpp"
#include "frames.hpp"
#include "options.hpp"
#include "stream_receiver.hpp"
#include "stream_sender.hpp"

namespace ferry::cli {
namespace {

constexpr int kMaxGatherMicroseconds = 1'000'000;

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
  if (o.listen) return stream::run_receiver(o, stop);
  return stream::run_sender(o, stop);
}

}  // namespace ferry::cli
