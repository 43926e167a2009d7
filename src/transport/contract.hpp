// The contract every transport implements (TCP, verbs, shared memory, loopback; CUDA IPC and
// libfabric next).
// It is shaped after RDMA: regions registered up front with per-transport keys, operations
// planned by the engine into slices spread over lanes (sockets, queue pairs), posted in
// batches, completed per slice, with back-pressure inside the transport. See
// docs/architecture.md for the rules.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/net.hpp"
#include "core/reactor.hpp"
#include "core/teardown.hpp"
#include "ferry/config.hpp"
#include "ferry/error.hpp"
#include "ferry/types.hpp"
#include "transport/matcher.hpp"
#include "transport/op.hpp"
#include "transport/region_table.hpp"

namespace ferry::transport {

struct PeerLink;

// What the engine lends its transports.
class Host {
 public:
  virtual RegionTable& regions() = 0;
  virtual core::Reactor& reactor() = 0;
  // Where calls that can block in the kernel go (destroying a closed peer's queue pairs).
  virtual core::Teardown& teardown() = 0;
  // A write_with_imm that came over `link` is fully visible in our memory.
  virtual void deliver_imm(PeerLink& link, uint32_t imm) = 0;

 protected:
  ~Host() = default;
};

// Tagged messages one channel carried for a peer (Peer::stats).
struct MessageCounters {
  std::atomic<uint64_t> sent{0};       // acknowledged as taken (whole or truncated)
  std::atomic<uint64_t> received{0};   // taken by a receive or buffered
  std::atomic<uint64_t> zero_copy{0};  // of those, placed by the sender's RDMA WRITE
  std::atomic<uint64_t> compact{0};    // of those, eager ones that came without a header
};

// State of one peer shared by the engine and the peer's channel.
struct PeerLink {
  // `unexpected_budget`: the engine's, shared by all its peers (Matcher); none: this peer's
  // byte limit alone.
  PeerLink(uint64_t remote_engine_id, std::size_t max_unexpected_bytes,
           std::shared_ptr<UnexpectedBudget> unexpected_budget = nullptr)
      : remote_engine_id(remote_engine_id),
        pool(std::make_shared<OpPool>()),
        matcher(max_unexpected_bytes, std::move(unexpected_budget)) {}
  uint64_t remote_engine_id;
  std::weak_ptr<void> owner;  // the engine's object for this peer: where notifications came from
  std::shared_ptr<OpPool> pool;
  Matcher matcher;
  std::atomic<uint64_t> imms_received{0};  // write_with_imm notifications it delivered

  // Fails every posted op and receive with `reason`; call only when no channel of the peer
  // can touch user memory any more.
  void fail_all(const Status& reason) {
    matcher.take_posted();
    for (OpState* op : pool->close_and_collect()) {
      op->record_error(reason);
      op->finish_posted();
      op->release();
    }
  }
};

// What a transport can do (TransportEntry::capabilities); routing (engine/route.hpp) reads it.
enum Capability : uint32_t {
  kCapOneSided = 1,      // write / read without the target's CPU in the data path (RDMA)
  kCapCrossHost = 2,     // reaches other machines (and so other processes)
  kCapInlineSmall = 4,   // small payloads travel inside the work request
  kCapCrossProcess = 8,  // reaches other processes of this host
  kCapMessages = 16,     // tagged send / recv
  kCapImm = 32,          // write_with_imm
};

enum class PostResult : uint8_t {
  kAccepted,  // every slice handed to the wire or the NIC
  kQueued,    // some slices wait for credits; the transport posts them as credits return
};

// The most bytes one channel's address (Channel::local_address) may take: the addresses of all
// of a peer's channels travel in one control frame (core::kMaxControlPayload).
constexpr std::size_t kMaxAddressBytes = 1024;

// A connection to one peer over one transport.
//
// Set-up, driven by the engine over the control connection: each side creates its channel
// (Transport::make_channel), the two exchange local_address() and connect() to each other's;
// then the dialing side opens side_connections() more TCP connections to the listener's port,
// which the engine hands to attach_side() on both ends. The address is opaque to the engine.
// Its attributes (unusable, lacks, max_slice_bytes, shapes_writes, lanes, rails) are read once,
// when its side connections are attached, and kept with it: they must not change after that.
class Channel {
 public:
  virtual ~Channel() = default;
  virtual TransportKind kind() const = 0;
  // What the peer's channel needs to connect to this one (at most kMaxAddressBytes).
  virtual std::vector<uint8_t> local_address() const = 0;
  // Connects to the peer's channel from its local_address(); rejects malformed input.
  virtual Status connect(std::span<const uint8_t> remote) = 0;
  // Extra connections the channel runs over (TCP: its streams), known once connected.
  virtual int side_connections() const { return 0; }
  // Hands over side connection `index` (0 .. side_connections() - 1).
  virtual Status attach_side(int index, core::Fd fd) {
    (void)fd;
    return {ErrorCode::kProtocol, "side connection " + std::to_string(index) + " for " +
                                      std::string(to_string(kind())) + ", which takes none"};
  }

  // Why this channel, although connected, cannot carry operations (a same-host channel whose
  // two processes may not read each other's memory), or "" when it can. Known once its side
  // connections are attached; routing then leaves it out and says why (Peer::routes).
  virtual std::string unusable() const { return {}; }
  // Capabilities (kCap* bits) of its transport that this connected channel cannot offer after
  // all, and why (a same-host channel whose processes may not read each other's memory carries
  // no messages): routing sends those operations to the next channel. Known with unusable().
  virtual uint32_t lacks(std::string& why) const {
    (void)why;
    return 0;
  }
  // The largest slice the channel takes (0: any size): the engine cuts transfers for it no
  // larger than this, whatever Config::slice_bytes says.
  virtual uint64_t max_slice_bytes() const { return 0; }
  // Whether the engine asks shape_write() of every write it posts on this channel.
  virtual bool shapes_writes() const { return false; }
  // A write of `total` bytes in all, admitted to this channel and cut in slices of
  // op.slice_bytes, is about to be posted: the channel may cut it finer for a path of its own
  // (shm copies mid-size writes through its rings when that moved them faster lately) by
  // lowering op.slice_bytes, and note in its op area which way it chose. Asked at every post,
  // of prepared writes too; the one question the engine asks a channel per operation.
  virtual void shape_write(OpState& op, uint64_t total) {
    (void)op;
    (void)total;
  }
  // Adds what the channel measured of its own paths to Peer::stats() (shm: the rings against
  // process_vm_readv, per size class).
  virtual void report_paths(std::vector<PathStats>& out) const { (void)out; }

  // Parallel paths (sockets, queue pairs) that the engine may spread slices over.
  virtual int lanes() const = 0;
  // Devices the channel stripes over (multi-rail), each opening a region with its own key: the
  // descriptor's keys for devices 0 .. rails() - 1, which the engine hands over in the op
  // (OpState::remote_key). Known once connected.
  virtual int rails() const { return 1; }
  // Posts a planned operation (see engine/planner.hpp); the op is already marked posted. On a
  // closing channel nothing is sent and the closing path fails the op.
  virtual PostResult post(OpState* op) = 0;
  // Closes the connection. Asynchronous and idempotent; `on_closed` (given at creation) runs
  // once when nothing in this channel touches user memory any more. The owner then fails
  // every op still posted (PeerLink::fail_all), after all of the peer's channels closed.
  virtual void close(const Status& reason) = 0;
  virtual bool closed() const = 0;
  // Closed, and `on_closed` has run: nothing of the channel runs on the progress threads.
  virtual bool quiesced() const = 0;
  // Releases what the progress threads would have; called once the reactor has stopped.
  virtual void stop_after_reactor() = 0;
  // Deregistering the region [base, base + length) has waited Config::revoke_timeout for
  // accesses to end: if this channel still serves one (the target's CPU copying into or out
  // of it for the peer), it closes with `why`, which fails the access and lets the region go.
  // Asynchronous.
  virtual void cut_off(const uint8_t* base, uint64_t length, const Status& why) = 0;
  // Region `region_id` is being deregistered and refuses new accesses: a channel that lent it
  // to the peer for longer than one access (a same-host mapping) asks for it back now; the
  // deregistration waits for the RegionUse it holds until the peer gave it back, or cuts it off
  // after Config::revoke_timeout. Asynchronous.
  virtual void revoking(uint32_t region_id) { (void)region_id; }

  MessageCounters messages;  // counted by the transport, read by Peer::stats()
};

// What a transport gets to create one peer's channel.
struct ChannelArgs {
  Host& host;
  std::shared_ptr<PeerLink> link;
  std::function<void(const Status&)> on_closed;  // once, when the channel has closed
  bool dialer;  // this side connected to the peer (the listener's address decides shared counts)
};

// Devices one channel stripes over at most (Channel::rails()).
constexpr int kMaxRails = 8;

// Takes a region's keys from its transport: one per device the transport opened (its rails),
// numbered from 0. An error (a key too long, or a second one for a device) fails the
// registration.
class KeySink {
 public:
  virtual Status add(uint8_t device, std::span<const uint8_t> key) = 0;

 protected:
  ~KeySink() = default;
};

// A region's key for a transport whose target's CPU checks every access against the region
// table (TCP, loopback): the table's own key, for device 0.
inline Status table_key_as_key(uint64_t table_key, KeySink& keys) {
  uint8_t bytes[sizeof table_key];
  std::memcpy(bytes, &table_key, sizeof table_key);
  return keys.add(0, bytes);
}

// A transport opened for one engine: registration keys and the channel factory.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;
  // Gives `keys` this transport's key for a region on each of its devices.
  // `access` is what the owner granted peers; a transport that checks remote access in
  // hardware (verbs) must register exactly that.
  virtual Status register_region(uint32_t region_id, uint8_t* base, uint64_t length, Access access,
                                 uint64_t table_key, KeySink& keys) = 0;
  virtual void deregister_region(uint32_t region_id) = 0;
  // A channel to a new peer, not yet connected; an error refuses that peer only.
  virtual Status make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) = 0;
};

}  // namespace ferry::transport
