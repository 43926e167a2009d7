#include "bench.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>

#include "bench_session.hpp"
#include "ferry/ferry.hpp"
#include "gauge.hpp"
#include "info.hpp"

extern char** environ;

namespace ferry::cli {
namespace {

using namespace bench;

// ---------------------------------------------------------------------------------------------
// Initiator

struct Row {
  std::string op;
  uint64_t size;
  int batch, concurrency, iters;
  double p50_us, p99_us, mb_per_s, ops_per_s;
  bool prepared;  // posted batches prepared once
  bool verified;
};

// While one size runs longer than a second, a line on stderr that says how far it is, redrawn
// at most ten times a second and erased before the size's row is printed. Only on terminals.
class Progress {
 public:
  Progress(bool shown, std::string what, uint64_t total)
      : shown_(shown), what_(std::move(what)), total_(total), start_(BenchClock::now()) {}
  ~Progress() {
    if (drawn_) std::fputs("\r\033[K", stderr);
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  // `now`: the caller's clock reading, so that the measured loop reads no clock for us.
  void update(uint64_t done, BenchClock::time_point now) {
    if (!shown_ || now - start_ < 1s || (drawn_ && now - drawn_at_ < 100ms)) return;
    std::fprintf(stderr, "\r%s %3d%%", what_.c_str(), static_cast<int>(100 * done / total_));
    drawn_ = true;
    drawn_at_ = now;
  }

 private:
  bool shown_;
  std::string what_;
  uint64_t total_;
  BenchClock::time_point start_, drawn_at_;
  bool drawn_ = false;
};

struct Initiator {
  const BenchOptions& o;
  Engine& engine;
  Peer peer;
  Descriptor remote;
  uint64_t bytes;
  std::span<uint8_t> buf, check_buf;  // in `region` and `check_region`
  Region region, check_region;
  Mailbox& mail;
  bool progress;  // a terminal shows Progress
  uint64_t imms_sent = 0;
  GaugeServer* gauge = nullptr;  // --web
  RateWindow window;
  uint64_t bytes_moved = 0;

  // `n` more bytes moved: the gauge's rate, where there is one.
  void moved(uint64_t n) {
    bytes_moved += n;
    double rate = 0;
    if (gauge != nullptr && window.sample(bytes_moved, rate)) gauge->publish(rate);
  }

  uint64_t slot_offset(uint64_t size, int slot) const {
    if (o.same_area) return 0;
    uint64_t per_op = size * static_cast<uint64_t>(o.batch);
    return (static_cast<uint64_t>(slot) * per_op) % (bytes - per_op + 1);
  }

  std::vector<Prepared> prepared;  // --prepared: one per slot

  // The batch of one slot: `o.batch` entries of `size` bytes, at the same offsets both sides.
  void fill_batch(uint64_t size, int slot, std::vector<Transfer>& batch) {
    uint64_t base = slot_offset(size, slot);
    batch.resize(static_cast<std::size_t>(o.batch));
    for (int i = 0; i < o.batch; ++i) {
      uint64_t off = base + static_cast<uint64_t>(i) * size;
      batch[static_cast<std::size_t>(i)] = Transfer{&region, off, &remote, off, size};
    }
  }

  void prepare(const std::string& op, uint64_t size) {
    std::vector<Transfer> batch;
    for (int slot = 0; slot < o.concurrency; ++slot) {
      fill_batch(size, slot, batch);
      prepared.push_back(op == "write" ? peer.prepare_write(batch)
                         : op == "read"
                             ? peer.prepare_read(batch)
                             : peer.prepare_write_with_imm(batch, static_cast<uint32_t>(size)));
    }
  }

  Future start(const std::string& op, uint64_t size, int slot, std::vector<Transfer>& batch) {
    if (!prepared.empty()) {
      if (op == "write_imm") ++imms_sent;
      return prepared[static_cast<std::size_t>(slot)].post();
    }
    fill_batch(size, slot, batch);
    if (op == "write") return peer.write(batch);
    if (op == "read") return peer.read(batch);
    if (op == "write_imm") {
      ++imms_sent;
      return peer.write_with_imm(batch, static_cast<uint32_t>(size));
    }
    return peer.send(kTagData, region, slot_offset(size, slot), size);
  }

  bool verify(const std::string& op, uint64_t size) {
    uint64_t n = std::min<uint64_t>(size * static_cast<uint64_t>(o.batch), bytes);
    Transfer t{&check_region, 0, &remote, 0, n};
    if (op == "read") {
      // The target filled its buffer with pattern(seed = buffer size); we must have read it.
      return matches(buf.data(), n, bytes);
    }
    if (op == "send") return true;  // the target checks every message and reports at the end
    // write / write_imm: write a fresh pattern, read it back through a separate region.
    fill(buf.data(), n, size ^ 0x5a5a);
    Transfer w{&region, 0, &remote, 0, n};
    check(peer.write({&w, 1}).wait(kOpTimeout), "verify write");
    std::fill(check_buf.begin(), check_buf.begin() + static_cast<long>(n), 0);
    check(peer.read({&t, 1}).wait(kOpTimeout), "verify read");
    return std::memcmp(check_buf.data(), buf.data(), n) == 0;
  }

  Row run(const std::string& op, uint64_t size) {
    uint64_t per_op = size * static_cast<uint64_t>(o.batch);
    int iters = o.iters.value_or(
        static_cast<int>(std::clamp<uint64_t>(kBytesPerSize / per_op, kMinIters, kMaxIters)));
    if (op == "pingpong" || op == "imm_pingpong") return pingpong(op, size, iters);
    if (op == "send") {
      mail.send(kTagSetup, std::to_string(iters + kWarmupIters) + " " + std::to_string(size) + " " +
                               std::to_string(o.concurrency) + " " + (o.same_area ? "1" : "0"));
      fill(buf.data(), size, size);
      // Sends reuse one source slot, so every message carries the pattern the target checks.
    }
    if (op == "read") {
      // Give the remote bytes a known pattern, then clear ours, so verify() proves the reads.
      uint64_t n = std::min<uint64_t>(size * static_cast<uint64_t>(o.batch), bytes);
      fill(buf.data(), n, bytes);
      Transfer w{&region, 0, &remote, 0, n};
      check(peer.write({&w, 1}).wait(kOpTimeout), "prepare read");
      std::fill(buf.begin(), buf.begin() + static_cast<long>(n), 0);
    }
    prepared.clear();
    if (o.prepared && op != "send") prepare(op, size);
    std::vector<std::vector<Transfer>> batches(static_cast<std::size_t>(o.concurrency));
    std::vector<double> lat_us;
    lat_us.reserve(static_cast<std::size_t>(iters));
    std::deque<std::pair<Future, BenchClock::time_point>> inflight;
    auto slot_for = [&](int i) { return op == "send" ? 0 : i % o.concurrency; };

    for (int i = 0; i < kWarmupIters; ++i) {
      check(start(op, size, slot_for(i), batches[0]).wait(kOpTimeout), op + " warm-up");
    }
    Progress shown(progress, op + " " + human_size(size), static_cast<uint64_t>(iters));
    auto t0 = BenchClock::now();
    int issued = 0;
    // send: messages the target reported consumed (warm-up ones included), kTagCredit.
    uint64_t consumed = 0;
    auto take_credit = [&] {
      (void)mail.recv(kTagCredit);
      consumed += kSendCreditEvery;
    };
    while (issued < iters || !inflight.empty()) {
      while (issued < iters && static_cast<int>(inflight.size()) < o.concurrency) {
        while (op == "send" &&
               kWarmupIters + static_cast<uint64_t>(issued) >= consumed + 2 * kSendCreditEvery)
          take_credit();
        int slot = slot_for(issued);
        auto ts = BenchClock::now();
        inflight.emplace_back(
            start(op, size, slot, batches[static_cast<std::size_t>(issued % o.concurrency)]), ts);
        ++issued;
      }
      auto [f, ts] = inflight.front();
      inflight.pop_front();
      check(f.wait(kOpTimeout), op + " " + human_size(size));
      auto now = BenchClock::now();
      lat_us.push_back(std::chrono::duration<double, std::micro>(now - ts).count());
      shown.update(lat_us.size(), now);
      moved(per_op);
    }
    double secs = std::chrono::duration<double>(BenchClock::now() - t0).count();
    if (op == "send") {
      while (consumed + kSendCreditEvery <= static_cast<uint64_t>(iters) + kWarmupIters)
        take_credit();
      std::string bad = mail.recv(kTagReport);
      if (bad != "0")
        throw Error(ErrorCode::kProtocol, "target saw corrupted send() messages: " + bad);
    }
    bool verified = verify(op, size);
    if (!verified)
      throw Error(ErrorCode::kProtocol, op + " " + human_size(size) + ": data mismatch");
    return finish(op, size, o.batch, o.concurrency, iters, secs, lat_us, !prepared.empty());
  }

  // --scatter: `n` entries of `size` bytes in slots of 2 x size (never adjacent), local and
  // remote slots each shuffled, one batch per iteration; beside it one contiguous transfer of
  // the same n x size bytes, timed the same way. Both verified byte for byte.
  struct ScatterResult {
    Row contiguous, scattered;
    double submit_ns_per_entry;
    double submit_cpu_ns_per_entry;  // the calling thread's CPU time in the call
  };
  ScatterResult scatter(const std::string& op, uint64_t size) {
    const uint64_t n = static_cast<uint64_t>(*o.scatter), stride = 2 * size, span = n * size;
    std::vector<uint64_t> local_slot(n), remote_slot(n);
    std::iota(local_slot.begin(), local_slot.end(), 0);
    std::iota(remote_slot.begin(), remote_slot.end(), 0);
    std::mt19937_64 rng(size);
    std::shuffle(local_slot.begin(), local_slot.end(), rng);
    std::shuffle(remote_slot.begin(), remote_slot.end(), rng);
    std::vector<Transfer> scattered(n);
    for (uint64_t i = 0; i < n; ++i)
      scattered[i] =
          Transfer{&region, local_slot[i] * stride, &remote, remote_slot[i] * stride, size};
    Transfer contiguous{&region, 0, &remote, 0, span};
    int iters = o.iters.value_or(
        static_cast<int>(std::clamp<uint64_t>(kBytesPerSize / span, kMinIters, kMaxIters)));
    bool write = op == "write";
    auto post = [&](std::span<const Transfer> b) { return write ? peer.write(b) : peer.read(b); };
    // The remote buffer gets a known pattern (reads must return it; writes must leave it alone
    // outside their entries).
    Transfer whole{&region, 0, &remote, 0, bytes};
    auto prepare_remote = [&] {
      fill(buf.data(), bytes, bytes);
      check(peer.write({&whole, 1}).wait(kOpTimeout), "scatter: prepare remote");
    };
    prepare_remote();
    if (write) fill(buf.data(), bytes, size ^ 0x5a5a);
    double submit_s = 0, submit_cpu_s = 0;
    auto thread_cpu = [] {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
    };
    struct Timed {
      double secs = 0;  // in the transfers: from each post to its completion
      std::vector<double> lat_us;
    } contiguous_t, scattered_t;
    contiguous_t.lat_us.reserve(static_cast<std::size_t>(iters));
    scattered_t.lat_us.reserve(static_cast<std::size_t>(iters));
    auto once = [&](std::span<const Transfer> b, bool count_submit, Timed& t) {
      double cpu0 = count_submit ? thread_cpu() : 0;
      auto ts = BenchClock::now();
      Future f = post(b);
      auto tp = BenchClock::now();
      if (count_submit) {
        submit_cpu_s += thread_cpu() - cpu0;
        submit_s += std::chrono::duration<double>(tp - ts).count();
      }
      check(f.wait(kOpTimeout), op + " " + human_size(size));
      auto now = BenchClock::now();
      t.secs += std::chrono::duration<double>(now - ts).count();
      t.lat_us.push_back(std::chrono::duration<double, std::micro>(now - ts).count());
      return now;
    };
    for (int i = 0; i < kWarmupIters; ++i) {
      check(post({&contiguous, 1}).wait(kOpTimeout), op + " warm-up");
      check(post(scattered).wait(kOpTimeout), op + " warm-up");
    }
    // Alternated, so that the host's slow and fast spells fall on both: their ratio is the
    // figure, and it swung by 0.15 between runs when each ran its iterations in one stretch.
    Progress shown(progress, op + " " + human_size(size) + " contiguous and scattered",
                   2 * static_cast<uint64_t>(iters));
    for (int i = 0; i < iters; ++i) {
      once({&contiguous, 1}, false, contiguous_t);
      shown.update(2 * static_cast<uint64_t>(i + 1), once(scattered, true, scattered_t));
    }
    auto& [csecs, clat] = contiguous_t;
    auto& [ssecs, slat] = scattered_t;
    // Verify: one more scattered batch of fresh bytes, then the remote buffer read back whole.
    if (write) {
      prepare_remote();  // the contiguous writes covered part of it
      fill(buf.data(), bytes, size ^ 0xa5a5);
      check(post(scattered).wait(kOpTimeout), "scatter: verify write");
      Transfer back{&check_region, 0, &remote, 0, bytes};
      check(peer.read({&back, 1}).wait(kOpTimeout), "scatter: verify read-back");
      std::vector<bool> used(n, false);
      for (uint64_t i = 0; i < n; ++i) {
        used[remote_slot[i]] = true;
        if (std::memcmp(check_buf.data() + remote_slot[i] * stride,
                        buf.data() + local_slot[i] * stride, size) != 0)
          throw Error(ErrorCode::kProtocol,
                      "scatter write: entry " + std::to_string(i) + " differs at the target");
      }
      for (uint64_t at = 0; at < bytes; ++at) {  // nothing else changed
        if ((at / stride < n && used[at / stride] && at % stride < size)) continue;
        if (check_buf[at] != pattern_byte(bytes, at))
          throw Error(ErrorCode::kProtocol, "scatter write: target byte " + std::to_string(at) +
                                                " outside every entry "
                                                "changed");
      }
    } else {
      std::fill(buf.begin(), buf.end(), 0);
      check(post(scattered).wait(kOpTimeout), "scatter: verify read");
      for (uint64_t i = 0; i < n; ++i) {
        const uint8_t* p = buf.data() + local_slot[i] * stride;
        for (uint64_t j = 0; j < size; ++j) {
          if (p[j] != pattern_byte(bytes, remote_slot[i] * stride + j))
            throw Error(ErrorCode::kProtocol,
                        "scatter read: entry " + std::to_string(i) + " holds the wrong bytes");
        }
        std::memset(buf.data() + local_slot[i] * stride, 0, size);
      }
      if (std::any_of(buf.begin(), buf.end(), [](uint8_t b) { return b != 0; }))
        throw Error(ErrorCode::kProtocol, "scatter read: a byte outside every entry changed");
      fill(buf.data(), bytes, 7);
    }
    return {finish(op, span, 1, 1, iters, csecs, clat, false),
            finish(op, size, static_cast<int>(n), 1, iters, ssecs, slat, false),
            submit_s * 1e9 / (static_cast<double>(iters) * static_cast<double>(n)),
            submit_cpu_s * 1e9 / (static_cast<double>(iters) * static_cast<double>(n))};
  }

  // Half round trips of ping-pong writes (imm_pingpong: write_with_imm, each side taking the
  // other's notification from next_imm), with the target answering each one.
  Row pingpong(const std::string& op, uint64_t size, int iters) {
    bool notify = op == "imm_pingpong";
    if (2 * size > bytes) throw Error(ErrorCode::kInvalidArgument, "ping-pong: size too large");
    // Allocated, the target may be lent it (a mapping needs remote read too); registered, it
    // only needs remote write.
    std::vector<uint8_t> owned;
    if (!o.allocate) owned.resize(2 * size);
    Region pp_region =
        o.allocate ? engine.allocate(2 * size, Access::kRemoteReadWrite)
                   : engine.register_memory(owned.data(), owned.size(), Access::kRemoteWrite);
    std::span<uint8_t> pp(static_cast<uint8_t*>(pp_region.data()), 2 * size);
    fill(pp.data() + size, size, size + 1);
    auto rounds = static_cast<uint64_t>(iters) + kWarmupIters;
    std::string cmd = op + " " + std::to_string(rounds) + " " + std::to_string(size) + " " +
                      pp_region.descriptor().to_string() + " " + (o.prepared ? "1" : "0");
    // Notifications need the target's next_imm to take them before the first one comes.
    if (notify) {
      if (std::string answer = mail.request(kTagSetup, cmd, kTagReport); answer != "ready")
        throw Error(ErrorCode::kProtocol, "ping-pong: the target answered '" + answer + "'");
    } else {
      mail.send(kTagSetup, cmd);
    }
    std::vector<double> lat_us;
    lat_us.reserve(static_cast<std::size_t>(iters));
    // A round is the time between two posts, as perftest's ib_write_lat takes it; the clock is
    // read just after posting, while the write is in flight, not before it.
    auto t0 = BenchClock::now();
    auto ts = t0;
    PingPongWriter writer(peer, pp_region, pp.data(), remote, size, o.prepared, notify);
    Progress shown(progress, op + " " + human_size(size), rounds);
    for (uint64_t r = 0; r < rounds; ++r) {
      Future f = writer.post(r);
      auto te = BenchClock::now();
      if (r > static_cast<uint64_t>(kWarmupIters)) {
        lat_us.push_back(std::chrono::duration<double, std::micro>(te - ts).count() / 2);
      } else {
        t0 = te;
      }
      ts = te;
      shown.update(r, te);
      pingpong_wait(std::move(f));
      await_answer(engine, peer, pp.data(), size, r, notify);
    }
    double secs = std::chrono::duration<double>(BenchClock::now() - t0).count();
    // The target's answers carried its pattern (all but the round mark).
    if (size > 1 && !matches(pp.data(), size - 1, size))
      throw Error(ErrorCode::kProtocol, "ping-pong: data mismatch");
    return finish(op, size, 1, 1, iters, secs, lat_us, o.prepared);
  }

  // A verified row from the latencies and the elapsed time of `iters` operations.
  static Row finish(const std::string& op, uint64_t size, int batch, int concurrency, int iters,
                    double secs, std::vector<double>& lat_us, bool prepared) {
    std::sort(lat_us.begin(), lat_us.end());
    auto pct = [&](double q) {
      return lat_us[static_cast<std::size_t>(q * static_cast<double>(lat_us.size() - 1))];
    };
    double moved = static_cast<double>(size) * batch * iters;
    return Row{op,           size,     batch,     concurrency,
               iters,        pct(0.5), pct(0.99), moved / secs / 1e6,
               iters / secs, prepared, true};
  }
};

// The route a benchmark operation takes (Peer::routes): its transport and why.
struct OpRoute {
  std::string transport;
  std::string why;
};

OpRoute route_of(const Peer& peer, const std::string& op) {
  std::string_view operations = op == "write_imm" || op == "imm_pingpong" ? "write_with_imm"
                                : op == "send"                            ? "send/recv"
                                               : "write/read";  // write, read, pingpong
  for (const RouteInfo& r : peer.routes()) {
    if (r.operations == operations && r.local == MemoryKind::kHost &&
        r.remote == MemoryKind::kHost) {
      return {r.transport ? std::string(to_string(*r.transport)) : "none", r.why};
    }
  }
  return {"none", "no route"};
}

void print_row(const Row& r, bool json, const OpRoute& route) {
  const std::string& transport = route.transport;
  char line[320];
  if (json) {
    std::snprintf(
        line, sizeof line,
        "{\"transport\":\"%s\",\"op\":\"%s\",\"size\":%llu,\"batch\":%d,\"concurrency\":%d,"
        "\"iters\":%d,\"p50_us\":%.2f,\"p99_us\":%.2f,\"mb_per_s\":%.1f,\"ops_per_s\":%.0f,"
        "\"prepared\":%s,\"verified\":%s,\"why\":",
        transport.c_str(), r.op.c_str(), static_cast<unsigned long long>(r.size), r.batch,
        r.concurrency, r.iters, r.p50_us, r.p99_us, r.mb_per_s, r.ops_per_s,
        r.prepared ? "true" : "false", r.verified ? "true" : "false");
    std::cout << line << json_string(route.why) << "}" << std::endl;
    return;
  }
  std::snprintf(line, sizeof line, "%-9s %-12s %7s %6d %5d %10.1f %10.1f %10.1f %11.0f",
                transport.c_str(), r.op.c_str(), human_size(r.size).c_str(), r.batch, r.concurrency,
                r.p50_us, r.p99_us, r.mb_per_s, r.ops_per_s);
  std::cout << line << std::endl;
}

// The class of `size` among one kind of transfers in `paths` (PathStats), if any went: the
// largest that starts at `size` or below.
std::optional<PathStats> path_class(const std::vector<PathStats>& paths,
                                    const std::string& transfers, uint64_t size) {
  std::optional<PathStats> found;
  for (const PathStats& p : paths) {
    if (p.transfers == transfers && p.from_bytes <= size &&
        (!found || p.from_bytes > found->from_bytes)) {
      found = p;
    }
  }
  return found;
}

// Under a same-host row of writes or messages that their channel sent either way: how many the
// row sent each way, and what each way moved lately.
void print_paths(const Peer& peer, const std::string& op, uint64_t size,
                 const std::vector<PathStats>& before) {
  std::string transfers = op == "write" || op == "write_imm" ? "write" : op == "send" ? op : "";
  if (transfers.empty()) return;
  std::optional<PathStats> now = path_class(peer.stats().paths, transfers, size);
  if (!now) return;
  std::optional<PathStats> then;  // the same class before the row (none: it is new)
  for (const PathStats& p : before) {
    if (p.transfers == transfers && p.from_bytes == now->from_bytes) then = p;
  }
  uint64_t pulled = now->direct - (then ? then->direct : 0);
  uint64_t rings = now->bounced - (then ? then->bounced : 0);
  if (pulled + rings == 0) return;
  char line[200];
  std::snprintf(line, sizeof line,
                "          ^ %llu pulled (%.0f MB/s lately), %llu through the rings (%.0f MB/s "
                "lately)",
                static_cast<unsigned long long>(pulled), now->direct_mb_per_s,
                static_cast<unsigned long long>(rings), now->bounced_mb_per_s);
  std::cout << line << std::endl;
}

// One connection's whole benchmark, after the connection.
void run_session(const BenchOptions& o, Engine& engine, Mailbox& mail) {
  const Peer& peer = mail.peer();
  if (o.transport != "auto" && to_string(peer.transport()) != o.transport) {
    throw Error(ErrorCode::kUnsupported,
                o.transport + " is not available between these peers (see ferry info)");
  }
  uint64_t bytes = buffer_bytes(o);
  Descriptor remote = Descriptor::parse(mail.request(
      kTagSetup, std::to_string(bytes) + (o.allocate ? " 1 0" : " 0 0"), kTagDescriptor));

  bool progress = !o.json && isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
  std::vector<uint8_t> owned, owned_check;  // outlive the regions registered on them
  Initiator ini{o, engine, peer, remote, bytes, {}, {}, {}, {}, mail, progress};
  std::unique_ptr<GaugeServer> gauge;
  if (o.web) {
    gauge = std::make_unique<GaugeServer>(*o.web, "ferry bench to " + peer.address(), &engine);
    ini.gauge = gauge.get();
    std::cerr << "gauge on " << gauge->url() << std::endl;  // stdout may be --json rows
  }
  if (o.allocate) {
    ini.region = engine.allocate(bytes, Access::kLocal);
    ini.check_region = engine.allocate(bytes, Access::kLocal);
  } else {
    owned.resize(bytes);
    owned_check.resize(bytes);
    ini.region = engine.register_memory(owned.data(), bytes, Access::kLocal);
    ini.check_region = engine.register_memory(owned_check.data(), bytes, Access::kLocal);
  }
  ini.buf = {static_cast<uint8_t*>(ini.region.data()), bytes};
  ini.check_buf = {static_cast<uint8_t*>(ini.check_region.data()), bytes};
  fill(ini.buf.data(), bytes, 7);

  if (!o.json) {
    std::cout << "memory: "
              << (o.allocate ? "allocated by the engines (Engine::allocate)"
                             : "the bench's own, registered")
              << "\nroutes to the peer (" << to_string(peer.reach()) << "):\n";
    print_routes(std::cout, peer.routes(), "  ");
    std::printf("\n%-9s %-12s %7s %6s %5s %10s %10s %10s %11s\n", "transport", "op", "size",
                "batch", "conc", "p50_us", "p99_us", "MB/s", "ops/s");
    std::fflush(stdout);  // a reader of a pipe sees the run start
  }
  for (const auto& op : o.ops) {
    OpRoute route = route_of(peer, op);
    const std::string& transport = route.transport;
    for (uint64_t size : o.sizes) {
      if (!o.scatter) {
        std::vector<PathStats> before = peer.stats().paths;
        print_row(ini.run(op, size), o.json, route);
        if (!o.json) print_paths(peer, op, size, before);
        continue;
      }
      Initiator::ScatterResult r = ini.scatter(op, size);
      print_row(r.contiguous, o.json, route);
      print_row(r.scattered, o.json, route);
      double ratio = r.scattered.mb_per_s / r.contiguous.mb_per_s;
      char line[256];
      if (o.json) {
        std::snprintf(line, sizeof line,
                      "{\"transport\":\"%s\",\"op\":\"%s\",\"size\":%llu,\"scatter\":%d,"
                      "\"ratio\":%.3f,\"submit_ns_per_entry\":%.1f,"
                      "\"submit_cpu_ns_per_entry\":%.1f}",
                      transport.c_str(), op.c_str(), static_cast<unsigned long long>(size),
                      *o.scatter, ratio, r.submit_ns_per_entry, r.submit_cpu_ns_per_entry);
      } else {
        std::snprintf(line, sizeof line,
                      "  scattered %s %s x %d: %.2f x contiguous, %s() call %.1f ns per entry "
                      "(%.1f ns of its thread's CPU time)",
                      op.c_str(), human_size(size).c_str(), *o.scatter, ratio, op.c_str(),
                      r.submit_ns_per_entry, r.submit_cpu_ns_per_entry);
      }
      std::cout << line << std::endl;
    }
  }
  uint64_t imms = 0, bad = 0;
  read_fields(mail.request(kTagSetup, "done", kTagReport), imms, bad);
  if (imms != ini.imms_sent) {
    throw Error(ErrorCode::kProtocol, "target got " + std::to_string(imms) + " immediates, " +
                                          std::to_string(ini.imms_sent) + " were sent");
  }
}

void run_initiator(const BenchOptions& o, const std::string& address) {
  Engine engine(engine_config(o, Address{"127.0.0.1", 0}));
  Mailbox mail(engine, engine.connect(address));
  try {
    run_session(o, engine, mail);
  } catch (const std::exception& e) {
    if (std::optional<std::string> theirs = mail.their_failure())
      throw std::runtime_error("target: " + *theirs);
    mail.tell_failure(e.what());
    throw;
  }
  mail.await_close();
}

// Starts `ferry bench --listen 127.0.0.1:0 --once` and returns the address it prints.
pid_t spawn_target(const BenchOptions& o, const std::string& self, std::string& address) {
  int out[2];
  if (pipe(out) != 0) throw Error(ErrorCode::kSystem, "pipe failed");
  std::vector<std::string> args = {
      self, "bench", "--listen", "127.0.0.1:0", "--once", "--threads", std::to_string(o.threads)};
  if (!o.secret.empty()) args.insert(args.end(), {"--secret", o.secret});
  // Named on the command line, it holds on both ends, whatever FERRY_TRANSPORTS says.
  if (o.transport != "auto") args.insert(args.end(), {"--transport", o.transport});
  auto pass = [&](const char* flag, const auto& value) {
    if (value) args.insert(args.end(), {flag, std::to_string(*value)});
  };
  pass("--metrics", o.metrics);
  pass("--slice", o.slice_bytes);
  pass("--stripe", o.stripe_bytes);
  pass("--busy-poll-us", o.busy_poll_us);
  pass("--wait-spin-us", o.wait_spin_us);
  for (const auto& [name, value] : o.settings) {
    std::string assignment = name;
    assignment += '=';
    assignment += value;
    args.insert(args.end(), {"--set", std::move(assignment)});
  }
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  if (rc != 0)
    throw Error(ErrorCode::kSystem, std::string("posix_spawn ") + self + ": " + std::strerror(rc));
  std::string line;
  char c;
  while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
  close(out[0]);
  const std::string prefix = "listening on ";
  if (line.rfind(prefix, 0) != 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw Error(ErrorCode::kSystem, "bench target did not start: '" + line + "'");
  }
  address = line.substr(prefix.size());
  return pid;
}

}  // namespace

int run_bench(const BenchOptions& o, const std::string& self_path) {
  require_transport(o);
  if (o.listen) return run_target(o);
  if (o.connect) {
    run_initiator(o, o.connect->to_string());
    return 0;
  }
  std::string address;
  pid_t pid = spawn_target(o, self_path, address);
  try {
    run_initiator(o, address);
  } catch (...) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::cerr << "ferry bench: target process failed" << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace ferry::cli
