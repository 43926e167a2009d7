// Discovery's cost beside a direct connect (bench/compare_lookup.sh starts the etcd): p50 and
// p99 of resolve(), region_named(), connect_named() and connect() to the same engine, each
// connection from an initiator engine of its own (an engine connects to another once at a time),
// made before the clock starts. Prints one row per call and the named / direct ratio.
//   lookup_latency ETCD_URL [iters=200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {
using Clock = std::chrono::steady_clock;

struct Row {
  double p50_us;
  double p99_us;
};

// `prepare` runs before each timed `call`, off the clock.
Row measure(
    int iters, const std::function<void()>& call, const std::function<void()>& prepare = [] {}) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(iters));
  prepare();
  call();  // the first connection and lookup warm up what later ones reuse
  for (int i = 0; i < iters; ++i) {
    prepare();
    auto start = Clock::now();
    call();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: lookup_latency ETCD_URL [iters]\n");
    return 2;
  }
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  ferry::Config c;
  c.transports = {ferry::TransportKind::kTcp};
  c.etcd = argv[1];
  c.etcd_prefix = "bench/";
  ferry::Engine target(c);
  std::vector<uint8_t> memory(4096);
  ferry::Region region =
      target.register_memory(memory.data(), memory.size(), ferry::Access::kRemoteRead);
  target.publish("bench-target");
  region.publish("kv");
  ferry::Engine initiator(c);
  ferry::Peer held = initiator.connect_named("bench-target");

  Row resolve = measure(iters, [&] { (void)initiator.resolve("bench-target"); });
  Row region_named = measure(iters, [&] { (void)held.region_named("kv"); });
  std::unique_ptr<ferry::Engine> fresh;
  auto new_initiator = [&] { fresh = std::make_unique<ferry::Engine>(c); };
  Row named = measure(
      iters, [&] { (void)fresh->connect_named("bench-target"); }, new_initiator);
  Row direct = measure(
      iters, [&] { (void)fresh->connect(target.address()); }, new_initiator);

  std::printf("%-34s %10s %10s\n", "call (tcp, loopback etcd)", "p50 us", "p99 us");
  auto row = [](const char* name, Row r) {
    std::printf("%-34s %10.1f %10.1f\n", name, r.p50_us, r.p99_us);
  };
  row("resolve(name)", resolve);
  row("peer.region_named(name)", region_named);
  row("connect_named(name)", named);
  row("connect(address)", direct);
  std::printf("connect_named / connect p50: %.2f\n", named.p50_us / direct.p50_us);
  return 0;
}
