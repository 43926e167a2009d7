// Logging inside Ferry (the public face is ferry/log.hpp). A log call costs one relaxed load
// and a compare when its level is off: the message is made by a callable only when the level
// is enabled, so nothing is formatted on a path that logs nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/log.hpp"

namespace ferry::core {

namespace log_detail {
// The level in force; kUnread until FERRY_LOG was read (at the first check).
constexpr uint8_t kUnread = 0xff;
inline std::atomic<uint8_t> level{kUnread};
LogLevel read_environment() noexcept;
}  // namespace log_detail

inline bool log_enabled(LogLevel at) {
  uint8_t now = log_detail::level.load(std::memory_order_relaxed);
  if (now == log_detail::kUnread) [[unlikely]]
    now = static_cast<uint8_t>(log_detail::read_environment());
  return at != LogLevel::kOff && static_cast<uint8_t>(at) <= now;
}

// Writes one record to the sink, the log file or stderr (whichever is set), whatever the level.
void write_log(LogLevel level, std::string_view component, std::string_view message);

// Logs what `make()` returns (a std::string) if `level` is enabled.
template <typename Make>
void log(LogLevel level, std::string_view component, Make&& make) {
  if (log_enabled(level)) [[unlikely]]
    write_log(level, component, std::forward<Make>(make)());
}

// Lets through a burst of `burst` events, then one per `period`; counts the rest, so that a
// flood (refused handshakes from a hostile source) costs a few lines, not a full disk. One per
// kind of event, shared by every thread that logs it.
class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  LogLimiter(uint32_t burst, Clock::duration period) : burst_(burst), period_(period) {}
  // Whether an event at `now` may be logged; if so, `suppressed` says how many were not since
  // the last one that was.
  bool allow(Clock::time_point now, uint64_t& suppressed);

 private:
  std::mutex mu_;
  const uint32_t burst_;
  const Clock::duration period_;
  uint32_t tokens_ = burst_;
  Clock::time_point refilled_{};
  uint64_t suppressed_ = 0;
};

// Rate-limited log(): "(N more like it not logged)" follows a message after suppressed ones.
template <typename Make>
void log_limited(LogLimiter& limiter, LogLevel level, std::string_view component, Make&& make) {
  if (!log_enabled(level)) return;
  uint64_t suppressed = 0;
  if (!limiter.allow(LogLimiter::Clock::now(), suppressed)) return;
  std::string message = std::forward<Make>(make)();
  if (suppressed != 0) message += " (" + std::to_string(suppressed) + " more like it not logged)";
  write_log(level, component, message);
}

}  // namespace ferry::core
