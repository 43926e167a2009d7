// A connected peer: planning and posting of its operations (validation, slicing, striping),
// its channels, and its control connection (liveness and goodbye, peer_control.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/net.hpp"
#include "engine/channel_set.hpp"
#include "engine/handshake.hpp"
#include "engine/route.hpp"
#include "ferry/ferry.hpp"
#include "transport/contract.hpp"

namespace ferry::detail {

class EngineImpl;
class PeerImpl;

// What a peer's control connection holds at most (peer_control.cpp asserts it).
constexpr std::size_t kControlBytes = 1024;
// One queued write_with_imm notification: the event and its share of the queue's blocks.
constexpr std::size_t kQueuedImmBytes = 64;

// What a Prepared handle holds: a checked one-sided batch and the local ranges each post leases.
struct PreparedImpl {
  struct Local {
    uint32_t region_id;
    uint64_t key;
    uint64_t begin, end;  // the span of the region the batch touches
  };
  std::shared_ptr<PeerImpl> peer;
  transport::OpKind kind = transport::OpKind::kWrite;
  bool with_imm = false;
  uint32_t imm = 0;
  uint8_t channel = 0;  // the peer's channel the entries' remote keys are for
  uint64_t slice_bytes = 0;
  std::vector<transport::OpEntry> entries;
  uint8_t rails = 1;
  transport::KeyStore keys;  // as in OpState
  std::vector<Local> locals;
  uint64_t slices = 0;
  uint64_t total = 0;
};

class PeerImpl : public std::enable_shared_from_this<PeerImpl> {
 public:
  // `incoming`: the peer connected to us (it claimed its identity); else we dialled it.
  static std::shared_ptr<PeerImpl> create(std::shared_ptr<EngineImpl> engine,
                                          const engine::Identity& remote, std::string address,
                                          bool incoming, core::Fd control);
  PeerImpl(std::shared_ptr<EngineImpl> engine, const engine::Identity& remote, std::string address,
           bool incoming, core::Fd control);

  Future one_sided(transport::OpKind kind, std::span<const Transfer> batch, bool with_imm,
                   uint32_t imm);
  // Checks a batch as one_sided() does (throws Error with its refusal) for posting many times.
  std::shared_ptr<const PreparedImpl> prepare(transport::OpKind kind,
                                              std::span<const Transfer> batch, bool with_imm,
                                              uint32_t imm);
  Future post_prepared(const PreparedImpl& p);
  Future send(uint64_t tag, const Region& local, uint64_t offset, uint64_t length);
  Future recv(uint64_t tag, const Region& local, uint64_t offset, uint64_t capacity);
  // `goodbye`: the peer said it was leaving (a routine close, logged at info).
  void close(const Status& reason, bool goodbye = false);
  // A channel finished closing; when the last one did, every op still posted fails.
  void channel_closed(const Status& reason);
  // The channels to take for `op` on host memory, best first (none: no channel carries it).
  std::span<const uint8_t> route(engine::OpClass op) const {
    return routes.table.order(op, MemoryKind::kHost, MemoryKind::kHost);
  }
  // The transport write / read between host memory use.
  TransportKind transport() const;
  PeerMetrics metrics() const;

  // Reads what each channel carries and how it is cut, once its side connections are attached
  // and before the peer is published: nothing of it is asked of the channels per operation.
  void settle();
  // Control connection (liveness); called by the engine's housekeeping.
  void start_control();
  void housekeeping(Clock::time_point now);
  // False once the control connection has seen the peer hang up or fail, even if the progress
  // thread has not handled it yet.
  bool control_alive() const;

  const core::PublicKey public_key;  // proven in the handshake
  const uint64_t engine_id;          // derived from it
  const uint64_t incarnation;
  const std::string address;
  const bool incoming;
  // The host an incoming peer connected from (its per-source admission caps); empty otherwise.
  const std::string source;
  std::shared_ptr<EngineImpl> engine;
  std::shared_ptr<transport::PeerLink> link;
  const Reach reach;      // how far the peer is, as the handshake showed
  ChannelSet channels;    // filled by the handshake before anyone else sees the peer
  engine::Routes routes;  // decided once the channels are set
  std::atomic<bool> lost{false};
  // Its routes were planned: it was connected, so losing it is worth a line in the log (a peer
  // refused during its handshake is logged once, by the listener).
  std::atomic<bool> established{false};
  std::atomic<std::size_t> queued_imms{0};  // its notifications waiting for next_imm()
  std::atomic<int> open_channels{0};

 private:
  friend class EngineImpl;
  struct Control;
  transport::OpState* start_op(transport::OpKind kind);
  // Completes an op that was never posted (validation failed, or nothing to do).
  Future finish_now(transport::OpState* op, const Status& status);
  // Validates a local range and leases its region to the op until completion.
  Status take_local(transport::OpState* op, const Region* local, uint64_t offset, uint64_t length,
                    uint8_t** addr, uint32_t* region_id = nullptr);
  // take_local without the reason: the data path's check. local_refusal() gives the reason.
  // `moves`: the memory kinds the op's channel reaches (a local region of another kind is
  // refused).
  bool lease_local(transport::OpState* op, const Region* local, uint64_t offset, uint64_t length,
                   uint8_t** addr, uint32_t* region_id,
                   transport::MemoryKinds moves = transport::kHostMemory);
  [[gnu::cold]] Status local_refusal(const Region* local, uint64_t offset, uint64_t length,
                                     transport::MemoryKinds moves = transport::kHostMemory) const;
  // Why the local region `id` refuses [offset, offset + length).
  [[gnu::cold]] Status region_refusal(uint32_t id, uint64_t key, uint64_t offset, uint64_t length,
                                      transport::MemoryKinds moves = transport::kHostMemory) const;
  // Why a one-sided batch entry cannot go; its message is built only then (refuse()).
  enum class Refusal : uint8_t {
    kNone,
    kNoRemote,
    kWrongPeer,
    kStale,
    kNotGranted,
    kOutOfBounds,
    kNoKey,
    kLocal
  };
  // A channel as admission and planning need it: its transport, its rails, the memory it moves
  // and how its operations are cut; read once, when the peer's channels are set (settle()).
  struct Via {
    TransportKind kind{};
    uint8_t rails = 1;
    transport::MemoryKinds memory{};
    uint64_t max_slice = 0;  // Channel::max_slice_bytes
    bool shapes_writes = false;
    int lanes = 1;
  };
  const Via& via(uint8_t channel) const { return vias_[channel]; }
  // The keys of every rail of `via` (keys[0 .. rails - 1], views into `d`); false when the
  // descriptor lacks one, or its memory is of a kind the channel cannot move.
  static bool keys_for(const Descriptor& d, const Via& via, std::span<const uint8_t>* keys);
  // keys_for() without the keys, and its keys to the op's last entry: the admission of keys
  // that do not fit an entry (several rails, over 8 bytes).
  [[gnu::cold]] static bool has_keys(const Descriptor& d, const Via& via);
  [[gnu::cold]] static void store_keys(transport::OpState* op, const Descriptor& d, const Via& via);
  // Gives entry `index`, the op's last, its keys on each of the op's rails: in its remote_key
  // when that holds them (one rail, at most 8 bytes), else in the op's key store.
  static void give_keys(transport::OpState* op, std::size_t index,
                        std::span<const std::span<const uint8_t>> keys);
  // Checks one entry and, if it may go, leases its local region and adds it to the op with the
  // remote keys of channel `via`.
  Refusal admit(transport::OpState* op, const Transfer& t, Access wanted, const Via& via);
  // An entry's descriptor has no key for the op's channel (or memory it cannot move): moves the
  // op, and the entries admitted so far, to the next channel of `order` that carries every one
  // of them. False when there is none.
  [[gnu::cold]] bool reroute(transport::OpState* op, std::span<const Transfer> batch,
                             std::size_t entry, std::span<const uint8_t> order);
  [[gnu::cold]] Future refuse(transport::OpState* op, std::size_t entry, const Transfer& t,
                              Refusal why, std::span<const uint8_t> order);
  Future post(transport::OpState* op);
  transport::OpState* start_one_sided(transport::OpKind kind, bool with_imm, uint32_t imm);
  // Admits every entry of `batch` into `op`, counting its slices and bytes; on a refusal, the
  // op completed with it. `may_stage`: a batch from CUDA memory that no channel moves, but
  // whose host copy one would, goes to the engine's Stager (stager.hpp).
  std::optional<Future> admit_batch(transport::OpState* op, std::span<const Transfer> batch,
                                    uint64_t& slices, uint64_t& total, bool may_stage = false);
  // Hands `batch` to the engine's Stager, its local regions leased until it ends.
  [[gnu::cold]] Future stage(transport::OpState* op, std::span<const Transfer> batch);
  // Lets the channel of an admitted write cut it finer (Channel::shape_write), at each post;
  // `slices` follows.
  void shape(transport::OpState* op, uint64_t total, uint64_t& slices) const;
  // Plans the lanes of an admitted op and posts it.
  Future plan_and_post(transport::OpState* op, uint64_t slices, uint64_t total);

  std::array<Via, ChannelSet::kMax> vias_{};  // per channel, from settle()
  std::shared_ptr<Control> control_;
  // Why the peer closed, first cause only: what its operations fail with, whichever channel
  // ends last. Set with `lost`, under close_mu_.
  std::mutex close_mu_;
  Status close_reason_;
  std::atomic<unsigned> next_lane_{0};
};

}  // namespace ferry::detail
