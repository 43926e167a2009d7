// The Python objects around the C++ API, and what the binding files share. Every object keeps
// its parents alive (a region its engine and the memory's owner, a peer its engine, a future
// its peer and the regions it uses), so Python may drop them in any order.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::python {

namespace nb = nanobind;

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
  nb::object engine;              // PyEngine: outlives its registrations
  nb::object owner;               // the registered object (array, tensor, bytearray)
  std::optional<Py_buffer> view;  // held while registered: the exporter cannot resize
  bool read_only = false;
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
  nb::object uses;  // the regions the operation touches (a tuple), kept until it is dropped
};

struct PyPrepared {
  Prepared prepared;
  nb::object peer;
  nb::object uses;
};

// One-sided batches from Python arguments: scalars, or 1-D integer arrays (NumPy, torch, any
// DLPack or buffer-protocol array) for page-table batches, built in one C++ loop.
struct Batch {
  Descriptor remote;
  std::vector<Transfer> transfers;
};
void build_batch(const PyRegion& local, nb::handle remote, nb::handle local_offset,
                 nb::handle remote_offset, nb::handle length, bool writes_local, Batch& out);
Descriptor parse_descriptor(nb::handle remote);

void bind_engine(nb::module_& m);
void bind_peer(nb::module_& m);
void bind_future(nb::module_& m);

}  // namespace ferry::python
