// Ferry public API: engine, registered regions, descriptors, peers, batched operations, futures.
//
//   ferry::Engine target({.listen_port = 0});
//   auto region = target.register_memory(buf, len, ferry::Access::kRemoteWrite);
//   std::string blob = region.descriptor().to_string();   // give this to the initiator
//
//   ferry::Engine initiator({});
//   ferry::Peer peer = initiator.connect(target.address());
//   auto remote = ferry::Descriptor::parse(blob);
//   ferry::Transfer t{&local, 0, &remote, 0, len};
//   ferry::Status s = peer.write({&t, 1}).wait(std::chrono::seconds(5));
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/config.hpp"
#include "ferry/error.hpp"
#include "ferry/export.hpp"
#include "ferry/metrics.hpp"
#include "ferry/types.hpp"

namespace ferry {

namespace detail {
struct OpState;
struct RegionRecord;
class EngineImpl;
class PeerImpl;
struct PreparedImpl;
struct WatchState;
}  // namespace detail

// A serializable description of a registered region: what a peer needs to access it.
// The binary form is versioned; to_string() gives a printable form, parse() reads it back.
// It carries one key per transport and device: a transport that stripes over several devices
// (rails) opens the region with a key on each.
class FERRY_API Descriptor {
 public:
  // Keys held inside the descriptor: TCP plus verbs on three devices. Data-path lookups scan
  // only these; more go to `more_keys`.
  static constexpr int kMaxKeys = 4;
  static constexpr int kMaxAllKeys = 64;  // in all: the binary form refuses more
  struct Key {
    TransportKind transport{};
    uint8_t device = 0;  // which of the transport's devices (rails) it opens the region on
    uint8_t length = 0;
    uint8_t bytes[21] = {};
    std::span<const uint8_t> view() const noexcept { return {bytes, length}; }
  };
  // A key beyond the inline ones, or longer than Key::bytes holds.
  struct MoreKey {
    TransportKind transport{};
    uint8_t device = 0;
    std::vector<uint8_t> bytes;  // at most 255
  };

  uint64_t engine_id = 0;
  uint64_t incarnation = 0;
  uint32_t region_id = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  Access access = Access::kLocal;
  MemoryKind memory = MemoryKind::kHost;  // routing takes a channel that moves this kind
  uint8_t memory_device = 0;              // the CUDA device ordinal of CUDA memory
  uint8_t key_count = 0;
  Key keys[kMaxKeys] = {};
  std::vector<MoreKey> more_keys;  // empty unless more than kMaxKeys keys or a long one

  // The inline key of `transport` for `device`, or null.
  const Key* key_for(TransportKind transport, uint8_t device = 0) const noexcept;
  // That key wherever it is held; empty when there is none.
  std::span<const uint8_t> find_key(TransportKind transport, uint8_t device = 0) const noexcept;
  // Adds a key: inline while there is room and it fits, else to more_keys. Throws
  // Error(kInvalidArgument) for a second key of one transport and device, an empty key or one
  // over 255 bytes, or more than kMaxAllKeys.
  void add_key(TransportKind transport, uint8_t device, std::span<const uint8_t> key);

  std::vector<uint8_t> encode() const;
  std::string to_string() const;  // "ferry1:" + base64url of encode()
  // Throw Error(kInvalidArgument / kVersionMismatch) on malformed input.
  static Descriptor decode(std::span<const uint8_t> bytes);
  static Descriptor parse(std::string_view text);
};

// A registered memory region. Owns the registration: destroying it (or deregister())
// revokes remote access and waits until no in-flight operation touches the memory. Inside a
// completion or immediate callback that wait would stall the thread that ends those operations:
// there deregister() throws kInvalidArgument, and a Region destroyed there is deregistered on
// another thread once its operations end (the destructor returns at once).
class FERRY_API Region {
 public:
  Region() = default;
  Region(Region&&) noexcept;
  Region& operator=(Region&&) noexcept;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region();

  // For CUDA memory a device pointer, which host code must not dereference.
  void* data() const noexcept;
  std::size_t size() const noexcept;
  Access access() const noexcept;
  // Host memory or a CUDA device's, as the driver reported it for data().
  Memory location() const noexcept;
  bool valid() const noexcept { return record_ != nullptr; }
  Descriptor descriptor() const;
  void deregister();
  // Publishes the region's descriptor under `name` among its engine's names in the directory
  // (Config::etcd), for Peer::region_named; a name published again points at the newer region.
  // The entry goes with the region's deregistration and with the engine. Throws kUnsupported
  // without a directory, kInvalidArgument for a bad name (1-128 characters: letters, digits,
  // '.', '_', '-', ':'), and what reaching etcd failed with.
  void publish(std::string_view name) const;
  // Memory from Engine::allocate, kept mapped while the returned handle lives, even past
  // deregistration (for views of it, such as Python's arrays); null for register_memory's
  // regions and for CUDA memory. After deregistration it is this process's alone: the peers' access
  // is revoked, and a peer that never gave back its mapping no longer shares its pages.
  std::shared_ptr<void> memory() const;

 private:
  friend class detail::EngineImpl;
  friend class detail::PeerImpl;
  explicit Region(std::shared_ptr<detail::RegionRecord> record);
  // Deregisters, or inside a callback hands that to another thread.
  void release() noexcept;
  std::shared_ptr<detail::RegionRecord> record_;
};

// One entry of a one-sided batch: `length` bytes between local[local_offset] and
// remote[remote_offset]. Both pointers must stay valid until the call returns.
struct Transfer {
  const Region* local = nullptr;
  uint64_t local_offset = 0;
  const Descriptor* remote = nullptr;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// The completion of one operation. Copies share the operation; its state is never reused
// while any Future refers to it.
class FERRY_API Future {
 public:
  Future() = default;
  Future(const Future&);
  Future(Future&&) noexcept;
  Future& operator=(const Future&);
  Future& operator=(Future&&) noexcept;
  ~Future();

  // Waits up to `timeout`; returns kTimeout if still running (the operation goes on). Over
  // verbs it first polls the completion queue for Config::wait_spin on the calling thread.
  Status wait(Duration timeout) const;
  // True once completed, successfully or not. Over verbs it polls the completion queue once.
  bool test() const;
  // The final status, or kInProgress.
  Status status() const;
  // Bytes moved: for recv(), the length of the message received.
  uint64_t bytes() const;
  // Calls `fn` once with the final status: at once if already done, else from the thread that
  // handles the completion (a progress thread, or a caller polling in wait() / test()).
  // Several callbacks run in the order they were given.
  void then(std::function<void(const Status&)> fn) const;

 private:
  friend class detail::PeerImpl;
  friend class detail::EngineImpl;
  explicit Future(detail::OpState* op) : op_(op) {}  // takes one reference
  detail::OpState* op_ = nullptr;
};

// A one-sided batch checked once and posted any number of times: the same pages every step
// (weight sync, KV-cache blocks). Each post() re-checks only the local regions (one deregistered
// since fails that post: kRevoked, or kUnknownRegion once its slot was reused) and skips the rest
// of what write() and read() do per call (descriptor checks, key lookup, slicing plan). Posts may
// overlap; each has its own Future. The remote memory is the descriptors' of prepare time: the
// target's NIC or engine still refuses a revoked region.
class FERRY_API Prepared {
 public:
  Prepared() = default;
  Future post() const;
  bool valid() const noexcept { return impl_ != nullptr; }

 private:
  friend class Peer;
  explicit Prepared(std::shared_ptr<const detail::PreparedImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const detail::PreparedImpl> impl_;
};

// What one of a peer's channels (one per transport both sides chose) carried since the peer
// connected.
struct ChannelStats {
  TransportKind transport{};
  int lanes = 0;                   // parallel paths: TCP streams, verbs queue pairs
  uint64_t messages_sent = 0;      // tagged messages acknowledged by the receiver as taken
  uint64_t messages_received = 0;  // taken by a receive or buffered
  // Of those received, the ones the sender wrote straight into the receive buffer (verbs: a
  // large message into a region that grants remote write); the others were copied.
  uint64_t messages_zero_copy = 0;
  // Of those received, the ones that came without a header (verbs: an eager message whose tag
  // fits 32 bits, its tag in the immediate).
  uint64_t messages_compact = 0;
};

struct PeerStats {
  std::vector<ChannelStats> channels;  // in the peer's channel order
  std::vector<PathStats> paths;        // the classes that saw transfers, writes first
  // Unmatched incoming messages held for this peer now (buffered, or arriving with no receive
  // posted), and the bytes they count against Config::max_unexpected_bytes.
  uint64_t unexpected_messages = 0;
  uint64_t unexpected_bytes = 0;
  // The channel of that transport; null when the peer has none.
  const ChannelStats* channel(TransportKind transport) const noexcept {
    for (const ChannelStats& c : channels) {
      if (c.transport == transport) return &c;
    }
    return nullptr;
  }
};

// How a peer's operations of one class travel between memory of two kinds, and why
// (Peer::routes, Engine::routes).
struct RouteInfo {
  std::string operations;                  // "write/read", "write_with_imm" or "send/recv"
  MemoryKind local = MemoryKind::kHost;    // this engine's memory
  MemoryKind remote = MemoryKind::kHost;   // the peer's
  std::optional<TransportKind> transport;  // none: no channel of the peer carries them
  // Each configured transport and its verdict: "verbs: chosen (rank 1); tcp: fallback ...".
  std::string why;
};

// A connected peer. Either side may start operations; one connection carries both directions.
class FERRY_API Peer {
 public:
  Peer() = default;

  Future write(std::span<const Transfer> batch) const;
  Future read(std::span<const Transfer> batch) const;
  // Like write(); the target's engine then queues `imm` (see Engine::next_imm) once every
  // byte of the batch is visible in its memory.
  Future write_with_imm(std::span<const Transfer> batch, uint32_t imm) const;
  // The same operations, prepared to be posted many times (Prepared). Throw Error with the
  // reason write() / read() would fail with.
  Prepared prepare_write(std::span<const Transfer> batch) const;
  Prepared prepare_read(std::span<const Transfer> batch) const;
  Prepared prepare_write_with_imm(std::span<const Transfer> batch, uint32_t imm) const;
  // The descriptor of the peer's region that it published under `name` (Region::publish), in
  // the incarnation this connection reached: kNotFound when it has none by that name (an
  // earlier incarnation's are never returned).
  Descriptor region_named(std::string_view name) const;
  // Tagged two-sided messages, matched by (peer, tag) in order.
  Future send(uint64_t tag, const Region& local, uint64_t offset, uint64_t length) const;
  Future recv(uint64_t tag, const Region& local, uint64_t offset, uint64_t capacity) const;

  uint64_t engine_id() const;
  uint64_t incarnation() const;
  // The peer engine's identity key (base64url), which it proved in the handshake: what a
  // Config::trusted_keys list names.
  std::string public_key() const;
  std::string address() const;
  // The transport that carries write / read between host memory (routes() has the rest).
  // Throws kInvalidArgument on an empty handle, as the operations do.
  TransportKind transport() const;
  // Which channel each class of operation uses, decided when the peer connected.
  std::vector<RouteInfo> routes() const;
  // How far the peer is (same process, same host, other host), as the handshake showed.
  Reach reach() const;
  PeerStats stats() const;
  // Its operations' counts per transport (ferry/metrics.hpp); empty unless Config::metrics.
  PeerMetrics metrics() const;
  bool connected() const;
  // Fails in-flight operations with kCancelled and closes the connection.
  void close() const;
  bool valid() const noexcept { return impl_ != nullptr; }

 private:
  friend class detail::EngineImpl;
  explicit Peer(std::shared_ptr<detail::PeerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::PeerImpl> impl_;
};

struct ImmEvent {
  uint64_t peer_engine_id = 0;
  uint32_t imm = 0;
  // The connection the notification arrived on; the engine id is the one that peer proved (its
  // identity key signed the handshake).
  Peer peer{};
};

// What an engine holds now and what it refused (Engine::stats()).
struct EngineStats {
  std::size_t peers = 0;        // connected, plus ones whose streams are joining or connecting
  uint64_t peers_admitted = 0;  // peers that connected to us since the engine started
  std::size_t pending_handshakes = 0;  // connections not yet admitted or joined
  uint64_t refused_connections = 0;    // handshakes refused, evicted, timed out or failed
  uint64_t accept_failures = 0;        // accept() out of descriptors or memory (then backs off)
};

// An engine as the directory knows it by name (Engine::resolve, Engine::watch).
struct NamedEngine {
  std::string name;
  uint64_t engine_id = 0;  // 0: no engine holds the name
  uint64_t incarnation = 0;
  std::vector<std::string> addresses;  // where it listens, the best first (Engine::addresses)
  std::string public_key;              // its identity key (Engine::public_key)
  bool present() const noexcept { return engine_id != 0; }
};

// A watch of a name in the directory (Engine::watch): destroying it or stop() ends it, waiting
// for a callback under way unless called from that callback.
class FERRY_API Watch {
 public:
  Watch() = default;
  Watch(Watch&&) noexcept;
  Watch& operator=(Watch&&) noexcept;
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
  ~Watch();
  void stop();
  bool valid() const noexcept { return state_ != nullptr; }

 private:
  friend class detail::EngineImpl;
  explicit Watch(std::shared_ptr<detail::WatchState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::WatchState> state_;
};

class FERRY_API Engine {
 public:
  explicit Engine(const Config& config = {});
  ~Engine();  // shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // "host:port" that peers can connect to: the listen host, or for a wildcard listen host
  // ("0.0.0.0", "::") the first address of an interface that is up, one other hosts can
  // reach when there is one. Empty when the engine does not listen.
  std::string address() const;
  // Every "host:port" peers can connect to, the best first (other hosts' reach first, this
  // host's loopback last).
  std::vector<std::string> addresses() const;
  uint16_t port() const;
  // Derived from the identity key (Config::identity_file): stable across restarts with one file.
  uint64_t id() const;
  uint64_t incarnation() const;
  // The identity key's public half (base64url, 43 characters), for peers' trusted_keys.
  std::string public_key() const;
  const Config& config() const;

  // `keep_alive` (optional) is held until the registration has ended: dropped after the region's
  // deregistration, on the thread that ended it (which, for a Region dropped in a callback, is
  // not the caller's). What owns the memory can hang on it (Python's buffer exports do).
  // `data` may be a CUDA device pointer: the driver (libcuda.so.1, loaded at the first
  // registration where it is installed) says which device holds it, and [data, data + length)
  // must lie within one of its allocations.
  Region register_memory(void* data, std::size_t length, Access access,
                         std::shared_ptr<void> keep_alive = nullptr);
  // A registered region of `length` bytes whose memory the engine allocates and frees once the
  // region is deregistered (or, where Region::memory() handles keep it, once they go): zeroed,
  // page-aligned, and from 2 MiB up in huge pages where the host has them. It is an anonymous
  // memory file mapped shared, which a same-host transport can hand to a peer to map. Errors name
  // the failed call (kResourceExhausted when memory runs out, kInvalidArgument for zero length).
  // Memory::cuda(device) allocates on that GPU instead (cuMemAlloc, zeroed; kUnsupported without
  // a CUDA driver, saying why).
  Region allocate(std::size_t length, Access access, Memory memory = Memory::host());

  // Connects to the engine at "host:port", within Config::connect_timeout. A stop requested on
  // `stop` meanwhile (another thread, a signal's handler thread) ends it with kCancelled, as
  // shutdown() does.
  Peer connect(std::string_view host_port, const std::stop_token& stop = {});
  // The next peer that connected to us, if one arrives within `timeout`. A peer that closed
  // before it was accepted is not returned (it left with everything it held); to wait for a
  // peer to come and go, watch stats().peers_admitted and stats().peers.
  std::optional<Peer> accept(Duration timeout);

  // Discovery through etcd (Config::etcd, docs/discovery.md). Each throws kUnsupported without
  // a directory, kInvalidArgument for a bad name (1-128 characters: letters, digits, '.', '_',
  // '-', ':'), and what reaching etcd failed with (kConnectFailed, kTimeout) naming it.
  // Publishes this engine under `name`: its id, incarnation, addresses and public key, under a
  // lease that keeps the entry while the engine lives (Config::etcd_ttl). A name another engine
  // holds is refused with kAlreadyExists; one an earlier incarnation of this engine's identity
  // (Config::identity_file) held passes to this one.
  void publish(std::string_view name);
  // Removes this engine's entry under `name`, if it holds it.
  void unpublish(std::string_view name);
  // The engine published under `name`; kNotFound when none is.
  NamedEngine resolve(std::string_view name);
  // connect() to the engine published under `name`, trying its addresses in turn. The engine
  // reached must prove the published id (kWrongPeer otherwise) and be the published incarnation
  // or a newer one the directory now holds (kStaleIncarnation otherwise).
  Peer connect_named(std::string_view name, const std::stop_token& stop = {});
  // Calls `fn` on a thread of the watch's own with the name's entry now (present() false when
  // none) and then with each change of what it says: a new incarnation or engine published
  // under it, new addresses, or the entry gone (unpublished, shut down, or its lease expired).
  // While etcd cannot be reached it retries every second, and on reaching it again reports the
  // entry if it changed meanwhile. An exception `fn` throws is logged and the watch goes on.
  Watch watch(std::string_view name, std::function<void(const NamedEngine&)> fn);

  // The next write_with_imm notification, if one arrives within `timeout`. It spins for up to
  // Config::wait_spin first, as Future::wait does, then sleeps. While it spins it polls the
  // same-host and RDMA channels of up to 16 peers itself, so their notifications reach it
  // without waking a progress thread.
  std::optional<ImmEvent> next_imm(Duration timeout);
  // Like next_imm, then every notification already queued up to out.size(), in one turn of the
  // lock the progress threads also take to queue them; how many were written to `out` (0: none
  // within `timeout`, an empty `out`, or the engine shut down).
  std::size_t next_imms(std::span<ImmEvent> out, Duration timeout);
  // Delivers notifications to `fn` instead of the queue, on the thread that takes them from
  // the channel: a progress thread, or a caller polling it (Future::wait, next_imm).
  void on_imm(std::function<void(const ImmEvent&)> fn);

  // Cancels in-flight operations, closes peers, joins threads. Idempotent. From a completion or
  // immediate callback it refuses new operations and returns at once; the rest (which joins the
  // thread running the callback) finishes on a thread of its own.
  void shutdown();

  EngineStats stats() const;
  // Every connected peer's metrics (Peer::metrics) and the admission counts; .prometheus()
  // gives the Prometheus text format. Takes the engine's peer list lock, never the data path's.
  EngineMetrics metrics() const;

  // Transports compiled in and whether they are usable on this host.
  static std::vector<TransportInfo> transports();
  // The CUDA driver and the GPUs it sees (the driver is loaded on first use; none is needed).
  static CudaInfo gpus();
  // `config` as an engine built from it uses it: the FERRY_TRANSPORTS environment variable, when
  // set and Config::transports_from_environment allows it, replaces Config::transports with the
  // transports it names, comma-separated, best first ("shm,tcp"), so that an operator can order
  // or restrict them without a rebuild. An empty list, an empty or unknown name is an error
  // (kInvalidArgument) that names the variable.
  // Then, unless Config::settings_from_environment is off, each FERRY_<TRANSPORT>_<NAME>
  // variable that is set (FERRY_TCP_STREAMS=4) overrides the transport setting it names, and
  // FERRY_ETCD and FERRY_ETCD_PREFIX, when set, Config::etcd and Config::etcd_prefix.
  static Config with_environment(const Config& config);
  static constexpr const char* kTransportsVariable = "FERRY_TRANSPORTS";
  static constexpr const char* kEtcdVariable = "FERRY_ETCD";
  static constexpr const char* kEtcdPrefixVariable = "FERRY_ETCD_PREFIX";
  // Every transport setting, with its value in `config` (after with_environment), default,
  // range, environment variable and help.
  static std::vector<SettingInfo> settings(const Config& config = Config{});
  // Sets the transport setting `name` ("tcp.streams", "shm.stream_poll") from text ("4",
  // "20us", "1M", "true"), checked against its declared type and range. Throws
  // Error(kInvalidArgument) naming the setting, leaving `config` unchanged.
  static void set(Config& config, std::string_view name, std::string_view value);
  // The routes an engine configured by `config` would take to a peer `reach` away that offers
  // the same transports, with this host's transports as they are now (ferry info).
  static std::vector<RouteInfo> routes(const Config& config, Reach reach);
  static std::string_view version();

 private:
  std::shared_ptr<detail::EngineImpl> impl_;
};

}  // namespace ferry
