// `ferry gauge` and `ferry stream --web` over plain HTTP: rates sent by UDP reach /rate and
// /events, bad datagrams are ignored, the page is served, and a stream's gauge shows its rate.
// (tests/browser renders the page in Chromium; this suite also runs under the sanitizers.)
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "support/cli_process.hpp"

namespace ferry::test {
namespace {

// The body of GET `path` from http://127.0.0.1:`port` (read for at most `limit` bytes: an
// event stream never ends by itself).
std::string http_get(int port, const std::string& path, std::size_t limit = 1 << 20) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::string request =
        "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    (void)!write(fd, request.data(), request.size());
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (reply.size() < limit && poll(&p, 1, 30000) > 0) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      reply.append(buf, static_cast<std::size_t>(n));
    }
  }
  close(fd);
  std::size_t body = reply.find("\r\n\r\n");
  return body == std::string::npos ? "" : reply.substr(body + 4);
}

double rate_of(const std::string& json) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"rate\":([0-9.]+)"))) return -1;
  return std::stod(m[1].str());
}

void send_datagram(int port, const std::string& text) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)sendto(fd, text.data(), text.size(), 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
  close(fd);
}

// Sends `datagram` until /rate shows `want` (a wait, not a measurement: the guard is generous).
bool rate_becomes(int web, int udp, const std::string& datagram, double want) {
  for (int i = 0; i < 3000; ++i) {
    send_datagram(udp, datagram);
    if (rate_of(http_get(web, "/rate")) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(Gauge, RatesByUdpReachItsRateAndEventStreamAndBadOnesAreIgnored) {
  Background gauge({"gauge", "--web", "127.0.0.1:0", "--udp", "127.0.0.1:0", "--title", "lab"});
  std::smatch m;
  std::string first = gauge.line();
  ASSERT_TRUE(std::regex_search(
      first, m,
      std::regex(R"(gauge on http://127\.0\.0\.1:(\d+)/ \(rates by UDP to 127\.0\.0\.1:(\d+)\))")))
      << first;
  int web = std::stoi(m[1].str()), udp = std::stoi(m[2].str());

  EXPECT_EQ(rate_of(http_get(web, "/rate")), 0);
  ASSERT_TRUE(rate_becomes(web, udp, "2.5GB/s", 2.5e9));
  ASSERT_TRUE(rate_becomes(web, udp, "123456789\n", 123456789));
  send_datagram(udp, "fast");  // no rate: ignored, the last one stays
  std::string events = http_get(web, "/events", 300);
  EXPECT_NE(events.find("data: {\"title\":\"lab\""), std::string::npos) << events;
  EXPECT_EQ(rate_of(events), 123456789) << events;
  std::string page = http_get(web, "/");
  EXPECT_NE(page.find("new EventSource(\"events\")"), std::string::npos);
  // Self-contained: nothing fetched from elsewhere.
  EXPECT_EQ(page.find("src=\"http"), std::string::npos);
  EXPECT_EQ(page.find("href=\"http"), std::string::npos);
  gauge.signal(SIGINT);
  EXPECT_EQ(gauge.wait(), 0);
  EXPECT_NE(gauge.errors().find("ignoring datagrams that hold no rate, such as 'fast'"),
            std::string::npos);
}

TEST(Gauge, AStreamServesItsRateOnItsPage) {
  Background receiver({"stream", "--listen", "127.0.0.1:0", "--web", "127.0.0.1:0", "--sink",
                       "/dev/null", "--sink-rate", "40MB/s", "--slot-bytes", "256K"});
  std::string first = receiver.line();
  ASSERT_EQ(first.rfind("listening on ", 0), 0u) << first;
  Background sender({"stream", "--connect", first.substr(13), "--bytes", "2G"});
  int web = 0;
  for (std::string l = receiver.line(); !l.empty() && web == 0; l = receiver.line()) {
    std::smatch m;
    if (std::regex_search(l, m, std::regex(R"(^gauge on http://127\.0\.0\.1:(\d+)/)")))
      web = std::stoi(m[1].str());
  }
  ASSERT_GT(web, 0);
  double shown = 0;
  for (int i = 0; i < 3000 && shown <= 0; ++i) {
    shown = rate_of(http_get(web, "/rate"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(shown, 0);  // its agreement with the stream's report: tests/browser
  sender.signal(SIGINT);
  EXPECT_EQ(sender.wait(), 0) << sender.errors();
  EXPECT_EQ(receiver.wait(), 0) << receiver.errors();
}

TEST(Gauge, BenchServesOneWhileItRuns) {
  std::string out;
  ASSERT_EQ(run("bench --web 127.0.0.1:0 --op write --sizes 64K --iters 500", out), 0) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(gauge on http://127\.0\.0\.1:\d+/)"))) << out;
  EXPECT_EQ(run("bench --listen 127.0.0.1:0 --web 127.0.0.1:0", out), 2);
  EXPECT_NE(out.find("excludes"), std::string::npos) << out;
}

}  // namespace
}  // namespace ferry::test
