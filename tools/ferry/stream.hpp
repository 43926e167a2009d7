// `ferry stream`: moves a byte stream without stopping into a ring of registered slots at the
// receiver. The sender fills a slot from its source and writes it with write_with_imm (the
// immediate names the slot); the receiver hands slots to its sink in order and returns credits,
// so a slot is never overwritten before it was consumed. A slow sink slows the source.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace ferry::cli {

struct StreamOptions {
  std::optional<Address> listen;   // receiver
  std::optional<Address> connect;  // sender
  std::string source = "gen";      // sender: what it reads
  std::string sink = "discard";    // receiver: where the stream goes
  int slots = 16;                  // receiver: the ring's slots...
  uint64_t slot_bytes = 1 << 20;   // ...and each one's size, its 16-byte header included
  uint64_t frame = 64 << 10;       // sender, gen: bytes per generated frame
  int window = 0;                  // sender: writes in flight at most (0: the ring's slots)
  uint64_t limit_bytes = 0;        // sender: stop after this many (0: at the source's end)
  double duration = 0;             // sender: stop after this many seconds (0: no limit)
  bool verify = false;             // receiver: check emulator frames (sequence, CRC, latency)
  double late_ms = 1;              // receiver: a frame slower than this counts as late
  double sink_rate = 0;            // receiver: write to the sink no faster (bytes/s; 0: no cap)
  double interval = 1;             // seconds between progress lines (0: none)
  std::optional<Address> web;      // a live gauge of the stream's rate on HOST:PORT
  std::string transport = "auto";
  std::string secret;
  bool json = false;
  // Receiver: the longest pause between passes over the ring while the sender is ahead
  // (gather.hpp sizes each pause to the rate chunks come at). Over verbs in the Soft-RoCE guest,
  // where a 64 KiB chunk comes every 1.1 ms, 12 chunks' time is 13 ms; 10 ms still gathers 9,
  // and latency matters little where the source waits for the transport anyway.
  int gather_us = 10'000;
};

void add_stream_options(CLI::App& app, StreamOptions& o);
// The checks between flags, after parsing. Throws CLI::ValidationError.
void check_stream_options(const StreamOptions& o);
int run_stream(const StreamOptions& o);

}  // namespace ferry::cli
