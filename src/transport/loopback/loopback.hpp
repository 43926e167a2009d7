// The loopback transport: two engines of one process, the initiator's progress thread copying
// straight between their memory after the target's region table allowed each access (as TCP's
// target does). It exists to test the engine without hardware: it is registered like any
// transport (transports.def), runs the conformance suite, and injects faults (Faults) into
// operations, lanes and connections. No default configuration offers it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "transport/close_latch.hpp"
#include "transport/contract.hpp"

namespace ferry::transport::loopback {

// Its kind: outside the range of transports that cross processes.
constexpr TransportKind kKind{0x7f};
// Lanes of a channel per rail: more than one, so operations are striped as over sockets or
// queue pairs.
constexpr int kLanesPerRail = 2;

// Faults injected into every loopback channel of the process while set (tests set them, then
// reset()). Counting is process-wide: slices are numbered from 1 across all channels.
struct Faults {
  std::atomic<uint64_t> fail_every_slice{0};  // every Nth slice fails with kSystem (0: none)
  std::atomic<uint64_t> break_at_slice{0};    // the Nth slice breaks its channel, as a lane whose
                                              // connection died: the peer is lost (0: none)
  std::atomic<int64_t> delay_us{0};           // each operation waits this long first
  std::atomic<uint64_t> drop_slice{0};        // the Nth slice is never done nor answered, as a
                                              // lost completion: its operation stays in flight
                                              // until a wait times out or the peer is closed
  std::atomic<bool> refuse_connect{false};    // connect() fails, as an unreachable device would
  std::atomic<uint64_t> slices{0};            // slices handled so far
  // Not a fault: the devices (rails) each loopback transport opened from now on has, each
  // opening a region with its own key as a NIC per rail would (1 to kMaxRails). A channel
  // stripes over the rails both ends have, lane l on rail l % rails.
  std::atomic<int> rails{1};
  // Not a fault either: channels connected while it is set ask to shape each write
  // (Channel::shapes_writes), and cut writes of at least shape_from bytes into slices of
  // shape_slice bytes, as shm cuts those it copies through its rings; read at each post.
  std::atomic<uint64_t> shape_from{0};
  std::atomic<uint64_t> shape_slice{0};
  void reset() {
    fail_every_slice = 0;
    break_at_slice = 0;
    delay_us = 0;
    drop_slice = 0;
    refuse_connect = false;
    slices = 0;
    rails = 1;
    shape_from = 0;
    shape_slice = 0;
  }
};
Faults& faults();

class LoopbackChannel final : public Channel, public std::enable_shared_from_this<LoopbackChannel> {
 public:
  LoopbackChannel(ChannelArgs args, int rails, std::size_t key_bytes);
  ~LoopbackChannel() override;
  // Makes the channel reachable by its address (once shared_from_this works).
  void publish();

  TransportKind kind() const override { return kKind; }
  // The address is this process's id (u32), the channel's endpoint number (u64) and its
  // rails (u8).
  std::vector<uint8_t> local_address() const override;
  Status connect(std::span<const uint8_t> remote) override;
  int lanes() const override { return kLanesPerRail * rails_; }
  int rails() const override { return rails_; }
  bool shapes_writes() const override { return faults().shape_slice.load() != 0; }
  void shape_write(OpState& op, uint64_t total) override {
    uint64_t slice = faults().shape_slice.load();
    if (slice != 0 && total >= faults().shape_from.load() && slice < op.slice_bytes) {
      op.slice_bytes = slice;
    }
  }
  PostResult post(OpState* op) override;
  void close(const Status& reason) override;
  bool closed() const override { return latch_.closing(); }
  bool quiesced() const override { return latch_.quiesced(); }
  void stop_after_reactor() override;
  // An access holds the target's region only while it copies: nothing to cut off.
  void cut_off(const uint8_t*, uint64_t, const Status&) override {}

 private:
  // A task (or the channel itself, until closed) stops using the channel; the last one reports
  // it closed.
  void leave();
  // Once: the channel is closed and nothing of it touches user memory (on_closed).
  // Joins as a user unless closing (then false).
  bool enter();
  // Carries out a posted operation on this engine's progress thread.
  void run(OpState* op);
  enum class Slice : uint8_t { kDone, kBroke, kDropped };
  // One slice of a write or read on `lane` into or from the target `to` (kDone also when the
  // access was refused: `failed` says so).
  Slice copy_slice(OpState& op, int lane, std::size_t index, uint64_t offset, uint64_t length,
                   LoopbackChannel& to, bool& failed);
  void send_message(OpState& op, LoopbackChannel& to);

  Host& host_;
  std::shared_ptr<PeerLink> link_;
  const int loop_;
  int rails_;                    // this end's until connect(), then the number both ends have
  const std::size_t key_bytes_;  // of the keys this end's transport registers
  uint64_t endpoint_ = 0;
  std::weak_ptr<LoopbackChannel> peer_;  // set by connect(), before any post
  // Tasks posted and not finished, plus one held by the channel until it closes.
  std::atomic<int> users_{1};
  CloseLatch latch_;
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(int rails, std::size_t key_bytes) : rails_(rails), key_bytes_(key_bytes) {}
  TransportKind kind() const override { return kKind; }
  // The target's region table checks every access, as over TCP, but the key differs from
  // TCP's (the table key, flipped) and from rail to rail: a key sent over the wrong channel or
  // rail is refused, as between real transports and NICs, which lets tests catch it. A key
  // longer than 8 bytes goes on with bytes made from the first 8, all of them checked.
  static constexpr uint64_t kKeyFlip = 0x6c6f6f7062616b6bULL;
  static uint64_t key_flip(int rail) { return kKeyFlip ^ (0x0101010101010101ULL * rail); }
  // Rail `rail`'s key for a region whose table key is `table_key`, `length` bytes.
  static void make_key(uint64_t table_key, int rail, std::span<uint8_t> key);
  // The table key `key` stands for on `rail`, if it is a key make_key() made of `length` bytes.
  static std::optional<uint64_t> table_key(std::span<const uint8_t> key, int rail,
                                           std::size_t length);
  Status register_region(uint32_t, uint8_t*, uint64_t, Access, uint64_t table_key,
                         KeySink& keys) override;
  void deregister_region(uint32_t) override {}
  Status make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) override;

 private:
  int rails_;
  std::size_t key_bytes_;
};

}  // namespace ferry::transport::loopback
