// A program of someone else's: it uses Ferry through whatever the build found (find_package,
// pkg-config, add_subdirectory, FetchContent) and checks that a write and a read move bytes.
#include <chrono>
#include <cstdio>
#include <ferry/ferry.hpp>
#include <vector>

int main() {
  using namespace std::chrono_literals;
  ferry::Engine target;
  ferry::Engine initiator({.listen = false});
  std::vector<uint8_t> remote_mem(4096, 0), local_mem(4096, 0x5a), back(4096, 0);
  ferry::Region remote_region =
      target.register_memory(remote_mem.data(), remote_mem.size(), ferry::Access::kRemoteReadWrite);
  ferry::Descriptor remote = ferry::Descriptor::parse(remote_region.descriptor().to_string());
  ferry::Region local = initiator.register_memory(local_mem.data(), 4096, ferry::Access::kLocal);
  ferry::Region check = initiator.register_memory(back.data(), 4096, ferry::Access::kLocal);

  ferry::Peer peer = initiator.connect(target.address());
  ferry::Transfer w{&local, 0, &remote, 0, 4096};
  ferry::Transfer r{&check, 0, &remote, 0, 4096};
  ferry::Status s = peer.write({&w, 1}).wait(10s);
  if (s.ok()) s = peer.read({&r, 1}).wait(10s);
  if (!s.ok() || back != local_mem || remote_mem != local_mem) {
    std::fprintf(stderr, "consumer: %s\n", s.ok() ? "bytes differ" : s.to_string().c_str());
    return 1;
  }
  try {  // errors cross the library boundary as ferry::Error
    ferry::Descriptor::parse("not a descriptor");
    return 1;
  } catch (const ferry::Error& e) {
    if (e.code() != ferry::ErrorCode::kInvalidArgument) return 1;
  }
  std::printf("consumer: ferry %s, write and read checked\n",
              std::string(ferry::Engine::version()).c_str());
  return 0;
}
