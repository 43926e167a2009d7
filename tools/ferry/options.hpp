// `ferry bench` options: the flags, the values each accepts, and the checks made before
// anything connects or starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace ferry::cli {

struct Address {
  std::string host;  // an IPv6 host without its brackets
  uint16_t port = 0;
  std::string to_string() const;  // "host:port", "[v6]:port"
};

std::vector<uint64_t> default_sizes();  // 4 KiB .. 64 MiB in x4 steps

struct BenchOptions {
  std::optional<Address> listen;   // target mode: serve initiators here
  std::optional<Address> connect;  // initiator mode: the target's address
  bool once = false;               // target mode: serve one initiator, exit with its outcome
  std::vector<std::string> ops = {"write", "read"};
  std::vector<uint64_t> sizes = default_sizes();
  int batch = 1;
  int concurrency = 1;
  std::string transport = "auto";  // auto (routing decides), or one transport's name
  bool allocate = false;           // --memory allocate: both sides' buffers from Engine::allocate
  std::optional<int> iters;        // unset: chosen per size
  bool json = false;
  std::string secret;
  // Unset: the engine's default (ferry::Config).
  std::optional<bool> metrics;  // Config::metrics
  std::optional<uint64_t> slice_bytes;
  std::optional<uint64_t> stripe_bytes;
  // Transport settings (Engine::settings), from --set NAME=VALUE and each one's own flag
  // (--tcp.streams 4), in order, after the flags above.
  std::vector<std::pair<std::string, std::string>> settings;
  int threads = 1;
  std::optional<int> busy_poll_us;
  std::optional<int> wait_spin_us;
  bool prepared = false;   // write, read, write_imm and ping-pongs post batches prepared once
  bool same_area = false;  // every op in flight (and the target's receives) uses the first area
  // write, read: batches of this many entries of each size at scattered offsets, each run
  // beside one contiguous transfer of the same bytes (ratio and submission cost printed).
  std::optional<int> scatter;
  std::optional<Address> web;  // initiator: a live gauge of the rate on HOST:PORT
};

// Value parsers shared by the commands: each throws CLI::ValidationError naming `flag`.
constexpr uint64_t kNoMaxSize = ~uint64_t{0};
// "64K", "64k", "64KB", "64KiB", "1G", "4096", "4096B": binary units, as the tables print
// sizes. nullopt: not a size; kNoMaxSize: more than 64 bits hold.
std::optional<uint64_t> parse_size(std::string_view text);
// A byte count of at least `lo` (and at most `hi`) that fits this host's memory.
uint64_t size_value(const std::string& flag, const std::string& text, uint64_t lo, uint64_t hi);
int int_value(const std::string& flag, const std::string& text, int lo, int hi);
// HOST:PORT, [IPv6]:PORT, a host name. A listener may take port 0 (any free one) and an empty
// host (every interface).
Address address_value(const std::string& flag, const std::string& text, bool listen);
// "auto" or the name of a transport built in.
std::string transport_value(const std::string& flag, const std::string& text);

// Registers the flags of `ferry bench`; each refuses a bad value (CLI::ValidationError naming
// the flag) while the command line is parsed.
void add_bench_options(CLI::App& bench, BenchOptions& o);
// The checks between flags, after parsing: what the initiator's buffers need against this
// host's memory. Throws CLI::ValidationError.
void check_bench_options(const BenchOptions& o);

// Bytes of the buffer each side registers (the initiator has two of them).
uint64_t buffer_bytes(const BenchOptions& o);
uint64_t physical_memory();
// "4K", "64M", "1000003": binary units, as --sizes takes them.
std::string human_size(uint64_t n);
// "23.4 GiB"
std::string human_memory(uint64_t n);

}  // namespace ferry::cli
