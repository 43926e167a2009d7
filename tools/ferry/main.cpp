// The `ferry` command: benchmark and host information.
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <iostream>

#include "bench.hpp"
#include "ferry/ferry.hpp"

namespace {

std::string self_path(const char* argv0) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return argv0;
  buf[n] = '\0';
  return buf;
}

int run_info() {
  std::cout << "ferry " << ferry::Engine::version() << "\n\ntransports:\n";
  std::vector<std::string> rdma_devices;
  for (const auto& t : ferry::Engine::transports()) {
    std::cout << "  " << ferry::to_string(t.kind) << (t.usable ? "  usable   " : "  unusable ")
              << t.detail << "\n";
    if (t.kind == ferry::TransportKind::kVerbs) rdma_devices = t.devices;
  }
  std::cout << "\nnetwork interfaces (tcp):\n";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr) continue;
      int family = a->ifa_addr->sa_family;
      if (family != AF_INET && family != AF_INET6) continue;
      char host[NI_MAXHOST];
      socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      if (getnameinfo(a->ifa_addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
        continue;
      std::cout << "  " << a->ifa_name << "  " << host
                << ((a->ifa_flags & IFF_UP) ? "" : "  (down)") << "\n";
    }
    freeifaddrs(list);
  }
  std::cout << "\nrdma devices:" << (rdma_devices.empty() ? " none" : "") << "\n";
  for (const auto& d : rdma_devices) std::cout << "  " << d << "\n";
  return 0;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"Ferry: peer-to-peer transfer engine"};
  app.require_subcommand(1);

  ferry::cli::BenchOptions bench;
  auto* b = app.add_subcommand("bench",
                               "Two-process transfer benchmark (starts its own target by default)");
  b->add_option("--listen", bench.listen,
                "Run as the target, accepting one initiator on HOST:PORT");
  b->add_option("--connect", bench.connect, "Run as the initiator against a target at HOST:PORT");
  b->add_option(
      "--op", bench.op,
      "Comma-separated operations: write, read, write_imm, send, pingpong (half the round "
      "trip of answered writes, as ib_write_lat)");
  b->add_option("--sizes", bench.sizes, "Transfer sizes in bytes (default 4K..64M, x4 steps)")
      ->delimiter(',');
  b->add_option("--batch", bench.batch, "Entries per operation");
  b->add_option("--concurrency", bench.concurrency, "Operations in flight");
  b->add_option("--transport", bench.transport, "Transport: auto (best present), tcp or verbs");
  b->add_option("--iters", bench.iters,
                "Operations per size (default: about 512 MiB or at least 20)");
  b->add_flag("--json", bench.json, "One JSON object per result line");
  b->add_option("--secret", bench.secret, "Shared secret for peer authentication");
  b->add_option("--streams", bench.streams, "TCP sockets per peer");
  b->add_option("--qps", bench.qps, "Verbs queue pairs per peer");
  b->add_option("--slice", bench.slice_bytes, "Slice size in bytes for large transfers");
  b->add_option("--stripe", bench.stripe_bytes,
                "Operations above this many bytes use every socket");
  b->add_option("--threads", bench.threads, "Progress threads per engine");
  b->add_option("--busy-poll-us", bench.busy_poll_us, "Progress threads spin this long after work");
  b->add_option("--wait-spin-us", bench.wait_spin_us,
                "Future::wait spins this long before sleeping");
  b->add_flag("--prepared", bench.prepared,
              "Post write, read, write_imm and pingpong batches prepared once (Peer::prepare_*)");
  b->add_flag("--same-area", bench.same_area,
              "Operations in flight all use the same buffer area, as perftest's do (default: "
              "one area each)");
  b->get_option("--listen")->excludes("--connect");

  auto* info = app.add_subcommand("info", "Version, transports usable here and devices");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*info) return run_info();
    return ferry::cli::run_bench(bench, self_path(argv[0]));
  } catch (const ferry::Error& e) {
    std::cerr << "ferry: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ferry: " << e.what() << std::endl;
    return 1;
  }
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "ferry: " << e.what() << std::endl;
    return 1;
  }
}
