// The driver calls Ferry relies on, checked against what cuda.h documents for each. make test
// runs them on the stand-in (tests/support/cuda_standin), so its semantics are checked, not
// assumed; make test-gpu runs them on the real driver, which shows the two agree. Cases marked
// "stand-in" check misuse the real driver leaves undefined but the stand-in reports.
#include <gtest/gtest.h>

#include <thread>

#include "cuda_test_support.hpp"

namespace ferry::test {
namespace {

using cuda::CUdeviceptr;

CUdeviceptr address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

std::string handle_hex(const cuda::CUipcMemHandle& h) { return hex(h.reserved, sizeof h.reserved); }

TEST(CudaDriver, ListsDevicesWithTheirAttributes) {
  auto inv = cuda::inventory();
  ASSERT_TRUE(inv.driver) << inv.why;
  EXPECT_GE(inv.driver_version, 11000);
  ASSERT_FALSE(inv.gpus.empty());
  for (const auto& g : inv.gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.memory_bytes, 0u);
    EXPECT_EQ(g.pci.size(), 12u) << g.pci;
  }
  if (standin()) {
    EXPECT_EQ(inv.gpus.size(), 2u);
    EXPECT_FALSE(inv.gpus[0].gpudirect_rdma);
  }
}

TEST(CudaDriver, CallsNeedACurrentContext) {
  const auto& d = driver();
  std::thread([&] {
    CUdeviceptr p = 0;
    EXPECT_EQ(error_name(d.mem_alloc(&p, 64)), "CUDA_ERROR_INVALID_CONTEXT");
    cuda::CUstream s = nullptr;
    EXPECT_EQ(error_name(d.stream_create(&s, 0)), "CUDA_ERROR_INVALID_CONTEXT");
  }).join();
}

TEST(CudaDriver, UnknownDeviceIsInvalidDevice) {
  const auto& d = driver();
  cuda::CUdevice dev = 0;
  EXPECT_EQ(error_name(d.device_get(&dev, 1000)), "CUDA_ERROR_INVALID_DEVICE");
  cuda::CUcontext ctx = nullptr;
  EXPECT_EQ(error_name(d.primary_ctx_retain(&ctx, 1000)), "CUDA_ERROR_INVALID_DEVICE");
}

TEST(CudaDriver, CopiesRoundTripAtOddOffsetsAndMemsetFills) {
  DeviceBuffer buf(1 << 20);
  auto bytes = pattern(65537, 3);
  buf.fill(bytes, 13);
  EXPECT_EQ(buf.read(13, bytes.size()), bytes);
  FERRY_CU_OK(driver().memset_d8(buf.get() + 5, 0xab, 7));
  auto head = buf.read(0, 13);
  for (std::size_t i = 5; i < 12; ++i) EXPECT_EQ(head[i], 0xab) << i;
  // Device to device, overlapping neither end.
  DeviceBuffer other(1 << 20);
  FERRY_CU_OK(driver().memcpy(other.get() + 1, buf.get() + 13, bytes.size()));
  EXPECT_EQ(other.read(1, bytes.size()), bytes);
}

TEST(CudaDriver, PointerAttributesTellDeviceFromHostMemory) {
  const auto& d = driver();
  DeviceBuffer buf(3 << 20);
  auto info = cuda::pointer_info(reinterpret_cast<void*>(buf.get() + 4097));
  EXPECT_TRUE(info.device);
  EXPECT_EQ(info.ordinal, 0);
  EXPECT_EQ(info.range_start, buf.get());
  EXPECT_EQ(info.range_size, buf.size());

  std::vector<uint8_t> host(4096);
  EXPECT_FALSE(cuda::pointer_info(host.data()).device);  // unknown to the driver: no error
  void* pinned = nullptr;
  FERRY_CU_OK(d.mem_host_alloc(&pinned, 8192, cuda::kHostAllocPortable));
  unsigned type = 0;
  int attribute = cuda::kPointerMemoryType;
  void* data[] = {&type};
  FERRY_CU_OK(d.pointer_get_attributes(1, &attribute, data, address(pinned)));
  EXPECT_EQ(type, cuda::kMemoryTypeHost);
  static_cast<char*>(pinned)[8191] = 1;  // pinned host memory is host memory
  FERRY_CU_OK(d.mem_free_host(pinned));

  CUdeviceptr base = 0;
  std::size_t size = 0;
  FERRY_CU_OK(d.mem_get_address_range(&base, &size, buf.get() + 100));
  EXPECT_EQ(base, buf.get());
  EXPECT_EQ(size, buf.size());
}

TEST(CudaDriverDeathTest, HostCodeCannotDereferenceDeviceMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceBuffer buf(4096);
  auto* p = static_cast<volatile char*>(buf.pointer());
  EXPECT_DEATH(*p = 1, "");
}

TEST(CudaDriver, StreamRunsCopiesInOrderAndItsEventCompletesAfterThem) {
  const auto& d = driver();
  constexpr std::size_t kBytes = 1 << 20;
  DeviceBuffer a(kBytes);
  DeviceBuffer b(kBytes);
  DeviceBuffer c(kBytes);
  auto bytes = pattern(kBytes, 9);
  std::vector<uint8_t> out(kBytes);
  cuda::CUstream s = nullptr;
  cuda::CUevent e = nullptr;
  FERRY_CU_OK(d.stream_create(&s, cuda::kStreamNonBlocking));
  FERRY_CU_OK(d.event_create(&e, cuda::kEventDisableTiming));
  FERRY_CU_OK(d.event_query(e));  // never recorded: nothing outstanding
  // Each copy reads what the one before wrote: only in-order execution yields the pattern.
  FERRY_CU_OK(d.memcpy_async(a.get(), address(bytes.data()), kBytes, s));
  FERRY_CU_OK(d.memcpy_async(b.get(), a.get(), kBytes, s));
  FERRY_CU_OK(d.memcpy_async(c.get(), b.get(), kBytes, s));
  FERRY_CU_OK(d.memcpy_async(address(out.data()), c.get(), kBytes, s));
  FERRY_CU_OK(d.event_record(e, s));
  FERRY_CU_OK(d.event_synchronize(e));
  FERRY_CU_OK(d.event_query(e));
  EXPECT_EQ(out, bytes);
  FERRY_CU_OK(d.stream_synchronize(s));
  FERRY_CU_OK(d.event_destroy(e));
  FERRY_CU_OK(d.stream_destroy(s));
}

TEST(CudaDriver, DestroyedStreamsAndEventsAreInvalidHandles) {
  if (!standin()) GTEST_SKIP() << "stand-in: the real driver leaves this undefined";
  const auto& d = driver();
  cuda::CUstream s = nullptr;
  cuda::CUevent e = nullptr;
  FERRY_CU_OK(d.stream_create(&s, 0));
  FERRY_CU_OK(d.event_create(&e, 0));
  FERRY_CU_OK(d.event_destroy(e));
  FERRY_CU_OK(d.stream_destroy(s));
  EXPECT_EQ(error_name(d.event_query(e)), "CUDA_ERROR_INVALID_HANDLE");
  EXPECT_EQ(error_name(d.stream_synchronize(s)), "CUDA_ERROR_INVALID_HANDLE");
}

TEST(CudaDriver, CopiesOfFreedOrOverrunMemoryAreRefused) {
  if (!standin()) GTEST_SKIP() << "stand-in: the real driver leaves this undefined";
  const auto& d = driver();
  std::vector<uint8_t> host(8192);
  DeviceBuffer buf(4096);
  EXPECT_EQ(error_name(d.memcpy(address(host.data()), buf.get() + 4095, 2)),
            "CUDA_ERROR_INVALID_VALUE");
  CUdeviceptr stale = buf.get();
  buf.free();
  EXPECT_EQ(error_name(d.memcpy(address(host.data()), stale, 1)), "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(error_name(d.mem_free(stale)), "CUDA_ERROR_INVALID_VALUE");
}

TEST(CudaDriver, IpcHandleOpensTheSameBytesInAnotherProcess) {
  const auto& d = driver();
  DeviceBuffer buf(1 << 20);
  auto bytes = pattern(4099, 21);
  buf.fill(bytes, 777);
  cuda::CUipcMemHandle h{};
  FERRY_CU_OK(d.ipc_get_mem_handle(&h, buf.get()));
  auto read = run_peer("read " + handle_hex(h) + " 777 4099");
  ASSERT_EQ(read.status, 0) << read.output;
  EXPECT_EQ(read.output, hex(bytes.data(), bytes.size()));
  auto write = run_peer("write " + handle_hex(h) + " 100000 5000 77");
  ASSERT_EQ(write.status, 0) << write.output;
  EXPECT_EQ(buf.read(100000, 5000), std::vector<uint8_t>(5000, 77));
}

TEST(CudaDriver, IpcHandleNeedsAnAllocationsBaseAndAnotherProcess) {
  const auto& d = driver();
  DeviceBuffer buf(1 << 20);
  cuda::CUipcMemHandle h{};
  EXPECT_EQ(error_name(d.ipc_get_mem_handle(&h, buf.get() + 4096)), "CUDA_ERROR_INVALID_VALUE");
  FERRY_CU_OK(d.ipc_get_mem_handle(&h, buf.get()));
  CUdeviceptr opened = 0;
  EXPECT_EQ(error_name(d.ipc_open_mem_handle(&opened, h, cuda::kIpcLazyEnablePeerAccess)),
            "CUDA_ERROR_INVALID_CONTEXT");
  cuda::CUipcMemHandle garbage{};
  auto r = run_peer("read " + handle_hex(garbage) + " 0 1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("cuIpcOpenMemHandle"), std::string::npos) << r.output;
}

TEST(CudaDriver, FreedAllocationsHandleNoLongerOpens) {
  const auto& d = driver();
  auto buf = std::make_unique<DeviceBuffer>(1 << 16);
  cuda::CUipcMemHandle h{};
  FERRY_CU_OK(d.ipc_get_mem_handle(&h, buf->get()));
  buf.reset();
  auto r = run_peer("read " + handle_hex(h) + " 0 1");
  EXPECT_NE(r.status, 0) << r.output;
  if (standin()) {
    EXPECT_EQ(r.output, "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_HANDLE");
  }
}

TEST(CudaDriver, MappingHeldByAPeerSeesTheExportersWrites) {
  const auto& d = driver();
  DeviceBuffer buf(1 << 16);
  cuda::CUipcMemHandle h{};
  FERRY_CU_OK(d.ipc_get_mem_handle(&h, buf.get()));
  HeldPeer held(handle_hex(h));
  ASSERT_TRUE(held.opened()) << held.said();
  // Another process opening and closing the same handle meanwhile leaves the held mapping be.
  buf.fill(pattern(64, 5), 64);
  auto r = run_peer("read " + handle_hex(h) + " 64 64");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, hex(pattern(64, 5).data(), 64));
  EXPECT_EQ(held.release(), 0);
}

}  // namespace
}  // namespace ferry::test
