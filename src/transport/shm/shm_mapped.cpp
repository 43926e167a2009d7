// The same-host channel's mapped path: regions whose memory the target's engine allocated (a
// memory file) are lent to the peer, which maps them and copies with memcpy on the posting
// thread. See shm_channel.hpp for the protocol; docs/protocol.md for the records.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/sys.hpp"
#include "transport/shm/shm_channel.hpp"

namespace ferry::transport::shm {

namespace {

// Whether [offset, offset + length) lies in a region of `size` bytes.
bool inside(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

// A descriptor of the region's file that maps only as the region allows: the file itself when
// the peer may write, else the file reopened read-only, which refuses a writable shared mapping
// (and any later mprotect to one). The file of such a region is also sealed against writes
// (core::map_memory_file), so reopening it for writing through /proc gains a peer nothing.
core::Fd file_to_lend(int backing_fd, bool writable, Status& error) {
  if (writable) {
    core::Fd dup(::fcntl(backing_fd, F_DUPFD_CLOEXEC, 0));
    if (!dup.valid()) error = core::sys_status("fcntl F_DUPFD_CLOEXEC (region file)");
    return dup;
  }
  std::string path = "/proc/self/fd/" + std::to_string(backing_fd);
  core::Fd read_only(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!read_only.valid()) error = core::sys_status("open " + path + " read-only");
  return read_only;
}

}  // namespace

std::unique_lock<std::shared_mutex> ShmChannel::lock_mappings() {
  remapping_.store(true, std::memory_order_release);
  std::unique_lock lock(map_mu_);
  remapping_.store(false, std::memory_order_release);
  return lock;
}

bool ShmChannel::post_mapped(OpState* op) {
  if (!any_mapping_.load(std::memory_order_acquire)) return false;
  {
    // Only with nothing of ours on the wire: an earlier write still being pulled, or a read
    // not yet answered, keeps its order with this op.
    std::lock_guard lock(send_mu_);
    if (send_closed_ || queue_head_ != nullptr || credits_ != kRequestsInFlight) return false;
  }
  const bool write = op->kind == OpKind::kWrite;
  // The loop waits to change the mappings: new copies leave it the lock (the records path
  // serves them meanwhile), else overlapping copies from several threads could starve it.
  if (remapping_.load(std::memory_order_acquire)) return false;
  std::shared_lock lock(map_mu_);
  // Entries of a batch mostly share a region: the last one found is tried first.
  Mapping* last = nullptr;
  auto find = [&](const OpEntry& e) -> Mapping* {
    if (last != nullptr && last->region == e.remote_region && last->key == e.remote_key) {
      return last;
    }
    for (Mapping& m : mappings_) {
      if (m.region != 0 && m.region == e.remote_region && m.key == e.remote_key) return &m;
    }
    return nullptr;
  };
  for (const OpEntry& e : op->entries) {
    last = find(e);
    if (last == nullptr || (write && !last->writable) ||
        !inside(e.remote_offset, e.length, last->length)) {
      return false;  // the records path serves it, and the target checks and says why
    }
  }
  op->transport_area<ShmOpArea>().route =
      ShmOpArea::kUnrouted;  // mapped: neither way the chooser measures
  uint64_t now = use_clock_.fetch_add(1, std::memory_order_relaxed);
  for (const OpEntry& e : op->entries) {
    last = find(e);
    if (e.length > 0) {
      uint8_t* remote = last->base + e.remote_offset;
      if (write) {
        pool_->copy(remote, e.local, e.length);
      } else {
        pool_->copy(e.local, remote, e.length);
      }
    }
    if (last->last_used.load(std::memory_order_relaxed) != now) {
      last->last_used.store(now, std::memory_order_relaxed);
    }
  }
  lock.unlock();
  int64_t slices = op->pending.load(std::memory_order_relaxed);
  if (write && op->with_imm) {
    // The notification must follow the bytes, through the target: one record, one answer.
    op->lanes[0].remaining = 0;
    op->finish_slices(slices - 1);
    Status failed;
    {
      std::lock_guard send_lock(send_mu_);
      if (send_closed_) return true;  // the close path fails the op
      failed = enqueue_locked(op);
    }
    if (!failed.ok()) close(failed);
    return true;
  }
  if (op->finish_slices(slices)) op->finish_posted();
  return true;
}

Status ShmChannel::lend(const Entry& e, const RegionUse& use) {
  const RegionSlot* slot = use.slot();
  if (slot->backing_fd < 0 || !allows(slot->access, Access::kRemoteRead) ||
      lent_.size() >= static_cast<std::size_t>(kMaxMappings)) {
    return {};  // nothing to lend (a mapping lets the peer read), or the peer holds enough
  }
  for (const Held& l : lent_) {
    if (l.id == e.region) return {};
  }
  // A use of its own, held until the peer gave the mapping back.
  uint8_t* base = nullptr;
  RegionUse held;
  if (!host_.regions().acquire(e.region, slot->key, 0, 0, Access::kRemoteRead, &base, held).ok()) {
    return {};
  }
  const bool writable = allows(slot->access, Access::kRemoteWrite);
  Status error;
  core::Fd file = file_to_lend(slot->backing_fd, writable, error);
  if (!file.valid()) return {};  // the records path still serves the peer
  Header h;
  h.type = Record::kMap;
  h.count = 1;
  h.flags = writable ? kFlagWritable : 0;
  Entry m;
  m.region = e.region;
  m.key = e.key;
  m.length = slot->length;
  lent_.push_back({e.region, std::move(held), base, slot->length});
  return send_control(h, &m, std::move(file));
}

Status ShmChannel::on_map(const View& r, core::Fd file) {
  Entry e = r.entry(0);
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return core::sys_status("fstat (a lent region's file)");
  if (e.region == 0 || static_cast<uint64_t>(st.st_size) < e.length) {
    return {ErrorCode::kProtocol, "shm map: region " + std::to_string(e.region) + " of " +
                                      std::to_string(e.length) + " bytes in a file of " +
                                      std::to_string(st.st_size)};
  }
  Header unmapped;
  unmapped.type = Record::kUnmapped;
  // A file that may shrink under the mapping would kill a copy with SIGBUS: only a memory
  // file sealed against it is mapped, anything else is declined (the records path serves it).
  int seals = ::fcntl(file.get(), F_GET_SEALS);
  if (!S_ISREG(st.st_mode) || seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    unmapped.tag = e.region;
    return send_control(unmapped);
  }
  const bool writable = (r.header.flags & kFlagWritable) != 0;
  std::unique_lock lock = lock_mappings();
  Mapping* slot = nullptr;
  Mapping* oldest = nullptr;
  for (Mapping& m : mappings_) {
    if (m.region == e.region) {
      return {ErrorCode::kProtocol, "shm map: region " + std::to_string(e.region) + " twice"};
    }
    if (m.region == 0) {
      if (slot == nullptr) slot = &m;
    } else if (oldest == nullptr || m.last_used.load() < oldest->last_used.load()) {
      oldest = &m;
    }
  }
  if (slot == nullptr) {  // full: the least recently used mapping makes room
    ::munmap(oldest->base, oldest->mapped);
    unmapped.tag = oldest->region;
    oldest->region = 0;
    slot = oldest;
    if (Status s = send_control(unmapped); !s.ok()) return s;
  }
  void* base = ::mmap(nullptr, static_cast<std::size_t>(st.st_size),
                      PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, file.get(), 0);
  if (base == MAP_FAILED) {  // declined: the records path serves this region
    unmapped.tag = e.region;
    return send_control(unmapped);
  }
  slot->key = e.key;
  slot->base = static_cast<uint8_t*>(base);
  slot->mapped = static_cast<std::size_t>(st.st_size);
  slot->length = e.length;
  slot->writable = writable;
  slot->last_used.store(use_clock_.load());
  slot->region = e.region;
  any_mapping_.store(true, std::memory_order_release);
  return {};
}

Status ShmChannel::on_revoke(const View& r) {
  std::unique_lock lock = lock_mappings();  // waits for copies into the mapping to end
  for (Mapping& m : mappings_) {
    if (m.region != 0 && m.region == r.header.tag) {
      ::munmap(m.base, m.mapped);
      m.region = 0;
      lock.unlock();
      Header unmapped;
      unmapped.type = Record::kUnmapped;
      unmapped.tag = r.header.tag;
      return send_control(unmapped);
    }
  }
  return {};  // declined or evicted: the peer was told already
}

Status ShmChannel::on_unmapped(const View& r) {
  for (Held& l : lent_) {
    if (l.id == r.header.tag) {
      l = std::move(lent_.back());
      lent_.pop_back();  // its use goes: a deregistration waiting for it goes on
      return {};
    }
  }
  return {ErrorCode::kProtocol,
          "shm: region " + std::to_string(r.header.tag) + " given back, which was not lent"};
}

void ShmChannel::revoking(uint32_t region_id) {
  if (latch_.closing()) return;
  host_.reactor().post(loop_, [self = shared_from_this(), region_id] {
    self->polling_.lock();
    bool lent = !self->stopped_ && std::any_of(self->lent_.begin(), self->lent_.end(),
                                               [&](const Held& l) { return l.id == region_id; });
    self->polling_.unlock();
    if (!lent) return;
    Header h;
    h.type = Record::kRevoke;
    h.tag = region_id;
    if (Status s = self->send_control(h); !s.ok()) self->close(s);
  });
}

void ShmChannel::unmap_all() {
  std::unique_lock lock = lock_mappings();
  for (Mapping& m : mappings_) {
    if (m.region != 0) ::munmap(m.base, m.mapped);
    m.region = 0;
  }
  any_mapping_.store(false);
}

}  // namespace ferry::transport::shm
