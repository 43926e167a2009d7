// The Python objects around the C++ API, and what the binding files share. Every object keeps
// its parents alive (a region its engine and the memory's owner, a peer its engine, a future
// its peer and the regions it uses), so Python may drop them in any order.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::python {

namespace nb = nanobind;

// A wait is cut into slices so that a signal (Ctrl-C) interrupts it between two.
constexpr Duration kSignalCheckInterval = std::chrono::milliseconds(100);

// `timeout` from now, or the end of time where that would overflow.
inline Clock::time_point deadline_after(Duration timeout) {
  Clock::time_point now = Clock::now();
  return timeout < Clock::time_point::max() - now ? now + timeout : Clock::time_point::max();
}

// Runs `done(slice)` without the GIL, slice by slice, until it returns true or `deadline`
// passes (then false); between slices raises what a signal handler raised (KeyboardInterrupt),
// so Ctrl-C ends a blocking call promptly.
template <typename Done>
bool wait_interruptibly(Clock::time_point deadline, Done done) {
  for (;;) {
    Duration slice = std::max<Duration>(
        std::min<Duration>(kSignalCheckInterval, deadline - Clock::now()), Duration::zero());
    bool finished;
    {
      nb::gil_scoped_release unlocked;
      finished = done(slice);
    }
    if (finished) return true;
    if (Clock::now() >= deadline) return false;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

// What Ferry threads hand to an asyncio event loop (ferry/_aio.py): push() takes no GIL and
// writes the eventfd the loop waits on only when the loop was not told since its last take(),
// so one wake-up carries however many items came meanwhile.
template <typename T>
class LoopQueue {
 public:
  LoopQueue() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (fd_ < 0) throw Error(ErrorCode::kSystem, std::string("eventfd: ") + std::strerror(errno));
  }
  ~LoopQueue() { ::close(fd_); }
  LoopQueue(const LoopQueue&) = delete;
  LoopQueue& operator=(const LoopQueue&) = delete;

  int fileno() const { return fd_; }
  void push(T item) {
    std::lock_guard lock(mu_);
    items_.push_back(std::move(item));
    if (told_) return;
    told_ = true;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof one);
  }
  // Everything pushed since the last call, in order.
  std::vector<T> take() {
    // Read before taking the items: one pushed in between is taken now, one after is told.
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = ::read(fd_, &count, sizeof count);
    std::lock_guard lock(mu_);
    std::vector<T> out(std::make_move_iterator(items_.begin()),
                       std::make_move_iterator(items_.end()));
    items_.clear();  // keeps its capacity: pushing allocates nothing once warm
    told_ = false;
    return out;
  }

 private:
  const int fd_;
  std::mutex mu_;
  std::vector<T> items_;
  bool told_ = false;  // the eventfd was written since the last take()
};

// Raises the exception class of `status.code()` (ferry.errors) with its message.
[[noreturn]] void raise_status(const Status& status);
void register_errors(nb::module_& m);

// A reference to a Python object that may be dropped on a thread without the GIL (a progress
// thread finishing a callback); once the interpreter is gone it is leaked instead.
class SharedRef {
 public:
  explicit SharedRef(nb::object o) : ptr_(o.release().ptr()) {}
  ~SharedRef() {
    if (nb::detail::cleanup_guard guard{}) Py_XDECREF(ptr_);
  }
  SharedRef(const SharedRef&) = delete;
  SharedRef& operator=(const SharedRef&) = delete;
  nb::handle get() const { return ptr_; }

 private:
  PyObject* ptr_;
};

struct PyEngine {
  std::unique_ptr<Engine> engine;
  ~PyEngine();  // shuts down without the GIL: Ferry's threads may be waiting for it
  Engine& get() const {
    if (!engine) raise_status({ErrorCode::kCancelled, "the engine was shut down"});
    return *engine;
  }
};

struct PyRegion {
  Region region;
  nb::object engine;  // PyEngine: outlives its registrations
  nb::object owner;   // the registered object (array, tensor, bytearray), until deregistered
  bool read_only = false;
  std::optional<Memory> expected;  // what a DLPack export said the memory is, checked once
  // Dropping the region waits for its operations, whose callbacks need the GIL: it is released
  // meanwhile (inside a callback the drop returns at once, the rest on another thread).
  ~PyRegion();
  void deregister();
  const Region& get() const {
    if (!region.valid()) raise_status({ErrorCode::kRevoked, "the region was deregistered"});
    return region;
  }
};

struct PyPeer {
  Peer peer;
  nb::object engine;
};

struct PyFuture {
  Future future;
  nb::object peer;  // PyPeer
  nb::object uses;  // the region (or a tuple of them) the operation touches, kept until dropped
};

struct PyPrepared {
  Prepared prepared;
  nb::object peer;
  nb::object uses;
};

// ferry.Descriptor: a peer's descriptor decoded once, immutable; passed where bytes or str go,
// it saves decoding them on every operation.
struct PyDescriptor {
  Descriptor descriptor;
};

// A peer's descriptor from Python: a ferry.Descriptor (used as is), bytes or str (decoded
// into `scratch`). Raises TypeError for anything else.
const Descriptor& resolve_descriptor(nb::handle remote, Descriptor& scratch);

// One-sided batches from Python arguments: scalars, or 1-D integer arrays (NumPy, torch, any
// DLPack or buffer-protocol array) for page-table batches, built in one C++ loop per column.
// A single entry needs no allocation; a page-table batch reuses a per-thread buffer (a nested
// call on the same thread, e.g. from a completion callback, gets its own).
class Batch {
 public:
  Batch() = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();
  std::span<const Transfer> transfers() const { return transfers_; }

 private:
  friend void build_batch(const PyRegion&, nb::handle, nb::handle, nb::handle, nb::handle, bool,
                          Batch&);
  Transfer* entries(std::size_t n);

  Descriptor parsed_;  // the descriptor, when it came as bytes or str
  Transfer one_;
  std::vector<Transfer> own_;
  std::vector<Transfer>* shared_ = nullptr;  // the thread's buffer while this batch holds it
  std::span<const Transfer> transfers_;
};
void build_batch(const PyRegion& local, nb::handle remote, nb::handle local_offset,
                 nb::handle remote_offset, nb::handle length, bool writes_local, Batch& out);

// Peer::metrics as a dict: engine_id, address, imms_received, and per transport name a dict of
// operation kinds ("write", ..., each succeeded, failed, bytes, in_flight, latency: bucket
// counts, latency_sum_s) and errors ({code name: count}).
nb::dict metrics_dict(const PeerMetrics& m);

// `s` seconds as a Duration; kInvalidArgument naming `what` when negative or not finite.
Duration seconds(double s, const char* what);
// A copy of `base` (a ferry.Config, or None: the defaults) with Engine()'s keywords applied:
// Config attributes, transport settings as <transport>_<name>, and settings={name: value}.
Config config_from(nb::handle base, const nb::kwargs& keywords);

void bind_config(nb::module_& m);
void bind_engine(nb::module_& m);
void bind_peer(nb::module_& m);
void bind_future(nb::module_& m);
void bind_descriptor(nb::module_& m);
// set_log_level, log_level, and the queue ferry/_log.py takes records from.
void bind_log(nb::module_& m);

}  // namespace ferry::python
