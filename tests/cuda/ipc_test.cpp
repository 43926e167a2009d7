// The CUDA IPC transport (src/transport/cuda_ipc): GPU memory between engines of one process and
// across processes, byte-exact; the target's checks; revocation that closes the peer's mapping
// before deregister() returns; a killed peer; the bounded cache of mappings.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <thread>

#include "cuda_test_support.hpp"

namespace ferry::test {
namespace {

Config cuda_config() {
  Config c = test_config();
  c.transports = {TransportKind::kCudaIpc, TransportKind::kTcp};
  return c;
}

// Mappings of the stand-in's device memory in process `pid` (its own allocations and the ones
// it opened from other processes).
int standin_mappings(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    n += line.find("memfd:ferry-cuda-standin") != std::string::npos;
  return n;
}

TEST(CudaIpc, WritesAndReadsBetweenDeviceRegionsAreByteExact) {
  Pair p(cuda_config(), cuda_config());
  constexpr std::size_t kBytes = 1 << 20;
  Region src = p.initiator.allocate(kBytes, Access::kLocal, Memory::cuda(0));
  Region back = p.initiator.allocate(kBytes, Access::kLocal, Memory::cuda(0));
  Region dst = p.target.allocate(kBytes, Access::kRemoteReadWrite, Memory::cuda(0));
  auto bytes = pattern(kBytes, 7);
  put(src, bytes);
  Descriptor d = dst.descriptor();
  ASSERT_FALSE(d.find_key(TransportKind::kCudaIpc).empty());
  // Odd sizes and offsets, one byte, and a batch's entries in one region.
  std::vector<Transfer> batch{{&src, 3, &d, 5, 4099},
                              {&src, 10000, &d, 20001, 65537},
                              {&src, 200000, &d, 300000, 1},
                              {&src, 400000, &d, 500000, 300000}};
  ASSERT_TRUE(p.peer.write(batch).wait(kWait).ok());
  for (const Transfer& t : batch) {
    EXPECT_EQ(get(dst, t.remote_offset, t.length),
              std::vector<uint8_t>(bytes.begin() + static_cast<long>(t.local_offset),
                                   bytes.begin() + static_cast<long>(t.local_offset + t.length)))
        << t.remote_offset;
  }
  std::vector<Transfer> reads;
  for (const Transfer& t : batch)
    reads.push_back({&back, t.local_offset, &d, t.remote_offset, t.length});
  ASSERT_TRUE(p.peer.read(reads).wait(kWait).ok());
  for (const Transfer& t : batch) {
    EXPECT_EQ(get(back, t.local_offset, t.length), get(src, t.local_offset, t.length));
  }
  for (const RouteInfo& r : p.peer.routes()) {
    // One-sided operations between device memory go over CUDA IPC (messages do not yet).
    if (r.local == MemoryKind::kCuda && r.remote == MemoryKind::kCuda &&
        r.operations != "send/recv") {
      EXPECT_EQ(r.transport, TransportKind::kCudaIpc) << r.why;
    }
  }
}

TEST(CudaIpc, WriteWithImmIsDeliveredAfterItsBytes) {
  Pair p(cuda_config(), cuda_config());
  Region src = p.initiator.allocate(1 << 16, Access::kLocal, Memory::cuda(0));
  Region dst = p.target.allocate(1 << 16, Access::kRemoteWrite, Memory::cuda(0));
  put(src, pattern(1 << 16, 3));
  Descriptor d = dst.descriptor();
  for (uint32_t imm = 1; imm <= 20; ++imm) {
    put(src, std::vector<uint8_t>(8, static_cast<uint8_t>(imm)), 8 * imm);
    Transfer t{&src, 8 * imm, &d, 8 * imm, 8};
    ASSERT_TRUE(p.peer.write_with_imm({&t, 1}, imm).wait(kWait).ok());
    std::optional<ImmEvent> e = p.target.next_imm(kWait);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->imm, imm);
    EXPECT_EQ(get(dst, 8 * imm, 8), std::vector<uint8_t>(8, static_cast<uint8_t>(imm)));
  }
}

TEST(CudaIpc, TheTargetRefusesWhatItDidNotGrant) {
  Pair p(cuda_config(), cuda_config());
  Region src = p.initiator.allocate(4096, Access::kLocal, Memory::cuda(0));
  Region read_only = p.target.allocate(4096, Access::kRemoteRead, Memory::cuda(0));
  put(read_only, pattern(4096, 1));
  // A descriptor claiming write access: the initiator's checks pass, the target's do not.
  Descriptor forged = read_only.descriptor();
  forged.access = Access::kRemoteReadWrite;
  Transfer t{&src, 0, &forged, 0, 4096};
  auto write = [&] { return p.peer.write({&t, 1}).wait(kWait); };
  auto read = [&] { return p.peer.read({&t, 1}).wait(kWait); };
  Status s = write();  // the first mapping asked for
  EXPECT_EQ(s.code(), ErrorCode::kPermissionDenied) << s.to_string();
  EXPECT_TRUE(read().ok());  // asked again, for reading
  EXPECT_EQ(get(src, 0, 4096), pattern(4096, 1));
  s = write();  // more access for a mapping already granted
  EXPECT_EQ(s.code(), ErrorCode::kPermissionDenied) << s.to_string();
  EXPECT_EQ(get(read_only, 0, 4096), pattern(4096, 1));
  EXPECT_TRUE(read().ok());  // the mapping stays for what was granted
  // A wrong table key inside the CUDA IPC key.
  Region writable = p.target.allocate(4096, Access::kRemoteWrite, Memory::cuda(0));
  Descriptor wrong = writable.descriptor();
  for (Descriptor::MoreKey& k : wrong.more_keys) {
    if (k.transport == TransportKind::kCudaIpc) k.bytes.back() ^= 0x5a;
  }
  Transfer w{&src, 0, &wrong, 0, 4096};
  s = p.peer.write({&w, 1}).wait(kWait);
  EXPECT_EQ(s.code(), ErrorCode::kWrongKey) << s.to_string();
}

TEST(CudaIpc, ManyRegionsShareABoundedSetOfMappings) {
  Config initiator = cuda_config();
  initiator.transport_settings = {{"cuda_ipc.mappings", "2"}};
  Pair p(cuda_config(), initiator);
  Region src = p.initiator.allocate(4096, Access::kLocal, Memory::cuda(0));
  std::vector<Region> targets;
  for (int i = 0; i < 5; ++i)
    targets.push_back(p.target.allocate(4096, Access::kRemoteReadWrite, Memory::cuda(0)));
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < targets.size(); ++i) {
      put(src, std::vector<uint8_t>(64, static_cast<uint8_t>(10 * round + i)));
      Descriptor d = targets[i].descriptor();
      Transfer t{&src, 0, &d, 0, 64};
      ASSERT_TRUE(p.peer.write({&t, 1}).wait(kWait).ok()) << i;
      EXPECT_EQ(get(targets[i], 0, 64),
                std::vector<uint8_t>(64, static_cast<uint8_t>(10 * round + i)));
    }
  }
  // The two still mapped are given back when asked; the others were already.
  for (Region& r : targets) r.deregister();
}

// With one mapping kept, every write_with_imm to the other region evicts the last: each
// immediate still arrives, and before the mapping's CLOSED (else the target would refuse it).
TEST(CudaIpc, ImmediatesArriveWhileTheirMappingsAreEvicted) {
  Config initiator = cuda_config();
  initiator.transport_settings = {{"cuda_ipc.mappings", "1"}};
  Pair p(cuda_config(), initiator);
  Region src = p.initiator.allocate(4096, Access::kLocal, Memory::cuda(0));
  Region a = p.target.allocate(4096, Access::kRemoteWrite, Memory::cuda(0));
  Region b = p.target.allocate(4096, Access::kRemoteWrite, Memory::cuda(0));
  Descriptor da = a.descriptor();
  Descriptor db = b.descriptor();
  for (uint32_t i = 1; i <= 10; ++i) {
    Transfer t{&src, 0, i % 2 == 0 ? &da : &db, 0, 64};
    ASSERT_TRUE(p.peer.write_with_imm({&t, 1}, i).wait(kWait).ok()) << i;
    std::optional<ImmEvent> e = p.target.next_imm(kWait);
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_EQ(e->imm, i);
  }
  EXPECT_TRUE(p.peer.connected());
}

TEST(CudaIpc, DeregisteringWaitsUntilThePeerUnmappedTheRegion) {
  Pair p(cuda_config(), cuda_config());
  Region src = p.initiator.allocate(4096, Access::kLocal, Memory::cuda(0));
  Region dst = p.target.allocate(4096, Access::kRemoteWrite, Memory::cuda(0));
  Descriptor d = dst.descriptor();
  Transfer t{&src, 0, &d, 0, 4096};
  ASSERT_TRUE(p.peer.write({&t, 1}).wait(kWait).ok());
  dst.deregister();  // the peer gives its mapping back first
  Status s = p.peer.write({&t, 1}).wait(kWait);
  EXPECT_TRUE(s.code() == ErrorCode::kRevoked || s.code() == ErrorCode::kUnknownRegion)
      << s.to_string();
}

// A page-table batch between two devices: 10,000 entries of an odd size, scattered over the
// target's region, then read back into another region in the opposite order.
TEST(CudaIpc, TenThousandScatteredEntriesBetweenTwoDevices) {
  if (Engine::gpus().gpus.size() < 2) GTEST_SKIP() << "needs two GPUs";
  Pair p(cuda_config(), cuda_config());
  constexpr std::size_t kEntries = 10000, kEntry = 333;
  constexpr std::size_t kBytes = kEntries * kEntry;
  Region src = p.initiator.allocate(kBytes, Access::kLocal, Memory::cuda(0));
  Region back = p.initiator.allocate(kBytes, Access::kLocal, Memory::cuda(0));
  Region dst = p.target.allocate(2 * kBytes, Access::kRemoteReadWrite, Memory::cuda(1));
  auto bytes = pattern(kBytes, 17);
  put(src, bytes);
  Descriptor d = dst.descriptor();
  std::vector<Transfer> writes, reads;
  for (std::size_t i = 0; i < kEntries; ++i) {
    uint64_t remote = (i * 7919 % kEntries) * 2 * kEntry + i % 3;  // a permutation, spaced
    writes.push_back({&src, i * kEntry, &d, remote, kEntry});
    reads.push_back({&back, (kEntries - 1 - i) * kEntry, &d, remote, kEntry});
  }
  Future written = p.peer.write(writes);
  ASSERT_TRUE(written.wait(kWait).ok()) << written.status().to_string();
  EXPECT_EQ(written.bytes(), kBytes);
  ASSERT_TRUE(p.peer.read(reads).wait(kWait).ok());
  auto got = get(back, 0, kBytes);
  for (std::size_t i = 0; i < kEntries; ++i) {
    ASSERT_TRUE(std::equal(bytes.begin() + static_cast<long>(i * kEntry),
                           bytes.begin() + static_cast<long>((i + 1) * kEntry),
                           got.begin() + static_cast<long>((kEntries - 1 - i) * kEntry)))
        << "entry " << i;
  }
}

// Threads post at once through one peer, each into its own area; every byte lands.
TEST(CudaIpc, ManyThreadsPostThroughOnePeer) {
  Pair p(cuda_config(), cuda_config());
  constexpr int kThreads = 4, kOps = 100;
  constexpr std::size_t kArea = 64 << 10;
  Region src = p.initiator.allocate(kThreads * kArea, Access::kLocal, Memory::cuda(0));
  Region dst = p.target.allocate(kThreads * kArea, Access::kRemoteReadWrite, Memory::cuda(0));
  auto bytes = pattern(kThreads * kArea, 5);
  put(src, bytes);
  Descriptor d = dst.descriptor();
  std::vector<std::thread> threads;
  std::vector<Status> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps && failures[t].ok(); ++i) {
        uint64_t at = t * kArea + (i * 4099) % (kArea - 8192);
        Transfer tr{&src, at, &d, at, 8192};
        Future f = i % 2 == 0 ? p.peer.write({&tr, 1}) : p.peer.write_with_imm({&tr, 1}, i);
        failures[t] = f.wait(kWait);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : failures) ASSERT_TRUE(s.ok()) << s.to_string();
  for (int i = 0; i < kThreads * kOps / 2; ++i) ASSERT_TRUE(p.target.next_imm(kWait).has_value());
  // Every written span holds the source's bytes; the rest of the target is still zero.
  auto got = get(dst, 0, kThreads * kArea);
  std::vector<bool> written(kThreads * kArea);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kOps; ++i) {
      std::size_t at = t * kArea + (i * 4099) % (kArea - 8192);
      std::fill(written.begin() + static_cast<long>(at),
                written.begin() + static_cast<long>(at + 8192), true);
    }
  }
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], written[i] ? bytes[i] : 0) << "byte " << i;
}

// Closing the peer, or shutting the engine down, while copies are queued: every operation
// ends, done or cancelled, none hangs, and the regions deregister after.
TEST(CudaIpc, ClosingOrShuttingDownMidFlightEndsEveryOperation) {
  for (bool shutdown : {false, true}) {
    SCOPED_TRACE(shutdown ? "shutdown" : "close");
    Pair p(cuda_config(), cuda_config());
    constexpr std::size_t kBytes = 16 << 20;
    Region src = p.initiator.allocate(kBytes, Access::kLocal, Memory::cuda(0));
    Region dst = p.target.allocate(kBytes, Access::kRemoteReadWrite, Memory::cuda(0));
    Descriptor d = dst.descriptor();
    post_then_end(p, {&src, 0, &d, 0, kBytes}, 32, shutdown);
    auto gone = std::async(std::launch::async, [&] {
      dst.deregister();
      src.deregister();
    });
    EXPECT_EQ(gone.wait_for(kWait), std::future_status::ready);
  }
}

// The test process is the target; a ferry_test_target process maps its region and writes.
class CudaIpcAcrossProcesses : public ::testing::Test {
 protected:
  void start_writer() {
    put(region, pattern(kBytes, 9));
    std::string into = target.address() + " " + region.descriptor().to_string();
    ScopedEnv allocate("FERRY_TEST_ALLOCATE", "cuda");
    ScopedEnv write_into("FERRY_TEST_WRITE_INTO", into.c_str());
    writer = std::make_unique<TargetProcess>(4096, "cuda_ipc,tcp");
  }
  static constexpr std::size_t kBytes = 1 << 20;
  Engine target{cuda_config()};
  Region region = target.allocate(kBytes, Access::kRemoteReadWrite, Memory::cuda(0));
  std::unique_ptr<TargetProcess> writer;
};

TEST_F(CudaIpcAcrossProcesses, AnotherProcessWritesThroughItsMappingAndGivesItBack) {
  start_writer();
  ASSERT_FALSE(writer->address.empty()) << "the writer failed (its stderr has why)";
  // It wrote its zeros over the pattern, then again with immediate 1.
  EXPECT_EQ(get(region, 0, kBytes), std::vector<uint8_t>(kBytes, 0));
  std::optional<ImmEvent> e = target.next_imm(kWait);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->imm, 1u);
  int mapped = standin_mappings(writer->pid);
  region.deregister();  // returns once the writer closed its mapping
  EXPECT_EQ(standin_mappings(writer->pid), mapped - 1);
}

TEST_F(CudaIpcAcrossProcesses, AKilledPeerLetsTheRegionGo) {
  start_writer();
  ASSERT_FALSE(writer->address.empty());
  writer->kill_now();
  // No peer to ask: its channel closed and let go of the region (a hang fails here).
  auto deregistered = std::async(std::launch::async, [&] { region.deregister(); });
  EXPECT_EQ(deregistered.wait_for(kWait), std::future_status::ready);
}

}  // namespace
}  // namespace ferry::test
