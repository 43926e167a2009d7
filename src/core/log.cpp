#include "core/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>

namespace ferry {

const char* to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kOff:
      return "off";
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kTrace:
      return "trace";
  }
  return "?";
}

std::optional<LogLevel> log_level_named(std::string_view name) noexcept {
  for (LogLevel l : {LogLevel::kOff, LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo,
                     LogLevel::kDebug, LogLevel::kTrace}) {
    if (name == to_string(l)) return l;
  }
  if (name == "warning") return LogLevel::kWarn;
  return std::nullopt;
}

namespace {

constexpr LogLevel kDefaultLevel = LogLevel::kWarn;

// Where records go: the sink if one is set, else the file descriptor (FERRY_LOG_FILE or
// stderr). Read once under `mu`; records are written outside it.
struct Output {
  std::mutex mu;
  std::shared_ptr<const LogSink> sink;
  int fd = STDERR_FILENO;
  bool opened = false;  // FERRY_LOG_FILE looked at
};

Output& output() {
  static Output* out = new Output;  // never destroyed: threads may log during exit
  return *out;
}

// The line written to a file or stderr: "ferry 2026-11-28T13:40:02.123Z warn listener: ...".
std::string format_line(LogLevel level, std::string_view component, std::string_view message) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  gmtime_r(&ts.tv_sec, &utc);
  char when[40];
  std::size_t n = std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
  std::string line = "ferry ";
  line += when;
  line += ' ';
  line += to_string(level);
  line += ' ';
  line += component;
  line += ": ";
  line += message;
  line += '\n';
  return line;
}

void write_all(int fd, const std::string& line) {
  std::size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere left to say it
    done += static_cast<std::size_t>(n);
  }
}

// FERRY_LOG_FILE, opened once for appending; a file that cannot be opened leaves stderr, which
// says why.
void open_log_file_locked(Output& out) {
  out.opened = true;
  const char* path = std::getenv("FERRY_LOG_FILE");
  if (path == nullptr || *path == '\0') return;
  int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    write_all(STDERR_FILENO, format_line(LogLevel::kWarn, "log",
                                         std::string("FERRY_LOG_FILE=") + path + ": open: " +
                                             std::strerror(errno) + "; logging to stderr"));
    return;
  }
  out.fd = fd;
}

}  // namespace

void set_log_level(LogLevel level) noexcept {
  core::log_detail::level.store(static_cast<uint8_t>(level), std::memory_order_relaxed);
}

LogLevel log_level() noexcept {
  uint8_t now = core::log_detail::level.load(std::memory_order_relaxed);
  return now == core::log_detail::kUnread ? core::log_detail::read_environment()
                                          : static_cast<LogLevel>(now);
}

void set_log_sink(LogSink sink) {
  Output& out = output();
  std::lock_guard lock(out.mu);
  out.sink = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
}

namespace core {

LogLevel log_detail::read_environment() noexcept {
  LogLevel level = kDefaultLevel;
  const char* value = std::getenv("FERRY_LOG");
  std::optional<LogLevel> named = value != nullptr ? log_level_named(value) : std::nullopt;
  if (named) level = *named;
  uint8_t expected = kUnread;
  // A level set meanwhile (set_log_level) wins over the environment.
  if (!log_detail::level.compare_exchange_strong(expected, static_cast<uint8_t>(level))) {
    return static_cast<LogLevel>(expected);
  }
  if (value != nullptr && !named) {
    write_log(LogLevel::kWarn, "log",
              std::string("FERRY_LOG=\"") + value +
                  "\" is not a level (off, error, warn, info, debug, trace); using warn");
  }
  return level;
}

void write_log(LogLevel level, std::string_view component, std::string_view message) {
  Output& out = output();
  std::shared_ptr<const LogSink> sink;
  int fd;
  {
    std::lock_guard lock(out.mu);
    if (!out.opened) open_log_file_locked(out);
    sink = out.sink;
    fd = out.fd;
  }
  if (sink) {
    (*sink)(LogRecord{level, component, message});
    return;
  }
  write_all(fd, format_line(level, component, message));
}

bool LogLimiter::allow(Clock::time_point now, uint64_t& suppressed) {
  std::lock_guard lock(mu_);
  if (refilled_ == Clock::time_point{}) refilled_ = now;
  if (now - refilled_ >= period_) {
    auto periods = static_cast<uint64_t>((now - refilled_) / period_);
    tokens_ = static_cast<uint32_t>(std::min<uint64_t>(burst_, tokens_ + periods));
    refilled_ += period_ * static_cast<int64_t>(periods);
  }
  if (tokens_ == 0) {
    ++suppressed_;
    return false;
  }
  --tokens_;
  suppressed = std::exchange(suppressed_, 0);
  return true;
}

}  // namespace core
}  // namespace ferry
