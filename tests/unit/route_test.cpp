// The routing decision (engine/route.hpp) and the locality it starts from (core/locality.hpp).
#include "engine/route.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/locality.hpp"
#include "ferry/error.hpp"
#include "ferry/types.hpp"
#include "transport/registry.hpp"

namespace ferry::engine {
namespace {

using transport::kCapCrossHost;
using transport::kCapCrossProcess;
using transport::kCapImm;
using transport::kCapMessages;
using transport::kCapOneSided;
using transport::memory_bit;

constexpr auto kHostOnly = memory_bit(MemoryKind::kHost);
constexpr auto kCudaOnly = memory_bit(MemoryKind::kCuda);
constexpr auto kBoth = static_cast<transport::MemoryKinds>(kHostOnly | kCudaOnly);
constexpr auto kShmLike = static_cast<TransportKind>(3);
constexpr auto kCudaIpcLike = static_cast<TransportKind>(4);

std::vector<TransportKind> chosen_kinds(std::span<const Candidate> c, const Decision& d) {
  std::vector<TransportKind> out;
  for (uint8_t i = 0; i < d.usable; ++i) out.push_back(c[d.order[i]].kind);
  return out;
}

TEST(Route, LowestRankWinsAndTheOthersFollowInRankOrder) {
  // Channel order is the server's; rank is this engine's configuration.
  std::vector<Candidate> c{
      {TransportKind::kTcp, kCapCrossHost | kCapMessages | kCapImm, kHostOnly, 1},
      {TransportKind::kVerbs, kCapOneSided | kCapCrossHost | kCapMessages | kCapImm, kHostOnly, 0},
  };
  Decision d = choose(c, OpClass::kOneSided, MemoryKind::kHost, MemoryKind::kHost);
  EXPECT_EQ(chosen_kinds(c, d), (std::vector{TransportKind::kVerbs, TransportKind::kTcp}));
  EXPECT_EQ(d.verdicts[1], Verdict::kChosen);
  EXPECT_EQ(d.verdicts[0], Verdict::kFallback);
}

TEST(Route, CapabilitiesAndMemoryKindsRuleChannelsOut) {
  std::vector<Candidate> c{
      {kCudaIpcLike, kCapCrossProcess, kCudaOnly, 0},  // no messages, no imm
      {kShmLike, kCapCrossProcess | kCapMessages | kCapImm, kHostOnly, 1},
      {TransportKind::kVerbs, kCapCrossHost | kCapMessages | kCapImm, kBoth, 2},
  };
  // Host memory: the same-host transport; device memory on both ends: the device transport.
  Decision host = choose(c, OpClass::kOneSided, MemoryKind::kHost, MemoryKind::kHost);
  EXPECT_EQ(chosen_kinds(c, host), (std::vector{kShmLike, TransportKind::kVerbs}));
  EXPECT_EQ(host.verdicts[0], Verdict::kLocalMemory);
  Decision cuda = choose(c, OpClass::kOneSided, MemoryKind::kCuda, MemoryKind::kCuda);
  EXPECT_EQ(chosen_kinds(c, cuda), (std::vector{kCudaIpcLike, TransportKind::kVerbs}));
  EXPECT_EQ(cuda.verdicts[1], Verdict::kLocalMemory);
  // Host here, device there: only the transport that moves both.
  Decision mixed = choose(c, OpClass::kOneSided, MemoryKind::kHost, MemoryKind::kCuda);
  EXPECT_EQ(chosen_kinds(c, mixed), (std::vector{TransportKind::kVerbs}));
  EXPECT_EQ(mixed.verdicts[0], Verdict::kLocalMemory);
  EXPECT_EQ(mixed.verdicts[1], Verdict::kRemoteMemory);
  // Messages and write_with_imm need their capability, whatever the rank.
  Decision msg = choose(c, OpClass::kMessage, MemoryKind::kCuda, MemoryKind::kCuda);
  EXPECT_EQ(chosen_kinds(c, msg), (std::vector{TransportKind::kVerbs}));
  EXPECT_EQ(msg.verdicts[0], Verdict::kNoCapability);
  Decision imm = choose(c, OpClass::kWriteImm, MemoryKind::kCuda, MemoryKind::kCuda);
  EXPECT_EQ(imm.verdicts[0], Verdict::kNoCapability);
  // Nothing fits: no route at all.
  std::vector<Candidate> host_only{c[1]};
  EXPECT_EQ(choose(host_only, OpClass::kOneSided, MemoryKind::kCuda, MemoryKind::kHost).usable, 0);
}

TEST(Route, ReachNeedsTheCrossingCapability) {
  EXPECT_TRUE(reaches(0, Reach::kSameProcess));
  EXPECT_FALSE(reaches(0, Reach::kSameHost));
  EXPECT_TRUE(reaches(kCapCrossProcess, Reach::kSameHost));
  EXPECT_FALSE(reaches(kCapCrossProcess, Reach::kOtherHost));
  EXPECT_TRUE(reaches(kCapCrossHost, Reach::kSameHost));
  EXPECT_TRUE(reaches(kCapCrossHost, Reach::kOtherHost));
}

TEST(Route, PlanFillsTheTableAndExplainsEveryConfiguredTransport) {
  Config config;
  config.transports = {TransportKind::kVerbs, static_cast<TransportKind>(0x7f),
                       TransportKind::kTcp};
  auto unusable = [](TransportKind k) {
    return k == TransportKind::kVerbs ? std::string("no RDMA device") : std::string();
  };
  // A peer on another host: loopback cannot reach it, verbs is not usable here.
  const std::vector<TransportKind> channels{TransportKind::kTcp};
  Routes r = plan_routes(config, channels, Reach::kOtherHost, unusable);
  for (OpClass op : {OpClass::kOneSided, OpClass::kWriteImm, OpClass::kMessage}) {
    auto order = r.table.order(op, MemoryKind::kHost, MemoryKind::kHost);
    ASSERT_EQ(order.size(), 1u);
    EXPECT_EQ(order[0], 0);
    EXPECT_TRUE(r.table.order(op, MemoryKind::kCuda, MemoryKind::kHost).empty());
  }
  ASSERT_EQ(r.info.size(), 3u);  // host memory only: no channel moves device memory
  const RouteInfo& row = r.info[0];
  EXPECT_EQ(row.operations, "write/read");
  EXPECT_EQ(row.transport, TransportKind::kTcp);
  EXPECT_EQ(row.why,
            "verbs: not usable here: no RDMA device; loopback: cannot reach another host; tcp: "
            "chosen (rank 3)");
  // The same engine and a peer in this process that has every transport too.
  const std::vector<TransportKind> all{TransportKind::kTcp, static_cast<TransportKind>(0x7f)};
  r = plan_routes(config, all, Reach::kSameProcess, unusable);
  EXPECT_EQ(r.info[2].operations, "send/recv");
  EXPECT_EQ(r.info[2].transport, static_cast<TransportKind>(0x7f));
  EXPECT_EQ(r.info[2].why,
            "verbs: not usable here: no RDMA device; loopback: chosen (rank 2); tcp: fallback "
            "(rank 3, for descriptors without a loopback key)");
}

TEST(Memory, NamesRoundTripAndOthersAreRefusedByName) {
  for (Memory m : {Memory::host(), Memory::cuda(0), Memory::cuda(7), Memory::cuda(123)})
    EXPECT_EQ(parse_memory(to_string(m)), m) << to_string(m);
  EXPECT_EQ(parse_memory("cuda"), Memory::cuda(0));
  for (std::string bad : {"", "gpu", "Host", "cuda:", "cuda:x", "cuda:-1", "cuda:1 ", " host",
                          "cuda:99999999999999999999", "cuda:0:1"}) {
    try {
      parse_memory(bad);
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.status().message(), "memory '" + bad + "': expected host, cuda or cuda:N");
    }
  }
}

TEST(Locality, ReachComparesHostAndProcess) {
  core::Locality us = core::this_locality();
  EXPECT_EQ(core::reach_between(us, core::this_locality()), Reach::kSameProcess);
  core::Locality sibling = us;
  sibling.process += 1;
  EXPECT_EQ(core::reach_between(us, sibling), Reach::kSameHost);
  core::Locality far = us;
  far.host[0] ^= 1;
  EXPECT_EQ(core::reach_between(us, far), Reach::kOtherHost);
  EXPECT_NE(us.host, decltype(us.host){});  // a hash (or random), never all zero in practice
}

}  // namespace
}  // namespace ferry::engine
