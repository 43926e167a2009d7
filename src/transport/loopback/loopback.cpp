#include "transport/loopback/loopback.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>

#include "core/bytes.hpp"

namespace ferry::transport::loopback {

Faults& faults() {
  static Faults f;
  return f;
}

namespace {
// Every loopback channel of the process, by endpoint number: where connect() finds its peer.
struct Fabric {
  std::mutex mu;
  std::unordered_map<uint64_t, std::weak_ptr<LoopbackChannel>> channels;
  uint64_t next = 1;
};
Fabric& fabric() {
  static auto* f = new Fabric;  // never destroyed: channels may outlive static destruction
  return *f;
}
}  // namespace

LoopbackChannel::LoopbackChannel(ChannelArgs args, int rails, std::size_t key_bytes)
    : host_(args.host),
      link_(std::move(args.link)),
      loop_(args.host.reactor().pick_loop()),
      rails_(rails),
      key_bytes_(key_bytes),
      latch_(std::move(args.on_closed)) {}

LoopbackChannel::~LoopbackChannel() {
  std::lock_guard lock(fabric().mu);
  fabric().channels.erase(endpoint_);
}

void LoopbackChannel::publish() {
  Fabric& f = fabric();
  std::lock_guard lock(f.mu);
  endpoint_ = f.next++;
  f.channels[endpoint_] = weak_from_this();
}

std::vector<uint8_t> LoopbackChannel::local_address() const {
  std::vector<uint8_t> out;
  core::ByteWriter w(out);
  w.u32(static_cast<uint32_t>(::getpid()));
  w.u64(endpoint_);
  w.u8(static_cast<uint8_t>(rails_));
  return out;
}

Status LoopbackChannel::connect(std::span<const uint8_t> remote) {
  core::ByteReader r(remote);
  uint32_t pid = r.u32();
  uint64_t endpoint = r.u64();
  int rails = r.u8();
  if (!r.ok() || !r.at_end() || rails < 1 || rails > kMaxRails) {
    return {ErrorCode::kProtocol, "loopback address: malformed"};
  }
  if (faults().refuse_connect.load()) {
    return {ErrorCode::kConnectFailed, "loopback: connection refused (injected fault)"};
  }
  if (pid != static_cast<uint32_t>(::getpid())) {
    return {ErrorCode::kUnsupported,
            "loopback reaches only its own process; the peer is process " + std::to_string(pid)};
  }
  std::lock_guard lock(fabric().mu);
  auto it = fabric().channels.find(endpoint);
  if (it == fabric().channels.end() || it->second.expired()) {
    return {ErrorCode::kConnectFailed,
            "loopback: no channel " + std::to_string(endpoint) + " in this process"};
  }
  peer_ = it->second;
  rails_ = std::min(rails_, rails);
  return {};
}

bool LoopbackChannel::enter() {
  users_.fetch_add(1);
  if (latch_.closing()) {
    leave();
    return false;
  }
  return true;
}

void LoopbackChannel::leave() {
  if (users_.fetch_sub(1) == 1) latch_.report();
}

PostResult LoopbackChannel::post(OpState* op) {
  if (!enter()) return PostResult::kAccepted;  // closing: the close path fails the op
  // One task per operation (a test transport may allocate on its data path).
  host_.reactor().post(loop_, [self = shared_from_this(), op] {
    self->run(op);
    self->leave();
  });
  return PostResult::kAccepted;
}

void LoopbackChannel::close(const Status& reason) {
  if (!latch_.begin(reason)) return;
  leave();  // the channel's own use: the last task to finish reports it closed
}

void LoopbackChannel::stop_after_reactor() {
  // Tasks the stopped reactor never ran touched nothing: the ops they hold fail with the peer.
  latch_.report();
}

void LoopbackChannel::run(OpState* op) {
  if (latch_.closing()) return;  // the close path fails it: nothing was touched
  if (int64_t us = faults().delay_us.load(); us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    if (latch_.closing()) return;
  }
  std::shared_ptr<LoopbackChannel> to = peer_.lock();
  if (!to || !to->enter()) {
    close({ErrorCode::kPeerLost, "loopback: the peer's channel closed"});
    return;
  }
  Slice outcome = Slice::kDone;
  bool failed = false;
  // Every entry's key on every rail, in the op's store unless each is its entry's 8 bytes.
  bool stored = rails_ > 1 || key_bytes_ > kShortKeyBytes;
  std::size_t keys = stored ? op->entries.size() * static_cast<std::size_t>(rails_) : 0;
  if (op->kind != OpKind::kSend && (op->rails != rails_ || op->keys.size() != keys)) {
    // The engine must hand over every rail's key of every entry; checked, not trusted.
    failed = true;
    op->record_error({ErrorCode::kProtocol, "loopback: the operation lacks keys of its " +
                                                std::to_string(rails_) + " rails"});
  } else if (op->kind == OpKind::kSend) {
    send_message(*op, *to);
  } else {
    for (int lane = 0; lane < op->lane_count && outcome != Slice::kBroke; ++lane) {
      LaneCursor c = op->lanes[lane];
      while (c.remaining > 0 && outcome != Slice::kBroke) {
        const OpEntry& e = op->entries[c.entry];
        uint64_t length = std::min<uint64_t>(e.length - c.offset, op->slice_bytes);
        Slice s = copy_slice(*op, (op->first_lane + lane) % lanes(), c.entry, c.offset, length, *to,
                             failed);
        if (s != Slice::kDone) outcome = s;
        advance(*op, c, static_cast<uint64_t>(op->lane_count));  // lanes take turns
        --c.remaining;
      }
    }
  }
  // A dropped slice leaves the op posted: closing the peer fails it.
  if (outcome == Slice::kDone) {
    // Every byte landed: the notification comes after them, as RC and TCP order it.
    if (op->kind == OpKind::kWrite && op->with_imm && !failed) {
      to->host_.deliver_imm(*to->link_, op->imm);
    }
    if (op->finish_slices(op->pending.load())) op->finish_posted();
  }
  to->leave();
}

LoopbackChannel::Slice LoopbackChannel::copy_slice(OpState& op, int lane, std::size_t index,
                                                   uint64_t offset, uint64_t length,
                                                   LoopbackChannel& to, bool& failed) {
  Faults& f = faults();
  uint64_t n = f.slices.fetch_add(1) + 1;
  if (uint64_t at = f.break_at_slice.load(); at != 0 && n == at) {
    close({ErrorCode::kPeerLost,
           "loopback: a lane broke at slice " + std::to_string(n) + " (injected fault)"});
    return Slice::kBroke;
  }
  if (uint64_t at = f.drop_slice.load(); at != 0 && n == at) return Slice::kDropped;
  const OpEntry& e = op.entries[index];
  bool write = op.kind == OpKind::kWrite;
  Status s;
  if (uint64_t every = f.fail_every_slice.load(); every != 0 && n % every == 0) {
    s = {ErrorCode::kSystem, "slice " + std::to_string(n) + " failed (injected fault)"};
  } else {
    uint8_t* addr = nullptr;
    RegionUse use;             // held while copying: a deregistration waits for it
    int rail = lane % rails_;  // lanes alternate between the rails
    std::optional<uint64_t> key =
        LoopbackTransport::table_key(op.remote_key(index, rail), rail, to.key_bytes_);
    s = key ? to.host_.regions().acquire(e.remote_region, *key, e.remote_offset + offset, length,
                                         write ? Access::kRemoteWrite : Access::kRemoteRead, &addr,
                                         use)
            : Status(ErrorCode::kWrongKey, "loopback: region " + std::to_string(e.remote_region) +
                                               ": not a key of this transport on rail " +
                                               std::to_string(rail));
    if (s.ok() && write) std::memcpy(addr, e.local + offset, length);
    if (s.ok() && !write) std::memcpy(e.local + offset, addr, length);
  }
  if (!s.ok()) {
    failed = true;
    op.record_error({s.code(), std::string(write ? "write" : "read") + " entry " +
                                   std::to_string(index) + ": " + s.message()});
  }
  return Slice::kDone;
}

void LoopbackChannel::send_message(OpState& op, LoopbackChannel& to) {
  const OpEntry& src = op.entries[0];
  Matcher& matcher = to.link_->matcher;
  Matcher::Arrival a = matcher.arrive(op.tag, src.length);
  if (!a.error.ok()) {
    op.record_error(a.error);
    return;
  }
  // Taken by a receive or buffered: counted on both ends, as every transport does.
  messages.sent.fetch_add(1, std::memory_order_relaxed);
  to.messages.received.fetch_add(1, std::memory_order_relaxed);
  if (a.recv != nullptr) {
    uint64_t capacity = a.recv->entries[0].length;
    Matcher::deliver(a.recv, src.local, src.length);
    a.recv->finish_posted();
    if (src.length > capacity) op.record_error(Matcher::truncated_send(op.tag, capacity));
  } else {
    matcher.commit(op.tag, std::vector<uint8_t>(src.local, src.local + src.length));
  }
}

void LoopbackTransport::make_key(uint64_t table_key, int rail, std::span<uint8_t> key) {
  uint64_t flipped = table_key ^ key_flip(rail);
  uint8_t first[sizeof flipped];
  std::memcpy(first, &flipped, sizeof flipped);
  for (std::size_t i = 0; i < key.size(); ++i) {
    key[i] = static_cast<uint8_t>(first[i % sizeof first] + (i / sizeof first) * 0x3b);
  }
}

std::optional<uint64_t> LoopbackTransport::table_key(std::span<const uint8_t> key, int rail,
                                                     std::size_t length) {
  if (key.size() != length || length < sizeof(uint64_t)) return std::nullopt;
  uint64_t flipped = 0;
  std::memcpy(&flipped, key.data(), sizeof flipped);
  uint64_t table = flipped ^ key_flip(rail);
  uint8_t expected[kMaxKeyBytes];
  make_key(table, rail, {expected, length});
  if (std::memcmp(expected, key.data(), length) != 0) return std::nullopt;
  return table;
}

Status LoopbackTransport::register_region(uint32_t, uint8_t*, uint64_t, Access, uint64_t table_key,
                                          KeySink& keys) {
  uint8_t key[kMaxKeyBytes];
  for (int rail = 0; rail < rails_; ++rail) {
    make_key(table_key, rail, {key, key_bytes_});
    if (Status s = keys.add(static_cast<uint8_t>(rail), {key, key_bytes_}); !s.ok()) return s;
  }
  return {};
}

Status LoopbackTransport::make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) {
  auto channel = std::make_shared<LoopbackChannel>(std::move(args), rails_, key_bytes_);
  channel->publish();
  out = std::move(channel);
  return {};
}

}  // namespace ferry::transport::loopback
