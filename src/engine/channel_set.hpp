// The channels of one peer: one per transport both sides chose, in the accepting side's order.
// Filled while the handshake sets the peer up, before the engine lists the peer anywhere another
// thread can find it, and never changed after; so it is read without a lock.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>

#include "engine/handshake.hpp"
#include "transport/contract.hpp"

namespace ferry::detail {

class ChannelSet {
 public:
  static constexpr std::size_t kMax = engine::kMaxOfferedTransports;

  void add(std::shared_ptr<transport::Channel> channel) {
    slots_.at(count_++) = std::move(channel);
  }
  std::span<const std::shared_ptr<transport::Channel>> all() const {
    return {slots_.data(), count_};
  }
  std::size_t size() const { return count_; }
  transport::Channel& at(std::size_t index) const { return *slots_[index]; }
  transport::Channel* find(TransportKind kind) const {
    for (const auto& c : all()) {
      if (c->kind() == kind) return c.get();
    }
    return nullptr;
  }
  int side_connections() const {
    int n = 0;
    for (const auto& c : all()) n += c->side_connections();
    return n;
  }
  void close(const Status& reason) const {
    for (const auto& c : all()) c->close(reason);
  }
  bool quiesced() const {
    for (const auto& c : all()) {
      if (!c->quiesced()) return false;
    }
    return true;
  }
  void stop_after_reactor() const {
    for (const auto& c : all()) c->stop_after_reactor();
  }
  void cut_off(const uint8_t* base, uint64_t length, const Status& why) const {
    for (const auto& c : all()) c->cut_off(base, length, why);
  }
  void revoking(uint32_t region_id) const {
    for (const auto& c : all()) c->revoking(region_id);
  }

 private:
  std::array<std::shared_ptr<transport::Channel>, kMax> slots_{};
  std::size_t count_ = 0;
};

}  // namespace ferry::detail
