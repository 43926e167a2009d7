// Operation state: one per user operation, pooled per peer and never reused while a Future or
// the transport still refers to it. The wire carries op ids (slot | generation << 32), so a
// late or forged completion for a reused slot is recognised and rejected.
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <type_traits>
#include <vector>

#include "core/fork.hpp"
#include "ferry/config.hpp"
#include "ferry/error.hpp"
#include "ferry/metrics.hpp"
#include "transport/meter.hpp"
#include "transport/region_table.hpp"

namespace ferry::detail {
struct OpState;  // named in the public API (Future), defined below
}  // namespace ferry::detail

namespace ferry::transport {

using OpState = ::ferry::detail::OpState;

enum class OpKind : uint8_t { kWrite, kRead, kSend, kRecv };

// The kind metrics count an op as (write_with_imm apart from write).
constexpr OperationKind operation_kind(OpKind kind, bool with_imm) {
  switch (kind) {
    case OpKind::kWrite:
      return with_imm ? OperationKind::kWriteWithImm : OperationKind::kWrite;
    case OpKind::kRead:
      return OperationKind::kRead;
    case OpKind::kSend:
      return OperationKind::kSend;
    case OpKind::kRecv:
      break;
  }
  return OperationKind::kRecv;
}

// OpEntry::remote_key holds a key's bytes in memory order (OpState::remote_key views them).
static_assert(std::endian::native == std::endian::little, "Ferry assumes a little-endian host");

// One contiguous piece of a batch.
struct OpEntry {
  uint8_t* local = nullptr;
  uint64_t length = 0;
  uint32_t remote_region = 0;
  uint32_t local_region = 0;  // for transports that need a local key (verbs lkey)
  // The chosen transport's key on device 0 when it is at most 8 bytes (TCP's table key, a verbs
  // rkey, shm's), little-endian and zero-padded: the data path's common case. A longer key, or
  // one of several rails, is in the op's key store (OpState::remote_key).
  uint64_t remote_key = 0;
  uint64_t remote_offset = 0;
  uint64_t remote_addr = 0;  // descriptor address + remote_offset, for RDMA
  uint8_t remote_key_length = 0;
};

// The longest key a descriptor carries for one transport and device.
constexpr std::size_t kMaxKeyBytes = 255;
// Keys that fit OpEntry::remote_key.
constexpr std::size_t kShortKeyBytes = sizeof(uint64_t);

// The remote keys of an op's entries that OpEntry::remote_key cannot hold: every device's key
// when the channel has several rails, and keys over 8 bytes (a CUDA IPC handle is 64). Kept
// across the op's reuses, so a warm op stores them without allocating.
class KeyStore {
 public:
  // Empty: every key is its entry's remote_key.
  bool empty() const { return at_.empty(); }
  // Keys held: entries added times their rails.
  std::size_t size() const { return at_.size(); }
  // Appends the keys of the next entry, one per rail.
  void add(std::span<const std::span<const uint8_t>> rail_keys) {
    for (std::span<const uint8_t> key : rail_keys) {
      at_.push_back({static_cast<uint32_t>(bytes_.size()), static_cast<uint8_t>(key.size())});
      bytes_.insert(bytes_.end(), key.begin(), key.end());
    }
  }
  // The key of the `index`th entry added, on `rail`, of `rails`.
  std::span<const uint8_t> key(std::size_t index, int rails, int rail) const {
    const Span& s = at_[index * static_cast<std::size_t>(rails) + static_cast<std::size_t>(rail)];
    return {bytes_.data() + s.offset, s.length};
  }
  void clear() {
    bytes_.clear();
    at_.clear();
  }
  void reserve(std::size_t keys, std::size_t bytes) {
    at_.reserve(keys);
    bytes_.reserve(bytes);
  }

 private:
  struct Span {
    uint32_t offset;
    uint8_t length;
  };
  std::vector<uint8_t> bytes_;
  std::vector<Span> at_;
};

// Where a stream (lane) stands in an operation: the next slice it sends.
struct LaneCursor {
  uint32_t entry = 0;
  uint64_t offset = 0;     // within the entry
  uint64_t remaining = 0;  // slices this lane still has to send
};

class OpPool;
struct ProgressFrame;  // op.cpp

// Something a waiting caller may drive instead of sleeping: a verbs channel polls its completion
// queue, a same-host channel its ring. Runs completions (and their callbacks) on the caller's
// thread. While callers watch it, the source need not wake a progress thread for what arrives;
// once none does, or an op is left unwatched (watch_begin() then watch_end()), it makes sure one
// will.
class ProgressSource {
 public:
  // Polls once, unwatched (Future::test).
  virtual void progress() = 0;
  // A caller starts watching: it will watch_poll() until watch_end(), holding what this returns
  // (the source itself: a completion callback may drop every other reference). Null: the source
  // is going, not to be watched.
  virtual std::shared_ptr<void> watch_begin() = 0;
  // One look while watching; `messages`: also what the peer's messages complete (a send's
  // acknowledgement, a receive, a write_with_imm notification), not only local completions.
  virtual void watch_poll(bool messages) = 0;
  // The caller stopped watching: what arrived meanwhile and nobody took wakes a progress thread.
  virtual void watch_end() = 0;

 protected:
  ~ProgressSource() = default;
};

// Slices an entry of `length` bytes is cut into (small entries are never split).
inline uint64_t slice_count(uint64_t length, uint64_t slice_bytes) {
  return (length + slice_bytes - 1) / slice_bytes;
}
// Moves `cursor` forward by `n` slices of the op's batch (the remaining count is the caller's).
void advance(const OpState& op, LaneCursor& cursor, uint64_t n);

}  // namespace ferry::transport

namespace ferry::detail {

struct OpState {
  using OpKind = transport::OpKind;
  using OpEntry = transport::OpEntry;
  using LaneCursor = transport::LaneCursor;
  using OpPool = transport::OpPool;
  using RegionSlot = transport::RegionSlot;

  static constexpr int kMaxLanes = ferry::kMaxLanes;
  // Lanes whose state lives inside the op; more go to `spill` (reserve_lanes).
  static constexpr int kInlineLanes = 16;
  enum Stage : uint8_t { kIdle, kPosted, kDone };

  // Identity and lifetime.
  std::atomic<uint32_t> refs{0};
  std::atomic<uint64_t> id{0};
  uint32_t slot = 0;
  std::atomic<uint32_t> free_next{0};  // the pool's free stack: the slot below this one
  OpPool* pool = nullptr;
  std::shared_ptr<OpPool> pool_keepalive;  // set while referenced

  // What to do.
  OpKind kind = OpKind::kWrite;
  bool with_imm = false;
  uint8_t channel = 0;  // which of the peer's channels carries it (the engine's routing)
  uint32_t imm = 0;
  uint64_t tag = 0;
  uint64_t slice_bytes = 0;
  int64_t spin_ns = 0;             // Future::wait spins this long before sleeping
  uint64_t started_ticks = 0;      // when the call started it (core::CycleClock); 0: unmetered
  bool in_flight_counted = false;  // count_in_flight() counted it
  std::vector<OpEntry> entries;    // capacity kept across reuses: no allocation when warm
  // Devices the op's channel stripes over (Channel::rails()).
  uint8_t rails = 1;
  // Every entry's keys on every rail, when the channel has several or a key is over 8 bytes;
  // else empty, and each entry's remote_key is its key.
  transport::KeyStore keys;
  // The key of entry `index` on device `rail`, whatever its length (up to kMaxKeyBytes).
  std::span<const uint8_t> remote_key(std::size_t index, int rail) const {
    if (keys.empty()) {
      const OpEntry& e = entries[index];
      return {reinterpret_cast<const uint8_t*>(&e.remote_key), e.remote_key_length};
    }
    return keys.key(index, rails, rail);
  }
  std::vector<RegionSlot*> leases;  // local regions held until completion

  // Lanes (TCP streams, queue pairs) the op is spread over.
  int lane_count = 0;
  int first_lane = 0;
  LaneCursor* lanes = lanes_inline_;   // lane_count of them
  OpState** lane_next = next_inline_;  // intrusive per-lane send queue links
  // Makes room for `n` lanes (at most kMaxLanes). Above kInlineLanes the first call allocates
  // the spill, which the op keeps for its later uses: a warm op never allocates.
  void reserve_lanes(int n) {
    if (n > kInlineLanes && spill_ == nullptr) [[unlikely]]
      grow_lanes();
  }

  // Progress.
  std::atomic<uint8_t> stage{kIdle};
  std::atomic<int64_t> pending{0};  // slices (or messages) not yet completed
  std::atomic<uint64_t> bytes{0};

  // The transport's own state for the op, typed by the transport in its folder (a message's
  // rendezvous, slices on the wire, a CUDA event, a libfabric context): zeroed whenever the op
  // is reused, so a fresh T is all zeros. T holds plain values (trivially copyable); a field
  // that threads share is reached through std::atomic_ref.
  static constexpr std::size_t kTransportAreaBytes = 64;
  template <typename T>
  T& transport_area() {
    static_assert(sizeof(T) <= kTransportAreaBytes, "the transport's area is 64 bytes");
    static_assert(alignof(T) <= kTransportAreaAlign);
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
    return *std::launder(reinterpret_cast<T*>(transport_area_));
  }

  // Completion. complete() takes `mu` only when `watchers` says a callback, a sleeper or a
  // recorded error (written under `mu`, perhaps by another thread) needs it: each side sets its
  // flag before checking the other's (`done`), all sequentially consistent, so one of them
  // always sees the other.
  enum Watcher : uint8_t { kCallback = 1, kSleeper = 2, kError = 4 };
  std::mutex mu;
  std::condition_variable cv;
  bool has_error = false;                       // guarded by mu
  Status status;                                // guarded by mu until done
  std::function<void(const Status&)> callback;  // guarded by mu
  std::atomic<uint8_t> watchers{0};
  std::atomic<bool> done{false};

  void add_ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  void release();

  // Records the first failure; later ones are dropped (the first names the cause).
  void record_error(const Status& s);
  // Accounts `n` finished slices; the caller that brings `pending` to zero completes the op.
  bool finish_slices(int64_t n) { return pending.fetch_sub(n, std::memory_order_acq_rel) == n; }
  // Marks the operation complete exactly once: releases leases, wakes waiters, runs the callback.
  // Returns false when it was already complete.
  bool complete();
  // Runs `fn` once the op is complete: now (on this thread) if it is, else on completion.
  void on_complete(std::function<void(const Status&)> fn);
  // Sleeps until complete or `deadline`; false on timeout.
  bool sleep_until(std::chrono::steady_clock::time_point deadline);
  // Completes at once with `s` (nothing was posted).
  void complete_with(const Status& s) {
    if (!s.ok()) record_error(s);
    complete();
  }
  // Completes a posted op and drops the reference the transport held while it was posted.
  void finish_posted() {
    if (complete()) release();
  }
  // On recycling: back to a fresh op's state.
  void reset_for_reuse();
  // Starts the metrics' latency clock, if the pool meters its ops.
  void start_clock();
  // Counts the op in flight on its channel (metered ops), before it is posted: its completion
  // then counts it out.
  void count_in_flight();

 private:
  // Counts the completion in the pool's meter of the op's channel, if it meters.
  void meter(ErrorCode code) const;
  struct LaneSpill {
    LaneCursor lanes[kMaxLanes];
    OpState* next[kMaxLanes] = {};
  };
  [[gnu::cold]] void grow_lanes();
  static constexpr std::size_t kTransportAreaAlign = 16;
  alignas(kTransportAreaAlign) unsigned char transport_area_[kTransportAreaBytes] = {};
  // `lanes` and `lane_next` point here or into `spill_`; ops are never moved (the pool holds
  // them by pointer), so the self-references stay valid.
  LaneCursor lanes_inline_[kInlineLanes];
  OpState* next_inline_[kInlineLanes] = {};
  std::unique_ptr<LaneSpill> spill_;
};

}  // namespace ferry::detail

namespace ferry::transport {

// Per-peer pool of operation states with id lookup for completions arriving from the wire.
class OpPool : public std::enable_shared_from_this<OpPool> {
 public:
  OpPool() = default;
  ~OpPool();
  OpPool(const OpPool&) = delete;
  OpPool& operator=(const OpPool&) = delete;

  // A fresh op with one reference (the caller's), stage kIdle. Lock-free unless the pool grows.
  OpState* acquire();
  // The op with this id if it is posted and not complete; no reference is taken: valid only
  // on the stream's progress thread while the op is posted, which keeps a reference.
  OpState* lookup(uint64_t id) const;

  // Marks the op posted, taking the transport's reference, unless the pool was closed (then it
  // returns false and the caller fails the op). Closing waits for posters inside this call, so
  // every op is either refused here or collected by close_and_collect.
  bool mark_posted(OpState* op);
  // Closes the pool for posting and returns every posted op still incomplete, each with a
  // reference the caller must release.
  std::vector<OpState*> close_and_collect();
  // Fails a posted op with `why(op)` and drops the transport's reference, unless the pool is
  // closing: then close_and_collect() owns it (and this touches it not at all). For an op the
  // caller took from the transport (a receive removed from the matcher) while the peer may be
  // failing concurrently.
  template <typename Why>
  bool fail_posted(OpState* op, Why why);
  // Counts ops in a meter per channel from now on (Config::metrics): called once, when the
  // peer's channels are set and before any op starts.
  void meter_channels(std::size_t channels) {
    meters_ = std::make_unique<ChannelMeter[]>(channels);
  }
  bool metered() const { return meters_ != nullptr; }
  // The fork generation the pool was made in (core/fork.hpp): its ops are the parent's in a
  // forked child.
  const uint64_t born = core::fork_generation();
  // The counters of the peer's channel `channel` (metered pools only).
  ChannelMeter& meter(uint8_t channel) { return meters_[channel]; }
  const ChannelMeter& meter(uint8_t channel) const { return meters_[channel]; }

  // Whether an op posted and still incomplete has an entry in the local region `region_id`.
  // Safe while ops complete and are reused meanwhile (not for the data path: it takes the
  // pool's lock and visits every op).
  bool posted_uses_region(uint32_t region_id) const;

  // The source Future::wait drives while it spins (one per peer: the channel whose completions
  // a caller can poll). Clearing it waits until no caller is inside it any more.
  void set_progress(ProgressSource* source);
  void clear_progress(ProgressSource* source);
  bool pollable() const { return progress_.load() != nullptr; }
  void progress();
  // Polls while `op` is incomplete, for about `budget`.
  void spin(const OpState& op, std::chrono::nanoseconds budget);
  // A spin for an op of at least this many bytes lets other threads of its core run every
  // kPollsPerYield polls (sched_yield, which returns at once when none waits): such an op takes
  // tens of microseconds at least, and where cores are few the spinning waiter held one that
  // the peer's copy threads needed. Same host, 2-core VM: 1 MiB writes 8 in flight moved more
  // with these yields and pulls split in two (shm::kMinPartBytes); either change alone gave
  // nothing. Yielding in every spin made the 8-byte notification ping-pong several times slower,
  // so smaller ops do not. A receive counts by its capacity (a small message into a large buffer
  // waits for a yield only after 64 polls, a few microseconds): pulled 1 MiB messages, 8 in
  // flight, moved more once the receiver's waits yielded too (docs/performance.md, "Each
  // transfer the faster way").
  static constexpr uint64_t kYieldingSpinFrom = 256 << 10;
  static constexpr unsigned kPollsPerYield = 64;
  // The most pools one spin_any() polls: their frames live on its stack, and a spin over more
  // would mostly look at idle channels (notifications from the others wake a progress thread).
  static constexpr std::size_t kMaxSpinPools = 16;
  // Polls the sources of `pools` (the first kMaxSpinPools; those without one are skipped) until
  // `done` or for about `budget`, timed from the first clock reading a few polls in (most spins
  // end sooner), yielding every kPollsPerYield polls if `yielding` (spin() asks it for large
  // ops): Engine::next_imm, whose notification may come from any peer, does not.
  static void spin_any(std::span<OpPool* const> pools, const std::atomic<bool>& done,
                       std::chrono::nanoseconds budget, bool messages, bool yielding = false);
  // Nobody watches an incomplete op any more (a callback was attached, or its last Future
  // went): completions must wake a progress thread.
  void unwatched();

 private:
  friend struct ::ferry::detail::OpState;
  void recycle(OpState* op);
  // Runs `fn` on the progress source, if any, counted in progress_users_.
  template <typename Fn>
  void with_progress(Fn&& fn);
  // Counts this thread in as a user of the source (progress_users_) until leave(), and returns
  // the source (nullptr: none).
  ProgressSource* enter(ProgressFrame& frame);
  void leave(const ProgressFrame& frame);

  static constexpr uint32_t kBlockBits = 10;
  static constexpr uint32_t kBlocks = 1024;  // up to 1M ops per peer at once
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  struct Block {
    std::atomic<OpState*> ops[1u << kBlockBits] = {};
  };
  OpState* at(uint32_t slot) const;  // nullptr for a slot never created
  mutable std::mutex mu_;            // owned_ and growth; never taken on the data path
  std::atomic<bool> closed_{false};
  std::atomic<int> posting_{0};  // callers inside mark_posted
  // Free ops: a lock-free stack of slots, (pops << 32) | top slot. The count makes a stale
  // compare-exchange fail (ABA).
  std::atomic<uint64_t> free_top_{kNoSlot};
  std::vector<std::unique_ptr<OpState>> owned_;
  std::atomic<Block*> blocks_[kBlocks] = {};
  std::atomic<ProgressSource*> progress_{nullptr};
  std::atomic<int> progress_users_{0};
  // Its own cache line: completing threads read it, and callers waiting write progress_users_.
  alignas(64) std::unique_ptr<ChannelMeter[]> meters_;
};

template <typename Why>
bool OpPool::fail_posted(OpState* op, Why why) {
  // The gate mark_posted() uses: close_and_collect() waits for this to leave, then finds the op
  // complete; or this sees the pool closed and leaves the op to it.
  posting_.fetch_add(1);
  bool open = !closed_.load();
  if (open) {
    op->record_error(why(*op));
    op->finish_posted();
  }
  posting_.fetch_sub(1, std::memory_order_release);
  return open;
}

}  // namespace ferry::transport
