#include "gauge.hpp"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "emulate.hpp"  // rate_value
#include "endpoints.hpp"
#include "ferry/ferry.hpp"
#include "flags.hpp"
#include "gauge_page.hpp"
#include "info.hpp"  // json_string

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPeriod = std::chrono::milliseconds(1000 / GaugeServer::kUpdatesPerSecond);

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

GaugeServer::GaugeServer(const Address& at, std::string title, const Engine* engine)
    : title_(std::move(title)),
      engine_(engine),
      host_(at.host),
      server_(std::make_unique<httplib::Server>()) {
  server_->new_task_queue = [] { return new httplib::ThreadPool(kMaxViewers); };
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kGaugePage, "text/html; charset=utf-8");
  });
  server_->Get("/rate", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(event(), "application/json");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/events", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream",
                                     [this](std::size_t, httplib::DataSink& sink) {
                                       if (stopping_.load()) return false;
                                       std::string message = "data: " + event() + "\n\n";
                                       if (!sink.write(message.data(), message.size()))
                                         return false;
                                       std::this_thread::sleep_for(kPeriod);
                                       return !stopping_.load();
                                     });
  });
  port_ = at.port == 0 ? server_->bind_to_any_port(at.host)
                       : (server_->bind_to_port(at.host, at.port) ? at.port : -1);
  if (port_ <= 0) {
    throw std::runtime_error("--web " + at.to_string() + ": cannot listen there (" +
                             std::strerror(errno) + ")");
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

GaugeServer::~GaugeServer() {
  stopping_.store(true);
  server_->stop();
  thread_.join();
}

std::string GaugeServer::url() const {
  Address a{host_, static_cast<uint16_t>(port_)};
  return "http://" + a.to_string() + "/";
}

std::string GaugeServer::event() const {
  char numbers[96];
  std::snprintf(numbers, sizeof numbers, "\"t\":%.3f,\"rate\":%.1f", now_seconds(), rate_.load());
  return "{\"title\":" + json_string(title_) + "," + numbers + "}";
}

std::string GaugeServer::metrics() const {
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f", rate_.load());
  std::string text =
      "# HELP ferry_gauge_rate_bytes_per_second The rate the gauge shows.\n"
      "# TYPE ferry_gauge_rate_bytes_per_second gauge\n"
      "ferry_gauge_rate_bytes_per_second ";
  text += rate;
  text += '\n';
  if (engine_ != nullptr) text += engine_->metrics().prometheus();
  return text;
}

bool RateWindow::sample(uint64_t total_bytes, double& rate) {
  auto now = Clock::now();
  if (!started_) {
    started_ = true;
    bytes_ = total_bytes;
    at_ = now;
    return false;
  }
  double seconds = std::chrono::duration<double>(now - at_).count();
  if (seconds < std::chrono::duration<double>(kPeriod).count()) return false;
  rate = static_cast<double>(total_bytes - bytes_) / seconds;
  bytes_ = total_bytes;
  at_ = now;
  return true;
}

void add_gauge_options(CLI::App& app, GaugeOptions& o) {
  add(app, "--web", o.web, address(true), "Serve the page on HOST:PORT (port 0: a free one)")
      ->type_name("HOST:PORT")
      ->default_str(o.web.to_string());
  add(app, "--udp", o.udp, address(true),
      "Take rates as UDP datagrams on HOST:PORT: bytes per second, units allowed (2.5GB/s)")
      ->type_name("HOST:PORT")
      ->default_str(o.udp.to_string());
  app.add_option("--title", o.title, "What the page names")->capture_default_str();
}

int run_gauge(const GaugeOptions& o) {
  const std::atomic<bool>& stop = stop_on_signals();
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, o.udp.host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(o.udp.port);
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, o.udp.host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(o.udp.port);
    len = sizeof *v6;
  } else {
    throw std::runtime_error("--udp " + o.udp.to_string() + ": not a numeric address");
  }
  OwnedFd udp(::socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (udp.get() < 0 || ::bind(udp.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
      ::getsockname(udp.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    throw std::runtime_error("--udp " + o.udp.to_string() + ": " + std::strerror(errno));
  }
  Address udp_at = o.udp;
  udp_at.port = ntohs(ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);

  GaugeServer server(o.web, o.title);
  std::cout << "gauge on " << server.url() << " (rates by UDP to " << udp_at.to_string() << ")"
            << std::endl;
  auto last = Clock::now();
  bool live = false;
  uint64_t ignored = 0;
  while (!stop.load()) {
    pollfd p{udp.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kPeriod.count())) > 0) {
      char text[128];
      ssize_t n = ::recv(udp.get(), text, sizeof text - 1, 0);
      if (n <= 0) continue;
      std::string datagram(text, static_cast<std::size_t>(n));
      while (!datagram.empty() && std::isspace(static_cast<unsigned char>(datagram.back())))
        datagram.pop_back();
      try {
        server.publish(rate_value("datagram", datagram));
        last = Clock::now();
        live = true;
      } catch (const CLI::ValidationError&) {
        if (ignored++ == 0)
          std::cerr << "ferry gauge: ignoring datagrams that hold no rate, "
                    << "such as '" << datagram << "'" << std::endl;
      }
    }
    if (live && std::chrono::duration<double>(Clock::now() - last).count() > o.stale_seconds) {
      server.publish(0);
      live = false;
    }
  }
  return 0;
}

}  // namespace ferry::cli
