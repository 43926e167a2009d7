// Descriptors exchanged in band: the initiator needs only the target's address. Once connected,
// the target sends its region's descriptor as a tagged message over the same connection, and
// the initiator reads the region with it. (The other examples pass the descriptor out of band.)
#include <cstring>
#include <vector>

#include "two_process.hpp"

using namespace std::chrono_literals;

constexpr uint64_t kDescriptorTag = 100;
constexpr std::size_t kMaxDescriptor = 1024;  // a descriptor's binary form is far smaller
constexpr std::size_t kBytes = 256 << 10;

uint8_t pattern(std::size_t i) { return static_cast<uint8_t>(i ^ (i >> 8)); }

void target(const std::string& listen, const std::function<void(const std::string&)>& publish) {
  ferry::Engine engine(example::listen_config(listen));
  std::vector<uint8_t> data(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) data[i] = pattern(i);
  ferry::Region region = engine.register_memory(data.data(), kBytes, ferry::Access::kRemoteRead);
  publish(engine.address());  // the address only

  ferry::Peer peer = example::accept_one(engine);
  std::vector<uint8_t> blob = region.descriptor().encode();
  ferry::Region out = engine.register_memory(blob.data(), blob.size(), ferry::Access::kLocal);
  example::check(peer.send(kDescriptorTag, out, 0, blob.size()).wait(10s), "send descriptor");
  std::cout << "target: sent a " << blob.size() << "-byte descriptor in band" << std::endl;
  example::serve_until_closed(peer);
}

void initiator(const std::string& offer) {
  ferry::Engine engine({.listen = false});
  ferry::Peer peer = engine.connect(offer);
  std::vector<uint8_t> blob(kMaxDescriptor);
  ferry::Region in = engine.register_memory(blob.data(), blob.size(), ferry::Access::kLocal);
  ferry::Future got = peer.recv(kDescriptorTag, in, 0, blob.size());
  example::check(got.wait(10s), "receive descriptor");
  ferry::Descriptor remote = ferry::Descriptor::decode({blob.data(), got.bytes()});

  std::vector<uint8_t> copy(kBytes, 0);
  ferry::Region local = engine.register_memory(copy.data(), kBytes, ferry::Access::kLocal);
  ferry::Transfer t{&local, 0, &remote, 0, kBytes};
  example::check(peer.read({&t, 1}).wait(10s), "read");
  for (std::size_t i = 0; i < kBytes; ++i) {
    if (copy[i] != pattern(i)) throw std::runtime_error("byte " + std::to_string(i) + " differs");
  }
  std::cout << "initiator: read " << kBytes / 1024 << " KiB with the descriptor it received"
            << std::endl;
}

int main(int argc, char** argv) { return example::run(argc, argv, target, initiator); }
