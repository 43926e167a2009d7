// The `ferry` command as a test runs it: to its end (Command, run) or in the background
// (Background), its output read back.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace ferry::test {

// Every command runs under `timeout`: a guard against a hang, never a measurement.
inline const std::string kFerry = std::string("timeout 300 ") + FERRY_CLI_PATH;

// Starts `ferry <args>` through the shell, stdout and stderr together.
class Command {
 public:
  explicit Command(const std::string& args)
      : pipe_(popen((kFerry + " " + args + " 2>&1").c_str(), "r")) {}
  ~Command() {
    if (pipe_ != nullptr) pclose(pipe_);
  }
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;
  // Its exit code, once it ended, and everything it printed.
  int finish(std::string& output) {
    char line[512];
    while (fgets(line, sizeof line, pipe_) != nullptr) output += line;
    int status = pclose(pipe_);
    pipe_ = nullptr;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  FILE* pipe_;
};

inline int run(const std::string& args, std::string& output) {
  return Command(args).finish(output);
}

// A `ferry` process in the background: stdout read line by line, stderr at the end.
class Background {
 public:
  explicit Background(std::vector<std::string> args) {
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    posix_spawn_file_actions_addclose(&fa, err[0]);
    args.insert(args.begin(), FERRY_CLI_PATH);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = posix_spawn(&pid_, FERRY_CLI_PATH, &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    close(err[1]);
    if (rc != 0) throw std::runtime_error("posix_spawn");
    out_ = fdopen(out[0], "r");
    err_ = err[0];
  }
  ~Background() {
    if (pid_ > 0) kill_now();
    fclose(out_);
    close(err_);
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  // The next line of stdout, "" at its end.
  std::string line() {
    char buf[512];
    if (fgets(buf, sizeof buf, out_) == nullptr) return "";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  bool running() const { return waitpid(pid_, nullptr, WNOHANG) == 0; }
  void kill_now() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void signal(int sig) const { kill(pid_, sig); }
  // Its exit code once it ends by itself; -1 after a signal, -2 when it had to be killed after
  // `guard_seconds` (a hang guard, never a measurement).
  int wait(int guard_seconds = 300) {
    int status = 0;
    for (int waited_ms = 0; waitpid(pid_, &status, WNOHANG) == 0; waited_ms += 10) {
      if (waited_ms >= guard_seconds * 1000) {
        kill_now();
        return -2;
      }
      usleep(10000);
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Everything on stderr; the process must have ended.
  std::string errors() const {
    std::string s;
    char buf[512];
    for (ssize_t n; (n = read(err_, buf, sizeof buf)) > 0;)
      s.append(buf, static_cast<std::size_t>(n));
    return s;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  int err_ = -1;
};

}  // namespace ferry::test
