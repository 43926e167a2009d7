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
    if (!out.announced) unexpected_bytes_ -= out.reserved;
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

Matcher::Arrival Matcher::arrive(uint64_t tag, uint64_t length) {
  Arrival a;
  std::lock_guard lock(mu_);
  a.recv = take_posted_locked(tag);
  if (a.recv != nullptr) return a;
  if (length > max_unexpected_ - unexpected_bytes_) {  // never above the limit: no overflow
    a.error = refusal(tag);
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
  std::size_t size = buffer.size();
  unexpected_.push_back({tag, std::move(buffer), nullptr, size});
}

OpState* Matcher::announce(uint64_t tag, uint64_t length, std::shared_ptr<Rendezvous> message,
                           Status& error) {
  std::lock_guard lock(mu_);
  if (OpState* recv = take_posted_locked(tag)) return recv;
  if (length > max_unexpected_ - unexpected_bytes_) {  // never above the limit: no overflow
    error = refusal(tag);
    return nullptr;
  }
  unexpected_bytes_ += length;
  unexpected_.push_back({tag, {}, std::move(message), length});
  return nullptr;
}

void Matcher::release(std::size_t bytes) {
  std::lock_guard lock(mu_);
  unexpected_bytes_ -= bytes;
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

Status Matcher::refusal(uint64_t tag) const {
  return {ErrorCode::kResourceExhausted,
          "send tag " + std::to_string(tag) + ": no receive posted and " +
              std::to_string(unexpected_bytes_) + " bytes already buffered (limit " +
              std::to_string(max_unexpected_) + ")"};
}

std::vector<OpState*> Matcher::take_posted() {
  std::lock_guard lock(mu_);
  std::vector<OpState*> out(posted_.begin(), posted_.end());
  posted_.clear();
  for (auto it = unexpected_.begin(); it != unexpected_.end();) {
    if (it->announced) {
      unexpected_bytes_ -= it->reserved;
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
