#include "transport/op.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <thread>
#include <utility>

#include "core/callback_scope.hpp"
#include "core/cycle_clock.hpp"

namespace ferry::transport {

void advance(const OpState& op, LaneCursor& cursor, uint64_t n) {
  while (n > 0 && cursor.entry < op.entries.size()) {
    const OpEntry& e = op.entries[cursor.entry];
    uint64_t left = slice_count(e.length - cursor.offset, op.slice_bytes);
    if (n < left) {
      cursor.offset += n * op.slice_bytes;
      return;
    }
    n -= left;
    ++cursor.entry;
    cursor.offset = 0;
  }
}

}  // namespace ferry::transport

namespace ferry::detail {

void OpState::release() {
  // The last holder needs no read-modify-write: nobody else can take a reference any more.
  if (refs.load(std::memory_order_acquire) != 1 &&
      refs.fetch_sub(1, std::memory_order_acq_rel) != 1) {
    return;
  }
  std::shared_ptr<OpPool> keep = std::move(pool_keepalive);
  pool->recycle(this);
  // `keep` may destroy the pool, and this op with it, here.
}

void OpState::record_error(const Status& s) {
  std::lock_guard lock(mu);
  if (!has_error) {
    has_error = true;
    status = s;
    watchers.fetch_or(kError);
  }
}

bool OpState::complete() {
  uint8_t expected = kPosted;
  bool was_posted = stage.compare_exchange_strong(expected, kDone);
  if (!was_posted) {
    if (expected != kIdle) return false;
    stage.store(kDone);
  }
  for (RegionSlot* slot : leases) transport::RegionTable::release(slot);
  leases.clear();
  // An error's status was written under `mu`: taking it before `done` publishes the status.
  // Metrics count the op just after `done` when nobody sleeps on it or waits for a callback, so
  // that a caller spinning on it goes on at once (counting first clearly slowed the busy-polled
  // 8-byte shm write p50: docs/performance.md, "Metrics on and off"); sleepers and callbacks see
  // it counted.
  bool locked_publish = watchers.load() != 0;
  if (!locked_publish) {
    done.store(true);
    meter(ErrorCode::kOk);
    if (watchers.load() == 0) return was_posted;  // no sleeper, callback or error: no lock
  }
  std::function<void(const Status&)> fn;
  {
    std::lock_guard lock(mu);
    if (locked_publish) meter(has_error ? status.code() : ErrorCode::kOk);
    done.store(true);
    fn = std::exchange(callback, nullptr);
  }
  cv.notify_all();
  if (fn) {
    core::CallbackScope in_callback;
    fn(status);
  }
  return was_posted;
}

void OpState::start_clock() {
  if (pool->metered()) started_ticks = core::CycleClock::now();
}

void OpState::count_in_flight() {
  if (started_ticks == 0) return;
  pool->meter(channel).posted(transport::operation_kind(kind, with_imm));
  in_flight_counted = true;
}

void OpState::meter(ErrorCode code) const {
  if (started_ticks == 0) return;
  uint64_t now = core::CycleClock::now();
  uint64_t latency = now > started_ticks ? core::CycleClock::to_ns(now - started_ticks) : 0;
  pool->meter(channel).completed(transport::operation_kind(kind, with_imm), code,
                                 bytes.load(std::memory_order_relaxed), latency, in_flight_counted);
}

void OpState::on_complete(std::function<void(const Status&)> fn) {
  {
    std::unique_lock lock(mu);
    if (callback) {  // a further callback runs after the earlier ones, none replaces them
      fn = [first = std::move(callback), then = std::move(fn)](const Status& s) {
        first(s);
        then(s);
      };
    }
    callback = std::move(fn);
    watchers.fetch_or(kCallback);
    if (!done.load()) return;
    // Completed meanwhile: whichever of complete() and this takes the callback runs it.
    fn = std::exchange(callback, nullptr);
  }
  if (fn) {
    core::CallbackScope in_callback;
    fn(status);
  }
}

bool OpState::sleep_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu);
  watchers.fetch_or(kSleeper);  // stays set: completing after a sleep just takes the lock
  return cv.wait_until(lock, deadline, [this] { return done.load(); });
}

void OpState::grow_lanes() {
  spill_ = std::make_unique<LaneSpill>();
  lanes = spill_->lanes;
  lane_next = spill_->next;
}

void OpState::reset_for_reuse() {
  kind = OpKind::kWrite;
  with_imm = false;
  channel = 0;
  imm = 0;
  tag = 0;
  started_ticks = 0;
  in_flight_counted = false;
  // Nobody refers to the op (it is on its way to the free stack, whose exchange publishes it).
  std::memset(transport_area_, 0, sizeof transport_area_);
  entries.clear();
  rails = 1;
  keys.clear();
  leases.clear();
  lane_count = 0;
  first_lane = 0;
  pending.store(0, std::memory_order_relaxed);
  bytes.store(0, std::memory_order_relaxed);
  if (has_error) {
    has_error = false;
    status = Status();
  }
  callback = nullptr;
  watchers.store(0, std::memory_order_relaxed);
  done.store(false, std::memory_order_relaxed);
  stage.store(kIdle, std::memory_order_relaxed);
}

}  // namespace ferry::detail

namespace ferry::transport {

OpPool::~OpPool() {
  for (auto& b : blocks_) delete b.load();
}

OpState* OpPool::at(uint32_t slot) const {
  if (slot >= kBlocks << kBlockBits) return nullptr;
  Block* block = blocks_[slot >> kBlockBits].load(std::memory_order_acquire);
  if (block == nullptr) return nullptr;
  return block->ops[slot & ((1u << kBlockBits) - 1)].load(std::memory_order_acquire);
}

OpState* OpPool::acquire() {
  OpState* op = nullptr;
  uint64_t top = free_top_.load(std::memory_order_acquire);
  while (static_cast<uint32_t>(top) != kNoSlot) {
    OpState* candidate = at(static_cast<uint32_t>(top));
    // Read before the exchange; if another thread took `candidate` meanwhile, the count in
    // `top` changed and the exchange fails.
    uint64_t next = ((top >> 32) + 1) << 32 | candidate->free_next.load(std::memory_order_relaxed);
    if (free_top_.compare_exchange_weak(top, next, std::memory_order_acquire)) {
      op = candidate;
      break;
    }
  }
  if (op == nullptr) {
    std::lock_guard lock(mu_);
    uint32_t slot = static_cast<uint32_t>(owned_.size());
    if (slot >= kBlocks << kBlockBits) {
      throw Error(ErrorCode::kResourceExhausted, "too many operations in flight on one peer");
    }
    owned_.push_back(std::make_unique<OpState>());
    op = owned_.back().get();
    op->slot = slot;
    op->pool = this;
    Block* block = blocks_[slot >> kBlockBits].load();
    if (block == nullptr) {
      block = new Block;
      blocks_[slot >> kBlockBits].store(block);
    }
    block->ops[slot & ((1u << kBlockBits) - 1)].store(op);
  }
  // Recycled ops were reset when they came back.
  uint64_t generation = (op->id.load(std::memory_order_relaxed) >> 32) + 1;
  op->id.store((generation << 32) | op->slot, std::memory_order_release);
  op->pool_keepalive = shared_from_this();
  op->refs.store(1, std::memory_order_relaxed);
  return op;
}

OpState* OpPool::lookup(uint64_t id) const {
  OpState* op = at(static_cast<uint32_t>(id));
  if (op == nullptr || op->id.load(std::memory_order_acquire) != id) return nullptr;
  if (op->stage.load(std::memory_order_acquire) != OpState::kPosted) return nullptr;
  return op;
}

bool OpPool::mark_posted(OpState* op) {
  // Sequentially consistent with close_and_collect: either this sees `closed_`, or the closer
  // waits for this call to leave and then sees the op posted.
  posting_.fetch_add(1);
  bool open = !closed_.load();
  if (open) {
    op->add_ref();
    // Release: a completion path that finds the op posted (lookup) sees all that set it up.
    op->stage.store(OpState::kPosted, std::memory_order_release);
  }
  posting_.fetch_sub(1, std::memory_order_release);
  return open;
}

std::vector<OpState*> OpPool::close_and_collect() {
  std::vector<OpState*> posted;
  std::lock_guard lock(mu_);
  closed_.store(true);
  while (posting_.load() != 0) std::this_thread::yield();  // a poster is a few instructions away
  for (auto& op : owned_) {
    if (op->stage.load() == OpState::kPosted) {
      op->add_ref();
      posted.push_back(op.get());
    }
  }
  return posted;
}

bool OpPool::posted_uses_region(uint32_t region_id) const {
  std::lock_guard lock(mu_);
  for (const auto& owned : owned_) {
    OpState* op = owned.get();
    // A reference taken only from a live op: with it held the op cannot be recycled, and once
    // it is seen posted its entries stay as they are until then.
    uint32_t refs = op->refs.load(std::memory_order_acquire);
    bool held = false;
    while (refs != 0 && !(held = op->refs.compare_exchange_weak(refs, refs + 1))) {
    }
    if (!held) continue;
    bool uses = op->stage.load(std::memory_order_acquire) == OpState::kPosted && !op->done.load() &&
                std::any_of(op->entries.begin(), op->entries.end(),
                            [&](const OpEntry& e) { return e.local_region == region_id; });
    op->release();
    if (uses) return true;
  }
  return false;
}

// A pool whose source this thread is inside, and the one it is nested in: a source may be
// closed from inside a poll (a completion callback closed its peer, or another peer whose pool
// an outer wait or spin_any() is inside), which must not wait for this thread.
struct ProgressFrame {
  const OpPool* pool = nullptr;
  const ProgressFrame* outer = nullptr;
};
namespace {
thread_local const ProgressFrame* progressing = nullptr;
}  // namespace

ProgressSource* OpPool::enter(ProgressFrame& frame) {
  frame = {this, progressing};
  progressing = &frame;
  progress_users_.fetch_add(1);
  return progress_.load();
}

void OpPool::leave(const ProgressFrame& frame) {
  progress_users_.fetch_sub(1);
  progressing = frame.outer;
}

template <typename Fn>
void OpPool::with_progress(Fn&& fn) {
  struct Entered {
    OpPool* pool;
    ProgressFrame frame;
    ~Entered() { pool->leave(frame); }  // a callback may throw out of fn
  } entered{this, {}};
  if (ProgressSource* s = enter(entered.frame)) fn(*s);
}

void OpPool::progress() {
  with_progress([](ProgressSource& s) { s.progress(); });
}

void OpPool::spin(const OpState& op, std::chrono::nanoseconds budget) {
  OpPool* self = this;
  // A receive's bytes are known only once it completes: its capacity stands for them.
  uint64_t size = op.kind == OpKind::kRecv && !op.entries.empty()
                      ? op.entries.front().length
                      : op.bytes.load(std::memory_order_relaxed);
  spin_any({&self, 1}, op.done, budget, op.kind == OpKind::kSend || op.kind == OpKind::kRecv,
           size >= kYieldingSpinFrom);
}

void OpPool::spin_any(std::span<OpPool* const> pools, const std::atomic<bool>& done,
                      std::chrono::nanoseconds budget, bool messages, bool yielding) {
  // The sources watched, each with its pool's frame and a reference that keeps it alive. The
  // watches end, then the pools are left, and only then are the references dropped: dropping
  // the last one runs the channel's destructor, whose clear_progress waits for every other
  // thread's frame on its pool, so a thread must hold none of ours then (two spinners would
  // wait for each other). On the way out of an exception from a callback too.
  struct Watched {
    std::array<ProgressFrame, kMaxSpinPools> frames;
    std::array<OpPool*, kMaxSpinPools> pools{};
    std::array<ProgressSource*, kMaxSpinPools> sources{};
    std::array<std::shared_ptr<void>, kMaxSpinPools> held;
    std::size_t count = 0;
    ~Watched() {
      for (std::size_t k = 0; k < count; ++k) sources[k]->watch_end();
      for (std::size_t k = count; k-- > 0;) pools[k]->leave(frames[k]);
    }  // `held` goes after this body
  } w;
  for (OpPool* pool : pools.first(std::min(pools.size(), kMaxSpinPools))) {
    std::size_t k = w.count;
    ProgressSource* s = pool->enter(w.frames[k]);
    std::shared_ptr<void> keep = s != nullptr ? s->watch_begin() : nullptr;
    if (!keep) {
      // No source, or it is going: out at once (the frame is the innermost), so that its
      // clearing does not wait for this spin.
      pool->leave(w.frames[k]);
      continue;
    }
    w.pools[k] = pool;
    w.sources[k] = s;
    w.held[k] = std::move(keep);
    ++w.count;
  }
  std::chrono::steady_clock::time_point until;
  for (unsigned i = 0; !done.load(std::memory_order_acquire); ++i) {
    for (std::size_t k = 0; k < w.count; ++k) w.sources[k]->watch_poll(messages);
    if (yielding && i % kPollsPerYield == kPollsPerYield - 1) sched_yield();
    // The clock every few polls: a clock read costs as much as a poll.
    if (i % 8 == 7) {
      auto now = std::chrono::steady_clock::now();
      if (i == 7) until = now + budget;
      if (now >= until) break;
    }
  }
}

void OpPool::unwatched() {
  with_progress([](ProgressSource& s) {
    if (std::shared_ptr<void> held = s.watch_begin()) s.watch_end();
  });
}

void OpPool::set_progress(ProgressSource* source) { progress_.store(source); }

void OpPool::clear_progress(ProgressSource* source) {
  ProgressSource* expected = source;
  progress_.compare_exchange_strong(expected, nullptr);
  // Sequentially consistent with progress(): a caller that counted itself in before the store
  // above may still be inside `source`.
  int mine = 0;
  for (const ProgressFrame* f = progressing; f != nullptr; f = f->outer) mine += f->pool == this;
  while (progress_users_.load() > mine) std::this_thread::yield();
}

void OpPool::recycle(OpState* op) {
  op->reset_for_reuse();  // here, off the next operation's path
  uint64_t top = free_top_.load(std::memory_order_relaxed);
  uint64_t next;
  do {
    op->free_next.store(static_cast<uint32_t>(top), std::memory_order_relaxed);
    next = ((top >> 32) + 1) << 32 | op->slot;
  } while (!free_top_.compare_exchange_weak(top, next, std::memory_order_release,
                                            std::memory_order_relaxed));
}

}  // namespace ferry::transport
