// Accepts peers' connections and drives every server-side handshake (hello, authentication,
// channel addresses, side-connection joins) as a non-blocking state machine on one thread, which
// also runs the engine's liveness timer. No connection can hold up another, the timer or shutdown:
// each handshake has its own deadline, reads only the bytes of the frame it expects, and the
// caps below bound how many can be pending (docs/architecture.md, "Limits").
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/frame.hpp"
#include "core/log.hpp"
#include "core/net.hpp"
#include "engine/handshake.hpp"
#include "engine/handshake_io.hpp"
#include "ferry/ferry.hpp"

namespace ferry::detail {

class PeerImpl;

// What the listener asks of its engine: the server's steps of the handshake and the liveness
// tick. EngineImpl implements it; the listener sees nothing else of the engine, so the two do
// not depend on each other (listener.cpp never includes engine_impl.hpp).
class ListenerHost {
 public:
  virtual const Config& settings() const = 0;
  virtual engine::Identity identity() const = 0;
  virtual const core::SigningKey& signing_key() const = 0;
  // Whether Config::trusted_keys admits an engine with identity key `key` (kAuthFailed if not).
  virtual Status check_trusted(const core::PublicKey& key) const = 0;
  // Transports this engine can use now, in preference order.
  virtual std::vector<TransportKind> usable_transports() const = 0;
  // The channels a client `reach` away that offered `offered` gets.
  virtual std::vector<TransportKind> channels_for(std::span<const TransportKind> offered,
                                                  Reach reach) const = 0;
  // Whether a peer that proved `hello`'s identity, connecting from `source`, may join: a newer
  // incarnation of a connected engine replaces it.
  virtual Status check_admission(const engine::Hello& hello, const std::string& source) = 0;
  // Admits the client and creates its peer and channels; `control` moves into the peer.
  virtual Status create_peer(const engine::Hello& hello, const std::string& address,
                             const std::vector<TransportKind>& channels, core::Fd& control,
                             std::shared_ptr<PeerImpl>& out) = 0;
  // Connects the peer's channels to the client's addresses (CHANNEL_ADDRESSES `body`), and the
  // frame of ours to answer with.
  virtual Status connect_peer_channels(const PeerImpl& peer, std::span<const uint8_t> body) = 0;
  virtual std::vector<uint8_t> peer_channel_addresses(const PeerImpl& peer) = 0;
  // The peer waits for its channels' side connections until `deadline`.
  virtual void add_joining(const engine::Token& token, std::shared_ptr<PeerImpl> peer,
                           Clock::time_point deadline) = 0;
  virtual std::shared_ptr<PeerImpl> find_joining(const engine::Token& token) = 0;
  // The client is told one more of its side connections joined (`delta` 1), or not after all.
  virtual void told_joined(const engine::Token& token, int delta) = 0;
  // A side connection joined; the peer is published once all of them did.
  virtual void attach_side(const std::shared_ptr<PeerImpl>& peer, const engine::Join& join,
                           core::Fd fd) = 0;
  // A peer that connected to us is ready: accept() returns it.
  virtual void publish(const std::shared_ptr<PeerImpl>& peer) = 0;

 protected:
  ~ListenerHost() = default;
};

class Listener {
 public:
  // `socket` is the listening socket, or invalid when the engine does not listen (then no
  // thread runs).
  Listener(ListenerHost& engine, core::Fd socket);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  void start();
  // Wakes the thread, fails every pending handshake with kCancelled and joins. Idempotent.
  void stop();

  // The most memory one pending handshake holds (docs/architecture.md, "Limits").
  static std::size_t worst_case_handshake_bytes();

  std::size_t pending() const { return pending_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  uint64_t accept_failures() const { return accept_failures_.load(std::memory_order_relaxed); }

 private:
  struct Handshake;
  void run();
  void accept_burst(Clock::time_point now);
  void admit(core::Fd fd, Clock::time_point now);
  void on_ready(Handshake& h, uint32_t events);
  // Reads what the current frame still lacks; a complete frame is handled by step().
  Status read_frame(Handshake& h, bool& progressed);
  Status step(Handshake& h, const core::FrameHeader& header, std::span<const uint8_t> body);
  Status on_hello(Handshake& h, std::span<const uint8_t> body);
  Status on_auth(Handshake& h, std::span<const uint8_t> body);
  Status on_addresses(Handshake& h, std::span<const uint8_t> body);
  Status on_join(Handshake& h, std::span<const uint8_t> body);
  // The client is who it says: create its peer and channels, then exchange their addresses.
  Status admit_peer(Handshake& h);
  // Queues bytes and sends what the socket takes now.
  Status queue(Handshake& h, const std::vector<uint8_t>& frame);
  Status flush(Handshake& h);
  // Watches the socket for room while bytes wait to be sent, and stops once they are out.
  Status watch_sending(Handshake& h);
  // The last reply is queued: once it is out the connection leaves.
  Status finish_replies(Handshake& h);
  // The last reply is out: the connection leaves the listener (to its peer, or as a stream).
  void hand_over(Handshake& h);
  void fail(Handshake& h, const Status& why);
  void forget(Handshake& h);
  void watch(Handshake& h);
  void expire(Clock::time_point now);
  // Makes room for one more handshake: evicts the oldest one of the source holding the most.
  void evict_one();

  ListenerHost& engine_;
  core::Fd socket_;
  core::Fd epoll_;
  core::Fd wake_;  // eventfd: stop()
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  // Listener thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Handshake>> handshakes_;
  std::unordered_map<std::string, int> per_source_;
  uint64_t next_id_ = 2;  // 0 and 1 name the wake-up eventfd and the listening socket
  Clock::time_point accept_resumes_{};
  Duration accept_backoff_{};

  // A flood of refused connections logs a burst and then one line a second, each saying how
  // many were not logged: enough to see who and why without filling a disk.
  static constexpr uint32_t kLogBurst = 10;
  static constexpr auto kLogPeriod = std::chrono::seconds(1);
  core::LogLimiter refusals_log_{kLogBurst, kLogPeriod};
  core::LogLimiter limits_log_{kLogBurst, kLogPeriod};

  std::atomic<std::size_t> pending_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> accept_failures_{0};
};

}  // namespace ferry::detail
