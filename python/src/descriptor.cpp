// ferry.Descriptor: a peer's region descriptor decoded once. Operations take it where they take
// bytes or str and then skip decoding them on every call.
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include "bindings.hpp"

namespace ferry::python {
namespace {

using namespace nb::literals;

// The ferry.Descriptor type (final: an exact type check recognises it).
PyTypeObject* descriptor_type = nullptr;

Descriptor decode_any(nb::handle remote) {
  if (PyUnicode_Check(remote.ptr())) return Descriptor::parse(nb::cast<std::string_view>(remote));
  if (PyBytes_Check(remote.ptr())) {
    auto* p = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(remote.ptr()));
    return Descriptor::decode({p, static_cast<std::size_t>(PyBytes_GET_SIZE(remote.ptr()))});
  }
  throw nb::type_error(
      "a descriptor is a ferry.Descriptor, bytes (Region.descriptor()) or str (its to_string "
      "form)");
}

nb::bytes encoded(const PyDescriptor& d) {
  std::vector<uint8_t> b = d.descriptor.encode();
  return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace

const Descriptor& resolve_descriptor(nb::handle remote, Descriptor& scratch) {
  if (Py_TYPE(remote.ptr()) == descriptor_type)
    return nb::inst_ptr<PyDescriptor>(remote)->descriptor;
  scratch = decode_any(remote);
  return scratch;
}

void bind_descriptor(nb::module_& m) {
  auto cls =
      nb::class_<PyDescriptor>(
          m, "Descriptor", nb::is_final(),
          "A peer's region descriptor, decoded once from the bytes of Region.descriptor() (or "
          "the str of Region.to_string()). Pass it to write/read/... where the bytes go: "
          "operations then skip decoding them. Immutable, hashable and picklable.")
          .def(
              "__init__",
              [](PyDescriptor* self, nb::handle data) {
                new (self) PyDescriptor{decode_any(data)};
              },
              "data"_a, nb::sig("def __init__(self, data: bytes | str) -> None"),
              "Decode a descriptor; raises InvalidArgument (or VersionMismatch) if malformed.")
          .def("to_bytes", &encoded, "The binary form, as Region.descriptor() returns it.")
          .def("__bytes__", &encoded)
          .def(
              "to_string", [](const PyDescriptor& d) { return d.descriptor.to_string(); },
              "The printable form ('ferry1:...').")
          .def_prop_ro("engine_id", [](const PyDescriptor& d) { return d.descriptor.engine_id; })
          .def_prop_ro(
              "size", [](const PyDescriptor& d) { return d.descriptor.length; },
              "Bytes in the region.")
          .def_prop_ro("access", [](const PyDescriptor& d) { return d.descriptor.access; })
          .def(
              "__eq__",
              [](const PyDescriptor& a, nb::handle b) -> nb::object {
                if (Py_TYPE(b.ptr()) != descriptor_type) return nb::borrow(Py_NotImplemented);
                return nb::bool_(a.descriptor.encode() ==
                                 nb::inst_ptr<PyDescriptor>(b)->descriptor.encode());
              },
              nb::sig("def __eq__(self, other: object) -> bool"))
          .def("__hash__", [](const PyDescriptor& d) { return nb::hash(encoded(d)); })
          .def("__reduce__",
               [](nb::handle self) {
                 return nb::make_tuple(
                     nb::handle(reinterpret_cast<PyObject*>(descriptor_type)),
                     nb::make_tuple(encoded(nb::cast<const PyDescriptor&>(self))));
               })
          .def("__repr__", [](const PyDescriptor& d) {
            return "ferry.Descriptor('" + d.descriptor.to_string() + "')";
          });
  descriptor_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
}

}  // namespace ferry::python
