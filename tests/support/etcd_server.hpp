// A real etcd server (Debian's etcd-server, scripts/install-deps.sh test) for the directory's
// tests: its own data directory and free ports; it can be stopped, killed and started again on
// the same ports and data, as an operator's etcd restarts.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/etcd.hpp"

extern char** environ;

namespace ferry::test {

class EtcdServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  EtcdServer() {
    if (!std::filesystem::exists(kBinary)) {
      throw std::runtime_error(std::string(kBinary) +
                               " is missing: scripts/install-deps.sh test installs etcd-server");
    }
    char dir[] = "/tmp/ferry-etcd-XXXXXX";
    if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp");
    dir_ = dir;
    client_port_ = free_port();
    peer_port_ = free_port();
    start();
  }
  ~EtcdServer() {
    kill_now();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(client_port_); }
  core::EtcdClient client() const {
    return core::EtcdClient({{"127.0.0.1", client_port_}}, std::chrono::seconds(5));
  }

  // Starts it on its ports and data, and waits until it answers (throws after 60 s).
  void start() {
    const std::string client = url();
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {kBinary,
                                     "--name=ferry-test",
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=ferry-test=" + peer,
                                     "--logger=zap",
                                     "--log-outputs=" + dir_ + "/etcd.log",
                                     "--log-level=warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, kBinary, nullptr, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
      throw std::runtime_error("posix_spawn etcd");
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!answers()) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("etcd did not answer within 60 s (" + dir_ + "/etcd.log)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // SIGTERM, and waits for it to end.
  void stop() { end(SIGTERM); }
  void kill_now() { end(SIGKILL); }

  bool answers() const {
    std::optional<core::EtcdClient::KeyValue> ignored;
    return client().get("ferry-test/probe", ignored).ok();
  }

 private:
  static uint16_t free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("no free port");
    }
    ::close(fd);
    return ntohs(a.sin_port);
  }
  void end(int signal) {
    if (pid_ <= 0) return;
    ::kill(pid_, signal);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  std::string dir_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace ferry::test
