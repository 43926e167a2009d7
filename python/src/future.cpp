// ferry.Future: wait with a timeout (the GIL released, Ctrl-C honoured), poll, callbacks.
// Awaiting one in asyncio is in ferry/_aio.py, on top of add_done_callback.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>

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

}  // namespace

void bind_future(nb::module_& m) {
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
            return nb::module_::import_("ferry._aio").attr("await_future")(self);
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
