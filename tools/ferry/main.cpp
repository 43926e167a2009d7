// The `ferry` command: benchmark, host information, a data-source emulator and streaming.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <iostream>

#include "bench.hpp"
#include "emulate.hpp"
#include "ferry/ferry.hpp"
#include "gauge.hpp"
#include "info.hpp"
#include "stream.hpp"

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

// Optimal string alignment distance: a swap of two letters ("bnech") counts once.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// CLI11 2.1 says only "A subcommand is required" for a misspelt command: name it, and the
// closest one.
bool unknown_command(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  std::string word = argv[1], closest, names;
  std::size_t best = 3;  // suggest within two edits
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == word) return false;
    names += (names.empty() ? "" : ", ") + sub->get_name();
    if (std::size_t d = edit_distance(word, sub->get_name()); d < best) {
      best = d;
      closest = sub->get_name();
    }
  }
  std::cerr << "ferry: unknown command '" << word << "'";
  if (closest.empty()) {
    std::cerr << " (commands: " << names << ")\n";
  } else {
    std::cerr << "; did you mean '" << closest << "'?\n";
  }
  return true;
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
  app.set_version_flag("--version", "ferry " + std::string(ferry::Engine::version()));
  app.option_defaults()->always_capture_default();
  app.failure_message(failure_message);

  ferry::cli::BenchOptions bench;
  auto* b = app.add_subcommand("bench",
                               "Two-process transfer benchmark (starts its own target by default)");
  ferry::cli::add_bench_options(*b, bench);
  auto* info = app.add_subcommand("info", "Version, transports usable here and devices");
  bool info_json = false;
  info->add_flag("--json", info_json, "One JSON object: version, transports, interfaces");
  std::string identity;
  info->add_option("--identity", identity,
                   "Print the engine id and public key of this identity file (an engine's "
                   "Config::identity_file; created if missing) instead, for peers' trusted_keys");

  ferry::cli::EmulateOptions emulate;
  auto* em = app.add_subcommand(
      "emulate",
      "Play an instrument: framed data at a set rate to one reader (ferry stream's source)");
  ferry::cli::add_emulate_options(*em, emulate);
  ferry::cli::StreamOptions stream;
  auto* st = app.add_subcommand(
      "stream",
      "Move a stream without stopping into a ring of slots at the receiver (--listen "
      "receives, --connect sends)");
  ferry::cli::add_stream_options(*st, stream);

  ferry::cli::GaugeOptions gauge;
  auto* ga = app.add_subcommand(
      "gauge", "A live throughput page in the browser, fed rates by UDP datagrams");
  ferry::cli::add_gauge_options(*ga, gauge);

  if (unknown_command(app, argc, argv)) return kExitUsage;
  try {
    app.parse(argc, argv);
    if (*b) ferry::cli::check_bench_options(bench);
    if (*st) ferry::cli::check_stream_options(stream);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  const char* command = *info ? "info" : *em ? "emulate" : *st ? "stream" : *ga ? "gauge" : "bench";
  try {
    if (*info && !identity.empty()) return ferry::cli::run_identity(identity, info_json);
    if (*info) return ferry::cli::run_info(info_json);
    if (*em) return ferry::cli::run_emulate(emulate);
    if (*st) return ferry::cli::run_stream(stream);
    if (*ga) return ferry::cli::run_gauge(gauge);
    return ferry::cli::run_bench(bench, self_path(argv[0]));
  } catch (const std::exception& e) {
    std::cerr << "ferry " << command << ": " << e.what() << std::endl;
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
