// The engine: region registry, peers and their connections, operation planning (slicing and
// striping), write_with_imm notifications, liveness and shutdown.
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

#include "core/net.hpp"
#include "core/reactor.hpp"
#include "engine/handshake.hpp"
#include "ferry/ferry.hpp"
#include "transport/contract.hpp"
#include "transport/tcp/tcp_channel.hpp"
#include "transport/tcp/tcp_transport.hpp"
#include "transport/verbs/verbs_channel.hpp"
#include "transport/verbs/verbs_device.hpp"

namespace ferry::detail {

class EngineImpl;
class PeerImpl;

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
  std::vector<transport::OpEntry> entries;
  std::vector<Local> locals;
  uint64_t slices = 0;
  uint64_t total = 0;
};

// What a Region handle owns.
struct RegionRecord {
  std::shared_ptr<EngineImpl> engine;
  uint32_t id = 0;
  uint64_t key = 0;
  uint8_t* base = nullptr;
  uint64_t length = 0;
  Access access = Access::kLocal;
  Descriptor descriptor;
  std::atomic<bool> registered{true};
};

class PeerImpl : public std::enable_shared_from_this<PeerImpl> {
 public:
  PeerImpl(std::shared_ptr<EngineImpl> engine, const engine::Hello& remote, std::string address,
           TransportKind transport, core::Fd control);

  Future one_sided(transport::OpKind kind, std::span<const Transfer> batch, bool with_imm,
                   uint32_t imm);
  // Checks a batch as one_sided() does (throws Error with its refusal) for posting many times.
  std::shared_ptr<const PreparedImpl> prepare(transport::OpKind kind,
                                              std::span<const Transfer> batch, bool with_imm,
                                              uint32_t imm);
  Future post_prepared(const PreparedImpl& p);
  Future send(uint64_t tag, const Region& local, uint64_t offset, uint64_t length);
  Future recv(uint64_t tag, const Region& local, uint64_t offset, uint64_t capacity);
  void close(const Status& reason);
  // A channel finished closing; when the last one did, every op still posted fails.
  void channel_closed(const Status& reason);
  // The channel one-sided operations use: verbs when chosen, else TCP.
  transport::Channel& data_channel() const;

  // Control connection (liveness); called by the engine's housekeeping.
  void start_control();
  void housekeeping(Clock::time_point now);

  const uint64_t engine_id;
  const uint64_t incarnation;
  const std::string address;
  const TransportKind transport;
  std::shared_ptr<EngineImpl> engine;
  std::shared_ptr<transport::PeerLink> link;
  std::shared_ptr<transport::tcp::TcpChannel> channel;    // control-adjacent streams, send/recv
  std::shared_ptr<transport::verbs::VerbsChannel> verbs;  // one-sided ops, when chosen
  std::atomic<bool> lost{false};
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
  bool lease_local(transport::OpState* op, const Region* local, uint64_t offset, uint64_t length,
                   uint8_t** addr, uint32_t* region_id);
  [[gnu::cold]] Status local_refusal(const Region* local, uint64_t offset, uint64_t length) const;
  // Why the local region `id` refuses [offset, offset + length).
  [[gnu::cold]] Status region_refusal(uint32_t id, uint64_t key, uint64_t offset,
                                      uint64_t length) const;
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
  // Checks one entry and, if it may go, leases its local region and adds it to the op.
  Refusal admit(transport::OpState* op, const Transfer& t, Access wanted, TransportKind via);
  [[gnu::cold]] Future refuse(transport::OpState* op, std::size_t entry, const Transfer& t,
                              Refusal why);
  Future post(transport::OpState* op);
  transport::OpState* start_one_sided(transport::OpKind kind, bool with_imm, uint32_t imm);
  // Admits every entry of `batch` into `op`, counting its slices and bytes; on a refusal, the
  // op completed with it.
  std::optional<Future> admit_batch(transport::OpState* op, std::span<const Transfer> batch,
                                    uint64_t& slices, uint64_t& total);
  // Plans the lanes of an admitted op and posts it.
  Future plan_and_post(transport::OpState* op, uint64_t slices, uint64_t total);

  std::shared_ptr<Control> control_;
  std::atomic<unsigned> next_lane_{0};
};

class EngineImpl final : public transport::Host, public std::enable_shared_from_this<EngineImpl> {
 public:
  explicit EngineImpl(const Config& config);
  ~EngineImpl();
  void start();  // after construction, once shared_from_this works

  // transport::Host
  transport::RegionTable& regions() override { return regions_; }
  core::Reactor& reactor() override { return *reactor_; }
  void deliver_imm(uint64_t peer_engine_id, uint32_t imm) override;

  Region register_memory(void* data, std::size_t length, Access access);
  void deregister(RegionRecord& record);
  Peer connect(std::string_view host_port);
  std::optional<Peer> accept(Duration timeout);
  std::optional<ImmEvent> next_imm(Duration timeout);
  void on_imm(std::function<void(const ImmEvent&)> fn);
  void shutdown();

  // The peer lost its connection (already closed); forget it.
  void peer_closed(PeerImpl* peer);
  std::shared_ptr<transport::tcp::TcpChannel> make_channel(const std::shared_ptr<PeerImpl>& peer,
                                                           int streams);
  // Creates the peer's verbs channel and connects it, exchanging addresses on `control`
  // (the client sends first).
  Status connect_verbs(const std::shared_ptr<PeerImpl>& peer, int control, bool client,
                       core::Deadline deadline);
  // Transports this engine can use now, in preference order.
  std::vector<TransportKind> usable_transports() const;

  const Config config;
  const uint64_t id;
  const uint64_t incarnation;
  const std::shared_ptr<transport::UnexpectedBudget> unexpected_budget =
      std::make_shared<transport::UnexpectedBudget>(config.max_unexpected_bytes_total,
                                                    config.max_unexpected_messages);
  uint16_t port = 0;
  std::vector<std::string> advertised;  // Engine::addresses(): empty when not listening

 private:
  void acceptor_loop();
  void serve_new_connection(core::Fd fd);
  Status serve_hello(core::Fd& fd, std::span<const uint8_t> body, core::Deadline deadline);
  Status serve_join(core::Fd& fd, std::span<const uint8_t> body, core::Deadline deadline);
  void housekeeping();

  transport::RegionTable regions_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;  // registration keys
  transport::verbs::VerbsDevice* verbs_ = nullptr;                 // owned by transports_
  std::string verbs_unusable_;                                     // why verbs_ is null
  std::unique_ptr<core::Reactor> reactor_;
  core::Fd listener_;
  core::Fd stop_event_;  // eventfd that wakes the acceptor
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};

  std::mutex mu_;  // peers, joining, accept queue
  std::condition_variable accept_cv_;
  std::vector<std::shared_ptr<PeerImpl>> peers_;
  struct Joining {
    std::shared_ptr<PeerImpl> peer;
    int joined = 0;
    int streams = 0;
    Clock::time_point deadline;
  };
  std::vector<std::pair<engine::Token, Joining>> joining_;
  std::deque<std::shared_ptr<PeerImpl>> accepted_;

  std::mutex imm_mu_;
  std::condition_variable imm_cv_;
  std::deque<ImmEvent> imms_;
  std::function<void(const ImmEvent&)> imm_callback_;
};

}  // namespace ferry::detail
