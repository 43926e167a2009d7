// What Ferry logs and where it goes: a vocabulary header (no dependencies beyond the standard
// library), so that every layer may log. Ferry logs what an operator needs to see (which
// transport each peer took and why, peers lost, refused handshakes and admission limits,
// configuration warnings, teardown steps that stall), never one line per operation.
//
// FERRY_LOG=off|error|warn|info|debug|trace sets the level (default warn); FERRY_LOG_FILE=PATH
// appends the lines to that file instead of stderr. Both are read once, at the first log call;
// set_log_level and set_log_sink change them afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "ferry/export.hpp"

namespace ferry {

// Most severe first: a level logs itself and everything before it.
enum class LogLevel : uint8_t { kOff, kError, kWarn, kInfo, kDebug, kTrace };

FERRY_API const char* to_string(LogLevel level) noexcept;
// The level named "off", "error", "warn" (or "warning"), "info", "debug" or "trace".
FERRY_API std::optional<LogLevel> log_level_named(std::string_view name) noexcept;

// One logged event. The views are valid during the sink's call only.
struct LogRecord {
  LogLevel level;
  std::string_view component;  // the part of Ferry that logged it: "engine", "listener", "shm", ...
  std::string_view message;
};
// Receives every record at or above the level, on the thread that logged it (a progress thread,
// the listener's, the caller's): it must not block, and must not call back into Ferry.
using LogSink = std::function<void(const LogRecord&)>;

FERRY_API void set_log_level(LogLevel level) noexcept;
FERRY_API LogLevel log_level() noexcept;
// Sends records to `sink` instead of FERRY_LOG_FILE or stderr; an empty sink restores those.
FERRY_API void set_log_sink(LogSink sink);

}  // namespace ferry
