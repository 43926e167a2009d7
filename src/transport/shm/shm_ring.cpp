#include "transport/shm/shm_ring.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

#include "core/shared_memory.hpp"
#include "core/sys.hpp"
#include "transport/shm/shm_wire.hpp"

namespace ferry::transport::shm {

namespace {

// Before each record: its length and flags.
struct Prefix {
  uint32_t length;
  uint32_t flags;
};
constexpr uint32_t kPad = 1;  // the rest of the ring up to its end is unused: go on at its start

static_assert((kRingBytes & (kRingBytes - 1)) == 0, "a power of two: positions wrap by masking");
static_assert(4 * (sizeof(Prefix) + kMaxRecordBytes) <= kRingBytes,
              "several of the largest records fit, so a producer waits only behind a consumer");

std::size_t aligned(std::size_t n) { return (n + kRecordAlign - 1) & ~(kRecordAlign - 1); }

template <typename T>
std::atomic_ref<T> shared(T& word) {
  return std::atomic_ref<T>(word);
}

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer sees no order through memory mapped twice, as both ends of a ring are in
// in-process tests: each ring file gets one object whose address both ends release and
// acquire, so what a record orders (bytes written before it) is ordered for it too.
void* order_key(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return nullptr;
  static std::mutex mu;
  static std::map<std::pair<dev_t, ino_t>, std::unique_ptr<char>> keys;
  std::lock_guard lock(mu);
  auto& key = keys[{st.st_dev, st.st_ino}];
  if (!key) key = std::make_unique<char>();
  return key.get();
}
void released(void* key) { __tsan_release(key); }
void acquired(void* key) { __tsan_acquire(key); }
#else
void* order_key(int) { return nullptr; }
void released(void*) {}
void acquired(void*) {}
#endif

}  // namespace

// Words both processes change; each on its own cache line, plain integers reached through
// std::atomic_ref (the memory file is the objects' only storage, zeroed by the kernel).
struct Ring::Control {
  alignas(64) uint64_t tail;       // producer: where its next record goes
  alignas(64) uint64_t head;       // consumer: the next record it reads
  alignas(64) uint32_t pollers;    // consumer: threads polling the ring now
  uint32_t bell;                   // 1: the consumer's bell was rung and it did not wake yet
  alignas(64) uint32_t want_room;  // producer: waits for the consumer to free room
};
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free &&
                  std::atomic_ref<uint32_t>::is_always_lock_free,
              "shared between processes: only lock-free atomics work there");

Ring& Ring::operator=(Ring&& other) noexcept {
  if (this != &other) {
    this->~Ring();
    control_ = std::exchange(other.control_, nullptr);
    records_ = std::exchange(other.records_, nullptr);
    order_key_ = other.order_key_;
    file_ = std::move(other.file_);
    position_ = other.position_;
    seen_ = other.seen_;
    shown_ = other.shown_;
  }
  return *this;
}

Ring::~Ring() {
  if (control_ != nullptr) ::munmap(control_, kRingFileBytes);
  control_ = nullptr;
  records_ = nullptr;
}

void Ring::attach(uint8_t* base) {
  static_assert(sizeof(Control) <= kRingControlBytes);
  control_ = reinterpret_cast<Control*>(base);
  records_ = base + kRingControlBytes;
}

Status Ring::create(Ring& out) {
  out = Ring();
  uint8_t* base = nullptr;
  core::Fd file;
  if (Status s = core::map_memory_file("ferry-ring", 0, kRingFileBytes, file, base); !s.ok()) {
    return s;
  }
  out.attach(base);
  out.order_key_ = order_key(file.get());
  out.file_ = std::move(file);
  return {};
}

Status Ring::open(core::Fd file, Ring& out) {
  out = Ring();
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return core::sys_status("fstat (the peer's ring)");
  int seals = ::fcntl(file.get(), F_GET_SEALS);
  if (!S_ISREG(st.st_mode) || static_cast<std::size_t>(st.st_size) != kRingFileBytes || seals < 0 ||
      (seals & F_SEAL_SHRINK) == 0) {
    return {ErrorCode::kProtocol, "shm: the peer's ring is not a sealed memory file of " +
                                      std::to_string(kRingFileBytes) + " bytes"};
  }
  void* p = ::mmap(nullptr, kRingFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.get(), 0);
  if (p == MAP_FAILED) return core::sys_status("mmap (the peer's ring)");
  out.attach(static_cast<uint8_t*>(p));
  // A producer starts where the consumer is (zero for a new ring).
  out.position_ = out.seen_ = shared(out.control_->head).load();
  shared(out.control_->tail).store(out.position_);
  out.order_key_ = order_key(file.get());
  out.file_ = std::move(file);
  return {};
}

bool Ring::write(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  const std::size_t need = aligned(sizeof(Prefix) + a.size() + b.size());
  const std::size_t offset = position_ & (kRingBytes - 1);
  // A record never wraps: the end of the ring is skipped when it does not fit there.
  const std::size_t pad = offset + need > kRingBytes ? kRingBytes - offset : 0;
  auto fits = [&] {
    uint64_t used = position_ - seen_;  // beyond the ring when the consumer published nonsense
    return used <= kRingBytes && pad + need <= kRingBytes - used;
  };
  if (!fits()) {
    seen_ = shared(control_->head).load(std::memory_order_acquire);
    if (!fits()) {
      // Asked before looking again: a consumer that frees room after the look sees the flag.
      shared(control_->want_room).store(1);
      seen_ = shared(control_->head).load();
      if (!fits()) return false;
    }
  }
  if (pad != 0) {
    Prefix p{0, kPad};
    std::memcpy(records_ + offset, &p, sizeof p);
  }
  uint8_t* at = records_ + ((position_ + pad) & (kRingBytes - 1));
  Prefix p{static_cast<uint32_t>(a.size() + b.size()), 0};
  std::memcpy(at, &p, sizeof p);
  if (!a.empty()) std::memcpy(at + sizeof p, a.data(), a.size());
  if (!b.empty()) std::memcpy(at + sizeof p + a.size(), b.data(), b.size());
  position_ += pad + need;
  released(order_key_);
  // Sequentially consistent with wake_needed()'s look at the pollers, against poll_end().
  shared(control_->tail).store(position_);
  return true;
}

bool Ring::wake_needed() {
  return shared(control_->pollers).load() == 0 && shared(control_->bell).exchange(1) == 0;
}

bool Ring::room_freed() const {
  // The consumer moving on frees room before it takes the request, which it does only once it
  // has read all it will (a ring's worth): polling producers fill behind it meanwhile.
  return shared(control_->head).load(std::memory_order_acquire) != seen_ ||
         shared(control_->want_room).load() == 0;
}

Status Ring::peek(std::size_t max_length, const uint8_t*& at, std::size_t& length) {
  length = 0;
  for (;;) {
    if (position_ == seen_) {
      seen_ = shared(control_->tail).load(std::memory_order_acquire);
      uint64_t published = seen_ - position_;
      if (published > kRingBytes || published % kRecordAlign != 0) {
        return {ErrorCode::kProtocol, "shm ring: the peer published position " +
                                          std::to_string(seen_) + " behind " +
                                          std::to_string(position_)};
      }
      if (published == 0) return {};
    }
    const std::size_t offset = position_ & (kRingBytes - 1);
    const uint64_t available = seen_ - position_;
    Prefix p;
    std::memcpy(&p, records_ + offset, sizeof p);
    const uint64_t step =
        p.flags == kPad ? kRingBytes - offset : aligned(sizeof(Prefix) + uint64_t{p.length});
    if ((p.flags != 0 && p.flags != kPad) || step > available || offset + step > kRingBytes ||
        (p.flags == 0 && p.length > max_length)) {
      return {ErrorCode::kProtocol, "shm ring: a record of " + std::to_string(p.length) +
                                        " bytes (flags " + std::to_string(p.flags) + ") at " +
                                        std::to_string(position_) + " does not fit"};
    }
    acquired(order_key_);
    if (p.flags == 0 && p.length == 0) {
      return {ErrorCode::kProtocol, "shm ring: an empty record at " + std::to_string(position_)};
    }
    shown_ = step;
    if (p.flags == 0) {
      at = records_ + offset + sizeof p;
      length = p.length;
      return {};
    }
    release();  // padding
  }
}

void Ring::release() {
  position_ += shown_;
  shown_ = 0;
  // Sequentially consistent with the producer's look at want_room after its own.
  shared(control_->head).store(position_);
}

Status Ring::read(std::span<uint8_t> out, std::size_t& length) {
  const uint8_t* at = nullptr;
  if (Status s = peek(out.size(), at, length); !s.ok() || length == 0) return s;
  std::memcpy(out.data(), at, length);
  release();
  return {};
}

void Ring::woken() { shared(control_->bell).store(0); }

bool Ring::room_wanted() {
  return shared(control_->want_room).load() != 0 && shared(control_->want_room).exchange(0) != 0;
}

bool Ring::pending() const {
  return shared(control_->tail).load() != shared(control_->head).load();
}

void Ring::poll_begin() { shared(control_->pollers).fetch_add(1); }

bool Ring::poll_end() {
  shared(control_->pollers).fetch_sub(1);
  return shared(control_->pollers).load() == 0 && pending() &&
         shared(control_->bell).exchange(1) == 0;
}

Status check_bell(int fd) {
  char target[64] = {};
  std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
  int flags = ::fcntl(fd, F_GETFL);
  if (n < 0 || std::string_view(target, static_cast<std::size_t>(n)) != "anon_inode:[eventfd]" ||
      flags < 0 || (flags & O_NONBLOCK) == 0) {
    return {ErrorCode::kProtocol, "shm: the peer's bell is not a non-blocking eventfd"};
  }
  return {};
}

void ring_bell(int fd) { (void)::eventfd_write(fd, 1); }

}  // namespace ferry::transport::shm
