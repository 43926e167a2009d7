// Building one-sided batches from Python arguments without per-entry Python objects: a
// page-table batch of thousands of blocks arrives as integer arrays and is read in one loop.
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <cstring>
#include <limits>

#include "bindings.hpp"

namespace ferry::python {
namespace {

using AnyArray = nb::ndarray<nb::ro, nb::ndim<1>>;

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, what);
}

// One argument of a batch: a non-negative integer, or a 1-D integer array on the CPU.
class Column {
 public:
  Column(const char* name, nb::handle value) : name_(name) {
    if (value.is_none()) return;
    if (PyLong_Check(value.ptr())) {
      long long v = PyLong_AsLongLong(value.ptr());
      if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        invalid(std::string(name) + " is too large");
      }
      if (v < 0) invalid(std::string(name) + " must not be negative");
      scalar_ = static_cast<uint64_t>(v);
      present_ = true;
      return;
    }
    if (!nb::try_cast(value, array_)) {
      invalid(std::string(name) + " must be an int or a 1-D integer array, not " +
              nb::type_name(value.type()).c_str());
    }
    if (array_.device_type() != nb::device::cpu::value)
      invalid(std::string(name) + ": the array must be in CPU memory");
    nb::dlpack::dtype t = array_.dtype();
    if ((t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Int) &&
         t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt)) ||
        (t.bits != 32 && t.bits != 64) || t.lanes != 1) {
      invalid(std::string(name) + ": the array must hold 32- or 64-bit integers");
    }
    signed_ = t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int);
    base_ = static_cast<const uint8_t*>(array_.data());
    stride_bytes_ = array_.stride(0) * static_cast<int64_t>(t.bits / 8);
    wide_ = t.bits == 64;
    present_ = true;
    is_array_ = true;
  }

  bool present() const { return present_; }
  bool is_array() const { return is_array_; }
  std::size_t size() const { return is_array_ ? array_.shape(0) : 1; }

  uint64_t at(std::size_t i) const {
    if (!is_array_) return scalar_;
    const uint8_t* p = base_ + static_cast<int64_t>(i) * stride_bytes_;
    int64_t v;
    if (wide_) {
      std::memcpy(&v, p, 8);
      if (!signed_) return static_cast<uint64_t>(v);
    } else if (signed_) {
      int32_t w;
      std::memcpy(&w, p, 4);
      v = w;
    } else {
      uint32_t w;
      std::memcpy(&w, p, 4);
      return w;
    }
    if (v < 0) invalid(std::string(name_) + "[" + std::to_string(i) + "] is negative");
    return static_cast<uint64_t>(v);
  }

 private:
  const char* name_;
  AnyArray array_;
  const uint8_t* base_ = nullptr;
  int64_t stride_bytes_ = 0;
  uint64_t scalar_ = 0;
  bool present_ = false, is_array_ = false, signed_ = false, wide_ = false;
};

}  // namespace

Descriptor parse_descriptor(nb::handle remote) {
  if (PyUnicode_Check(remote.ptr())) return Descriptor::parse(nb::cast<std::string_view>(remote));
  if (PyBytes_Check(remote.ptr())) {
    auto* p = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(remote.ptr()));
    return Descriptor::decode({p, static_cast<std::size_t>(PyBytes_GET_SIZE(remote.ptr()))});
  }
  throw nb::type_error("a descriptor is bytes (Region.descriptor()) or str (its to_string form)");
}

void build_batch(const PyRegion& local, nb::handle remote, nb::handle local_offset,
                 nb::handle remote_offset, nb::handle length, bool writes_local, Batch& out) {
  const Region& region = local.get();
  if (writes_local && local.read_only)
    invalid("the local region is read-only: it cannot receive data");
  out.remote = parse_descriptor(remote);
  Column local_col("local_offset", local_offset), remote_col("remote_offset", remote_offset),
      length_col("length", length);
  std::size_t n = 1;
  bool batch = false;
  for (const Column* c : {&local_col, &remote_col, &length_col}) {
    if (!c->is_array()) continue;
    if (batch && c->size() != n) invalid("the offset and length arrays differ in length");
    n = c->size();
    batch = true;
  }
  if (batch && n == 0) invalid("an empty batch");
  if (!length_col.present() && batch) invalid("length is required for a batch");
  out.transfers.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    uint64_t lo = local_col.at(i);
    uint64_t len =
        length_col.present() ? length_col.at(i) : (lo < region.size() ? region.size() - lo : 0);
    out.transfers[i] = Transfer{&region, lo, &out.remote, remote_col.at(i), len};
  }
}

}  // namespace ferry::python
