// `ferry bench`: the two-process transfer benchmark.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::cli {

struct BenchOptions {
  std::string listen;   // target mode: accept one initiator here
  std::string connect;  // initiator mode: the target's host:port
  std::string op = "write,read";
  std::vector<uint64_t> sizes;  // empty: 4 KiB .. 64 MiB in x4 steps
  int batch = 1;
  int concurrency = 1;
  std::string transport = "auto";  // auto (best present), tcp, verbs
  int iters = 0;                   // 0: chosen per size
  bool json = false;
  std::string secret;
  int streams = 0;            // 0: engine default
  int qps = 0;                // 0: engine default
  uint64_t slice_bytes = 0;   // 0: engine default
  uint64_t stripe_bytes = 0;  // 0: engine default
  int threads = 1;
  int busy_poll_us = -1;  // -1: engine default
  int wait_spin_us = -1;
  bool quiet_target = false;
  bool prepared = false;   // write, read, write_imm and pingpong post batches prepared once
  bool same_area = false;  // write, read, write_imm: every op in flight uses the first area
};

int run_bench(const BenchOptions& options, const std::string& self_path);

}  // namespace ferry::cli
