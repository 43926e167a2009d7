// Two processes: transfers across a process boundary, a killed target, a hung target.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/pair.hpp"

extern char** environ;

namespace ferry::test {
namespace {

// The target process, its address and descriptor; stdin closed or SIGKILL ends it.
struct TargetProcess {
  // `transports`: the target's, by name, comma-separated (empty: the default ones).
  explicit TargetProcess(std::size_t size, std::string transports = {}) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::string size_arg = std::to_string(size);
    std::string host_arg = "127.0.0.1";
    char* argv[] = {const_cast<char*>(FERRY_TEST_TARGET_PATH), size_arg.data(), host_arg.data(),
                    transports.empty() ? nullptr : transports.data(), nullptr};
    if (posix_spawn(&pid, FERRY_TEST_TARGET_PATH, &fa, nullptr, argv, environ) != 0) {
      throw std::runtime_error("posix_spawn");
    }
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    stdin_fd = in[1];
    FILE* f = fdopen(out[0], "r");
    char line[4096];
    while (fgets(line, sizeof line, f) != nullptr) {
      std::string s(line);
      if (!s.empty() && s.back() == '\n') s.pop_back();
      if (s.rfind("ADDR ", 0) == 0) address = s.substr(5);
      if (s.rfind("DESC ", 0) == 0) {
        descriptor = Descriptor::parse(s.substr(5));
        break;
      }
    }
    fclose(f);
  }
  ~TargetProcess() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      kill(pid, SIGCONT);
      waitpid(pid, nullptr, 0);
    }
    close(stdin_fd);
  }
  void kill_now() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  pid_t pid = -1;
  int stdin_fd = -1;
  std::string address;
  Descriptor descriptor;
};

// SIGSTOP is asynchronous: wait until every thread of `pid` is really stopped.
bool wait_until_stopped(pid_t pid) {
  for (int attempt = 0; attempt < 2000; ++attempt) {
    bool all_stopped = true;
    std::string dir = "/proc/" + std::to_string(pid) + "/task";
    for (const auto& task : std::filesystem::directory_iterator(dir)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      auto close = line.rfind(')');
      if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T')
        all_stopped = false;
    }
    if (all_stopped) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

uint8_t target_byte(uint64_t i) { return static_cast<uint8_t>(i * 31 + 7); }

TEST(MultiProcess, ByteExactAcrossTheProcessBoundary) {
  constexpr std::size_t kSize = 16 << 20;
  TargetProcess target(kSize);
  ASSERT_FALSE(target.address.empty());
  Engine e(test_config());
  Peer peer = e.connect(target.address);
  std::vector<uint8_t> buf(kSize), back(kSize);
  Region local = e.register_memory(buf.data(), kSize, Access::kLocal);
  Region check = e.register_memory(back.data(), kSize, Access::kLocal);

  // Reads see what the target process wrote itself.
  Transfer whole{&local, 0, &target.descriptor, 0, kSize};
  ASSERT_TRUE(peer.read({&whole, 1}).wait(kWait).ok());
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(buf[i], target_byte(i)) << i;

  for (uint64_t size :
       {uint64_t{1}, uint64_t{3}, uint64_t{4097}, uint64_t{999999}, uint64_t{5} << 20}) {
    uint64_t off = (size * 13) % (kSize - size);
    fill_pattern(buf.data() + off, size, static_cast<uint32_t>(size));
    Transfer w{&local, off, &target.descriptor, off, size};
    ASSERT_TRUE(peer.write({&w, 1}).wait(kWait).ok()) << size;
    Transfer r{&check, off, &target.descriptor, off, size};
    ASSERT_TRUE(peer.read({&r, 1}).wait(kWait).ok()) << size;
    ASSERT_EQ(0, std::memcmp(buf.data() + off, back.data() + off, size)) << size;
  }
}

TEST(MultiProcess, ATransportThatStaysInOneProcessIsNotOfferedToAnother) {
  constexpr std::size_t kSize = 1 << 20;
  TargetProcess target(kSize, "loopback,tcp");
  ASSERT_FALSE(target.address.empty());
  Config c = test_config();
  c.transports = {transport_named("loopback").value(), TransportKind::kTcp};
  Engine e(c);
  Peer peer = e.connect(target.address);
  EXPECT_EQ(peer.reach(), Reach::kSameHost);
  EXPECT_EQ(peer.transport(), TransportKind::kTcp);
  std::vector<RouteInfo> routes = peer.routes();
  ASSERT_FALSE(routes.empty());
  EXPECT_EQ(routes[0].why, "loopback: cannot reach another process; tcp: chosen (rank 2)");

  std::vector<uint8_t> buf(kSize);
  Region local = e.register_memory(buf.data(), kSize, Access::kLocal);
  Transfer whole{&local, 0, &target.descriptor, 0, kSize};
  ASSERT_TRUE(peer.read({&whole, 1}).wait(kWait).ok());
  for (uint64_t i = 0; i < kSize; i += 4093) ASSERT_EQ(buf[i], target_byte(i)) << i;
}

TEST(MultiProcess, KilledTargetFailsInFlightOperationsWithinTheTimeout) {
  constexpr std::size_t kSize = 16 << 20;
  TargetProcess target(kSize);
  Config c = test_config();
  c.peer_timeout = std::chrono::seconds(3);
  Engine e(c);
  Peer peer = e.connect(target.address);
  // Reads land in one buffer, writes come from another: the two never touch the same bytes.
  std::vector<uint8_t> in(kSize), out(kSize);
  Region read_into = e.register_memory(in.data(), kSize, Access::kLocal);
  Region write_from = e.register_memory(out.data(), kSize, Access::kLocal);
  Transfer t{&write_from, 0, &target.descriptor, 0, kSize};
  Transfer r{&read_into, 0, &target.descriptor, 0, kSize};
  std::vector<Future> futures;
  for (int i = 0; i < 64; ++i) futures.push_back(i % 2 ? peer.write({&t, 1}) : peer.read({&r, 1}));
  ASSERT_TRUE(futures[0].wait(kWait).ok());
  target.kill_now();
  auto start = Clock::now();
  int lost = 0;
  for (auto& f : futures) {
    Status s = f.wait(c.peer_timeout + std::chrono::seconds(2));
    ASSERT_NE(s.code(), ErrorCode::kTimeout) << "an operation hung after the target died";
    if (s.code() == ErrorCode::kPeerLost)
      ++lost;
    else
      EXPECT_TRUE(s.ok()) << s.to_string();
  }
  if (peer.transport() == TransportKind::kTcp) {
    // Over RDMA (the Soft-RoCE guest) the kernel finishes the DMA already in flight before the
    // killed process is gone, so there every operation may succeed; none may hang.
    EXPECT_GT(lost, 0);
  }
  EXPECT_LT(Clock::now() - start, c.peer_timeout + std::chrono::seconds(2));
  EXPECT_EQ(peer.write({&t, 1}).wait(kWait).code(), ErrorCode::kPeerLost);
  EXPECT_FALSE(peer.connected());
}

TEST(MultiProcess, HungTargetIsDetectedByLiveness) {
  TargetProcess target(1 << 20);
  Config c = test_config();
  c.peer_timeout = std::chrono::seconds(1);
  Engine e(c);
  Peer peer = e.connect(target.address);
  std::vector<uint8_t> buf(1 << 20);
  Region local = e.register_memory(buf.data(), buf.size(), Access::kLocal);
  Transfer t{&local, 0, &target.descriptor, 0, buf.size()};
  ASSERT_TRUE(peer.read({&t, 1}).wait(kWait).ok());
  kill(target.pid, SIGSTOP);  // alive for the kernel, silent for us
  ASSERT_TRUE(wait_until_stopped(target.pid));
  Future read = peer.read({&t, 1});
  // Nobody receives: the message waits for the target's engine to buffer and acknowledge it.
  Future sent = peer.send(1, local, 0, 64);
  auto start = Clock::now();
  Status s = sent.wait(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), ErrorCode::kPeerLost) << s.to_string();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(s.message().find("no sign of life"), std::string::npos) << s.message();
  EXPECT_FALSE(peer.connected());
  Status r = read.wait(std::chrono::seconds(1));
  if (peer.transport() == TransportKind::kTcp) {
    EXPECT_EQ(r.code(), ErrorCode::kPeerLost) << r.to_string();
  } else {
    // Over RDMA (the Soft-RoCE guest) the stopped target's kernel still serves the read.
    EXPECT_TRUE(r.ok() || r.code() == ErrorCode::kPeerLost) << r.to_string();
  }
}

}  // namespace
}  // namespace ferry::test
