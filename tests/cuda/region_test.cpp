// CUDA memory as the engine registers it: the kind and device found from the pointer, engine
// allocations on a device, descriptors carrying them, what no transport moves refused with the
// reason, and ferry info listing the GPUs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "cuda_test_support.hpp"
#include "support/cli_process.hpp"
#include "transport/region_table.hpp"

namespace ferry::test {
namespace {

TEST(CudaRegion, DevicePointerRegistersAsCudaMemoryOfItsDevice) {
  DeviceBuffer buf(1 << 20);
  Engine engine(test_config());
  Region r = engine.register_memory(static_cast<char*>(buf.pointer()) + 100, 4096,
                                    Access::kRemoteReadWrite);
  EXPECT_EQ(r.location(), Memory::cuda(0));
  Descriptor d = Descriptor::parse(r.descriptor().to_string());
  EXPECT_EQ(d.memory, MemoryKind::kCuda);
  EXPECT_EQ(d.memory_device, 0);
  // Neither verbs nor TCP (this engine's transports) moves CUDA memory: neither adds a key.
  EXPECT_EQ(d.key_count + d.more_keys.size(), 0u);

  std::vector<uint8_t> host(4096);
  EXPECT_EQ(engine.register_memory(host.data(), host.size(), Access::kLocal).location(),
            Memory::host());
}

TEST(CudaRegion, RegistrationPastTheAllocationsEndIsRefused) {
  DeviceBuffer buf(1 << 16);
  Engine engine(test_config());
  try {
    engine.register_memory(static_cast<char*>(buf.pointer()) + 4096, buf.size(), Access::kLocal);
    FAIL() << "registered past the allocation";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("run past its end"), std::string::npos) << e.what();
  }
}

TEST(CudaRegion, AllocateOnADeviceGivesZeroedDeviceMemoryFreedWithTheRegion) {
  if (Engine::gpus().gpus.size() < 2) GTEST_SKIP() << "needs two GPUs";
  Engine engine(test_config());
  Region r = engine.allocate(3 * 4096 + 5, Access::kRemoteWrite, Memory::cuda(1));
  EXPECT_EQ(r.location(), Memory::cuda(1));
  EXPECT_EQ(r.descriptor().memory_device, 1);
  EXPECT_EQ(r.memory(), nullptr);  // no host view of device memory
  auto where = core::cuda::pointer_info(r.data());
  EXPECT_TRUE(where.device);
  EXPECT_EQ(where.ordinal, 1);
  const auto& d = driver();
  std::vector<uint8_t> out(r.size(), 0xee);
  FERRY_CU_OK(d.memcpy(reinterpret_cast<cuda::CUdeviceptr>(out.data()),
                       reinterpret_cast<cuda::CUdeviceptr>(r.data()), out.size()));
  EXPECT_EQ(out, std::vector<uint8_t>(r.size(), 0));
  auto pointer = reinterpret_cast<cuda::CUdeviceptr>(r.data());
  r.deregister();
  r = Region();
  EXPECT_EQ(error_name(d.mem_get_address_range(nullptr, nullptr, pointer)), "CUDA_ERROR_NOT_FOUND");
}

TEST(CudaRegion, AllocateOnAMissingDeviceNamesTheCall) {
  Engine engine(test_config());
  try {
    engine.allocate(4096, Access::kLocal, Memory::cuda(63));
    FAIL() << "allocated on a device that does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cuda:63"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_INVALID_DEVICE"), std::string::npos)
        << e.what();
  }
}

// Device memory at the peer over the host transports is not staged (only the initiator's side
// is: staging_test.cpp): refused with the reason, the host paths working beside it.
TEST(CudaRegion, OperationsNoChannelMovesFailWithTheReason) {
  Pair p;
  Region target_device = p.target.allocate(1 << 16, Access::kRemoteReadWrite, Memory::cuda(0));
  Buffer host(p.initiator, 1 << 16, Access::kLocal, 1);
  Buffer target_host(p.target, 1 << 16, Access::kRemoteReadWrite, 2);
  Descriptor to_host = target_host.region.descriptor();
  Descriptor to_device = target_device.descriptor();

  auto write = [&](const Region& local, const Descriptor& remote) {
    Transfer t{&local, 0, &remote, 0, 4096};
    return p.peer.write({&t, 1}).wait(kWait);
  };
  Status s = write(host.region, to_device);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("from host to cuda memory"), std::string::npos) << s.to_string();
  // The host path still works beside them.
  ASSERT_TRUE(write(host.region, to_host).ok());
  EXPECT_EQ(std::vector<uint8_t>(target_host.bytes.begin(), target_host.bytes.begin() + 4096),
            std::vector<uint8_t>(host.bytes.begin(), host.bytes.begin() + 4096));
}

// Whatever a peer asks, the CPU paths never touch a slot of device memory.
TEST(CudaRegion, RegionTableRefusesHostAccessToDeviceMemory) {
  DeviceBuffer buf(4096);
  transport::RegionTable table;
  uint32_t id = table.insert(static_cast<uint8_t*>(buf.pointer()), 4096, Access::kRemoteReadWrite,
                             42, -1, Memory::cuda(0));
  uint8_t* addr = nullptr;
  EXPECT_EQ(table.try_acquire(id, 42, 0, 8, Access::kRemoteWrite, &addr), nullptr);
  transport::RegionUse use;
  Status s = table.acquire(id, 42, 0, 8, Access::kRemoteRead, &addr, use);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("holds cuda memory"), std::string::npos) << s.to_string();
  table.revoke(
      id, std::chrono::seconds(1), [] {}, [] {});
}

TEST(CudaRegion, FerryInfoListsTheGpus) {
  CudaInfo cuda = Engine::gpus();
  ASSERT_TRUE(cuda.driver) << cuda.why;
  ASSERT_FALSE(cuda.gpus.empty());
  std::string out;
  EXPECT_EQ(run("info", out), 0) << out;
  EXPECT_NE(out.find("gpus (CUDA driver "), std::string::npos) << out;
  for (const GpuInfo& g : cuda.gpus) EXPECT_NE(out.find(g.name), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run("info --json", out), 0) << out;
  EXPECT_NE(out.find("\"cuda\":{\"driver\":true"), std::string::npos) << out;
}

// CUDA starts only where CUDA memory is used: an engine moving host memory (cuda_ipc opened
// among the default transports, every buffer's pointer classified) never calls cuInit, so it
// costs nothing and leaves fork() safe for CUDA in the children; ferry info does.
TEST(CudaRegion, HostMemoryLeavesCudaUnstarted) {
  if (!standin()) GTEST_SKIP() << "the stand-in logs which processes call cuInit";
  std::string log = ::testing::TempDir() + "ferry-init-log-" + std::to_string(::getpid());
  std::remove(log.c_str());
  ASSERT_EQ(::setenv("FERRY_STANDIN_INIT_LOG", log.c_str(), 1), 0);
  auto lines = [&] {
    std::ifstream in(log);
    std::size_t n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  std::string out;
  EXPECT_EQ(run("bench --op write,read,write_imm,send --sizes 4K,1M --iters 3", out), 0) << out;
  EXPECT_EQ(lines(), 0U) << "a host-memory bench started CUDA";
  EXPECT_EQ(run("info", out), 0) << out;
  EXPECT_EQ(lines(), 1U) << "ferry info lists the GPUs, so it starts CUDA";
  ::unsetenv("FERRY_STANDIN_INIT_LOG");
  std::remove(log.c_str());
}

}  // namespace
}  // namespace ferry::test
