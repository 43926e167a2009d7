// `ferry emulate`: plays an instrument. Frames (frames.hpp) at a set rate, with optional jitter
// and bursts, to one reader of a socket, a pipe or a file; reports what it sent and when the
// reader kept it waiting.
#pragma once

#include <cstdint>

#include "endpoints.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace ferry::cli {

struct EmulateOptions {
  std::string listen = "tcp:127.0.0.1:9000";  // serve one reader here...
  std::string out;                            // ...or write to this sink instead
  double rate = 0;                            // bytes per second; 0: as fast as the reader takes
  uint64_t frame = 64 << 10;                  // bytes per frame, its header included
  double jitter = 0;                          // each burst moves by up to this share of its period
  int burst = 1;                              // frames sent back to back
  uint64_t frames = 0;                        // stop after this many (0: no limit)
  double duration = 0;                        // stop after this many seconds (0: no limit)
  double interval = 1;                        // seconds between progress lines (0: none)
  bool json = false;
};

// "2GB/s", "500MB/s", "1.5G", "800K/s", "max": decimal units (a GB is 10^9 bytes), as link
// speeds are quoted. 0 for "max". Throws CLI::ValidationError naming `flag`.
double rate_value(const std::string& flag, const std::string& text);

void add_emulate_options(CLI::App& app, EmulateOptions& o);
int run_emulate(const EmulateOptions& o);

}  // namespace ferry::cli
