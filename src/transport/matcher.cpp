#include "transport/matcher.hpp"

#include <cstring>
#include <string>

namespace ferry::transport {

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

bool Matcher::take_unexpected_locked(uint64_t tag, std::vector<uint8_t>& out) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (it->tag != tag) continue;
    out = std::move(it->data);
    unexpected_.erase(it);
    unexpected_bytes_ -= out.size();
    return true;
  }
  return false;
}

bool Matcher::take_buffered(OpState* recv) {
  std::vector<uint8_t> msg;
  {
    std::lock_guard lock(mu_);
    if (!take_unexpected_locked(recv->tag, msg)) return false;
  }
  deliver(recv, msg.data(), msg.size());
  return true;
}

void Matcher::post(OpState* recv) {
  std::vector<uint8_t> msg;
  {
    std::lock_guard lock(mu_);
    if (!take_unexpected_locked(recv->tag, msg)) {
      posted_.push_back(recv);
      return;
    }
  }
  deliver(recv, msg.data(), msg.size());
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

Matcher::Arrival Matcher::arrive(uint64_t tag, uint64_t length) {
  Arrival a;
  std::lock_guard lock(mu_);
  a.recv = take_posted_locked(tag);
  if (a.recv != nullptr) return a;
  if (unexpected_bytes_ + length > max_unexpected_) {
    a.error = {ErrorCode::kResourceExhausted,
               "send tag " + std::to_string(tag) + ": no receive posted and " +
                   std::to_string(unexpected_bytes_) + " bytes already buffered (limit " +
                   std::to_string(max_unexpected_) + ")"};
    return a;
  }
  unexpected_bytes_ += length;  // reserved now so concurrent arrivals respect the limit
  a.buffer.resize(length);
  return a;
}

void Matcher::commit(uint64_t tag, std::vector<uint8_t> buffer) {
  std::unique_lock lock(mu_);
  if (OpState* recv = take_posted_locked(tag)) {
    unexpected_bytes_ -= buffer.size();
    lock.unlock();
    deliver(recv, buffer.data(), buffer.size());
    recv->finish_posted();
    return;
  }
  unexpected_.push_back({tag, std::move(buffer)});
}

std::vector<OpState*> Matcher::take_posted() {
  std::lock_guard lock(mu_);
  std::vector<OpState*> out(posted_.begin(), posted_.end());
  posted_.clear();
  return out;
}

}  // namespace ferry::transport
