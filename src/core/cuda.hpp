// The CUDA driver API, loaded at run time from libcuda.so.1 (as verbs loads libibverbs): the
// same binary runs without a GPU, a driver or the CUDA toolkit; then Driver::get() says why CUDA
// is unavailable. Ferry declares the few types and constants it uses itself, with the values
// of the toolkit's cuda.h (tests/cuda/abi_test.cpp checks them against it where the toolkit
// is installed), so building needs no toolkit either.
//
// Only the versioned entry points a current cuda.h maps its names to are bound (cuMemAlloc is
// cuMemAlloc_v2, ...): what a program compiled against the toolkit would call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/types.hpp"

namespace ferry::core::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(google-runtime-int): cuda.h's own type
struct CUctx_st;
using CUcontext = CUctx_st*;
struct CUstream_st;
using CUstream = CUstream_st*;
struct CUevent_st;
using CUevent = CUevent_st*;

constexpr std::size_t kIpcHandleBytes = 64;  // CU_IPC_HANDLE_SIZE
struct CUipcMemHandle {
  char reserved[kIpcHandleBytes];
};

// CUresult values (cuda.h's CUDA_ERROR_*).
enum : CUresult {
  kSuccess = 0,
  kErrorInvalidValue = 1,
  kErrorOutOfMemory = 2,
  kErrorNotInitialized = 3,
  kErrorDeinitialized = 4,
  kErrorNoDevice = 100,
  kErrorInvalidDevice = 101,
  kErrorInvalidContext = 201,
  kErrorMapFailed = 205,
  kErrorAlreadyMapped = 208,
  kErrorInvalidHandle = 400,
  kErrorNotFound = 500,
  kErrorNotReady = 600,
  kErrorIllegalAddress = 700,
  kErrorNotSupported = 801,
  kErrorUnknown = 999,
};

// CUpointer_attribute values Ferry asks for.
enum PointerAttribute : int {
  kPointerContext = 1,        // CU_POINTER_ATTRIBUTE_CONTEXT
  kPointerMemoryType = 2,     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
  kPointerDeviceOrdinal = 9,  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
  kPointerRangeStart = 11,    // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
  kPointerRangeSize = 12,     // CU_POINTER_ATTRIBUTE_RANGE_SIZE
};
// CUmemorytype values.
enum : unsigned {
  kMemoryTypeHost = 1,
  kMemoryTypeDevice = 2,
};
// CUdevice_attribute values Ferry reads.
enum DeviceAttribute : int {
  kAttrPciBusId = 33,
  kAttrPciDeviceId = 34,
  kAttrUnifiedAddressing = 41,
  kAttrPciDomainId = 50,
  kAttrVirtualMemoryManagement = 102,
  kAttrPosixFdHandles = 103,
  kAttrGpuDirectRdma = 116,
  kAttrDmaBuf = 124,
};
constexpr unsigned kIpcLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
constexpr unsigned kStreamNonBlocking = 0x1;        // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 0x2;       // CU_EVENT_DISABLE_TIMING
constexpr unsigned kHostAllocPortable = 0x1;        // CU_MEMHOSTALLOC_PORTABLE

struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*driver_get_version)(int*) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*device_get_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_name)(char*, int, CUdevice) = nullptr;
  CUresult (*device_get_attribute)(int*, int, CUdevice) = nullptr;
  CUresult (*device_total_mem)(std::size_t*, CUdevice) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*primary_ctx_release)(CUdevice) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr*, std::size_t) = nullptr;
  CUresult (*mem_free)(CUdeviceptr) = nullptr;
  CUresult (*mem_host_alloc)(void**, std::size_t, unsigned) = nullptr;
  CUresult (*mem_free_host)(void*) = nullptr;
  CUresult (*mem_get_address_range)(CUdeviceptr*, std::size_t*, CUdeviceptr) = nullptr;
  CUresult (*pointer_get_attributes)(unsigned, int*, void**, CUdeviceptr) = nullptr;
  CUresult (*memset_d8)(CUdeviceptr, unsigned char, std::size_t) = nullptr;
  CUresult (*memcpy)(CUdeviceptr, CUdeviceptr, std::size_t) = nullptr;
  CUresult (*memcpy_async)(CUdeviceptr, CUdeviceptr, std::size_t, CUstream) = nullptr;
  CUresult (*stream_create)(CUstream*, unsigned) = nullptr;
  CUresult (*stream_destroy)(CUstream) = nullptr;
  CUresult (*stream_synchronize)(CUstream) = nullptr;
  CUresult (*event_create)(CUevent*, unsigned) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
  CUresult (*event_synchronize)(CUevent) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;
  CUresult (*ipc_get_mem_handle)(CUipcMemHandle*, CUdeviceptr) = nullptr;
  CUresult (*ipc_open_mem_handle)(CUdeviceptr*, CUipcMemHandle, unsigned) = nullptr;
  CUresult (*ipc_close_mem_handle)(CUdeviceptr) = nullptr;

  // The process-wide table, loaded and cuInit()ed once; null with `why` set when there is no
  // usable driver (no libcuda.so.1, a symbol missing, cuInit failing: "no CUDA device").
  static const Driver* get(std::string* why = nullptr);
  // The same table without cuInit, for code that must not start CUDA in a process that does
  // not use it: until someone calls cuInit, its calls answer CUDA_ERROR_NOT_INITIALIZED.
  static const Driver* bound(std::string* why = nullptr);

  // "CUDA_ERROR_INVALID_VALUE: invalid argument"
  std::string describe(CUresult result) const;
  // A typed error naming the failed call: "cuMemAlloc 4096 bytes: CUDA_ERROR_OUT_OF_MEMORY: ..."
  Status status(CUresult result, std::string_view call) const;
  void check(CUresult result, std::string_view call) const;
};

// Where a pointer's memory lives, from cuPointerGetAttributes.
struct PointerInfo {
  bool device = false;  // CUDA device memory (else host memory, pinned or not)
  int ordinal = -1;     // the device, for device memory
  CUdeviceptr range_start = 0;
  std::size_t range_size = 0;  // the allocation holding the pointer
};
// Host memory (device = false) without a driver, or for a pointer the driver does not know.
PointerInfo pointer_info(const void* pointer);

// The driver and its devices (Engine::gpus, ferry info). Devices without unified addressing
// are left out: Ferry tells device from host pointers by address.
CudaInfo inventory();

// `device`'s primary context, retained once per process and device (never released: that would
// free every allocation in it); throws naming the call.
CUcontext primary_context(const Driver& driver, int device);
// Makes `device`'s primary context current on the calling thread; throws naming the call.
void use_device(const Driver& driver, int device);

// Makes a context current on this thread for a scope, then restores the one that was (a user's
// thread may have its own current device: PyTorch's, for one).
class ScopedContext {
 public:
  ScopedContext(const Driver& driver, CUcontext context) : driver_(driver) {
    driver_.ctx_get_current(&previous_);
    if (previous_ != context) driver_.ctx_set_current(context);
  }
  ~ScopedContext() { driver_.ctx_set_current(previous_); }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver& driver_;
  CUcontext previous_ = nullptr;
};

}  // namespace ferry::core::cuda
