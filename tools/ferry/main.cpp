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

// Exit status of a command line refused before anything started; 1 is a run that failed.
constexpr int kExitUsage = 2;

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

// "ferry bench: --iters: '0' must be between 1 and 1000000"
std::string failure_message(const CLI::App* app, const CLI::Error& e) {
  std::string who = "ferry";
  for (const CLI::App* sub : app->get_subcommands()) who += " " + sub->get_name();
  return who + ": " + e.what() + "\n(" + who + " --help shows the options)\n";
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"Ferry: peer-to-peer transfer engine"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();
  app.failure_message(failure_message);

  ferry::cli::BenchOptions bench;
  auto* b = app.add_subcommand("bench",
                               "Two-process transfer benchmark (starts its own target by default)");
  ferry::cli::add_bench_options(*b, bench);
  auto* info = app.add_subcommand("info", "Version, transports usable here and devices");

  try {
    app.parse(argc, argv);
    if (*b) ferry::cli::check_bench_options(bench);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  try {
    if (*info) return run_info();
    return ferry::cli::run_bench(bench, self_path(argv[0]));
  } catch (const std::exception& e) {
    std::cerr << "ferry " << (*info ? "info" : "bench") << ": " << e.what() << std::endl;
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
