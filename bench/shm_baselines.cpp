// What one thread moves between two buffers of this host without Ferry, the yardsticks
// bench/compare_shm.sh divides Ferry's same-host figures by:
//   memcpy_<size>_mbs   memcpy between two warm buffers of one process
//   cma_<size>_mbs      one process_vm_readv stream from another process (a forked child)
//   cma2_<size>_mbs     two streams at once, each reading half: what two cores can pull, the
//                       ceiling of a same-host pull split over threads (a thread started per
//                       copy: ~50 us of a 64 MiB copy's ~5 ms)
// usage: shm_baselines SIZE... (bytes); prints one JSON object.
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Repeats `copy` for about half a second after a warm-up and returns the median MB/s of its
// rounds (a round: enough copies for ~20 ms).
template <typename Copy>
double median_mbs(std::size_t size, Copy copy) {
  copy();  // page faults and caches out of the way
  int per_round = std::max<int>(1, static_cast<int>((std::size_t{256} << 20) / size / 10));
  std::vector<double> rounds;
  auto end = Clock::now() + std::chrono::milliseconds(500);
  while (rounds.size() < 5 || Clock::now() < end) {
    auto t0 = Clock::now();
    for (int i = 0; i < per_round; ++i) copy();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rounds.push_back(static_cast<double>(size) * per_round / s / 1e6);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

double memcpy_mbs(std::size_t size) {
  std::vector<unsigned char> from(size, 1), to(size, 0);
  return median_mbs(size, [&] {
    std::memcpy(to.data(), from.data(), size);
    asm volatile("" : : "r"(to.data()) : "memory");  // the copy is not optimised away
  });
}

// A child holds `size` bytes and waits; this process reads them with process_vm_readv, in
// `streams` equal parts at once.
double cma_mbs(std::size_t size, std::size_t streams) {
  std::vector<unsigned char> from(size, 1), to(size, 0);
  int ready[2], done[2];
  if (pipe(ready) != 0 || pipe(done) != 0) return 0;
  pid_t child = fork();
  if (child == 0) {
    std::memset(from.data(), 2, size);  // its own pages, not the parent's copy-on-write ones
    char c = 1;
    (void)!write(ready[1], &c, 1);
    (void)!read(done[0], &c, 1);
    _exit(0);
  }
  char c;
  (void)!read(ready[0], &c, 1);
  std::atomic<bool> ok{true};
  auto part = [&](std::size_t i) {
    std::size_t begin = size * i / streams, end = size * (i + 1) / streams;
    iovec local{to.data() + begin, end - begin}, remote{from.data() + begin, end - begin};
    if (process_vm_readv(child, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(end - begin))
      ok = false;
  };
  double mbs = median_mbs(size, [&] {
    std::vector<std::thread> others;
    for (std::size_t i = 1; i < streams; ++i) others.emplace_back(part, i);
    part(0);
    for (std::thread& t : others) t.join();
  });
  (void)!write(done[1], &c, 1);
  waitpid(child, nullptr, 0);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
  return ok ? mbs : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SIZE...\n", argv[0]);
    return 2;
  }
  std::string out = "{";
  for (int i = 1; i < argc; ++i) {
    std::size_t size = std::strtoull(argv[i], nullptr, 10);
    if (size == 0) {
      std::fprintf(stderr, "%s: not a size\n", argv[i]);
      return 2;
    }
    char field[192];
    std::snprintf(
        field, sizeof field, "%s\"memcpy_%zu_mbs\":%.1f,\"cma_%zu_mbs\":%.1f,\"cma2_%zu_mbs\":%.1f",
        i > 1 ? "," : "", size, memcpy_mbs(size), size, cma_mbs(size, 1), size, cma_mbs(size, 2));
    out += field;
  }
  std::printf("%s}\n", out.c_str());
  return 0;
}
