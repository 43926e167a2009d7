// Engine settings (Config): a vocabulary header, so that transports read their own settings
// from it without depending on the rest of the public API.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/types.hpp"

namespace ferry {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::nanoseconds;

// The same-host transport for peers on this host, verbs where a device is usable, then TCP.
inline std::vector<TransportKind> default_transports() {
  std::vector<TransportKind> t;
  t.push_back(TransportKind::kShm);
  t.push_back(TransportKind::kCudaIpc);
  t.push_back(TransportKind::kVerbs);
  t.push_back(TransportKind::kTcp);
  return t;
}

// The most lanes (TCP streams, verbs queue pairs) one channel may stripe an operation over.
// Operations over at most 16 keep their lane state inside the pooled operation; wider ones
// add 2 KiB to it once, the first time.
constexpr int kMaxLanes = 64;

// TCP's settings (Config::tcp); docs/performance.md has the measurements behind each default.
struct TcpConfig {
  // Sockets per peer (1..kMaxLanes): 2 beat 1 at 64 MiB on loopback; 4 gained nothing more
  // (docs/performance.md, "Settings and the measurements behind them").
  int streams = 2;
  // Unacknowledged slices per socket: bounds the target's response queue.
  int slices_in_flight_per_stream = 64;
  // A send() above this is announced first and its bytes sent once the receiver's receive
  // takes it, straight into that receive: the receiver buffers no message larger than this.
  // Smaller ones go at once (buffered if no receive waits). The announcement costs a round
  // trip: on loopback, announced messages moved clearly less than eager ones at 256 KiB and
  // 1 MiB, about as much at 4 MiB (docs/performance.md, "Settings and the measurements behind
  // them").
  std::size_t eager_bytes = 1 << 20;
  // After serving small requests (the wake-up received at most 16 KiB), the progress thread
  // keeps polling its sockets this long for the next before it sleeps in epoll: one small
  // operation after another then finds the target awake. On a 2-core VM an 8-byte write one at
  // a time took 28 us p50 with 0 and 14-15 us with 20 us; 64 KiB and 1 MiB did not change
  // (docs/performance.md, "Small operations and wake-ups"). Larger requests never start it:
  // polling after them took CPU from the threads moving their bytes. The cost: after its last
  // small request a target polls at most this long, and it stops polling by itself while
  // requests come further apart (core::RequestPolling). 0 turns it off; at most 1 s.
  Duration request_poll = std::chrono::microseconds(20);
};

// The verbs transport's settings (Config::verbs).
struct VerbsConfig {
  // Device name (empty: the first with an active port; an unknown name is an error).
  std::string device{};
  // GID index (-1: the routable RoCE v2 GID).
  int gid_index = -1;
  // RC queue pairs per peer (1..kMaxLanes).
  int qps = 2;
  // A large message may be written by the sender straight into a posted receive whose region
  // grants remote write (no copy). Off by default: the sending peer then learns that region's
  // key and could write anywhere in it until it is deregistered, as a peer given its
  // descriptor could. Otherwise such messages are sent in pieces and copied.
  bool zero_copy_receives = false;
};

// The same-host transport's settings (Config::shm).
struct ShmConfig {
  // Copy between two processes of this host with cross-memory attach (process_vm_readv), one
  // copy from the source's memory to the destination's. Where it works the two processes
  // could already read each other's memory (the kernel's ptrace check), so Ferry's region
  // checks guard against mistakes and stale descriptors, not against a hostile process of the
  // same user. Off (or refused by the kernel, seccomp or ptrace_scope for a pair): regions from
  // Engine::allocate are still mapped, other writes and reads travel through the shared-memory
  // rings in pieces of 32 KiB (two copies), and messages take the next transport.
  bool cross_memory = true;
  // Threads besides the progress thread that split one large copy (from 1 MiB) into parts
  // copied at once. Measured on a 2-core VM at 64 MiB: two process_vm_readv streams moved well
  // more than one, three or four no more than two (docs/performance.md, "Settings and the
  // measurements behind them"); 0 - 16.
  int copy_threads = 1;
  // Writes of 256 KiB up to this many bytes in all, and messages of that size up to 2 MiB,
  // may travel through the shared-memory rings in 32 KiB pieces (in cache, both sides at once;
  // which of them do: measure_paths) instead of one process_vm_readv, which moved them slower on
  // a 2-core VM (docs/performance-history.md, "Real bytes on both sides, and mid-size writes
  // through the rings"). Below 256 KiB (0 included) none do: then only slices of 32 KiB or less
  // ride in the rings. The initiating (sending) engine's setting counts. Where caches or the
  // kernel's page walks differ, `ferry bench --transport shm --shm.ring_copies_up_to` finds the
  // crossover. 2 -> 16 MiB, with stream_poll below, moved 16 MiB writes faster, 8 in flight from
  // one area and one at a time, and 8 MiB ones too (docs/performance-history.md, "Streams through
  // the rings"). Messages stay at 2 MiB: one that finds no receive posted would be buffered
  // whole.
  uint64_t ring_copies_up_to = 16 << 20;
  // Writes of that window, and messages of its part up to 2 MiB, take, each, the way that
  // moved writes (or messages) of their size faster lately: through the rings, or pulled by the
  // target with process_vm_readv (a run of 8 in 256 tries the other way). Which is faster
  // depends on the host's caches and page walks: 1 MiB writes, 8 in flight, moved well ahead
  // through the rings on one 2-core VM and behind pulls on another (docs/performance.md, "Each
  // transfer the faster way"). false: all of them go through the rings.
  bool measure_paths = true;
  // While a transfer streams through the rings (a piece of 16 KiB or more just taken), the
  // progress thread keeps polling them this long for the next piece before it sleeps. Without
  // it the two sides took turns, each waking the other: through the rings, 8 in flight from one
  // area, 16 MiB messages moved far more with 20 us than without, and writes somewhat more
  // (docs/performance-history.md, "Streams through the rings"). Small records never start it. 0
  // turns it off; at most 1 s.
  Duration stream_poll = std::chrono::microseconds(20);
  // After a request (a write, read or message to serve), the progress thread keeps polling the
  // rings this long for the next before it sleeps: one operation after another, each request
  // then finds the target awake instead of waking it through its bell (an eventfd and an
  // epoll wake-up, most of a small operation's latency). On a 2-core VM an 8-byte write, one at
  // a time, took 11.3 us p50 with 0 and 0.6 us with 20 us (docs/performance.md, "Small
  // operations and wake-ups"); idle, nothing polls. The cost: after its last request a target polls
  // at most this long, and it stops polling by itself while requests come further apart
  // (core::RequestPolling). 0 turns it off; at most 1 s.
  Duration request_poll = std::chrono::microseconds(20);
};

struct Config {
  // Accept connecting peers. An engine that only initiates can set false: it opens no port
  // (address() is then empty), and each peer it connects to still uses its connection both
  // ways (either side may start operations).
  bool listen = true;
  // Address and port to accept peers on; port 0 picks a free one (see Engine::address()).
  // The default accepts peers on this host only; "0.0.0.0" (or "::") accepts them on every
  // interface. An open listener grants nothing by itself: every access needs a region's
  // descriptor (its key), and with `secret` set only peers that prove it get past the handshake.
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  // Transports this engine may use, best first. A peer gets a channel on each one that both
  // sides can use and that reaches it (a same-host transport only a peer on this host); this
  // engine's operations go over the best of those that can carry them (Peer::routes says which
  // and why). Those that cannot be used on this host are skipped (an explicitly named device
  // that fails is an error); at least one must remain.
  std::vector<TransportKind> transports = default_transports();
  // Whether the FERRY_TRANSPORTS environment variable, when set, replaces `transports` (see
  // Engine::with_environment). A tool that takes a transport on its command line turns this off
  // where the user named one.
  bool transports_from_environment = true;
  // Each transport's own settings (it reads them when it opens and makes channels).
  TcpConfig tcp{};
  VerbsConfig verbs{};
  ShmConfig shm{};
  // Transport settings kept by name, {"fabric.provider", "efa"}: those a transport declares
  // without a field above. Engine::set writes any setting by name (and checks it);
  // Engine::settings lists them all, with their ranges and help.
  std::vector<std::pair<std::string, std::string>> transport_settings{};
  // Whether FERRY_<TRANSPORT>_<NAME> environment variables (FERRY_TCP_STREAMS=4) override the
  // settings they name, and FERRY_ETCD / FERRY_ETCD_PREFIX etcd and etcd_prefix (see
  // Engine::with_environment).
  bool settings_from_environment = true;
  // Threads that drive sockets and completions.
  int progress_threads = 1;
  // When set, peers must prove knowledge of it (HMAC-SHA256 challenge in both directions).
  std::string secret{};
  // The engine's identity: an Ed25519 private key (PEM, PKCS#8), created there, readable by its
  // owner only, when the file does not exist. The engine id is derived from its public key, and
  // every handshake proves the key (a signature), so no peer, even one that knows `secret`, can
  // take another engine's id. Empty: a new key per Engine, so a new id. The incarnation is
  // always new per Engine; a newer incarnation of a connected id replaces the older.
  std::string identity_file{};
  // When not empty, only engines whose public key (Engine::public_key, base64url) is listed here
  // are admitted, and connect() refuses a listener whose key is not: pinning, on top of or
  // instead of `secret`.
  std::vector<std::string> trusted_keys{};

  // Discovery through etcd (docs/discovery.md). Its client URLs, "http://host:2379" (several
  // comma-separated, tried in turn): where Engine::publish, Region::publish, Engine::resolve,
  // Engine::connect_named, Engine::watch and Peer::region_named keep and find names. Empty: they
  // fail with kUnsupported, and nothing else needs it (direct addresses are the default). The
  // FERRY_ETCD environment variable sets it, FERRY_ETCD_PREFIX the prefix (with_environment).
  std::string etcd{};
  // Every key this engine writes or reads in etcd starts with it: clusters sharing one etcd
  // keep apart by their prefixes.
  std::string etcd_prefix = "ferry/";
  // The lease of everything the engine publishes, renewed every third of it: an engine that dies
  // without shutdown() leaves the directory within this (shutdown() removes its entries at
  // once). Whole seconds, 2 s to 1 h.
  Duration etcd_ttl = std::chrono::seconds(10);
  // Each request to an etcd endpoint (a lookup, a step of a publication, a renewal) gives up
  // after this, and the next endpoint is tried.
  Duration etcd_timeout = std::chrono::seconds(3);

  // Speed settings; docs/performance.md has the measurements behind each default.
  // Large transfers are cut into slices of this size: 1-4 MiB moved as much, 256 KiB less
  // (docs/performance.md, "Settings and the measurements behind them").
  std::size_t slice_bytes = 1 << 20;
  // Operations above this are spread over all lanes (sockets, queue pairs); smaller ones stay
  // on one, in turn.
  std::size_t stripe_threshold = 1 << 20;
  // One-sided operations between CUDA memory here and host memory at a peer, over a transport
  // that moves host memory only (TCP, shm, verbs without GPUDirect), bounce through pinned host
  // buffers: staging_chunks chunks of staging_chunk_bytes, allocated on the first such
  // operation and kept until shutdown. While one chunk is copied the others are on the wire.
  // Not yet measured on a GPU: 4 MiB follows slice_bytes (1-4 MiB moved as much), and 4 chunks
  // keep 3 in flight while one is copied (docs/gpu.md, "Staging").
  std::size_t staging_chunk_bytes = 4 << 20;
  int staging_chunks = 4;
  // Progress threads spin this long after work before sleeping (over verbs: keep polling the
  // completion queue; over shm: the rings, so a record needs no wake-up). 0 on few-core hosts:
  // on 2 cores 50 us made the 8-byte TCP write latency several times worse (spinning threads
  // starve the ones with work). Over shm on 2 cores, 20 us cut the p50 of 8-byte write, read and
  // write_with_imm several-fold, but slowed a ping-pong of registered memory, where both
  // applications spin too (docs/performance.md, "Settings and the measurements behind them").
  Duration busy_poll = std::chrono::microseconds(0);
  // Future::wait and Engine::next_imm spin this long before sleeping (polling the peers'
  // completion queues over verbs, their rings over shm), saving a thread wake-up on small
  // operations: on TCP loopback 50 us lowered the 8-byte write p50 that 0-20 us left, and
  // 200 us only raised p99 (docs/performance.md, "Settings and the measurements behind them").
  Duration wait_spin = std::chrono::microseconds(50);

  // Count every operation per peer and transport (Engine::metrics): a few stores to counters
  // the thread owns and two readings of the CPU's cycle counter per operation, about 10 KiB per
  // channel. 8-byte write p50 on TCP: the same on or off. Over shm on a 2-core VM runs fell into
  // a slower mode more often with it on (docs/performance.md, "Metrics on and off"): turn it off
  // where same-host latency is all that counts.
  bool metrics = true;

  // A peer silent for this long is declared lost and its operations fail with kPeerLost.
  Duration peer_timeout = std::chrono::seconds(10);
  // Region::deregister() waits for the accesses in progress; after this long, the peers whose
  // accesses (or whose part in our operations on the region) still hold it are closed, their
  // operations failing with kRevoked, so no peer can hold a deregistration longer.
  Duration revoke_timeout = std::chrono::seconds(5);
  Duration connect_timeout = std::chrono::seconds(10);
  // write_with_imm notifications waiting for next_imm(), per peer and in all. A peer whose
  // notification finds either full is closed with kResourceExhausted (its operations fail):
  // the application is not taking them, and they must not be dropped silently.
  std::size_t max_queued_imms = 1 << 16;
  std::size_t max_queued_imms_total = 1 << 20;
  // Unmatched incoming send() messages (no receive posted yet) are buffered within three limits;
  // a message over any of them is refused: its sender's send() fails with kResourceExhausted,
  // and nothing else changes for that peer or any other. Bytes per peer; each message counts
  // 128 bytes more than its length (its bookkeeping), so empty messages are not free.
  std::size_t max_unexpected_bytes = 64 << 20;
  // Messages per peer, however small.
  std::size_t max_unexpected_messages = 4096;
  // Bytes for all peers of the engine together (counted as max_unexpected_bytes is), so that
  // many peers each within their own limit cannot exhaust the host's memory.
  std::size_t max_unexpected_bytes_total = std::size_t{256} << 20;

  // Limits on what connecting peers can make this engine hold (docs/architecture.md, "Limits",
  // has the worst case per peer and per engine). A connection over a limit is refused with
  // kResourceExhausted; the peers already admitted see no difference.
  // Connected peers, both those that connected to us and those we connected to.
  std::size_t max_peers = 1024;
  // Connections still handshaking (a peer's control connection before it is admitted, each
  // of its data streams before it joins). When full, the oldest handshake of the source address
  // with the most pending is dropped for a new one, so one flooding host cannot lock others out.
  std::size_t max_handshakes = 256;
  // Handshakes pending from one source address; more are refused at once. A Ferry client so
  // refused (a burst of engines on one host) tries again after a jittered backoff within its
  // connect_timeout, so a legitimate burst connects in full while one source holds at most this.
  int max_handshakes_per_source = 32;
  // Peers one source address may hold (incoming, admitted or still joining): below max_peers,
  // so one host cannot take every place and lock the others out.
  std::size_t max_peers_per_source = 512;
  // Of those, peers admitted whose data streams have not all joined yet (unproven: a client may
  // stop after CHANNEL_ADDRESSES). Each holds its channels, ~80 KiB, until it joins or
  // connect_timeout passes.
  std::size_t max_joining_per_source = 32;
};

}  // namespace ferry
