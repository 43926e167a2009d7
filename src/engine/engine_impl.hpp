// The engine: region registration, the transports it opened, admission of peers,
// write_with_imm notifications and shutdown. The handshake's client half is dialer.cpp's, its
// server half listener.cpp's; operation planning is peer_impl.cpp's; a peer's liveness,
// peer_control.cpp's.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/fork.hpp"
#include "core/net.hpp"
#include "core/periodic.hpp"
#include "core/reactor.hpp"
#include "core/shared_memory.hpp"
#include "engine/directory.hpp"
#include "engine/handshake.hpp"
#include "engine/listener.hpp"
#include "engine/peer_impl.hpp"
#include "engine/stager.hpp"
#include "ferry/ferry.hpp"
#include "transport/contract.hpp"

namespace ferry::detail {

class EngineImpl;
class PeerImpl;

// What a Region handle owns.
struct RegionRecord {
  std::shared_ptr<EngineImpl> engine;
  uint32_t id = 0;
  uint64_t key = 0;
  uint8_t* base = nullptr;
  uint64_t length = 0;
  Access access = Access::kLocal;
  Memory memory;
  Descriptor descriptor;
  std::atomic<bool> registered{true};
  // Engine::allocate's memory: freed with the record, after the region was deregistered,
  // unless Region::memory() handles keep it (detached from its file then).
  std::shared_ptr<core::SharedMemory> owned;
  // Engine::register_memory's keep_alive, or Engine::allocate's CUDA memory: goes with the
  // record, after deregistration.
  std::shared_ptr<void> keep_alive;
};

// The engine's settings (settings.cpp). `config` with the FERRY_TRANSPORTS environment variable
// applied (Engine::with_environment).
Config apply_environment(const Config& config);
// Throws kInvalidArgument, naming the setting, for a value out of its range.
void validate(const Config& config);
// Logs the settings that work but deserve a second look.
void warn_about(const Config& config);
// An identity key as Engine::public_key() and Config::trusted_keys write it.
std::string public_key_text(const core::PublicKey& key);

class EngineImpl final : public transport::Host,
                         public ListenerHost,
                         public std::enable_shared_from_this<EngineImpl> {
 public:
  explicit EngineImpl(const Config& config);
  ~EngineImpl();
  void start();  // after construction, once shared_from_this works

  // transport::Host
  transport::RegionTable& regions() override { return regions_; }
  core::Reactor& reactor() override { return *reactor_; }
  core::Teardown& teardown() override { return teardown_; }
  void deliver_imm(transport::PeerLink& link, uint32_t imm) override;

  Region register_memory(void* data, std::size_t length, Access access,
                         std::shared_ptr<void> keep_alive);
  Region allocate(std::size_t length, Access access, Memory memory);
  Region allocate_cuda(std::size_t length, Access access, int device);
  void deregister(RegionRecord& record);
  Peer connect(std::string_view host_port, const std::stop_token& stop);
  std::optional<Peer> accept(Duration timeout);
  // The directory (Config::etcd), made on first use: kUnsupported without one, kCancelled once
  // the engine shut down. `call` names the caller in those errors.
  Directory& directory(const char* call);
  // The directory if one was made, else null; it lives as long as the engine.
  Directory* made_directory();
  Peer connect_named(std::string_view name, const std::stop_token& stop);
  Watch watch(std::string_view name, std::function<void(const NamedEngine&)> fn);
  std::size_t next_imms(std::span<ImmEvent> out, Duration timeout);
  void on_imm(std::function<void(const ImmEvent&)> fn);
  void shutdown();
  // What shutdown() does after refusing new operations.
  void finish_shutdown();

  // The peer lost its connection (already closed); forget it.
  void peer_closed(PeerImpl* peer);
  // Transports this engine can use now, in preference order.
  std::vector<TransportKind> usable_transports() const override;
  // The channels a client `reach` away that offered `offered` gets: those of our usable
  // transports it offered that reach it, in our order.
  std::vector<TransportKind> channels_for(std::span<const TransportKind> offered,
                                          Reach reach) const override;
  // Why a configured transport could not be opened here ("" when it was).
  std::string unusable_reason(TransportKind kind) const;
  // Channel set-up, both sides (docs/protocol.md, "Handshake"). Creates one channel of the
  // peer per kind in `kinds`; an error refuses the peer.
  Status make_channels(const std::shared_ptr<PeerImpl>& peer, std::span<const TransportKind> kinds,
                       bool dialer);
  // Decides the peer's routes from its channels, once they are all set up (a channel may then
  // say it cannot carry operations) and before the peer is used.
  void plan_routes(PeerImpl& peer) const;
  // The CHANNEL_ADDRESSES frame of the peer's channels.
  static std::vector<uint8_t> channel_addresses(const PeerImpl& peer);
  // Connects each of the peer's channels to its address in `body` (CHANNEL_ADDRESSES).
  static Status connect_channels(const PeerImpl& peer, std::span<const uint8_t> body);
  // Operations from CUDA memory that only a host-memory channel can carry (stager.hpp).
  Stager& stager() { return stager_; }
  EngineStats stats() const;
  EngineMetrics metrics() const;

  // The most memory peers can make an engine of this configuration hold, in bytes, with a
  // channel on every configured transport (docs/architecture.md, "Limits", gives the formula).
  struct MemoryBound {
    std::size_t per_handshake;   // one connection still handshaking
    std::size_t per_peer_fixed;  // a peer's state and channel buffers, however it behaves
    std::size_t per_peer;        // plus its unmatched messages and queued notifications
    std::size_t engine;          // every handshake and peer the limits allow, together
  };
  static MemoryBound memory_bound(const Config& config);

  // The server's handshake steps and the liveness tick, driven by the Listener (ListenerHost
  // says what each does).
  const Config& settings() const override { return config; }
  engine::Identity identity() const override {
    return {identity_key.public_key(), incarnation, locality};
  }
  const core::SigningKey& signing_key() const override { return identity_key; }
  Status check_trusted(const core::PublicKey& key) const override;
  // Also: no other live peer that connected to us holds the engine id in the same incarnation
  // (a newer one replaces the older), and the max_peers cap.
  Status check_admission(const engine::Hello& hello, const std::string& source) override;
  Status create_peer(const engine::Hello& hello, const std::string& address,
                     const std::vector<TransportKind>& channels, core::Fd& control,
                     std::shared_ptr<PeerImpl>& out) override;
  Status connect_peer_channels(const PeerImpl& peer, std::span<const uint8_t> body) override {
    return connect_channels(peer, body);
  }
  std::vector<uint8_t> peer_channel_addresses(const PeerImpl& peer) override {
    return channel_addresses(peer);
  }
  void add_joining(const engine::Token& token, std::shared_ptr<PeerImpl> peer,
                   Clock::time_point deadline) override;
  std::shared_ptr<PeerImpl> find_joining(const engine::Token& token) override;
  void told_joined(const engine::Token& token, int delta) override;
  void attach_side(const std::shared_ptr<PeerImpl>& peer, const engine::Join& join,
                   core::Fd fd) override;
  void publish(const std::shared_ptr<PeerImpl>& peer) override;
  // Liveness, every kLivenessPeriod on a thread of its own: declares silent peers lost, pings
  // idle ones, drops peers whose side connections are late.
  void housekeeping();

  const Config config;
  // The engine's identity (Config::identity_file) and the id derived from it.
  const core::SigningKey identity_key;
  const uint64_t id;
  const uint64_t incarnation;
  // Config::trusted_keys, decoded: empty admits any key.
  const std::vector<core::PublicKey> trusted_keys;
  // The fork generation the engine was made in (core/fork.hpp): in a forked child it is inert,
  // and the handles refuse every call that would act (handles.cpp).
  const uint64_t born = core::fork_generation();
  const core::Locality locality = core::this_locality();
  const std::shared_ptr<transport::UnexpectedBudget> unexpected_budget =
      std::make_shared<transport::UnexpectedBudget>(config.max_unexpected_bytes_total,
                                                    config.max_unexpected_messages);
  uint16_t port = 0;
  std::vector<std::string> advertised;  // Engine::addresses(): empty when not listening

 private:
  // One attempt of connect(): throws what failed, naming the step.
  Peer dial(const core::HostPort& where, core::Deadline deadline, int stopped);
  // Refuses registration once shut down, and access flags it does not know.
  void check_registration(const char* call, Access access) const;
  // Registers `rec` (its base and length set) with the table and every transport.
  Region add_region(std::shared_ptr<RegionRecord> rec, Access access);
  // Takes the oldest queued notification (imm_mu_ held).
  ImmEvent pop_imm_locked();
  // Peers, and peers still joining or connecting (mu_ held).
  std::size_t peer_count_locked() const {
    return peers_.size() + joining_.size() + connecting_.size();
  }

  // Every peer whose channels may reach our regions now: published, joining and connecting
  // (a copy: the caller may block). The remote side may use a channel from its first attached
  // stream on, before the peer is published here.
  std::vector<std::shared_ptr<PeerImpl>> peers_with_channels() const;
  transport::Transport* transport_of(TransportKind kind) const;

  transport::RegionTable regions_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;  // usable, in config order
  std::vector<std::pair<TransportKind, std::string>> unusable_;    // configured, not opened: why
  std::unique_ptr<core::Reactor> reactor_;
  // Destroyed before the transports it may still be using (the destructor hands them to it).
  core::Teardown teardown_;
  std::unique_ptr<Listener> listener_;
  Stager stager_{*this};  // stopped by finish_shutdown(), once the peers are closed
  std::unique_ptr<core::Periodic> liveness_;  // runs housekeeping(); from start()
  std::mutex directory_mu_;
  // Made once by directory(), under directory_mu_, and kept until the engine goes: callers use
  // it without the lock.
  std::unique_ptr<Directory> directory_;
  // Readable once shutdown() began: it wakes every connect() under way (dialer.cpp).
  core::Fd connect_cancel_;
  std::atomic<bool> stopping_{false};
  // Where shutdown() stands once stopping_ is set: the peers closed, finish_shutdown() under
  // way (perhaps on a thread of its own, for a shutdown from a callback), or done. A shutdown()
  // outside a callback returns only once done, running the finish itself if nobody started it.
  enum class Finish { kNotStarted, kRunning, kDone };
  std::mutex finish_mu_;
  std::condition_variable finish_cv_;
  Finish finish_ = Finish::kNotStarted;  // under finish_mu_

  mutable std::mutex mu_;  // peers, joining, accept queue
  std::condition_variable accept_cv_;
  std::vector<std::shared_ptr<PeerImpl>> peers_;
  struct Joining {
    std::shared_ptr<PeerImpl> peer;
    int joined = 0;
    int expected = 0;  // side connections of its channels
    Clock::time_point deadline;
    int told = 0;  // JOIN_OKs queued: once all are, the client may use the peer and leave
  };
  std::vector<std::pair<engine::Token, Joining>> joining_;
  std::vector<std::shared_ptr<PeerImpl>> connecting_;  // in connect(), channels connected
  std::deque<std::shared_ptr<PeerImpl>> accepted_;
  uint64_t admitted_ = 0;  // peers that connected to us and joined all their streams (mu_)

  std::mutex imm_mu_;
  std::condition_variable imm_cv_;
  std::deque<ImmEvent> imms_;
  // !imms_.empty(), for next_imm's spin to look at without the lock.
  std::atomic<bool> imms_waiting_{false};
  // The pools of the first OpPool::kMaxSpinPools peers whose channels a caller can poll, for
  // next_imm's spin; replaced whenever peers_ changes (update_polled_locked, mu_ held). Its own
  // lock, held only to copy or swap the pointer (libstdc++'s atomic<shared_ptr> locks as well,
  // in a way ThreadSanitizer does not follow).
  struct PolledPools {
    std::vector<std::shared_ptr<transport::OpPool>> owners;
    std::vector<transport::OpPool*> pools;
  };
  std::mutex polled_mu_;
  std::shared_ptr<const PolledPools> polled_ = std::make_shared<PolledPools>();
  void update_polled_locked();
  std::function<void(const ImmEvent&)> imm_callback_;
};

}  // namespace ferry::detail
