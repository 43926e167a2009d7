// The registry of an engine's regions, read lock-free by progress threads on every access.
//
// Slots are preallocated and never freed, so a reader may touch a slot whose region is being
// deregistered: it raises `users`, then checks state and id. Deregistration first marks the slot
// revoked and then waits for `users` to drain, so once it returns no access is in progress and
// none can start (the classic store-then-load handshake, all seq_cst).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/types.hpp"

namespace ferry::transport {

// A set of memory kinds (bit 1 << MemoryKind): what a transport moves on both ends, and what a
// caller of the region table can reach.
using MemoryKinds = uint8_t;
constexpr MemoryKinds memory_bit(MemoryKind kind) {
  return static_cast<MemoryKinds>(1U << static_cast<unsigned>(kind));
}
constexpr MemoryKinds kHostMemory = memory_bit(MemoryKind::kHost);

struct RegionSlot {
  enum State : uint8_t { kFree = 0, kActive = 1, kRevoked = 2 };
  std::atomic<uint32_t> id{0};
  std::atomic<uint8_t> state{kFree};
  std::atomic<int64_t> users{0};
  // Written before state becomes kActive, read only after a successful acquire.
  uint8_t* base = nullptr;
  uint64_t length = 0;
  Access access = Access::kLocal;
  uint64_t key = 0;
  // The memory file holding exactly this region (Engine::allocate), which a same-host transport
  // may lend to a peer to map; -1 for memory the engine did not allocate.
  int backing_fd = -1;
  // A slot of CUDA memory refuses every access from a caller that moves host memory only (the
  // CPU would dereference a device address), whatever a peer asks for.
  Memory memory;  // its kind, and its device for CUDA memory
};

// The outcome of validating one access; holds a use of the region until released.
class RegionUse {
 public:
  RegionUse() = default;
  explicit RegionUse(RegionSlot* slot) : slot_(slot) {}
  RegionUse(RegionUse&& o) noexcept : slot_(o.slot_) { o.slot_ = nullptr; }
  RegionUse& operator=(RegionUse&& o) noexcept {
    if (this != &o) {
      release();
      slot_ = o.slot_;
      o.slot_ = nullptr;
    }
    return *this;
  }
  RegionUse(const RegionUse&) = delete;
  RegionUse& operator=(const RegionUse&) = delete;
  ~RegionUse() { release(); }
  void release() {
    if (slot_ != nullptr) slot_->users.fetch_sub(1);
    slot_ = nullptr;
  }
  const RegionSlot* slot() const { return slot_; }
  // Hands the use to the caller, who must call RegionTable::release(slot) later.
  RegionSlot* detach() {
    RegionSlot* s = slot_;
    slot_ = nullptr;
    return s;
  }
  bool valid() const { return slot_ != nullptr; }

 private:
  RegionSlot* slot_ = nullptr;
};

class RegionTable {
 public:
  // Slot index bits in a region id; the rest counts reuses of the slot, so a stale id fails.
  static constexpr uint32_t kSlotBits = 16;
  static constexpr uint32_t kMaxRegions = 1u << kSlotBits;

  RegionTable();

  // Returns the new region's id, or throws kResourceExhausted.
  uint32_t insert(uint8_t* base, uint64_t length, Access access, uint64_t key, int backing_fd = -1,
                  Memory memory = Memory::host());
  // Revokes the region and waits until no access to it is in progress. `revoked` runs once the
  // region refuses new accesses, before the wait: holders that keep a use until asked (a peer's
  // mapping) are asked then. If accesses are still going after `patience`, `cut_off` runs once
  // (on this thread) and must make their holders let go soon; the wait then goes on until they
  // did. Both run on this thread.
  void revoke(uint32_t id, std::chrono::nanoseconds patience, const std::function<void()>& revoked,
              const std::function<void()>& cut_off);

  // Validates an access of [offset, offset + length) wanting `wanted` rights by a caller that
  // reaches the memory kinds `moves` and, on success, stores the address in `*addr` and the use
  // in `use`.
  Status acquire(uint32_t id, uint64_t key, uint64_t offset, uint64_t length, Access wanted,
                 uint8_t** addr, RegionUse& use, MemoryKinds moves = kHostMemory);
  // The same check for the data path: on success holds a use of the region (give it back with
  // release()) and returns its slot; else returns nullptr, and acquire() tells why.
  RegionSlot* try_acquire(uint32_t id, uint64_t key, uint64_t offset, uint64_t length,
                          Access wanted, uint8_t** addr, MemoryKinds moves = kHostMemory) {
    RegionSlot& slot = slots_[id & (kMaxRegions - 1)];
    slot.users.fetch_add(1);
    if (verdict(slot, id, key, offset, length, wanted, moves) != ErrorCode::kOk) {
      slot.users.fetch_sub(1);
      return nullptr;
    }
    *addr = slot.base + offset;
    return &slot;
  }
  static void release(RegionSlot* slot) { slot->users.fetch_sub(1); }
  // try_acquire() for a caller that already holds a use of `slot` (a batch's next entry in the
  // same region): the same checks, no second use.
  static bool allows_held(const RegionSlot& slot, uint32_t id, uint64_t key, uint64_t offset,
                          uint64_t length, Access wanted, uint8_t** addr,
                          MemoryKinds moves = kHostMemory) {
    if (verdict(slot, id, key, offset, length, wanted, moves) != ErrorCode::kOk) return false;
    *addr = slot.base + offset;
    return true;
  }

 private:
  // The first reason the access is refused, or kOk; the caller holds a use of `slot`.
  static ErrorCode verdict(const RegionSlot& slot, uint32_t id, uint64_t key, uint64_t offset,
                           uint64_t length, Access wanted, MemoryKinds moves) {
    // Slot 0 is never used: its id 0 would match id 0.
    if ((id & (kMaxRegions - 1)) == 0 || slot.id.load() != id) return ErrorCode::kUnknownRegion;
    if (slot.state.load() != RegionSlot::kActive) return ErrorCode::kRevoked;
    if (slot.key != key) return ErrorCode::kWrongKey;
    if (!allows(slot.access, wanted)) return ErrorCode::kPermissionDenied;
    if (offset > slot.length || length > slot.length - offset) return ErrorCode::kOutOfBounds;
    if ((moves & memory_bit(slot.memory.kind)) == 0) return ErrorCode::kUnsupported;
    return ErrorCode::kOk;
  }

  std::unique_ptr<RegionSlot[]> slots_;
  std::mutex mu_;  // guards free_ and next_unused_ (registration only, never the data path)
  std::vector<uint32_t> free_;
  uint32_t next_unused_ = 1;  // slot 0 is never used, so id 0 is never valid
};

}  // namespace ferry::transport
