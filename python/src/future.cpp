// ferry.Future: wait with a timeout (the GIL released, Ctrl-C honoured), poll, callbacks.
// Awaiting one in asyncio is in ferry/_aio.py, on top of ferry._ferry.Completions.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <vector>

#include "bindings.hpp"

namespace ferry::python {
namespace {

using namespace nb::literals;
using namespace std::chrono_literals;

// Longer timeouts wait as long as None does (and stay clear of time_point overflow).
constexpr double kForeverSeconds = 1e9;

Status wait_for(const PyFuture& f, std::optional<double> timeout) {
  if (timeout && !(*timeout >= 0)) {
    throw Error(ErrorCode::kInvalidArgument, "timeout must be >= 0 seconds");
  }
  auto deadline = timeout && *timeout < kForeverSeconds
                      ? Clock::now() + std::chrono::duration_cast<Duration>(
                                           std::chrono::duration<double>(*timeout))
                      : Clock::time_point::max();
  Status s;
  bool finished = wait_interruptibly(deadline, [&](Duration slice) {
    s = f.future.wait(slice);
    return s.code() != ErrorCode::kTimeout || f.future.test();
  });
  return finished ? f.future.status() : s;
}

// Completions handed to an asyncio event loop in batches (ferry/_aio.py): the Ferry thread that
// completes a watched future only queues its token (LoopQueue: no GIL, one wake-up for many).
class Completions {
 public:
  int fileno() const { return queue_->fileno(); }
  void watch(const PyFuture& f, uint64_t token) {
    f.future.then([queue = queue_, token](const Status&) { queue->push(token); });
  }
  // The tokens of the futures completed since the last call, in completion order.
  std::vector<uint64_t> drain() { return queue_->take(); }

 private:
  // Shared with the callbacks, so the eventfd outlives every future still watched.
  std::shared_ptr<LoopQueue<uint64_t>> queue_ = std::make_shared<LoopQueue<uint64_t>>();
};

// ferry._aio's entry points, looked up once: awaiting is on the hot path of asyncio programs.
// Kept for the process (never released: the interpreter may be gone at exit); constant-
// initialized, so no guard is taken while the import releases the GIL. Two threads racing here
// under the GIL store the same objects, one reference more kept.
struct AioEntryPoints {
  PyObject* finished = nullptr;      // _finished(value): an awaitable's iterator, done at once
  PyObject* await_future = nullptr;  // await_future(future)
};
const AioEntryPoints& aio() {
  static AioEntryPoints entry;
  if (entry.await_future == nullptr) {
    nb::module_ module = nb::module_::import_("ferry._aio");
    entry.finished = nb::object(module.attr("_finished")).release().ptr();
    entry.await_future = nb::object(module.attr("await_future")).release().ptr();
  }
  return entry;
}

}  // namespace

void bind_future(nb::module_& m) {
  nb::class_<Completions>(m, "Completions",
                          "Futures' completions for one asyncio event loop, in batches: watch() "
                          "futures, wait for fileno() to be readable, drain() their tokens.")
      .def(nb::init<>())
      .def("fileno", &Completions::fileno)
      .def("watch", &Completions::watch, "future"_a, "token"_a,
           "Once `future` completes, `token` is among what drain() returns.")
      .def("drain", &Completions::drain,
           "The tokens of the futures completed since the last call.");

  nb::class_<PyFuture>(m, "Future",
                       "The completion of one operation. Awaitable in asyncio; any thread may "
                       "wait on it.")
      .def(
          "wait",
          [](const PyFuture& f, std::optional<double> timeout) {
            Status s = wait_for(f, timeout);
            if (!s.ok()) raise_status(s);
            return f.future.bytes();
          },
          "timeout"_a = nb::none(),
          "Wait up to `timeout` seconds (None: until done). Returns the bytes moved; raises "
          "the operation's error, or ferry.Timeout while it is still running.")
      .def(
          "done", [](const PyFuture& f) { return f.future.test(); },
          "True once completed, successfully or not.")
      .def(
          "_spin",
          [](const PyFuture& f) {
            const auto& engine = nb::cast<const PyEngine&>(nb::cast<const PyPeer&>(f.peer).engine);
            Duration spin = engine.engine ? engine.engine->config().wait_spin : Duration(0);
            if (spin.count() > 0 && !f.future.test()) {
              nb::gil_scoped_release unlocked;
              (void)f.future.wait(spin);  // spins at most wait_spin, sleeps no further
            }
            return f.future.test();
          },
          "Spin up to the engine's wait_spin for the completion, as wait() does before it sleeps, "
          "the GIL released; returns done(). Awaiting calls it when its event loop has nothing "
          "else to run.")
      .def_prop_ro(
          "bytes", [](const PyFuture& f) { return f.future.bytes(); },
          "Bytes moved; for recv(), the length of the message received.")
      .def(
          "exception",
          [](const PyFuture& f) -> nb::object {
            Status s = f.future.status();
            if (s.ok()) return nb::none();
            if (s.code() == ErrorCode::kInProgress)
              raise_status({ErrorCode::kInProgress, "the operation is still running"});
            try {
              raise_status(s);
            } catch (nb::python_error& e) {
              return nb::borrow(e.value());
            }
          },
          "The error the operation failed with (an exception object), or None if it "
          "succeeded. Raises InProgress while it runs.")
      .def(
          "__await__",
          [](nb::handle self) {
            auto& f = nb::cast<PyFuture&>(self);
            if (f.future.test()) {  // done: no trip through the event loop
              Status s = f.future.status();
              if (!s.ok()) raise_status(s);
              return nb::handle(aio().finished)(f.future.bytes());
            }
            return nb::handle(aio().await_future)(self);
          },
          "Await it in asyncio: the completion is handed to the event loop, nothing polls.")
      .def(
          "add_done_callback",
          [](nb::handle self, nb::object fn) {
            auto& f = nb::cast<PyFuture&>(self);
            auto call = std::make_shared<SharedRef>(std::move(fn));
            auto me = std::make_shared<SharedRef>(nb::borrow(self));
            f.future.then([call, me](const Status&) {
              nb::detail::cleanup_guard guard{};
              if (!guard) return;  // the interpreter is gone
              try {
                call->get()(me->get());
              } catch (nb::python_error& err) {
                err.discard_as_unraisable(call->get());
              }
            });
          },
          "fn"_a,
          "Call fn(future) once it completes: at once if it has, else on the thread that "
          "completes it. Exceptions fn raises go to sys.unraisablehook.");
}

}  // namespace ferry::python
