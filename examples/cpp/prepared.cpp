// A prepared batch reused every step, as a weight sync or a KV-cache transfer does: the same
// 16 scattered blocks go to the same places each step, so the batch is checked and planned
// once (prepare_write) and only posted per step. A completed write has landed at the target;
// a message then tells it which step it holds, and its answer lets the next step overwrite it.
#include <cstring>
#include <vector>

#include "two_process.hpp"

using namespace std::chrono_literals;

constexpr std::size_t kBlocks = 16;
constexpr std::size_t kBlockBytes = 64 << 10;
constexpr uint32_t kSteps = 10;
constexpr uint64_t kStepTag = 6;
constexpr uint64_t kAckTag = 7;

// Block b of step s is written at remote block (b * 5) % kBlocks: scattered, not contiguous.
std::size_t remote_block(std::size_t b) { return (b * 5) % kBlocks; }
uint8_t pattern(uint32_t step, std::size_t block) {
  return static_cast<uint8_t>(step * 16 + block);
}

void target(const std::string& listen, const std::function<void(const std::string&)>& publish) {
  ferry::Engine engine(example::listen_config(listen));
  std::vector<uint8_t> weights(kBlocks * kBlockBytes, 0);
  ferry::Region region =
      engine.register_memory(weights.data(), weights.size(), ferry::Access::kRemoteWrite);
  publish(engine.address() + " " + region.descriptor().to_string());
  ferry::Peer peer = example::accept_one(engine);
  uint32_t step_done = 0;
  ferry::Region mailbox =
      engine.register_memory(&step_done, sizeof step_done, ferry::Access::kLocal);

  for (uint32_t step = 0; step < kSteps; ++step) {
    example::check(peer.recv(kStepTag, mailbox, 0, sizeof step_done).wait(30s), "step message");
    if (step_done != step) throw std::runtime_error("steps out of order");
    for (std::size_t b = 0; b < kBlocks; ++b) {
      const uint8_t* block = weights.data() + remote_block(b) * kBlockBytes;
      if (block[0] != pattern(step, b) || block[kBlockBytes - 1] != pattern(step, b))
        throw std::runtime_error("step " + std::to_string(step) + ": block not updated");
    }
    example::check(peer.send(kAckTag, mailbox, 0, sizeof step_done).wait(10s), "ack");
  }
  std::cout << "target: " << kSteps << " steps of " << kBlocks << " scattered blocks checked"
            << std::endl;
  example::serve_until_closed(peer);
}

void initiator(const std::string& offer) {
  auto [address, weights] = example::parse_offer(offer);
  ferry::Engine engine({.listen = false});
  ferry::Peer peer = engine.connect(address);

  std::vector<uint8_t> staging(kBlocks * kBlockBytes);
  ferry::Region local =
      engine.register_memory(staging.data(), staging.size(), ferry::Access::kLocal);
  uint32_t step_message = 0, ack = 0;
  ferry::Region out =
      engine.register_memory(&step_message, sizeof step_message, ferry::Access::kLocal);
  ferry::Region ack_in = engine.register_memory(&ack, sizeof ack, ferry::Access::kLocal);

  // Checked and planned once; posting re-checks only that `local` is still registered.
  std::vector<ferry::Transfer> batch(kBlocks);
  for (std::size_t b = 0; b < kBlocks; ++b) {
    batch[b] = {&local, b * kBlockBytes, &weights, remote_block(b) * kBlockBytes, kBlockBytes};
  }
  ferry::Prepared update = peer.prepare_write(batch);

  for (uint32_t step = 0; step < kSteps; ++step) {
    for (std::size_t b = 0; b < kBlocks; ++b)
      std::memset(staging.data() + b * kBlockBytes, pattern(step, b), kBlockBytes);
    example::check(update.post().wait(10s), "post");
    step_message = step;
    ferry::Future acked = peer.recv(kAckTag, ack_in, 0, sizeof ack);
    example::check(peer.send(kStepTag, out, 0, sizeof step_message).wait(10s), "step message");
    example::check(acked.wait(30s), "the target's ack");
  }
  std::cout << "initiator: one prepared batch posted " << kSteps << " times" << std::endl;
}

int main(int argc, char** argv) { return example::run(argc, argv, target, initiator); }
