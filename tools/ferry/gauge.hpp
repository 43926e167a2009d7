// The live throughput gauge: an HTTP server (cpp-httplib) on threads of its own that serves a
// self-contained page (gauge_page.hpp), the current rate as Server-Sent Events four times a
// second (/events) and as one JSON object (/rate), and the rate with the engine's metrics in
// Prometheus text format (/metrics). `ferry gauge` feeds it from UDP datagrams; `ferry stream
// --web` and `ferry bench --web` from their transfers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "options.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace httplib {
class Server;
}  // namespace httplib

namespace ferry {
class Engine;
}  // namespace ferry

namespace ferry::cli {

class GaugeServer {
 public:
  // How often /events sends the rate: at least four times a second, as a needle needs to move
  // smoothly.
  static constexpr int kUpdatesPerSecond = 4;
  // Event streams served at once; more wait (each holds one of the server's threads).
  static constexpr int kMaxViewers = 16;

  // Listens on `at` (port 0: a free one). Throws std::runtime_error naming the address.
  // `engine`, when given, must outlive the server: /metrics serves its Engine::metrics().
  GaugeServer(const Address& at, std::string title, const Engine* engine = nullptr);
  ~GaugeServer();  // ends the event streams and stops the server
  GaugeServer(const GaugeServer&) = delete;
  GaugeServer& operator=(const GaugeServer&) = delete;

  std::string url() const;
  // The rate now, bytes per second; any thread.
  void publish(double bytes_per_second) { rate_.store(bytes_per_second); }

 private:
  std::string event() const;    // one JSON object: title, time, rate
  std::string metrics() const;  // the Prometheus text of /metrics

  std::string title_;
  const Engine* engine_;
  std::string host_;
  int port_ = 0;
  std::atomic<double> rate_{0};
  std::atomic<bool> stopping_{false};
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

// A rate measured over windows of 1 / kUpdatesPerSecond: feed it the running byte count.
class RateWindow {
 public:
  // True (and `rate` set, bytes per second) when a window closed.
  bool sample(uint64_t total_bytes, double& rate);

 private:
  bool started_ = false;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point at_{};
};

struct GaugeOptions {
  Address web{"127.0.0.1", 8080};
  Address udp{"127.0.0.1", 9999};
  std::string title = "ferry gauge";
  // A rate older than this shows as 0: its sender stopped.
  double stale_seconds = 2;
};

void add_gauge_options(CLI::App& app, GaugeOptions& o);
// Listens for rates (UDP datagrams: a number of bytes per second, with optional units as
// --rate takes them: "2500000000", "2.5GB/s") and shows them until Ctrl-C.
int run_gauge(const GaugeOptions& o);

}  // namespace ferry::cli
