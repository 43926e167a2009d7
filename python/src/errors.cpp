// Library errors as Python exceptions: ferry.errors defines one class per error code and hands
// the table to the module at import.
#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace ferry::python {
namespace {

// Code name -> exception class. Deliberately never released: it lives as long as the
// interpreter, and a static nb::object would be dropped after the interpreter is gone.
PyObject* error_classes = nullptr;

}  // namespace

void raise_status(const Status& status) {
  const char* code = to_string(status.code());
  PyObject* cls = error_classes != nullptr ? PyDict_GetItemString(error_classes, code) : nullptr;
  if (cls == nullptr) cls = PyExc_RuntimeError;
  nb::object exc = nb::borrow(cls)(code, status.message());
  PyErr_SetObject(cls, exc.ptr());
  throw nb::python_error();
}

void register_errors(nb::module_& m) {
  m.def(
      "_set_error_classes",
      [](nb::dict classes) {
        Py_XDECREF(error_classes);
        error_classes = classes.release().ptr();
      },
      "Internal: ferry.errors registers its exception classes by error code name.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      try {
        raise_status(e.status());
      } catch (nb::python_error& pending) {
        pending.restore();
      }
    }
  });
}

}  // namespace ferry::python
