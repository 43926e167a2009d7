// Collects Ferry's log records while it lives (ferry/log.hpp), at a level of the test's choice;
// restores the level and the default output after.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/log.hpp"

namespace ferry::test {

class LogCapture {
 public:
  struct Entry {
    LogLevel level;
    std::string component;
    std::string message;
  };

  explicit LogCapture(LogLevel level) : before_(log_level()) {
    set_log_level(level);
    // The state outlives the capture: a thread may still be inside the sink as it goes.
    set_log_sink([state = state_](const LogRecord& r) {
      std::lock_guard lock(state->mu);
      state->entries.push_back({r.level, std::string(r.component), std::string(r.message)});
    });
  }
  ~LogCapture() {
    set_log_sink(nullptr);
    set_log_level(before_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<Entry> entries() const {
    std::lock_guard lock(state_->mu);
    return state_->entries;
  }
  // Records whose message contains `text`.
  std::vector<Entry> containing(const std::string& text) const {
    std::vector<Entry> out;
    for (Entry& e : entries()) {
      if (e.message.find(text) != std::string::npos) out.push_back(std::move(e));
    }
    return out;
  }
  // Waits (up to `limit`, generous: a busy machine) until a record contains `text`.
  bool wait_for(const std::string& text,
                std::chrono::milliseconds limit = std::chrono::seconds(30)) const {
    auto until = std::chrono::steady_clock::now() + limit;
    while (containing(text).empty()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

 private:
  struct State {
    std::mutex mu;
    std::vector<Entry> entries;
  };
  LogLevel before_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace ferry::test
