#include "transport/matcher.hpp"

#include <cstdint>
#include <cstring>
#include <string>

namespace ferry::transport {

Matcher::Matcher(std::size_t max_unexpected_bytes, std::shared_ptr<UnexpectedBudget> budget)
    : max_unexpected_(max_unexpected_bytes),
      budget_(budget ? std::move(budget) : std::make_shared<UnexpectedBudget>(SIZE_MAX, SIZE_MAX)) {
}

Matcher::~Matcher() { budget_->release(unexpected_bytes_); }

void Matcher::deliver(OpState* recv, const uint8_t* data, uint64_t length) {
  const OpEntry& dst = recv->entries[0];
  uint64_t n = length < dst.length ? length : dst.length;
  if (n > 0) std::memcpy(dst.local, data, n);
  settle(recv, length);
}

void Matcher::settle(OpState* recv, uint64_t length) {
  const OpEntry& dst = recv->entries[0];
  recv->bytes.store(length < dst.length ? length : dst.length);
  if (length > dst.length) {
    recv->record_error({ErrorCode::kTruncated, "recv tag " + std::to_string(recv->tag) +
                                                   ": message of " + std::to_string(length) +
                                                   " bytes, buffer holds " +
                                                   std::to_string(dst.length)});
  }
}

Status Matcher::truncated_send(uint64_t tag, uint64_t capacity) {
  return {ErrorCode::kTruncated, "send tag " + std::to_string(tag) + ": receiver buffer of " +
                                     std::to_string(capacity) + " bytes"};
}

bool Matcher::take_unexpected_locked(uint64_t tag, bool data_only, Unexpected& out) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (it->tag != tag || (data_only && it->announced)) continue;
    out = std::move(*it);
    unexpected_.erase(it);
    // An announced message's buffer lives on until its bytes are in (release()).
    if (!out.announced) unreserve_locked(out.reserved);
    return true;
  }
  return false;
}

bool Matcher::take_buffered(OpState* recv) {
  Unexpected msg;
  {
    std::lock_guard lock(mu_);
    // The peer is gone: an announced message can no longer be fetched.
    if (!take_unexpected_locked(recv->tag, true, msg)) return false;
  }
  deliver(recv, msg.data.data(), msg.data.size());
  return true;
}

void Matcher::post(OpState* recv) {
  Unexpected msg;
  {
    std::lock_guard lock(mu_);
    if (!take_unexpected_locked(recv->tag, false, msg)) {
      posted_.push_back(recv);
      return;
    }
  }
  if (msg.announced) {
    msg.announced->matched(recv);
    return;
  }
  deliver(recv, msg.data.data(), msg.data.size());
  recv->finish_posted();
}

OpState* Matcher::take_posted_locked(uint64_t tag) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->tag == tag) {
      OpState* op = *it;
      posted_.erase(it);
      return op;
    }
  }
  return nullptr;
}

Status Matcher::reserve_locked(uint64_t tag, uint64_t length) {
  auto refused = [tag](const std::string& why) {
    return Status(ErrorCode::kResourceExhausted,
                  "send tag " + std::to_string(tag) + ": no receive posted and " + why);
  };
  if (unexpected_messages_ >= budget_->max_messages_per_peer()) {
    return refused(std::to_string(unexpected_messages_) + " messages already buffered (limit " +
                   std::to_string(budget_->max_messages_per_peer()) + ")");
  }
  std::size_t room = max_unexpected_ - unexpected_bytes_;  // never above the limit: no overflow
  if (length > room || kUnexpectedOverheadBytes > room - length) {
    return refused(std::to_string(unexpected_bytes_) + " bytes already buffered (limit " +
                   std::to_string(max_unexpected_) + ", each message counts " +
                   std::to_string(kUnexpectedOverheadBytes) + " more than its length)");
  }
  std::size_t c = charge(length);
  if (!budget_->try_reserve(c)) {
    return refused("the engine's buffers for all peers are full (" +
                   std::to_string(budget_->used()) + " bytes, limit " +
                   std::to_string(budget_->max_total_bytes()) + ")");
  }
  unexpected_bytes_ += c;
  ++unexpected_messages_;
  return {};
}

void Matcher::unreserve_locked(std::size_t reserved) {
  unexpected_bytes_ -= reserved;
  --unexpected_messages_;
  budget_->release(reserved);
}

Matcher::Arrival Matcher::arrive(uint64_t tag, uint64_t length) {
  Arrival a;
  std::lock_guard lock(mu_);
  a.recv = take_posted_locked(tag);
  if (a.recv != nullptr) return a;
  // Counted now, so concurrent arrivals respect the limits; the bytes are not here yet.
  a.error = reserve_locked(tag, length);
  return a;
}

void Matcher::commit(uint64_t tag, std::vector<uint8_t> buffer) {
  std::unique_lock lock(mu_);
  if (OpState* recv = take_posted_locked(tag)) {
    unreserve_locked(charge(buffer.size()));
    lock.unlock();
    deliver(recv, buffer.data(), buffer.size());
    recv->finish_posted();
    return;
  }
  std::size_t reserved = charge(buffer.size());
  unexpected_.push_back({tag, std::move(buffer), nullptr, reserved});
}

void Matcher::abandon(uint64_t length) {
  std::lock_guard lock(mu_);
  unreserve_locked(charge(length));
}

OpState* Matcher::announce(uint64_t tag, uint64_t length, std::shared_ptr<Rendezvous> message,
                           Status& error) {
  std::lock_guard lock(mu_);
  if (OpState* recv = take_posted_locked(tag)) return recv;
  error = reserve_locked(tag, length);
  if (!error.ok()) return nullptr;
  unexpected_.push_back({tag, {}, std::move(message), charge(length)});
  return nullptr;
}

void Matcher::release(std::size_t length) {
  std::lock_guard lock(mu_);
  unreserve_locked(charge(length));
}

bool Matcher::fulfil(const Rendezvous* message, std::vector<uint8_t>& data) {
  std::lock_guard lock(mu_);
  for (Unexpected& u : unexpected_) {
    if (u.announced.get() != message) continue;
    u.data = std::move(data);
    u.announced.reset();
    return true;
  }
  return false;
}

Matcher::Usage Matcher::usage() const {
  std::lock_guard lock(mu_);
  return {unexpected_messages_, unexpected_bytes_};
}

std::vector<OpState*> Matcher::take_posted() {
  std::lock_guard lock(mu_);
  std::vector<OpState*> out(posted_.begin(), posted_.end());
  posted_.clear();
  for (auto it = unexpected_.begin(); it != unexpected_.end();) {
    if (it->announced) {
      unreserve_locked(it->reserved);
      it = unexpected_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<OpState*> Matcher::take_posted_into(uint32_t region_id) {
  std::lock_guard lock(mu_);
  std::vector<OpState*> out;
  std::erase_if(posted_, [&](OpState* recv) {
    bool into = recv->entries[0].local_region == region_id;
    if (into) out.push_back(recv);
    return into;
  });
  return out;
}

}  // namespace ferry::transport
