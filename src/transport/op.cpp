#include "transport/op.hpp"

#include <thread>

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
  if (refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::shared_ptr<OpPool> keep = std::move(pool_keepalive);
  pool->recycle(this);
  // `keep` may destroy the pool, and this op with it, here.
}

void OpState::record_error(const Status& s) {
  std::lock_guard lock(mu);
  if (!has_error) {
    has_error = true;
    status = s;
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
  std::function<void(const Status&)> fn;
  {
    std::lock_guard lock(mu);
    done.store(true, std::memory_order_release);
    fn = std::move(callback);
    callback = nullptr;
  }
  cv.notify_all();
  if (fn) fn(status);
  return was_posted;
}

void OpState::reset_for_reuse() {
  kind = OpKind::kWrite;
  with_imm = false;
  imm = 0;
  tag = 0;
  peer_token = 0;
  zero_copy = false;
  ack_due.store(false);
  entries.clear();
  leases.clear();
  lane_count = 0;
  first_lane = 0;
  pending.store(0);
  bytes.store(0);
  has_error = false;
  status = Status();
  callback = nullptr;
  done.store(false);
  stage.store(kIdle);
}

}  // namespace ferry::detail

namespace ferry::transport {

OpPool::~OpPool() {
  for (auto& b : blocks_) delete b.load();
}

OpState* OpPool::acquire() {
  OpState* op;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      op = free_.back();
      free_.pop_back();
    } else {
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
  }
  op->reset_for_reuse();
  uint64_t generation = (op->id.load() >> 32) + 1;
  op->id.store((generation << 32) | op->slot, std::memory_order_release);
  op->pool_keepalive = shared_from_this();
  op->refs.store(1);
  return op;
}

OpState* OpPool::lookup(uint64_t id) const {
  uint32_t slot = static_cast<uint32_t>(id);
  if (slot >= kBlocks << kBlockBits) return nullptr;
  Block* block = blocks_[slot >> kBlockBits].load(std::memory_order_acquire);
  if (block == nullptr) return nullptr;
  OpState* op = block->ops[slot & ((1u << kBlockBits) - 1)].load(std::memory_order_acquire);
  if (op == nullptr || op->id.load(std::memory_order_acquire) != id) return nullptr;
  if (op->stage.load(std::memory_order_acquire) != OpState::kPosted) return nullptr;
  return op;
}

bool OpPool::mark_posted(OpState* op) {
  std::lock_guard lock(mu_);
  if (closed_) return false;
  op->add_ref();
  op->stage.store(OpState::kPosted);
  return true;
}

std::vector<OpState*> OpPool::close_and_collect() {
  std::vector<OpState*> posted;
  std::lock_guard lock(mu_);
  closed_ = true;
  for (auto& op : owned_) {
    if (op->stage.load() == OpState::kPosted) {
      op->add_ref();
      posted.push_back(op.get());
    }
  }
  return posted;
}

namespace {
// The pool this thread is inside progress() of, and how deeply: a source may be destroyed from
// inside its own progress() (a completion callback dropped the last reference), which must not
// wait for itself.
struct Progressing {
  const OpPool* pool = nullptr;
  int depth = 0;
};
thread_local Progressing progressing;
}  // namespace

template <typename Fn>
void OpPool::with_progress(Fn&& fn) {
  Progressing outer = progressing;
  progressing = {this, outer.pool == this ? outer.depth + 1 : 1};
  progress_users_.fetch_add(1);
  if (ProgressSource* s = progress_.load()) fn(*s);
  progress_users_.fetch_sub(1);
  progressing = outer;
}

void OpPool::progress() {
  with_progress([](ProgressSource& s) { s.progress(); });
}

void OpPool::spin(const OpState& op, std::chrono::steady_clock::time_point until) {
  bool polled = false;
  with_progress([&](ProgressSource& s) {
    polled = true;
    s.spin(op.done, until, op.kind == OpKind::kSend || op.kind == OpKind::kRecv);
  });
  if (!polled) {
    while (!op.done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
    }
  }
}

void OpPool::unwatched() {
  with_progress([](ProgressSource& s) { s.unwatched(); });
}

void OpPool::set_progress(ProgressSource* source) { progress_.store(source); }

void OpPool::clear_progress(ProgressSource* source) {
  ProgressSource* expected = source;
  progress_.compare_exchange_strong(expected, nullptr);
  // Sequentially consistent with progress(): a caller that counted itself in before the store
  // above may still be inside `source`.
  int mine = progressing.pool == this ? progressing.depth : 0;
  while (progress_users_.load() > mine) std::this_thread::yield();
}

void OpPool::recycle(OpState* op) {
  std::lock_guard lock(mu_);
  free_.push_back(op);
}

}  // namespace ferry::transport
