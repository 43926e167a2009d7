// write_with_imm with a consumer loop: the initiator fills the target's slots one by one, each
// write carrying the slot number as its immediate; the target consumes a slot once its
// notification says every byte of it has landed.
#include <vector>

#include "two_process.hpp"

using namespace std::chrono_literals;

constexpr std::size_t kSlots = 64;
constexpr std::size_t kSlotBytes = 16 << 10;

uint8_t pattern(std::size_t slot, std::size_t i) { return static_cast<uint8_t>(slot * 31 + i); }

void target(const std::string& listen, const std::function<void(const std::string&)>& publish) {
  ferry::Engine engine(example::listen_config(listen));
  std::vector<uint8_t> ring(kSlots * kSlotBytes, 0);
  ferry::Region region =
      engine.register_memory(ring.data(), ring.size(), ferry::Access::kRemoteWrite);
  publish(engine.address() + " " + region.descriptor().to_string());

  // The consumer loop: one notification per filled slot, in the order the writes were posted.
  for (std::size_t consumed = 0; consumed < kSlots; ++consumed) {
    std::optional<ferry::ImmEvent> event = engine.next_imm(30s);
    if (!event) throw std::runtime_error("no notification within 30 s");
    if (!event->peer.valid()) throw std::runtime_error("notification from no connection");
    std::size_t slot = event->imm;
    if (slot >= kSlots) throw std::runtime_error("immediate names no slot");
    const uint8_t* bytes = ring.data() + slot * kSlotBytes;
    for (std::size_t i = 0; i < kSlotBytes; ++i) {
      if (bytes[i] != pattern(slot, i)) throw std::runtime_error("slot not fully written");
    }
  }
  std::cout << "target: consumed " << kSlots << " slots, each complete when notified" << std::endl;
  example::serve_one(engine);  // the initiator leaves once its writes completed
}

void initiator(const std::string& offer) {
  auto [address, ring] = example::parse_offer(offer);
  ferry::Engine engine({.listen = false});
  ferry::Peer peer = engine.connect(address);

  std::vector<uint8_t> source(kSlots * kSlotBytes);
  for (std::size_t s = 0; s < kSlots; ++s) {
    for (std::size_t i = 0; i < kSlotBytes; ++i) source[s * kSlotBytes + i] = pattern(s, i);
  }
  ferry::Region local = engine.register_memory(source.data(), source.size(), ferry::Access::kLocal);
  std::vector<ferry::Future> posted;
  for (std::size_t s = 0; s < kSlots; ++s) {
    ferry::Transfer t{&local, s * kSlotBytes, &ring, s * kSlotBytes, kSlotBytes};
    posted.push_back(peer.write_with_imm({&t, 1}, static_cast<uint32_t>(s)));
  }
  for (auto& f : posted) example::check(f.wait(10s), "write_with_imm");
  std::cout << "initiator: " << kSlots << " slots written, each with its notification" << std::endl;
}

int main(int argc, char** argv) { return example::run(argc, argv, target, initiator); }
