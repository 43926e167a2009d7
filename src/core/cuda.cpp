#include "core/cuda.hpp"

#include <dlfcn.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <mutex>

namespace ferry::core::cuda {

namespace {

struct Loaded {
  Driver driver;
  std::string why;
  bool ok = false;
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn& out, std::string& why) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (out == nullptr) why = std::string("libcuda.so.1 lacks ") + name;
  return out != nullptr;
}

Loaded load() {
  Loaded l;
  // Never closed: the driver keeps threads and mappings for the process's life.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    l.why = std::string("libcuda.so.1 not loadable (no NVIDIA driver): ") +
            (err != nullptr ? err : "unknown error");
    return l;
  }
  Driver& d = l.driver;
  bool ok = bind(lib, "cuInit", d.init, l.why) &&
            bind(lib, "cuDriverGetVersion", d.driver_get_version, l.why) &&
            bind(lib, "cuGetErrorName", d.get_error_name, l.why) &&
            bind(lib, "cuGetErrorString", d.get_error_string, l.why) &&
            bind(lib, "cuDeviceGetCount", d.device_get_count, l.why) &&
            bind(lib, "cuDeviceGet", d.device_get, l.why) &&
            bind(lib, "cuDeviceGetName", d.device_get_name, l.why) &&
            bind(lib, "cuDeviceGetAttribute", d.device_get_attribute, l.why) &&
            bind(lib, "cuDeviceTotalMem_v2", d.device_total_mem, l.why) &&
            bind(lib, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain, l.why) &&
            bind(lib, "cuDevicePrimaryCtxRelease_v2", d.primary_ctx_release, l.why) &&
            bind(lib, "cuCtxSetCurrent", d.ctx_set_current, l.why) &&
            bind(lib, "cuCtxGetCurrent", d.ctx_get_current, l.why) &&
            bind(lib, "cuMemAlloc_v2", d.mem_alloc, l.why) &&
            bind(lib, "cuMemFree_v2", d.mem_free, l.why) &&
            bind(lib, "cuMemHostAlloc", d.mem_host_alloc, l.why) &&
            bind(lib, "cuMemFreeHost", d.mem_free_host, l.why) &&
            bind(lib, "cuMemGetAddressRange_v2", d.mem_get_address_range, l.why) &&
            bind(lib, "cuPointerGetAttributes", d.pointer_get_attributes, l.why) &&
            bind(lib, "cuMemsetD8_v2", d.memset_d8, l.why) &&
            bind(lib, "cuMemcpy", d.memcpy, l.why) &&
            bind(lib, "cuMemcpyAsync", d.memcpy_async, l.why) &&
            bind(lib, "cuStreamCreate", d.stream_create, l.why) &&
            bind(lib, "cuStreamDestroy_v2", d.stream_destroy, l.why) &&
            bind(lib, "cuStreamSynchronize", d.stream_synchronize, l.why) &&
            bind(lib, "cuEventCreate", d.event_create, l.why) &&
            bind(lib, "cuEventRecord", d.event_record, l.why) &&
            bind(lib, "cuEventQuery", d.event_query, l.why) &&
            bind(lib, "cuEventSynchronize", d.event_synchronize, l.why) &&
            bind(lib, "cuEventDestroy_v2", d.event_destroy, l.why) &&
            bind(lib, "cuIpcGetMemHandle", d.ipc_get_mem_handle, l.why) &&
            bind(lib, "cuIpcOpenMemHandle_v2", d.ipc_open_mem_handle, l.why) &&
            bind(lib, "cuIpcCloseMemHandle", d.ipc_close_mem_handle, l.why);
  l.ok = ok;
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

// cuInit once, on the first call that needs a device: the library alone initializes nothing.
const Loaded& initialized() {
  static const Loaded l = [] {
    Loaded out = loaded();
    if (!out.ok) return out;
    if (CUresult r = out.driver.init(0); r != kSuccess) {
      out.ok = false;
      out.why = "cuInit: " + out.driver.describe(r);
    }
    return out;
  }();
  return l;
}

ErrorCode code_for(CUresult result) {
  switch (result) {
    case kErrorOutOfMemory:
      return ErrorCode::kResourceExhausted;
    case kErrorInvalidValue:
    case kErrorInvalidHandle:
    case kErrorInvalidDevice:
      return ErrorCode::kInvalidArgument;
    case kErrorNotSupported:
    case kErrorNoDevice:
      return ErrorCode::kUnsupported;
    default:
      return ErrorCode::kSystem;
  }
}

}  // namespace

const Driver* Driver::get(std::string* why) {
  const Loaded& l = initialized();
  if (!l.ok && why != nullptr) *why = l.why;
  return l.ok ? &l.driver : nullptr;
}

const Driver* Driver::bound(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why != nullptr) *why = l.why;
  return l.ok ? &l.driver : nullptr;
}

std::string Driver::describe(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name(result, &name) != kSuccess || name == nullptr) {
    return "CUDA error " + std::to_string(result);
  }
  std::string out(name);
  if (get_error_string(result, &text) == kSuccess && text != nullptr)
    out += std::string(": ") + text;
  return out;
}

Status Driver::status(CUresult result, std::string_view call) const {
  if (result == kSuccess) return Status::ok_status();
  return {code_for(result), std::string(call) + ": " + describe(result)};
}

void Driver::check(CUresult result, std::string_view call) const {
  if (result != kSuccess) throw Error(status(result, call));
}

PointerInfo pointer_info(const void* pointer) {
  PointerInfo info;
  // Not Driver::get(): a process that never initialized CUDA holds no device memory (the call
  // answers CUDA_ERROR_NOT_INITIALIZED, read as host memory), and initializing it here would
  // cost every host-memory user a driver start and break CUDA in children it forks.
  const Driver* d = Driver::bound();
  if (d == nullptr || pointer == nullptr) return info;
  unsigned memory_type = 0;
  int ordinal = -1;
  CUdeviceptr start = 0;
  std::size_t size = 0;
  std::array<int, 4> attributes{kPointerMemoryType, kPointerDeviceOrdinal, kPointerRangeStart,
                                kPointerRangeSize};
  std::array<void*, 4> data{&memory_type, &ordinal, &start, &size};
  // Unlike cuPointerGetAttribute, an address the driver does not know is no error: its
  // attributes come back zeroed, which reads as host memory.
  CUresult r =
      d->pointer_get_attributes(static_cast<unsigned>(attributes.size()), attributes.data(),
                                data.data(), reinterpret_cast<CUdeviceptr>(pointer));
  if (r != kSuccess || memory_type != kMemoryTypeDevice) return info;
  info.device = true;
  info.ordinal = ordinal;
  info.range_start = start;
  info.range_size = size;
  return info;
}

CudaInfo inventory() {
  CudaInfo inv;
  std::error_code ignored;
  inv.peer_memory_module = std::filesystem::exists("/sys/module/nvidia_peermem", ignored) ||
                           std::filesystem::exists("/sys/module/nv_peer_mem", ignored);
  const Driver* d = Driver::get(&inv.why);
  if (d == nullptr) return inv;
  inv.driver = true;
  d->driver_get_version(&inv.driver_version);
  int count = 0;
  if (CUresult r = d->device_get_count(&count); r != kSuccess) {
    inv.why = "cuDeviceGetCount: " + d->describe(r);
    return inv;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    if (d->device_get(&dev, i) != kSuccess) continue;
    GpuInfo g;
    g.ordinal = i;
    std::array<char, 256> name{};
    if (d->device_get_name(name.data(), static_cast<int>(name.size()), dev) == kSuccess)
      g.name = name.data();
    auto attr = [&](int which) {
      int v = 0;
      return d->device_get_attribute(&v, which, dev) == kSuccess ? v : 0;
    };
    std::array<char, 32> pci{};
    std::snprintf(pci.data(), pci.size(), "%04x:%02x:%02x.0", attr(kAttrPciDomainId),
                  attr(kAttrPciBusId), attr(kAttrPciDeviceId));
    g.pci = pci.data();
    std::size_t bytes = 0;
    d->device_total_mem(&bytes, dev);
    g.memory_bytes = bytes;
    if (attr(kAttrUnifiedAddressing) == 0) continue;
    g.vmm_posix_fd = attr(kAttrVirtualMemoryManagement) != 0 && attr(kAttrPosixFdHandles) != 0;
    g.gpudirect_rdma = attr(kAttrGpuDirectRdma) != 0;
    g.dmabuf = attr(kAttrDmaBuf) != 0;
    inv.gpus.push_back(std::move(g));
  }
  return inv;
}

CUcontext primary_context(const Driver& driver, int device) {
  static std::mutex mu;
  static std::array<CUcontext, 64> contexts{};
  std::lock_guard lock(mu);
  if (device < 0 || device >= static_cast<int>(contexts.size()))
    throw Error(ErrorCode::kInvalidArgument, "CUDA device " + std::to_string(device));
  if (contexts[device] == nullptr) {
    // Idempotent; the driver may be bound only (a transport opened in a process whose
    // application initialized CUDA itself).
    driver.check(driver.init(0), "cuInit");
    CUdevice dev = 0;
    driver.check(driver.device_get(&dev, device), "cuDeviceGet " + std::to_string(device));
    driver.check(driver.primary_ctx_retain(&contexts[device], dev),
                 "cuDevicePrimaryCtxRetain " + std::to_string(device));
  }
  return contexts[device];
}

void use_device(const Driver& driver, int device) {
  driver.check(driver.ctx_set_current(primary_context(driver, device)), "cuCtxSetCurrent");
}

}  // namespace ferry::core::cuda
