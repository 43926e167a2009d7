// Engine::metrics and Peer::metrics count what each transport's operations did, exactly
// (tests/conformance/conformance.hpp runs them for every transport).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "conformance/conformance.hpp"

namespace ferry::test {
namespace {

const TransportMetrics* metrics_of(const PeerMetrics& m, TransportKind kind) {
  for (const TransportMetrics& t : m.transports) {
    if (t.transport == kind) return &t;
  }
  return nullptr;
}

uint64_t latency_count(const OperationMetrics& o) {
  uint64_t n = 0;
  for (uint64_t b : o.latency) n += b;
  return n;
}

// The peer's metrics once `operations` completions have been counted on it in all: an
// operation is counted just after its Future completes.
PeerMetrics once_counted(const Peer& peer, uint64_t operations) {
  auto deadline = std::chrono::steady_clock::now() + kWait;
  for (;;) {
    PeerMetrics m = peer.metrics();
    uint64_t counted = 0;
    for (const TransportMetrics& t : m.transports) {
      for (const OperationMetrics& o : t.operations) counted += latency_count(o);
    }
    if (counted >= operations || std::chrono::steady_clock::now() > deadline) return m;
    std::this_thread::yield();
  }
}

uint64_t errors_with(const TransportMetrics& t, ErrorCode code) {
  for (const auto& [c, n] : t.errors) {
    if (c == code) return n;
  }
  return 0;
}

TEST_P(Conformance, MetricsCountEachKindOfOperationAndItsBytes) {
  Pair& p = pair();
  Buffer src(p.initiator, 256 << 10, Access::kLocal, 1);
  Buffer dst(p.target, 256 << 10, Access::kRemoteReadWrite, 2);
  Descriptor remote = dst.region.descriptor();
  // One batch of three entries: one write, 1000 + 70000 + 1 bytes.
  Transfer batch[] = {{&src.region, 0, &remote, 0, 1000},
                      {&src.region, 1000, &remote, 1000, 70000},
                      {&src.region, 71000, &remote, 71000, 1}};
  ASSERT_TRUE(p.peer.write(batch).wait(kWait).ok());
  Transfer back{&src.region, 100000, &remote, 0, 4096};
  ASSERT_TRUE(p.peer.read({&back, 1}).wait(kWait).ok());
  Transfer note{&src.region, 0, &remote, 0, 8};
  ASSERT_TRUE(p.peer.write_with_imm({&note, 1}, 7).wait(kWait).ok());
  ASSERT_TRUE(p.target.next_imm(kWait).has_value());
  Future r = p.target_peer.recv(5, dst.region, 200000, 1000);
  ASSERT_TRUE(p.peer.send(5, src.region, 0, 100).wait(kWait).ok());
  ASSERT_TRUE(r.wait(kWait).ok());
  EXPECT_EQ(0, std::memcmp(src.bytes.data(), dst.bytes.data() + 200000, 100));

  PeerMetrics out = once_counted(p.peer, 4);
  EXPECT_EQ(out.engine_id, p.target.id());
  const TransportMetrics* t = metrics_of(out, GetParam());
  ASSERT_NE(t, nullptr);
  struct Expected {
    OperationKind kind;
    uint64_t bytes;
  };
  for (Expected e :
       {Expected{OperationKind::kWrite, 71001}, Expected{OperationKind::kRead, 4096},
        Expected{OperationKind::kWriteWithImm, 8}, Expected{OperationKind::kSend, 100}}) {
    SCOPED_TRACE(to_string(e.kind));
    const OperationMetrics& o = t->operation(e.kind);
    EXPECT_EQ(o.succeeded, 1u);
    EXPECT_EQ(o.failed, 0u);
    EXPECT_EQ(o.bytes, e.bytes);
    EXPECT_EQ(latency_count(o), 1u);
    EXPECT_GT(o.latency_sum_ns, 0u);
  }
  EXPECT_EQ(t->operation(OperationKind::kRecv).succeeded, 0u);
  for (const OperationMetrics& o : t->operations) EXPECT_EQ(o.in_flight, 0u);
  EXPECT_TRUE(t->errors.empty());

  PeerMetrics in = once_counted(p.target_peer, 1);
  const TransportMetrics* u = metrics_of(in, GetParam());
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->operation(OperationKind::kRecv).succeeded, 1u);
  EXPECT_EQ(u->operation(OperationKind::kRecv).bytes, 100u);  // the message, not the capacity
  EXPECT_EQ(u->operation(OperationKind::kWrite).succeeded, 0u);
  EXPECT_EQ(in.imms_received, 1u);

  // The engine's view holds the same peer, and its Prometheus text the same figures.
  EngineMetrics all = p.initiator.metrics();
  ASSERT_EQ(all.peers.size(), 1u);
  EXPECT_EQ(all.peers[0].engine_id, p.target.id());
  std::string text = all.prometheus();
  std::string write_bytes = "ferry_bytes_total{peer=\"";
  char id[17];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(p.target.id()));
  write_bytes += id;
  write_bytes += "\",address=\"" + out.address + "\",transport=\"" +
                 std::string(to_string(GetParam())) + "\",kind=\"write\"} 71001\n";
  EXPECT_NE(text.find(write_bytes), std::string::npos) << text;
  EXPECT_NE(text.find("ferry_peers 1\n"), std::string::npos) << text;
}

TEST_P(Conformance, MetricsCountFailuresByCodeAndOperationsInFlight) {
  Pair& p = pair();
  Buffer src(p.initiator, 8192, Access::kLocal, 3);
  Buffer dst(p.target, 4096, Access::kRemoteWrite, 4);
  Descriptor remote = dst.region.descriptor();
  // Beyond the region: refused at the initiator, counted as a failed write.
  Transfer past{&src.region, 0, &remote, 4000, 200};
  EXPECT_EQ(p.peer.write({&past, 1}).wait(kWait).code(), ErrorCode::kOutOfBounds);
  EXPECT_EQ(p.peer.write({&past, 1}).wait(kWait).code(), ErrorCode::kOutOfBounds);
  // Not granted: the region lets peers write only.
  Transfer read{&src.region, 0, &remote, 0, 8};
  EXPECT_EQ(p.peer.read({&read, 1}).wait(kWait).code(), ErrorCode::kPermissionDenied);
  PeerMetrics out = once_counted(p.peer, 3);
  const TransportMetrics* t = metrics_of(out, GetParam());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->operation(OperationKind::kWrite).failed, 2u);
  EXPECT_EQ(t->operation(OperationKind::kWrite).succeeded, 0u);
  EXPECT_EQ(t->operation(OperationKind::kWrite).bytes, 0u);
  EXPECT_EQ(t->operation(OperationKind::kRead).failed, 1u);
  EXPECT_EQ(errors_with(*t, ErrorCode::kOutOfBounds), 2u);
  EXPECT_EQ(errors_with(*t, ErrorCode::kPermissionDenied), 1u);
  EXPECT_EQ(t->errors.size(), 2u);
  EXPECT_EQ(t->operation(OperationKind::kWrite).in_flight, 0u);  // refused: never posted

  // A receive waiting for its message is in flight until the message comes.
  Buffer inbox(p.target, 4096, Access::kLocal, 5);
  Future r = p.target_peer.recv(9, inbox.region, 0, 64);
  PeerMetrics in = p.target_peer.metrics();
  ASSERT_NE(metrics_of(in, GetParam()), nullptr);
  EXPECT_EQ(metrics_of(in, GetParam())->operation(OperationKind::kRecv).in_flight, 1u);
  ASSERT_TRUE(p.peer.send(9, src.region, 0, 64).wait(kWait).ok());
  ASSERT_TRUE(r.wait(kWait).ok());
  in = once_counted(p.target_peer, 1);
  EXPECT_EQ(metrics_of(in, GetParam())->operation(OperationKind::kRecv).in_flight, 0u);
  EXPECT_EQ(metrics_of(in, GetParam())->operation(OperationKind::kRecv).succeeded, 1u);

  // A message longer than the receive: both ends fail, truncated, on each side's count.
  Future small = p.target_peer.recv(10, inbox.region, 0, 16);
  EXPECT_EQ(p.peer.send(10, src.region, 0, 64).wait(kWait).code(), ErrorCode::kTruncated);
  EXPECT_EQ(small.wait(kWait).code(), ErrorCode::kTruncated);
  in = once_counted(p.target_peer, 2);
  const TransportMetrics* after = metrics_of(in, GetParam());
  EXPECT_EQ(after->operation(OperationKind::kRecv).failed, 1u);
  EXPECT_EQ(after->operation(OperationKind::kRecv).succeeded, 1u);
  EXPECT_EQ(errors_with(*after, ErrorCode::kTruncated), 1u);
  out = once_counted(p.peer, 5);
  EXPECT_EQ(metrics_of(out, GetParam())->operation(OperationKind::kSend).failed, 1u);
  EXPECT_EQ(errors_with(*metrics_of(out, GetParam()), ErrorCode::kTruncated), 1u);
}

TEST_P(Conformance, MetricsOffCountNothingAndChangeNothing) {
  Config off = config();
  off.metrics = false;
  std::unique_ptr<Pair> p = connect(off, off);
  Buffer src(p->initiator, 4096, Access::kLocal, 6);
  Buffer dst(p->target, 4096, Access::kRemoteWrite, 7);
  Descriptor remote = dst.region.descriptor();
  Transfer t{&src.region, 0, &remote, 0, 4096};
  ASSERT_TRUE(p->peer.write({&t, 1}).wait(kWait).ok());
  EXPECT_EQ(0, std::memcmp(src.bytes.data(), dst.bytes.data(), 4096));
  PeerMetrics m = p->peer.metrics();
  EXPECT_EQ(m.engine_id, p->target.id());
  EXPECT_TRUE(m.transports.empty());
  EXPECT_EQ(p->initiator.metrics().prometheus().find("ferry_bytes_total{"), std::string::npos);
}

}  // namespace
}  // namespace ferry::test
