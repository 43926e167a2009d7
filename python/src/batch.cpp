// Building one-sided batches from Python arguments without per-entry Python objects: a
// page-table batch of thousands of blocks arrives as integer arrays, checked once and read
// through typed pointers, one tight loop per column.
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <cstring>
#include <limits>
#include <type_traits>

#include "bindings.hpp"

namespace ferry::python {
namespace {

using AnyArray = nb::ndarray<nb::ro, nb::ndim<1>>;

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, what);
}

// Batches above this many entries give their per-thread buffer back afterwards.
constexpr std::size_t kKeptEntries = std::size_t{1} << 20;

struct ThreadBuffer {
  std::vector<Transfer> entries;
  bool busy = false;
};
thread_local ThreadBuffer thread_buffer;

// One argument of a batch: a non-negative integer, or a 1-D integer array on the CPU.
class Column {
 public:
  enum class Kind { kAbsent, kScalar, kI32, kU32, kI64, kU64 };

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
      kind_ = Kind::kScalar;
      return;
    }
    if (!nb::try_cast(value, array_)) {
      invalid(std::string(name) + " must be an int or a 1-D integer array, not " +
              nb::type_name(value.type()).c_str());
    }
    if (array_.device_type() != nb::device::cpu::value)
      invalid(std::string(name) + ": the array must be in CPU memory");
    nb::dlpack::dtype t = array_.dtype();
    bool is_signed = t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int);
    if ((!is_signed && t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt)) ||
        (t.bits != 32 && t.bits != 64) || t.lanes != 1) {
      invalid(std::string(name) + ": the array must hold 32- or 64-bit integers");
    }
    kind_ = t.bits == 64 ? (is_signed ? Kind::kI64 : Kind::kU64)
                         : (is_signed ? Kind::kI32 : Kind::kU32);
    base_ = static_cast<const uint8_t*>(array_.data());
    stride_bytes_ = array_.stride(0) * static_cast<int64_t>(t.bits / 8);
  }

  bool present() const { return kind_ != Kind::kAbsent; }
  bool is_array() const { return kind_ != Kind::kAbsent && kind_ != Kind::kScalar; }
  std::size_t size() const { return is_array() ? array_.shape(0) : 1; }
  uint64_t scalar() const { return scalar_; }

  // Stores the column into `Field` of out[0..n): the scalar, or each array element.
  template <uint64_t Transfer::*Field>
  void fill(Transfer* out, std::size_t n) const {
    switch (kind_) {
      case Kind::kAbsent:
      case Kind::kScalar:
        for (std::size_t i = 0; i < n; ++i) out[i].*Field = scalar_;
        return;
      case Kind::kI32:
        return fill_from<int32_t, Field>(out, n);
      case Kind::kU32:
        return fill_from<uint32_t, Field>(out, n);
      case Kind::kI64:
        return fill_from<int64_t, Field>(out, n);
      case Kind::kU64:
        return fill_from<uint64_t, Field>(out, n);
    }
  }

 private:
  template <typename T, uint64_t Transfer::*Field>
  void fill_from(Transfer* out, std::size_t n) const {
    T any_negative = 0;  // signed: the OR of every value, negative if one of them is
    auto load = [](const uint8_t* p) {
      T v;
      std::memcpy(&v, p, sizeof v);  // DLPack data need not be aligned
      return v;
    };
    if (stride_bytes_ == static_cast<int64_t>(sizeof(T))) {
      for (std::size_t i = 0; i < n; ++i) {
        T v = load(base_ + i * sizeof(T));
        if constexpr (std::is_signed_v<T>) any_negative |= v;
        out[i].*Field = static_cast<uint64_t>(v);
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        T v = load(base_ + static_cast<int64_t>(i) * stride_bytes_);
        if constexpr (std::is_signed_v<T>) any_negative |= v;
        out[i].*Field = static_cast<uint64_t>(v);
      }
    }
    if constexpr (std::is_signed_v<T>) {
      if (any_negative < 0) {
        for (std::size_t i = 0; i < n; ++i) {
          if (load(base_ + static_cast<int64_t>(i) * stride_bytes_) < 0)
            invalid(std::string(name_) + "[" + std::to_string(i) + "] is negative");
        }
      }
    }
  }

  const char* name_;
  AnyArray array_;
  const uint8_t* base_ = nullptr;
  int64_t stride_bytes_ = 0;
  uint64_t scalar_ = 0;
  Kind kind_ = Kind::kAbsent;
};

}  // namespace

Batch::~Batch() {
  if (shared_ == nullptr) return;
  if (shared_->capacity() > kKeptEntries) std::vector<Transfer>().swap(*shared_);
  thread_buffer.busy = false;
}

Transfer* Batch::entries(std::size_t n) {
  if (n == 1) {
    transfers_ = {&one_, 1};
    return &one_;
  }
  std::vector<Transfer>* v = &own_;
  if (!thread_buffer.busy) {
    thread_buffer.busy = true;
    shared_ = v = &thread_buffer.entries;
  }
  v->resize(n);
  transfers_ = {v->data(), n};
  return v->data();
}

void build_batch(const PyRegion& local, nb::handle remote, nb::handle local_offset,
                 nb::handle remote_offset, nb::handle length, bool writes_local, Batch& out) {
  const Region& region = local.get();
  if (writes_local && local.read_only)
    invalid("the local region is read-only: it cannot receive data");
  const Descriptor& desc = resolve_descriptor(remote, out.parsed_);
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
  Transfer* t = out.entries(n);
  if (!batch) {
    uint64_t lo = local_col.scalar();
    uint64_t len =
        length_col.present() ? length_col.scalar() : (lo < region.size() ? region.size() - lo : 0);
    *t = Transfer{&region, lo, &desc, remote_col.scalar(), len};
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    t[i].local = &region;
    t[i].remote = &desc;
  }
  local_col.fill<&Transfer::local_offset>(t, n);
  remote_col.fill<&Transfer::remote_offset>(t, n);
  length_col.fill<&Transfer::length>(t, n);
}

}  // namespace ferry::python
