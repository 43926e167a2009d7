// One-sided write and read between two processes: the initiator writes 1 MiB into the target's
// region, reads it back into another buffer, and both check the bytes.
#include <algorithm>
#include <numeric>
#include <vector>

#include "two_process.hpp"

using namespace std::chrono_literals;

constexpr std::size_t kBytes = 1 << 20;

uint8_t pattern(std::size_t i) { return static_cast<uint8_t>(i * 7 + 3); }

void target(const std::string& listen, const std::function<void(const std::string&)>& publish) {
  ferry::Engine engine(example::listen_config(listen));
  std::vector<uint8_t> buffer(kBytes, 0);
  ferry::Region region =
      engine.register_memory(buffer.data(), buffer.size(), ferry::Access::kRemoteReadWrite);
  publish(engine.address() + " " + region.descriptor().to_string());

  example::serve_one(engine);
  for (std::size_t i = 0; i < kBytes; ++i) {
    if (buffer[i] != pattern(i)) throw std::runtime_error("target: byte " + std::to_string(i));
  }
  std::cout << "target: 1 MiB written by the peer, every byte checked" << std::endl;
}

void initiator(const std::string& offer) {
  auto [address, remote] = example::parse_offer(offer);
  ferry::Engine engine({.listen = false});  // it only initiates: no port opened
  ferry::Peer peer = engine.connect(address);

  std::vector<uint8_t> source(kBytes), back(kBytes, 0);
  for (std::size_t i = 0; i < kBytes; ++i) source[i] = pattern(i);
  ferry::Region src = engine.register_memory(source.data(), kBytes, ferry::Access::kLocal);
  ferry::Region dst = engine.register_memory(back.data(), kBytes, ferry::Access::kLocal);

  ferry::Transfer write{&src, 0, &remote, 0, kBytes};
  example::check(peer.write({&write, 1}).wait(10s), "write");
  ferry::Transfer read{&dst, 0, &remote, 0, kBytes};
  example::check(peer.read({&read, 1}).wait(10s), "read");
  if (back != source) throw std::runtime_error("read back other bytes than written");
  std::cout << "initiator: wrote and read back 1 MiB over " << ferry::to_string(peer.transport())
            << std::endl;
}

int main(int argc, char** argv) { return example::run(argc, argv, target, initiator); }
