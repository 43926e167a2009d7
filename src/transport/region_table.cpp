#include "transport/region_table.hpp"

#include <string>
#include <thread>

namespace ferry::transport {

RegionTable::RegionTable() : slots_(new RegionSlot[kMaxRegions]) {}

uint32_t RegionTable::insert(uint8_t* base, uint64_t length, Access access, uint64_t key,
                             int backing_fd, Memory memory) {
  uint32_t index;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else if (next_unused_ < kMaxRegions) {
      index = next_unused_++;
    } else {
      throw Error(
          ErrorCode::kResourceExhausted,
          "register_memory: all " + std::to_string(kMaxRegions - 1) + " region slots in use");
    }
  }
  RegionSlot& slot = slots_[index];
  uint32_t generation = (slot.id.load() >> kSlotBits) + 1;
  uint32_t id = (generation << kSlotBits) | index;
  slot.base = base;
  slot.length = length;
  slot.access = access;
  slot.key = key;
  slot.backing_fd = backing_fd;
  slot.memory = memory;
  slot.id.store(id);
  slot.state.store(RegionSlot::kActive);
  return id;
}

void RegionTable::revoke(uint32_t id, std::chrono::nanoseconds patience,
                         const std::function<void()>& revoked,
                         const std::function<void()>& cut_off) {
  uint32_t index = id & (kMaxRegions - 1);
  RegionSlot& slot = slots_[index];
  if (slot.id.load() != id || slot.state.load() != RegionSlot::kActive) return;
  slot.state.store(RegionSlot::kRevoked);
  revoked();
  // Accesses are usually over within microseconds: yield first, then sleep to spare the CPU.
  auto cut_off_at = std::chrono::steady_clock::now() + patience;
  bool cut = false;
  for (int spins = 0; slot.users.load() != 0; ++spins) {
    if (!cut && std::chrono::steady_clock::now() >= cut_off_at) {
      cut = true;
      cut_off();
    }
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  std::lock_guard lock(mu_);
  free_.push_back(index);
}

Status RegionTable::acquire(uint32_t id, uint64_t key, uint64_t offset, uint64_t length,
                            Access wanted, uint8_t** addr, RegionUse& use, MemoryKinds moves) {
  RegionSlot& slot = slots_[id & (kMaxRegions - 1)];
  slot.users.fetch_add(1);
  RegionUse held(&slot);
  ErrorCode code = verdict(slot, id, key, offset, length, wanted, moves);
  if (code == ErrorCode::kOk) {
    *addr = slot.base + offset;
    use = std::move(held);
    return {};
  }
  std::string region = "region " + std::to_string(id);
  switch (code) {
    case ErrorCode::kUnknownRegion:
      return {ErrorCode::kUnknownRegion, region + " unknown"};
    case ErrorCode::kRevoked:
      return {ErrorCode::kRevoked, region + " was deregistered"};
    case ErrorCode::kWrongKey:
      return {ErrorCode::kWrongKey, region + ": wrong key"};
    case ErrorCode::kPermissionDenied:
      return {ErrorCode::kPermissionDenied, region + " does not grant remote " +
                                                (wanted == Access::kRemoteRead ? "read" : "write")};
    case ErrorCode::kUnsupported:
      return {ErrorCode::kUnsupported, region + " holds " + std::string(to_string(slot.memory.kind)) +
                                           " memory, which this transport does not move"};
    default:
      return {ErrorCode::kOutOfBounds, region + ": offset " + std::to_string(offset) +
                                           " + length " + std::to_string(length) +
                                           " exceeds its length " + std::to_string(slot.length)};
  }
}

}  // namespace ferry::transport
