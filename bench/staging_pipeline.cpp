// The staged path's overlap (docs/gpu.md, "Staging"): operations of 64 MiB between CUDA memory
// here and host memory at a same-host peer, over shm (or the transport named first), beside the
// stages they are made of, each measured alone on the same bytes:
//   write: the copy out of the device into pinned memory, then the host write of it;
//   read: the host read into pinned memory, then the copy into the device.
// A pipeline that overlaps its stages moves at the rate of the slower one; run back to back
// they would take the sum. Prints each rate (MB/s, medians of ROUNDS) and staged / slower stage.
//   staging_pipeline [transport] [MiB] [rounds]
// Against whatever libcuda.so.1 the loader finds: bench/compare_gpu.sh puts the stand-in first
// on the library path where no GPU driver is wanted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda.hpp"
#include "ferry/ferry.hpp"

namespace {

namespace cu = ferry::core::cuda;
using Clock = std::chrono::steady_clock;

double median_mbs(std::size_t bytes, int rounds, const std::function<void()>& run) {
  std::vector<double> rates;
  for (int i = 0; i < rounds; ++i) {
    auto start = Clock::now();
    run();
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    rates.push_back(static_cast<double>(bytes) / seconds / 1e6);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

void check(const ferry::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "staging_pipeline: %s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string transport = argc > 1 ? argv[1] : "shm";
  std::size_t bytes = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64) << 20;
  int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  try {
    std::optional<ferry::TransportKind> kind = ferry::transport_named(transport);
    if (!kind) throw ferry::Error(ferry::ErrorCode::kInvalidArgument, "no transport " + transport);
    ferry::Config c;
    c.transports = {*kind};
    ferry::Engine target(c);
    c.listen = false;
    ferry::Engine initiator(c);
    ferry::Peer peer = initiator.connect(target.address());
    ferry::Region device = initiator.allocate(bytes, ferry::Access::kLocal, ferry::Memory::cuda(0));
    ferry::Region host = target.allocate(bytes, ferry::Access::kRemoteReadWrite);
    ferry::Descriptor d = host.descriptor();

    const cu::Driver& driver = *cu::Driver::get();
    cu::use_device(driver, 0);
    void* pinned = nullptr;
    driver.check(driver.mem_host_alloc(&pinned, bytes, cu::kHostAllocPortable), "cuMemHostAlloc");
    ferry::Region staged = initiator.register_memory(pinned, bytes, ferry::Access::kLocal);
    auto device_address = reinterpret_cast<cu::CUdeviceptr>(device.data());
    auto pinned_address = reinterpret_cast<cu::CUdeviceptr>(pinned);

    ferry::Transfer from_device{&device, 0, &d, 0, bytes};
    ferry::Transfer from_pinned{&staged, 0, &d, 0, bytes};
    auto op = [&](bool write, const ferry::Transfer& t) {
      check((write ? peer.write({&t, 1}) : peer.read({&t, 1})).wait(std::chrono::seconds(120)),
            write ? "write" : "read");
    };
    op(true, from_device);  // warms the staging buffers and the channel
    op(true, from_pinned);
    double out = median_mbs(bytes, rounds, [&] {
      driver.check(driver.memcpy(pinned_address, device_address, bytes), "cuMemcpy D2H");
    });
    double in = median_mbs(bytes, rounds, [&] {
      driver.check(driver.memcpy(device_address, pinned_address, bytes), "cuMemcpy H2D");
    });
    double host_write = median_mbs(bytes, rounds, [&] { op(true, from_pinned); });
    double host_read = median_mbs(bytes, rounds, [&] { op(false, from_pinned); });
    double staged_write = median_mbs(bytes, rounds, [&] { op(true, from_device); });
    double staged_read = median_mbs(bytes, rounds, [&] { op(false, from_device); });

    std::printf("staged %s, %zu MiB, medians of %d rounds (MB/s)\n", transport.c_str(), bytes >> 20,
                rounds);
    std::printf("%-36s %10.1f\n", "device -> pinned copy alone", out);
    std::printf("%-36s %10.1f\n", ("host write over " + transport + " alone").c_str(), host_write);
    std::printf("%-36s %10.1f\n", "staged write", staged_write);
    std::printf("%-36s %10.2f\n", "staged write / slower stage",
                staged_write / std::min(out, host_write));
    std::printf("%-36s %10.1f\n", ("host read over " + transport + " alone").c_str(), host_read);
    std::printf("%-36s %10.1f\n", "pinned -> device copy alone", in);
    std::printf("%-36s %10.1f\n", "staged read", staged_read);
    std::printf("%-36s %10.2f\n", "staged read / slower stage",
                staged_read / std::min(in, host_read));
    staged.deregister();
    driver.mem_free_host(pinned);
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "staging_pipeline: %s\n", e.what());
    return 1;
  }
  return 0;
}
