// A target process for multi-process tests: registers a patterned region, prints its address
// and descriptor, and serves until its standard input closes.
// usage: ferry_test_target [SIZE [LISTEN_HOST [TRANSPORTS]]]
//   (defaults: 1 MiB, 127.0.0.1, the default transports; TRANSPORTS: names, comma-separated)
// With FERRY_TEST_DENY_CROSS_MEMORY=1 in its environment, a seccomp filter refuses the process
// process_vm_readv/writev (EPERM) once its engine is open, as a container's profile would.
// With FERRY_TEST_ALLOCATE=1, the region's memory comes from Engine::allocate; with
// FERRY_TEST_ALLOCATE=cuda, from Engine::allocate on CUDA device 0 (zeroed, not filled).
// With FERRY_TEST_WRITE_INTO="ADDRESS DESCRIPTOR", it first connects to ADDRESS and writes the
// whole region DESCRIPTOR names (bytes i * 31 + 7; zeros into CUDA memory, from CUDA memory)
// twice, the second time with immediate 1, before it prints anything.
// With FERRY_TEST_PUBLISH="ENGINE REGION" (and FERRY_ETCD), it publishes itself and its region
// under those names, with a 2 s lease, before it prints anything; FERRY_TEST_IDENTITY names its
// identity file (Config::identity_file).
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

#if defined(__x86_64__)
constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#endif

// Every thread of the process (the engine's included) gets EPERM from process_vm_*.
void deny_cross_memory() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 1, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &program) != 0) {
    std::cerr << "seccomp: " << std::strerror(errno) << std::endl;
    std::exit(2);
  }
}

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
void ignore_writes(bool on) {
  if (on) {
    __tsan_ignore_thread_begin();
  } else {
    __tsan_ignore_thread_end();
  }
}
#else
void ignore_writes(bool) {}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::size_t size = argc > 1 ? std::stoull(argv[1]) : (1 << 20);
  ferry::Config c;
  c.listen_host = argc > 2 ? argv[2] : "127.0.0.1";
  if (argc > 3) {
    c.transports.clear();
    std::istringstream names(argv[3]);
    for (std::string name; std::getline(names, name, ',');)
      c.transports.push_back(ferry::transport_named(name).value());
  }
  const char* publish = std::getenv("FERRY_TEST_PUBLISH");
  if (publish != nullptr) c.etcd_ttl = std::chrono::seconds(2);
  if (const char* identity = std::getenv("FERRY_TEST_IDENTITY")) c.identity_file = identity;
  ferry::Engine engine(c);
  if (const char* deny = std::getenv("FERRY_TEST_DENY_CROSS_MEMORY"); deny && *deny == '1')
    deny_cross_memory();
  auto fill = [](uint8_t* bytes, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  };
  std::vector<uint8_t> mem;
  ferry::Region region;
  const char* allocate = std::getenv("FERRY_TEST_ALLOCATE");
  if (allocate != nullptr && std::string(allocate) == "cuda") {
    region = engine.allocate(size, ferry::Access::kRemoteReadWrite, ferry::Memory::cuda(0));
  } else if (allocate != nullptr && *allocate == '1') {
    region = engine.allocate(size, ferry::Access::kRemoteReadWrite);
    // Before any peer knows the region; the progress threads touch it only once a peer read
    // its descriptor from our output, an order through another process that ThreadSanitizer
    // cannot see: these writes are kept from it.
    ignore_writes(true);
    fill(static_cast<uint8_t*>(region.data()), size);
    ignore_writes(false);
  } else {
    mem.resize(size);
    fill(mem.data(), size);  // before registering: the progress threads read it after that
    region = engine.register_memory(mem.data(), size, ferry::Access::kRemoteReadWrite);
  }
  // Kept until the process ends: the peer holds the mapping it was lent.
  std::vector<uint8_t> source;
  ferry::Region local;
  ferry::Peer peer;
  if (const char* into = std::getenv("FERRY_TEST_WRITE_INTO"); into && *into) {
    std::istringstream words(into);
    std::string address, text;
    words >> address >> text;
    ferry::Descriptor d = ferry::Descriptor::parse(text);
    if (d.memory == ferry::MemoryKind::kCuda) {
      local = engine.allocate(d.length, ferry::Access::kLocal, ferry::Memory::cuda(0));  // zeroes
    } else {
      source.resize(d.length);
      fill(source.data(), source.size());
      local = engine.register_memory(source.data(), source.size(), ferry::Access::kLocal);
    }
    peer = engine.connect(address);
    ferry::Transfer whole{&local, 0, &d, 0, d.length};
    for (int i = 0; i < 2; ++i) {
      ferry::Future f = i == 0 ? peer.write({&whole, 1}) : peer.write_with_imm({&whole, 1}, 1);
      ferry::Status s = f.wait(std::chrono::seconds(20));
      if (!s.ok()) {
        std::cerr << "write into " << address << ": " << s.to_string() << std::endl;
        return 2;
      }
    }
  }
  if (publish != nullptr) {
    std::istringstream words(publish);
    std::string engine_name, region_name;
    words >> engine_name >> region_name;
    engine.publish(engine_name);
    region.publish(region_name);
  }
  std::cout << "ADDR " << engine.address() << "\nDESC " << region.descriptor().to_string()
            << std::endl;
  char c1;
  while (read(STDIN_FILENO, &c1, 1) > 0) {
  }
  return 0;
}
