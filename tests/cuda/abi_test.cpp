// Ferry declares the CUDA driver's types and constants itself (src/core/cuda.hpp) so that
// building needs no toolkit; where the toolkit's cuda.h is installed, this checks them against
// it at compile time (CMake adds the file only then).
#include <cuda.h>
#include <gtest/gtest.h>

#include "core/cuda.hpp"

namespace ferry::test {
namespace {

namespace f = core::cuda;

// cuda.h's constants are enumerators of its own enums; Ferry's are plain integers.
constexpr bool same(long long ours, long long theirs) { return ours == theirs; }

// Same argument count and each argument and the result of the same size: what the call through
// the pointer relies on (cuda.h's CUresult is an enum, Ferry's an int).
template <class R1, class... A1, class R2, class... A2>
constexpr bool same_shape(R1 (*)(A1...), R2 (*)(A2...)) {
  if constexpr (sizeof...(A1) != sizeof...(A2)) {
    return false;
  } else {
    return sizeof(R1) == sizeof(R2) && ((sizeof(A1) == sizeof(A2)) && ...);
  }
}

static_assert(sizeof(f::CUipcMemHandle) == sizeof(CUipcMemHandle));
static_assert(sizeof(f::CUdeviceptr) == sizeof(CUdeviceptr));
static_assert(sizeof(f::CUresult) == sizeof(CUresult));
static_assert(same(f::kIpcHandleBytes, CU_IPC_HANDLE_SIZE));
static_assert(same(f::kSuccess, CUDA_SUCCESS));
static_assert(same(f::kErrorInvalidValue, CUDA_ERROR_INVALID_VALUE));
static_assert(same(f::kErrorOutOfMemory, CUDA_ERROR_OUT_OF_MEMORY));
static_assert(same(f::kErrorNotInitialized, CUDA_ERROR_NOT_INITIALIZED));
static_assert(same(f::kErrorDeinitialized, CUDA_ERROR_DEINITIALIZED));
static_assert(same(f::kErrorNoDevice, CUDA_ERROR_NO_DEVICE));
static_assert(same(f::kErrorInvalidDevice, CUDA_ERROR_INVALID_DEVICE));
static_assert(same(f::kErrorInvalidContext, CUDA_ERROR_INVALID_CONTEXT));
static_assert(same(f::kErrorMapFailed, CUDA_ERROR_MAP_FAILED));
static_assert(same(f::kErrorAlreadyMapped, CUDA_ERROR_ALREADY_MAPPED));
static_assert(same(f::kErrorInvalidHandle, CUDA_ERROR_INVALID_HANDLE));
static_assert(same(f::kErrorNotFound, CUDA_ERROR_NOT_FOUND));
static_assert(same(f::kErrorNotReady, CUDA_ERROR_NOT_READY));
static_assert(same(f::kErrorIllegalAddress, CUDA_ERROR_ILLEGAL_ADDRESS));
static_assert(same(f::kErrorNotSupported, CUDA_ERROR_NOT_SUPPORTED));
static_assert(same(f::kErrorUnknown, CUDA_ERROR_UNKNOWN));
static_assert(same(f::kPointerContext, CU_POINTER_ATTRIBUTE_CONTEXT));
static_assert(same(f::kPointerMemoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE));
static_assert(same(f::kPointerDeviceOrdinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL));
static_assert(same(f::kPointerRangeStart, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR));
static_assert(same(f::kPointerRangeSize, CU_POINTER_ATTRIBUTE_RANGE_SIZE));
static_assert(same(f::kMemoryTypeHost, CU_MEMORYTYPE_HOST));
static_assert(same(f::kMemoryTypeDevice, CU_MEMORYTYPE_DEVICE));
static_assert(same(f::kAttrPciBusId, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID));
static_assert(same(f::kAttrPciDeviceId, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
static_assert(same(f::kAttrUnifiedAddressing, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING));
static_assert(same(f::kAttrPciDomainId, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID));
static_assert(same(f::kAttrVirtualMemoryManagement,
                   CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED));
static_assert(same(f::kAttrPosixFdHandles,
                   CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED));
static_assert(same(f::kAttrGpuDirectRdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED));
static_assert(same(f::kAttrDmaBuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED));
static_assert(same(f::kIpcLazyEnablePeerAccess, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
static_assert(same(f::kStreamNonBlocking, CU_STREAM_NON_BLOCKING));
static_assert(same(f::kEventDisableTiming, CU_EVENT_DISABLE_TIMING));
static_assert(same(f::kHostAllocPortable, CU_MEMHOSTALLOC_PORTABLE));

// The table's function pointers have the shape of the entry points they are bound to.
static_assert(same_shape(f::Driver{}.mem_alloc, &cuMemAlloc_v2));
static_assert(same_shape(f::Driver{}.memcpy_async, &cuMemcpyAsync));
static_assert(same_shape(f::Driver{}.ipc_get_mem_handle, &cuIpcGetMemHandle));
static_assert(same_shape(f::Driver{}.ipc_open_mem_handle, &cuIpcOpenMemHandle_v2));
static_assert(same_shape(f::Driver{}.pointer_get_attributes, &cuPointerGetAttributes));
static_assert(same_shape(f::Driver{}.device_total_mem, &cuDeviceTotalMem_v2));
static_assert(same_shape(f::Driver{}.event_record, &cuEventRecord));

TEST(CudaAbi, DeclarationsMatchTheToolkitsHeader) {
  EXPECT_EQ(sizeof(f::CUipcMemHandle), sizeof(CUipcMemHandle));  // the checks ran at compile time
}

}  // namespace
}  // namespace ferry::test
