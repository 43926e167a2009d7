#include "options.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <limits>
#include <string_view>

#include "ferry/ferry.hpp"
#include "flags.hpp"

namespace ferry::cli {
namespace {

// The engine refuses other values when it starts (ferry::Config's checks); saying so here
// names the flag, before anything starts.
constexpr int kMaxThreads = 64;
constexpr uint64_t kMinSlice = 4 << 10;
constexpr uint64_t kMaxSlice = 64 << 20;
// The bench's own bounds: enough for any measurement, small enough to fail early.
constexpr int kMaxIters = 1'000'000;
constexpr int kMaxBatch = 16384;
constexpr int kMaxConcurrency = 1024;
constexpr int kMaxInFlight = 16384;  // --batch x --concurrency
constexpr int kMaxScatter = 1'000'000;
constexpr int kMaxMicroseconds = 1'000'000;
constexpr uint64_t kNoMax = kNoMaxSize;

const std::vector<std::string> kOps = {"write", "read",     "write_imm",
                                       "send",  "pingpong", "imm_pingpong"};
const char* const kOpList = "write, read, write_imm, send, pingpong or imm_pingpong";

[[noreturn]] void bad(const std::string& flag, const std::string& why) {
  throw CLI::ValidationError(flag, why);
}

std::string in_quotes(std::string_view text) { return "'" + std::string(text) + "'"; }

// A transport setting from `flag`, checked here against its declaration (the engine would
// refuse it later, without naming the flag).
void take_setting(BenchOptions& o, const std::string& flag, std::string name, std::string value) {
  Config scratch;
  try {
    Engine::set(scratch, name, value);
  } catch (const Error& e) {
    bad(flag, e.status().message());
  }
  o.settings.emplace_back(std::move(name), std::move(value));
}

}  // namespace

std::optional<uint64_t> parse_size(std::string_view text) {
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (end == text.data()) return std::nullopt;
  std::string unit;
  for (const char* p = end; p != text.data() + text.size(); ++p)
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  if (unit.ends_with('b')) unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'i') unit.pop_back();
  int shift = 0;
  if (!unit.empty()) {
    constexpr std::string_view kPrefixes = "kmgt";
    auto at = kPrefixes.find(unit);
    if (unit.size() != 1 || at == std::string_view::npos) return std::nullopt;
    shift = 10 * static_cast<int>(at + 1);
  }
  if (ec == std::errc::result_out_of_range || n > (kNoMax >> shift)) return kNoMax;
  return n << shift;
}

uint64_t size_value(const std::string& flag, const std::string& text, uint64_t lo, uint64_t hi) {
  std::optional<uint64_t> n = parse_size(text);
  if (!n) {
    bad(flag, in_quotes(text) + " is not a size (use a number with an optional K, M or G suffix)");
  }
  if (*n > physical_memory()) {
    bad(flag, in_quotes(text) + " is larger than this host's memory (" +
                  human_memory(physical_memory()) + ")");
  }
  if (*n < lo || *n > hi) {
    bad(flag, in_quotes(text) +
                  (hi == kNoMax ? " must be at least " + (lo == 1 ? "1 byte" : human_size(lo))
                                : " must be between " + human_size(lo) + " and " + human_size(hi)));
  }
  return *n;
}

int int_value(const std::string& flag, const std::string& text, int lo, int hi) {
  long long n = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, n);
  if (ptr == text.data() || ptr != end) bad(flag, in_quotes(text) + " is not a whole number");
  if (ec == std::errc::result_out_of_range || n < lo || n > hi) {
    bad(flag,
        in_quotes(text) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  }
  return static_cast<int>(n);
}

Address address_value(const std::string& flag, const std::string& text, bool listen) {
  const std::string use = " (use HOST:PORT, or [IPv6]:PORT)";
  if (text.empty()) bad(flag, "'' is not an address" + use);
  std::string_view all(text), host, port;
  if (all.front() == '[') {
    auto close = all.find(']');
    if (close == std::string_view::npos) bad(flag, in_quotes(text) + " has no closing ']'" + use);
    host = all.substr(1, close - 1);
    if (close + 1 == all.size()) bad(flag, in_quotes(text) + " has no port" + use);
    if (all[close + 1] != ':') bad(flag, in_quotes(text) + " has no ':' after ']'" + use);
    port = all.substr(close + 2);
    if (host.empty()) bad(flag, in_quotes(text) + " has an empty host" + use);
  } else {
    auto colon = all.rfind(':');
    if (colon == std::string_view::npos) bad(flag, in_quotes(text) + " has no port" + use);
    host = all.substr(0, colon);
    port = all.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      bad(flag, in_quotes(text) + " has more than one ':': an IPv6 address goes in brackets, as " +
                    "[::1]:5000");
    }
    if (host.empty() && !listen) bad(flag, in_quotes(text) + " has an empty host" + use);
  }
  if (port.empty()) bad(flag, in_quotes(text) + " has no port" + use);
  unsigned lo = listen ? 0 : 1, value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ptr != port.data() + port.size()) {
    bad(flag, in_quotes(text) + ": port " + in_quotes(port) + " is not a number" + use);
  }
  if (ec != std::errc() || value < lo || value > 65535) {
    bad(flag, in_quotes(text) + ": port " + in_quotes(port) + " is out of range (" +
                  std::to_string(lo) + " to 65535)");
  }
  return {host.empty() ? "0.0.0.0" : std::string(host), static_cast<uint16_t>(value)};
}

std::string transport_value(const std::string& flag, const std::string& text) {
  if (text != "auto" && !transport_named(text)) {
    std::string names;
    for (const TransportInfo& t : Engine::transports())
      names += ", " + std::string(to_string(t.kind));
    bad(flag, in_quotes(text) + " is not one of auto" + names);
  }
  return text;
}

namespace {

std::vector<std::string> ops_value(const std::string& flag, const std::string& text) {
  if (text.empty()) bad(flag, std::string("'' names no operation (use ") + kOpList + ")");
  std::vector<std::string> ops;
  for (std::size_t start = 0; start <= text.size();) {
    std::size_t comma = std::min(text.find(',', start), text.size());
    std::string op = text.substr(start, comma - start);
    if (op.empty()) bad(flag, in_quotes(text) + " has an empty operation");
    if (std::find(kOps.begin(), kOps.end(), op) == kOps.end())
      bad(flag, "unknown operation " + in_quotes(op) + " (use " + kOpList + ")");
    ops.push_back(op);
    start = comma + 1;
  }
  return ops;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

std::string microseconds(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

}  // namespace

std::string Address::to_string() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

std::vector<uint64_t> default_sizes() {
  std::vector<uint64_t> sizes;
  for (uint64_t s = 4096; s <= (64u << 20); s *= 4) sizes.push_back(s);
  return sizes;
}

void add_bench_options(CLI::App& b, BenchOptions& o) {
  const Config engine;  // the defaults of the flags left to the engine
  auto* listen =
      add(b, "--listen", o.listen, address(true),
          "Run as the target and serve initiators, one after another, on HOST:PORT (port 0: a "
          "free one; 0.0.0.0, [::] or an empty host: every interface)")
          ->type_name("HOST:PORT");
  auto* connect = add(b, "--connect", o.connect, address(false),
                      "Run as the initiator against a target at HOST:PORT or [IPv6]:PORT")
                      ->type_name("HOST:PORT");
  listen->excludes(connect);
  // Hidden: the target that `ferry bench` starts for itself ends with its one initiator.
  b.add_flag("--once", o.once, "Serve one initiator, then exit with its outcome")->group("");
  add(b, "--op", o.ops, ops_value,
      "Comma-separated operations: write, read, write_imm, send, pingpong (half the round trip "
      "of answered writes, as ib_write_lat), imm_pingpong (the same with write_with_imm, each "
      "side taking the other's notification from next_imm)")
      ->type_name("OPS")
      ->default_str(join(o.ops));
  std::vector<std::string> size_default;
  for (uint64_t s : o.sizes) size_default.push_back(human_size(s));
  b.add_option_function<std::vector<std::string>>(
       "--sizes",
       [&o](const std::vector<std::string>& texts) {
         o.sizes.clear();
         for (const auto& t : texts) o.sizes.push_back(size_value("--sizes", t, 1, kNoMax));
       },
       "Transfer sizes in bytes, or with K, M, G (x1024) suffixes")
      ->delimiter(',')
      ->type_name("SIZES")
      ->default_str(join(size_default));
  add(b, "--batch", o.batch, count(1, kMaxBatch), "Entries per operation")
      ->type_name("N")
      ->default_str(std::to_string(o.batch));
  add(b, "--concurrency", o.concurrency, count(1, kMaxConcurrency), "Operations in flight")
      ->type_name("N")
      ->default_str(std::to_string(o.concurrency));
  add(b, "--transport", o.transport, transport_value,
      "Transport: auto (the best both sides have, see ferry info) or one by name (tcp, verbs)")
      ->type_name("NAME")
      ->default_str(o.transport);
  b.add_option_function<std::string>(
       "--memory",
       [&o](const std::string& kind) {
         if (kind != "register" && kind != "allocate") {
           bad("--memory", in_quotes(kind) + ": expected register or allocate");
         }
         o.allocate = kind == "allocate";
       },
       "Buffers: register (the bench's own memory, registered) or allocate (Engine::allocate, "
       "which a same-host peer maps)")
      ->type_name("KIND")
      ->default_str("register");
  add(b, "--iters", o.iters, count(1, kMaxIters),
      "Operations per size (default: about 512 MiB or at least 20)")
      ->type_name("N");
  b.add_flag("--json", o.json, "One JSON object per result line");
  b.add_option("--secret", o.secret, "Shared secret for peer authentication");
  b.add_option("--metrics", o.metrics,
               "Count every operation (Engine::metrics, /metrics of --web); 0: count nothing")
      ->type_name("0|1")
      ->default_str(engine.metrics ? "1" : "0");
  add(b, "--slice", o.slice_bytes, bytes(kMinSlice, kMaxSlice), "Slice size of large transfers")
      ->type_name("SIZE")
      ->default_str(human_size(engine.slice_bytes));
  add(b, "--stripe", o.stripe_bytes, bytes(1, kNoMax),
      "Operations above this size use every socket")
      ->type_name("SIZE")
      ->default_str(human_size(engine.stripe_threshold));
  // One flag per declared transport setting (--tcp.streams 4): what --set takes, from the
  // transport's own declaration, so a setting a transport adds needs no line here.
  for (const SettingInfo& s : Engine::settings()) {
    std::string flag = "--" + s.name;
    b.add_option_function<std::string>(
         flag,
         [&o, flag, name = s.name](const std::string& value) {
           take_setting(o, flag, name, value);
         },
         s.help + " (" + s.type + (s.range.empty() ? "" : " " + s.range) + ")")
        ->type_name("VALUE")
        ->default_str(s.default_value);
  }
  b.add_option_function<std::vector<std::string>>(
       "--set",
       [&o](const std::vector<std::string>& items) {
         for (const std::string& item : items) {
           std::size_t eq = item.find('=');
           if (eq == std::string::npos) bad("--set", in_quotes(item) + ": expected NAME=VALUE");
           take_setting(o, "--set", item.substr(0, eq), item.substr(eq + 1));
         }
       },
       "A transport setting, NAME=VALUE (tcp.streams=4, shm.stream_poll=50us), as its own flag "
       "above takes it; repeatable. `ferry info` lists them, their ranges and environment "
       "variables")
      ->type_name("NAME=VALUE")
      ->allow_extra_args(false);
  add(b, "--threads", o.threads, count(1, kMaxThreads), "Progress threads per engine")
      ->type_name("N")
      ->default_str(std::to_string(o.threads));
  add(b, "--busy-poll-us", o.busy_poll_us, count(0, kMaxMicroseconds),
      "Progress threads spin this long after work")
      ->type_name("US")
      ->default_str(microseconds(engine.busy_poll));
  add(b, "--wait-spin-us", o.wait_spin_us, count(0, kMaxMicroseconds),
      "Future::wait spins this long before sleeping")
      ->type_name("US")
      ->default_str(microseconds(engine.wait_spin));
  b.add_flag("--prepared", o.prepared,
             "Post write, read, write_imm and ping-pong batches prepared once (Peer::prepare_*)");
  b.add_flag("--same-area", o.same_area,
             "Operations in flight, and the receives the target posts for send, all use the same "
             "buffer area, as perftest's do (default: one area each). Messages then overwrite "
             "each other before the target checks them: it checks their lengths and samples "
             "of the area");
  add(b, "--web", o.web, address(true),
      "Serve a live gauge of the rate on HOST:PORT (a page for the browser; initiator only)")
      ->type_name("HOST:PORT")
      ->excludes(listen);
  add(b, "--scatter", o.scatter, count(1, kMaxScatter),
      "write and read batches of N entries of each size at scattered offsets (both sides "
      "shuffled, gaps between entries), each beside one contiguous transfer of the same bytes: "
      "prints the ratio and the write()/read() call's cost per entry")
      ->type_name("N");
}

void check_bench_options(const BenchOptions& o) {
  if (o.once && !o.listen) throw CLI::ValidationError("--once", "only with --listen");
  if (o.listen) return;  // a target's buffer is what each initiator asks for
  if (o.scatter) {
    for (const auto& op : o.ops) {
      if (op != "write" && op != "read")
        throw CLI::ValidationError("--scatter", "only with --op write and read, not " + op);
    }
    if (o.batch != 1 || o.concurrency != 1 || o.prepared)
      throw CLI::ValidationError("--scatter",
                                 "runs one batch at a time: not with --batch, "
                                 "--concurrency or --prepared");
  }
  if (o.batch * o.concurrency > kMaxInFlight) {
    throw CLI::ValidationError("--batch", std::to_string(o.batch) + " with --concurrency " +
                                              std::to_string(o.concurrency) + " puts " +
                                              std::to_string(o.batch * o.concurrency) +
                                              " transfers in flight; at most " +
                                              std::to_string(kMaxInFlight));
  }
  uint64_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  uint64_t bytes = buffer_bytes(o);
  // The initiator registers two buffers (data and its read-back), the ping-pong two areas of
  // the largest size besides; the target started here (no --connect) one buffer.
  bool pingpong = std::any_of(o.ops.begin(), o.ops.end(),
                              [](const std::string& op) { return op.ends_with("pingpong"); });
  uint64_t need = 2 * bytes + (pingpong ? 2 * largest : 0) + (o.connect ? 0 : bytes);
  if (need > physical_memory()) {
    throw CLI::ValidationError(
        "--sizes", human_memory(largest) + " with --batch " + std::to_string(o.batch) +
                       " and --concurrency " + std::to_string(o.concurrency) + " needs " +
                       human_memory(need) + " of buffers on this host, more than its memory (" +
                       human_memory(physical_memory()) + ")");
  }
}

uint64_t buffer_bytes(const BenchOptions& o) {
  uint64_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  // --scatter: N slots of twice the size, so that no two entries touch.
  if (o.scatter) return 2 * largest * static_cast<uint64_t>(*o.scatter);
  auto batch = static_cast<uint64_t>(o.batch);
  uint64_t bytes = largest * batch * static_cast<uint64_t>(o.concurrency);
  bytes = std::min<uint64_t>(bytes, std::max<uint64_t>(largest * batch, 256ull << 20));
  return std::max<uint64_t>(bytes, 2 * largest);  // ping-pong's receive and send areas
}

uint64_t physical_memory() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return kNoMax;  // unknown: no limit of ours
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

std::string human_size(uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

std::string human_memory(uint64_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  auto value = static_cast<double>(n);
  for (; value >= 1024 && unit < 4; ++unit) value /= 1024;
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

}  // namespace ferry::cli
