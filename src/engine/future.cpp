#include <algorithm>
#include <thread>
#include <utility>

#include "core/callback_scope.hpp"
#include "core/fork.hpp"
#include "ferry/ferry.hpp"
#include "transport/op.hpp"

namespace ferry {

Future::Future(const Future& o) : op_(o.op_) {
  if (op_ != nullptr) op_->add_ref();
}
Future::Future(Future&& o) noexcept : op_(std::exchange(o.op_, nullptr)) {}
Future& Future::operator=(const Future& o) {
  if (this != &o) {
    Future copy(o);
    std::swap(op_, copy.op_);
  }
  return *this;
}
Future& Future::operator=(Future&& o) noexcept {
  if (this != &o) {
    Future old(std::move(*this));
    op_ = std::exchange(o.op_, nullptr);
  }
  return *this;
}
Future::~Future() {
  if (op_ == nullptr) return;
  // In a forked child the op is the parent's: its pool's locks and wake-ups are not ours.
  if (core::fork_generation() != op_->pool->born) return;
  if (!op_->done.load(std::memory_order_acquire)) op_->pool->unwatched();
  op_->release();
}

bool Future::test() const {
  if (op_ == nullptr) return false;
  if (op_->done.load(std::memory_order_acquire)) return true;
  core::refuse_in_forked_child(op_->pool->born, "Future::test");
  op_->pool->progress();  // a polling caller drives the completion queue, as wait() does
  return op_->done.load(std::memory_order_acquire);
}

Status Future::status() const {
  if (op_ == nullptr) return {ErrorCode::kInvalidArgument, "empty future"};
  detail::OpState* op = op_;
  if (!op->done.load(std::memory_order_acquire))
    return {ErrorCode::kInProgress, "operation running"};
  return op->status;
}

Status Future::wait(Duration timeout) const {
  if (op_ == nullptr) return {ErrorCode::kInvalidArgument, "empty future"};
  detail::OpState* op = op_;
  if (op->done.load(std::memory_order_acquire)) return op->status;
  if (Status refusal = core::forked_child_refusal(op->pool->born, "Future::wait"); !refusal.ok())
    return refusal;
  // A short spin catches completions that arrive within a few microseconds without a sleep;
  // where the peer's channel lets callers poll (verbs), the spin polls its completion queue.
  // Its clock starts at its first reading: most waits end before one.
  Duration spin = std::min(Duration(op->spin_ns), timeout);
  op->pool->spin(*op, spin);
  if (!op->done.load(std::memory_order_acquire) &&
      !op->sleep_until(Clock::now() + (timeout - spin))) {
    return {ErrorCode::kTimeout, "operation still running after the wait timed out"};
  }
  return op->status;
}

uint64_t Future::bytes() const {
  return op_ == nullptr ? 0 : op_->bytes.load(std::memory_order_acquire);
}

void Future::then(std::function<void(const Status&)> fn) const {
  if (op_ == nullptr || !fn) return;
  detail::OpState* op = op_;
  if (op->done.load(std::memory_order_acquire)) {
    // A callback, though on the caller's thread: what it may do does not hang on timing.
    core::CallbackScope in_callback;
    fn(op->status);
    return;
  }
  core::refuse_in_forked_child(op->pool->born, "Future::then");
  op->on_complete(std::move(fn));
  op->pool->unwatched();  // the callback must run without a waiter polling
}

}  // namespace ferry
