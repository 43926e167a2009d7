// Raw TCP ping-pong between two processes on loopback: the floor any TCP-based engine's
// small-message round trip is measured against. Prints the p50 and p99 round trip in us.
//   tcp_pingpong [bytes=8] [iters=20000]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {
bool io_all(int fd, char* p, size_t n, bool sending) {
  while (n > 0) {
    ssize_t r = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 8;
  int iters = argc > 2 ? std::atoi(argv[2]) : 20000;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(lfd, 1) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    perror("listen");
    return 1;
  }
  int one = 1;
  std::vector<char> buf(bytes);
  pid_t pid = fork();
  if (pid == 0) {  // echo server
    int fd = accept(lfd, nullptr, nullptr);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    while (io_all(fd, buf.data(), bytes, false) && io_all(fd, buf.data(), bytes, true)) {
    }
    _exit(0);
  }
  close(lfd);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    perror("connect");
    return 1;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<double> rtt;
  rtt.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters + 100; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (!io_all(fd, buf.data(), bytes, true) || !io_all(fd, buf.data(), bytes, false)) return 1;
    if (i >= 100) {
      rtt.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  close(fd);
  waitpid(pid, nullptr, 0);
  std::sort(rtt.begin(), rtt.end());
  std::printf("rtt_p50_us %.2f\nrtt_p99_us %.2f\n", rtt[rtt.size() / 2],
              rtt[rtt.size() * 99 / 100]);
  return 0;
}
