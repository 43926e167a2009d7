// Fault probe of the two-guest suite (tests/rdma/two-guest.py): one engine with two verbs
// peers, a faulty one (the other guest, which the host then kills, unplugs, freezes or powers
// off) and a healthy one (a target in this guest). Both are kept busy with writes and reads.
// Prints "PROBE READY" once both moved data, then waits until every operation on the faulty
// peer failed, watches the healthy peer for --after-ms more, shuts the engine down and prints
// METRIC lines and "PROBE DONE".
//
// usage: ferry_wire_probe --faulty ADDR DESC --healthy ADDR DESC [--peer-timeout-ms N]
//                         [--size BYTES] [--depth N] [--after-ms N] [--limit-ms N]
//
// Exit status 0 only if the faulty peer's operations all failed within --limit-ms of its last
// success (a hang detector, far above the expected peer_timeout + 1 s, which is reported), the
// healthy peer saw no error and kept completing operations after the failure.
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Options {
  std::string faulty_addr, faulty_desc, healthy_addr, healthy_desc;
  int peer_timeout_ms = 2000;
  uint64_t size = 65536;
  int depth = 2;
  int after_ms = 3000;
  int limit_ms = 30000;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "ferry_wire_probe: " << why
            << "\nusage: ferry_wire_probe --faulty ADDR DESC --healthy ADDR DESC"
               " [--peer-timeout-ms N] [--size BYTES] [--depth N] [--after-ms N] [--limit-ms N]\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto need = [&](int n) {
      if (i + n >= argc) usage(a + " needs " + std::to_string(n) + " value(s)");
    };
    if (a == "--faulty" || a == "--healthy") {
      need(2);
      (a == "--faulty" ? o.faulty_addr : o.healthy_addr) = argv[++i];
      (a == "--faulty" ? o.faulty_desc : o.healthy_desc) = argv[++i];
    } else if (a == "--peer-timeout-ms" || a == "--size" || a == "--depth" || a == "--after-ms" ||
               a == "--limit-ms") {
      need(1);
      uint64_t v = std::stoull(argv[++i]);
      if (v == 0) usage(a + " must be at least 1");
      if (a == "--peer-timeout-ms") o.peer_timeout_ms = static_cast<int>(v);
      if (a == "--size") o.size = v;
      if (a == "--depth") o.depth = static_cast<int>(v);
      if (a == "--after-ms") o.after_ms = static_cast<int>(v);
      if (a == "--limit-ms") o.limit_ms = static_cast<int>(v);
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (o.faulty_addr.empty() || o.healthy_addr.empty()) usage("--faulty and --healthy are required");
  return o;
}

// What a hang or crash of the probe leaves in its log: the guest has no debugger. Addresses
// are the binary's (PIE offsets): `addr2line -fCie ferry_wire_probe 0x...` on the host.
void print_stack(const char* what) {
  char line[96];
  int n = std::snprintf(line, sizeof line, "PROBE STACK %s thread %ld\n", what,
                        static_cast<long>(::syscall(SYS_gettid)));
  (void)!::write(STDOUT_FILENO, line, static_cast<std::size_t>(n));
  void* frames[64];
  ::backtrace_symbols_fd(frames, ::backtrace(frames, 64), STDOUT_FILENO);
}

void on_crash(int sig) {
  print_stack(sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : "SIGABRT");
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

// Turned by the main loop and the steps after it; 0 once the probe is about to exit.
std::atomic<int64_t> heartbeat_ms{0};

// Prints every thread's stack (SIGUSR2 to each) once the probe stopped turning for `stuck_ms`:
// where it hangs, not only that it did.
void watch_main_loop(int stuck_ms) {
  ::signal(SIGUSR2, [](int) { print_stack("stuck"); });
  void* warm[1];
  ::backtrace(warm, 1);  // loads the unwinder now: in a signal handler it must not allocate
  heartbeat_ms = now_ms();
  std::thread([stuck_ms] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      int64_t beat = heartbeat_ms.load();
      if (beat == 0) return;
      if (now_ms() - beat < stuck_ms) continue;
      std::cout << "PROBE STUCK: the main loop has not turned for " << stuck_ms << " ms"
                << std::endl;
      DIR* tasks = ::opendir("/proc/self/task");
      while (dirent* e = tasks != nullptr ? ::readdir(tasks) : nullptr) {
        if (e->d_name[0] == '.') continue;
        ::syscall(SYS_tgkill, ::getpid(), std::atoi(e->d_name), SIGUSR2);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (tasks != nullptr) ::closedir(tasks);
      return;
    }
  }).detach();
}

struct Done {
  int peer;
  int slot;
  ferry::Status status;
  Clock::time_point at;
};

// What one peer's operations did.
struct Track {
  ferry::Peer peer;
  ferry::Descriptor remote;
  std::vector<bool> busy;
  uint64_t ok = 0, failed = 0, issued = 0;
  Clock::time_point last_ok{}, last_done{};
  double worst_gap_ms = 0;  // longest time between completions since READY
  std::string first_error;
};

int probe(const Options& o) {
  // Before the engine: completion callbacks may run until it is shut down.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Done> done;
  ferry::Config config;
  // Verbs alone: the healthy target shares this guest, where the same-host transport would
  // otherwise serve it.
  config.transports = {ferry::TransportKind::kVerbs};
  config.peer_timeout = std::chrono::milliseconds(o.peer_timeout_ms);
  auto engine_owner = std::make_unique<ferry::Engine>(config);
  ferry::Engine& engine = *engine_owner;

  std::vector<uint8_t> mem(2 * static_cast<std::size_t>(o.depth) * o.size, 0x5a);
  ferry::Region local = engine.register_memory(mem.data(), mem.size(), ferry::Access::kLocal);

  Track tracks[2];
  const std::string* addrs[2] = {&o.faulty_addr, &o.healthy_addr};
  const std::string* descs[2] = {&o.faulty_desc, &o.healthy_desc};
  for (int p = 0; p < 2; ++p) {
    tracks[p].peer = engine.connect(*addrs[p]);
    tracks[p].remote = ferry::Descriptor::parse(*descs[p]);
    tracks[p].busy.assign(static_cast<std::size_t>(o.depth), false);
    if (tracks[p].peer.transport() != ferry::TransportKind::kVerbs) {
      std::cerr << "ferry_wire_probe: peer " << *addrs[p] << " is not served over verbs\n";
      return 1;
    }
    if (tracks[p].remote.length < static_cast<uint64_t>(o.depth) * o.size) {
      std::cerr << "ferry_wire_probe: the region of " << *addrs[p] << " is too small\n";
      return 1;
    }
  }

  auto post = [&](int p, int slot) {
    Track& t = tracks[p];
    // Slot s of peer p has its own local area; writes and reads alternate.
    ferry::Transfer tr{&local, (static_cast<uint64_t>(p) * o.depth + slot) * o.size, &t.remote,
                       static_cast<uint64_t>(slot) * o.size, o.size};
    ferry::Future f = t.issued++ % 2 == 0 ? t.peer.write({&tr, 1}) : t.peer.read({&tr, 1});
    t.busy[static_cast<std::size_t>(slot)] = true;
    f.then([&, p, slot](const ferry::Status& s) {
      std::lock_guard lock(mu);
      done.push_back({p, slot, s, Clock::now()});
      cv.notify_one();
    });
  };
  for (int p = 0; p < 2; ++p)
    for (int s = 0; s < o.depth; ++s) post(p, s);

  Track& faulty = tracks[0];
  Track& healthy = tracks[1];
  bool ready = false;
  Clock::time_point failed_at{}, all_failed_at{};
  uint64_t healthy_after = 0;  // healthy completions after the faulty peer's first failure
  auto started = Clock::now();
  auto last_status = started;
  for (;;) {
    heartbeat_ms = now_ms();
    std::deque<Done> batch;
    {
      std::unique_lock lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return !done.empty(); });
      batch.swap(done);
    }
    auto now = Clock::now();
    if (ms_between(last_status, now) >= 2000) {
      last_status = now;
      std::cout << "PROBE STATUS faulty ok " << faulty.ok << " failed " << faulty.failed
                << ", healthy ok " << healthy.ok << " failed " << healthy.failed << std::endl;
    }
    for (const Done& d : batch) {
      Track& t = tracks[d.peer];
      t.busy[static_cast<std::size_t>(d.slot)] = false;
      if (ready && t.last_done != Clock::time_point{})
        t.worst_gap_ms = std::max(t.worst_gap_ms, ms_between(t.last_done, d.at));
      t.last_done = d.at;
      if (d.status.ok()) {
        ++t.ok;
        t.last_ok = d.at;
        if (d.peer == 1 && failed_at != Clock::time_point{}) ++healthy_after;
      } else {
        ++t.failed;
        if (t.first_error.empty()) t.first_error = d.status.to_string();
      }
      // A peer gets no new operation once one of its operations failed.
      if (t.failed == 0) post(d.peer, d.slot);
    }
    if (!ready && faulty.ok >= 20 && healthy.ok >= 20) {
      ready = true;
      std::cout << "PROBE READY" << std::endl;
    }
    bool faulty_idle =
        std::none_of(faulty.busy.begin(), faulty.busy.end(), [](bool b) { return b; });
    if (faulty.failed > 0 && failed_at == Clock::time_point{}) failed_at = now;
    if (faulty.failed > 0 && faulty_idle && all_failed_at == Clock::time_point{}) {
      all_failed_at = faulty.last_done;
      std::cout << "PROBE FAILED " << ms_between(faulty.last_ok, all_failed_at)
                << " ms after the last success: " << faulty.first_error << std::endl;
    }
    if (all_failed_at != Clock::time_point{} && ms_between(all_failed_at, now) >= o.after_ms) break;
    Clock::time_point since = faulty.last_ok == Clock::time_point{} ? started : faulty.last_ok;
    if (all_failed_at == Clock::time_point{} && ms_between(since, now) > o.limit_ms) {
      std::cout << "PROBE HUNG: the faulty peer's operations did not all fail within " << o.limit_ms
                << " ms of its last success (" << faulty.failed << " failed)" << std::endl;
      break;
    }
  }

  double fail_ms =
      all_failed_at == Clock::time_point{} ? -1 : ms_between(faulty.last_ok, all_failed_at);
  heartbeat_ms = now_ms();  // shutdown and destruction get their own 10 s
  auto shutdown_from = Clock::now();
  engine.shutdown();
  double shutdown_ms = ms_between(shutdown_from, Clock::now());
  // Destroying the engine waits (bounded) for the teardown thread: the faulty peer's queue
  // pairs, which a stalled wire may still hold.
  for (Track& t : tracks) t.peer = ferry::Peer();
  local = ferry::Region();
  auto destroy_from = Clock::now();
  engine_owner.reset();
  double destroy_ms = ms_between(destroy_from, Clock::now());

  heartbeat_ms = 0;
  std::cout << "METRIC fail_ms " << fail_ms << " ms\n"
            << "METRIC healthy_worst_stall_ms " << healthy.worst_gap_ms << " ms\n"
            << "METRIC healthy_ops " << healthy.ok << " ops\n"
            << "METRIC healthy_errors " << healthy.failed << " ops\n"
            << "METRIC faulty_failed " << faulty.failed << " ops\n"
            << "METRIC healthy_ops_after_failure " << healthy_after << " ops\n"
            << "METRIC shutdown_ms " << shutdown_ms << " ms\n"
            << "METRIC destroy_ms " << destroy_ms << " ms\n"
            << "NOTE faulty peer error: " << faulty.first_error << "\n";
  if (!healthy.first_error.empty())
    std::cout << "NOTE healthy peer error: " << healthy.first_error << "\n";
  bool ok = all_failed_at != Clock::time_point{} && healthy.failed == 0 && healthy_after > 0;
  std::cout << "PROBE DONE " << (ok ? "ok" : "FAILED") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT}) ::signal(sig, on_crash);
  watch_main_loop(10000);
  // A failed connect or registration is a finding the host script reports, not a crash.
  try {
    return probe(o);
  } catch (const std::exception& e) {
    heartbeat_ms = 0;
    std::cout << "PROBE ERROR " << e.what() << std::endl;
    return 1;
  }
}
