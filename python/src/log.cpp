// Ferry's log records for Python's logging module. No Ferry thread ever takes the GIL for a
// record (it may log while holding a lock a Python caller waits on): the sink queues records,
// and a Python thread (ferry/_log.py) takes them in batches with the GIL released while it waits.
#include "ferry/log.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"

namespace ferry::python {
namespace {

// Records waiting for the Python thread; beyond this many the oldest are dropped and counted
// (a logger that cannot keep up must not make Ferry hold unbounded memory).
constexpr std::size_t kMaxQueuedRecords = 4096;

using Record = std::tuple<int, std::string, std::string>;  // level, component, message

struct Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Record> records;
  uint64_t dropped = 0;
  bool stopped = false;
};

Queue& queue() {
  static Queue* q = new Queue;  // never destroyed: Ferry threads may log during exit
  return *q;
}

void enqueue(const LogRecord& r) {
  Queue& q = queue();
  {
    std::lock_guard lock(q.mu);
    if (q.stopped) return;
    if (q.records.size() == kMaxQueuedRecords) {
      q.records.pop_front();
      ++q.dropped;
    }
    q.records.emplace_back(static_cast<int>(r.level), std::string(r.component),
                           std::string(r.message));
  }
  q.cv.notify_one();
}

// Waits up to `timeout_s` for records and takes them all (empty: none came, or forwarding
// stopped). Dropped records are reported as one more.
std::vector<Record> take(double timeout_s) {
  Queue& q = queue();
  std::vector<Record> out;
  {
    nb::gil_scoped_release unlocked;
    std::unique_lock lock(q.mu);
    q.cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                  [&] { return !q.records.empty() || q.stopped; });
    out.assign(std::make_move_iterator(q.records.begin()),
               std::make_move_iterator(q.records.end()));
    q.records.clear();
    if (q.dropped != 0) {
      out.emplace_back(static_cast<int>(LogLevel::kWarn), "log",
                       std::to_string(q.dropped) + " records dropped: Python took them too slowly");
      q.dropped = 0;
    }
  }
  return out;
}

}  // namespace

void bind_log(nb::module_& m) {
  m.def(
      "set_log_level",
      [](const std::string& name) {
        std::optional<LogLevel> level = log_level_named(name);
        if (!level) {
          throw nb::value_error(
              ("log level '" + name + "': one of off, error, warn, info, debug, trace").c_str());
        }
        set_log_level(*level);
      },
      nb::arg("level"),
      "Sets the level Ferry logs at: off, error, warn (the default, or FERRY_LOG), info, debug, "
      "trace.");
  m.def(
      "log_level", [] { return std::string(to_string(log_level())); }, "The level Ferry logs at.");
  m.def(
      "_forward_logs",
      [] {
        {
          std::lock_guard lock(queue().mu);
          queue().stopped = false;
        }
        set_log_sink(enqueue);
      },
      "Queues Ferry's log records for _take_logs instead of writing them to stderr.");
  m.def("_take_logs", &take, nb::arg("timeout_s"));
  m.def("_stop_forwarding_logs", [] {
    set_log_sink(nullptr);
    {
      std::lock_guard lock(queue().mu);
      queue().stopped = true;
    }
    queue().cv.notify_all();
  });
}

}  // namespace ferry::python
