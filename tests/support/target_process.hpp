// A target engine in another process (support/target_main.cpp), for tests across the process
// boundary.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "ferry/ferry.hpp"

extern char** environ;

namespace ferry::test {

// A child process whose stdin and stdout are pipes to us.
struct PipedChild {
  pid_t pid = -1;
  int to_stdin = -1;     // ours to write and close
  int from_stdout = -1;  // ours to read and close
};
// Starts `path` with `argv` (argv[0] first, null-terminated); throws naming `path` on failure.
inline PipedChild spawn_piped(const char* path, char* const argv[]) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  PipedChild child;
  int spawned = posix_spawn(&child.pid, path, &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (spawned != 0) {
    close(in[1]);
    close(out[0]);
    throw std::runtime_error(std::string("posix_spawn ") + path);
  }
  child.to_stdin = in[1];
  child.from_stdout = out[0];
  return child;
}

// The target process, its address and descriptor; stdin closed or SIGKILL ends it.
struct TargetProcess {
  // `transports`: the target's, by name, comma-separated (empty: the default ones).
  explicit TargetProcess(std::size_t size, std::string transports = {}) {
    std::string size_arg = std::to_string(size);
    std::string host_arg = "127.0.0.1";
    char* argv[] = {const_cast<char*>(FERRY_TEST_TARGET_PATH), size_arg.data(), host_arg.data(),
                    transports.empty() ? nullptr : transports.data(), nullptr};
    PipedChild child = spawn_piped(FERRY_TEST_TARGET_PATH, argv);
    pid = child.pid;
    stdin_fd = child.to_stdin;
    FILE* f = fdopen(child.from_stdout, "r");
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
inline bool wait_until_stopped(pid_t pid) {
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

inline uint8_t target_byte(uint64_t i) { return static_cast<uint8_t>(i * 31 + 7); }

}  // namespace ferry::test
