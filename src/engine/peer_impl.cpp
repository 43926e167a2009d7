// A peer's operations: validation at the initiator, slicing and striping over the channel's
// lanes, posting, and two-sided messages.
#include <algorithm>
#include <bit>
#include <cstring>

#include "core/log.hpp"
#include "engine/engine_impl.hpp"
#include "transport/registry.hpp"

namespace ferry::detail {

using transport::OpEntry;
using transport::OpKind;
using transport::OpState;

namespace {
const char* op_name(OpKind kind, bool imm) {
  return to_string(transport::operation_kind(kind, imm));
}

// The slices of a batch's transfers, or of an op's entries, cut at `slice_bytes`.
template <typename WithLength>
uint64_t count_slices(std::span<const WithLength> items, uint64_t slice_bytes) {
  uint64_t slices = 0;
  for (const WithLength& x : items) {
    slices += x.length <= slice_bytes ? (x.length > 0 ? 1 : 0)
                                      : transport::slice_count(x.length, slice_bytes);
  }
  return slices;
}

engine::OpClass one_sided_class(const OpState& op) {
  return op.with_imm ? engine::OpClass::kWriteImm : engine::OpClass::kOneSided;
}
}  // namespace

OpState* PeerImpl::start_op(OpKind kind) {
  OpState* op = link->pool->acquire();
  op->kind = kind;
  op->slice_bytes = engine->config.slice_bytes;
  op->spin_ns = engine->config.wait_spin.count();
  op->start_clock();
  return op;
}

Future PeerImpl::finish_now(OpState* op, const Status& status) {
  op->complete_with(status);
  return Future(op);
}

bool PeerImpl::lease_local(OpState* op, const Region* local, uint64_t offset, uint64_t length,
                           uint8_t** addr, uint32_t* region_id, transport::MemoryKinds moves) {
  if (local == nullptr || !local->valid()) return false;
  const RegionRecord& rec = *local->record_;
  if (rec.engine.get() != engine.get()) return false;
  // A batch's entries mostly share a local region: one lease of it serves them all.
  if (!op->leases.empty() && op->leases.back()->id.load(std::memory_order_relaxed) == rec.id) {
    if (!transport::RegionTable::allows_held(*op->leases.back(), rec.id, rec.key, offset, length,
                                             Access::kLocal, addr, moves)) {
      return false;
    }
    *region_id = rec.id;
    return true;
  }
  transport::RegionSlot* slot =
      engine->regions().try_acquire(rec.id, rec.key, offset, length, Access::kLocal, addr, moves);
  if (slot == nullptr) return false;
  op->leases.push_back(slot);
  *region_id = rec.id;
  return true;
}

Status PeerImpl::local_refusal(const Region* local, uint64_t offset, uint64_t length,
                               transport::MemoryKinds moves) const {
  if (local == nullptr || !local->valid()) return {ErrorCode::kInvalidArgument, "no local region"};
  const RegionRecord& rec = *local->record_;
  if (rec.engine.get() != engine.get()) {
    return {ErrorCode::kInvalidArgument, "local region belongs to another engine"};
  }
  return region_refusal(rec.id, rec.key, offset, length, moves);
}

Status PeerImpl::region_refusal(uint32_t id, uint64_t key, uint64_t offset, uint64_t length,
                                transport::MemoryKinds moves) const {
  transport::RegionUse use;
  uint8_t* addr = nullptr;
  Status s = engine->regions().acquire(id, key, offset, length, Access::kLocal, &addr, use, moves);
  // A refused id stays refused (ids are never reused), so this names the same reason.
  if (s.ok()) return {ErrorCode::kRevoked, "local region changed while in use"};
  return {s.code(), "local " + s.message()};
}

Status PeerImpl::take_local(OpState* op, const Region* local, uint64_t offset, uint64_t length,
                            uint8_t** addr, uint32_t* region_id) {
  uint32_t id = 0;
  if (!lease_local(op, local, offset, length, addr, &id))
    return local_refusal(local, offset, length);
  if (region_id != nullptr) *region_id = id;
  return {};
}

Future PeerImpl::post(OpState* op) {
  op->count_in_flight();
  if (lost.load() || !link->pool->mark_posted(op)) {
    if (op->kind == OpKind::kRecv && link->matcher.take_buffered(op)) return finish_now(op, {});
    return finish_now(op, {ErrorCode::kPeerLost, "peer " + address + " is not connected"});
  }
  if (op->kind == OpKind::kRecv) {
    link->matcher.post(op);
  } else {
    channels.at(op->channel).post(op);
  }
  return Future(op);
}

TransportKind PeerImpl::transport() const {
  std::span<const uint8_t> order = route(engine::OpClass::kOneSided);
  return channels.at(order.empty() ? 0 : order[0]).kind();
}

PeerMetrics PeerImpl::metrics() const {
  PeerMetrics m;
  m.engine_id = engine_id;
  m.address = address;
  m.imms_received = link->imms_received.load(std::memory_order_relaxed);
  if (!link->pool->metered()) return m;
  m.transports.resize(channels.size());
  for (std::size_t i = 0; i < channels.size(); ++i) {
    m.transports[i].transport = channels.at(i).kind();
    link->pool->meter(static_cast<uint8_t>(i)).read(m.transports[i]);
  }
  return m;
}

namespace {
// Fallbacks of a batch to a later channel are logged a few at a time: each one is a batch.
constexpr uint32_t kRerouteLogBurst = 4;
constexpr auto kRerouteLogPeriod = std::chrono::seconds(10);

}  // namespace

void PeerImpl::settle() {
  for (std::size_t i = 0; i < channels.size(); ++i) {
    const transport::Channel& c = channels.at(i);
    const transport::TransportEntry* entry = transport::find_transport(c.kind());
    vias_[i] = {c.kind(),
                static_cast<uint8_t>(std::clamp(c.rails(), 1, transport::kMaxRails)),
                entry != nullptr ? entry->memory : transport::MemoryKinds{},
                c.max_slice_bytes(),
                c.shapes_writes(),
                c.lanes()};
  }
}

bool PeerImpl::keys_for(const Descriptor& d, const Via& via, std::span<const uint8_t>* keys) {
  if ((via.memory & transport::memory_bit(d.memory)) == 0) return false;
  for (uint8_t rail = 0; rail < via.rails; ++rail) {
    keys[rail] = d.find_key(via.kind, rail);
    if (keys[rail].empty()) return false;
  }
  return true;
}

void PeerImpl::give_keys(OpState* op, std::size_t index,
                         std::span<const std::span<const uint8_t>> keys) {
  OpEntry& e = op->entries[index];
  if (op->keys.empty() && keys.size() == 1 && keys[0].size() <= transport::kShortKeyBytes) {
    e.remote_key = 0;
    std::memcpy(&e.remote_key, keys[0].data(), keys[0].size());
    e.remote_key_length = static_cast<uint8_t>(keys[0].size());
    return;
  }
  if (op->keys.empty() && index > 0) [[unlikely]] {
    // The first entry whose keys its remote_key cannot hold: those before it move to the store.
    for (std::size_t i = 0; i < index; ++i) {
      uint64_t value = op->entries[i].remote_key;
      std::span<const uint8_t> key{reinterpret_cast<const uint8_t*>(&value),
                                   op->entries[i].remote_key_length};
      op->keys.add({&key, 1});
    }
  }
  op->keys.add(keys);
}

PeerImpl::Refusal PeerImpl::admit(OpState* op, const Transfer& t, Access wanted, const Via& via) {
  const Descriptor* remote = t.remote;
  if (remote == nullptr) return Refusal::kNoRemote;
  if (remote->engine_id != engine_id) return Refusal::kWrongPeer;
  if (remote->incarnation != incarnation) return Refusal::kStale;
  if (!allows(remote->access, wanted)) return Refusal::kNotGranted;
  if (t.remote_offset > remote->length || t.length > remote->length - t.remote_offset) {
    return Refusal::kOutOfBounds;
  }
  if ((via.memory & transport::memory_bit(remote->memory)) == 0) return Refusal::kNoKey;
  // The common case: one rail, a short key held inline. A fixed 8-byte load masked to the key's
  // length (Key::bytes holds more): a copy of a variable length became a `rep movs` costing a
  // third of each entry's admission.
  const Descriptor::Key* inline_key = nullptr;
  if (via.rails == 1 && op->keys.empty()) [[likely]]
    inline_key = remote->key_for(via.kind, 0);
  bool short_key = inline_key != nullptr && inline_key->length <= transport::kShortKeyBytes;
  if (!short_key && !has_keys(*remote, via)) return Refusal::kNoKey;
  uint8_t* local = nullptr;
  uint32_t local_region = 0;
  if (!lease_local(op, t.local, t.local_offset, t.length, &local, &local_region, via.memory)) {
    return Refusal::kLocal;
  }
  if (t.length == 0) return Refusal::kNone;
  uint64_t key = 0;
  uint8_t key_length = 0;
  if (short_key) [[likely]] {
    static_assert(sizeof inline_key->bytes >= sizeof key);
    std::memcpy(&key, inline_key->bytes, sizeof key);
    if (inline_key->length < sizeof key) key &= (uint64_t{1} << (8 * inline_key->length)) - 1;
    key_length = inline_key->length;
  }
  op->entries.push_back(OpEntry{local, t.length, remote->region_id, local_region, key,
                                t.remote_offset, remote->address + t.remote_offset, key_length});
  if (!short_key) [[unlikely]]
    store_keys(op, *remote, via);
  return Refusal::kNone;
}

bool PeerImpl::has_keys(const Descriptor& d, const Via& via) {
  std::span<const uint8_t> keys[transport::kMaxRails];
  return keys_for(d, via, keys);
}

void PeerImpl::store_keys(OpState* op, const Descriptor& d, const Via& via) {
  std::span<const uint8_t> keys[transport::kMaxRails];
  keys_for(d, via, keys);
  give_keys(op, op->entries.size() - 1, {keys, via.rails});
}

bool PeerImpl::reroute(OpState* op, std::span<const Transfer> batch, std::size_t entry,
                       std::span<const uint8_t> order) {
  auto at = std::find(order.begin(), order.end(), op->channel);
  std::span<const uint8_t> keys[transport::kMaxRails];
  for (auto next = at == order.end() ? order.end() : at + 1; next != order.end(); ++next) {
    const Via& to = via(*next);
    bool all = std::all_of(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(entry) + 1,
                           [&](const Transfer& t) { return keys_for(*t.remote, to, keys); });
    if (!all) continue;
    // The entries admitted so far take the new channel's keys (zero-length ones were checked
    // but not added).
    op->keys.clear();
    op->rails = to.rails;
    std::size_t added = 0;
    for (std::size_t i = 0; i < entry; ++i) {
      if (batch[i].length == 0) continue;
      keys_for(*batch[i].remote, to, keys);
      give_keys(op, added++, {keys, to.rails});
    }
    // Cold: a region registered where the better transport could not take it.
    static core::LogLimiter limiter(kRerouteLogBurst, kRerouteLogPeriod);
    core::log_limited(limiter, LogLevel::kInfo, "engine", [&] {
      return std::string(op_name(op->kind, op->with_imm)) + " to peer " +
             std::to_string(engine_id) + " falls back from " +
             std::string(to_string(channels.at(op->channel).kind())) + " to " +
             std::string(to_string(to.kind)) + ": entry " + std::to_string(entry) +
             "'s descriptor has no key for the first";
    });
    op->channel = *next;
    return true;
  }
  return false;
}

Future PeerImpl::refuse(OpState* op, std::size_t entry, const Transfer& t, Refusal why,
                        std::span<const uint8_t> order) {
  const Descriptor* remote = t.remote;
  bool read = op->kind == OpKind::kRead;
  Status s;
  switch (why) {
    case Refusal::kNoRemote:
      s = {ErrorCode::kInvalidArgument, "no remote descriptor"};
      break;
    case Refusal::kWrongPeer:
      s = {ErrorCode::kWrongPeer, "descriptor of engine " + std::to_string(remote->engine_id) +
                                      ", peer is " + std::to_string(engine_id)};
      break;
    case Refusal::kStale:
      s = {ErrorCode::kStaleIncarnation, "descriptor from an earlier incarnation of the peer"};
      break;
    case Refusal::kNotGranted:
      s = {ErrorCode::kPermissionDenied, "region " + std::to_string(remote->region_id) +
                                             " does not grant remote " + (read ? "read" : "write")};
      break;
    case Refusal::kOutOfBounds:
      s = {ErrorCode::kOutOfBounds, "remote offset " + std::to_string(t.remote_offset) +
                                        " + length " + std::to_string(t.length) +
                                        " exceeds region length " + std::to_string(remote->length)};
      break;
    case Refusal::kNoKey: {
      // Each channel that carries it, with the device whose key is missing where it has several.
      std::string kinds;
      bool moved = false;
      for (uint8_t c : order) {
        const Via& v = via(c);
        kinds += (kinds.empty() ? "" : " or ") + std::string(to_string(v.kind));
        for (uint8_t rail = 0; rail < v.rails; ++rail) {
          if (!remote->find_key(v.kind, rail).empty()) continue;
          if (rail > 0) kinds += " device " + std::to_string(rail);
          break;
        }
        moved = moved || (v.memory & transport::memory_bit(remote->memory)) != 0;
      }
      if (kinds.empty()) kinds = "any channel";
      s = {ErrorCode::kUnsupported,
           moved ? "descriptor has no key for " + kinds + " (the peer's channels that carry it)"
                 : "region " + std::to_string(remote->region_id) + " is " +
                       std::string(to_string(remote->memory)) + " memory, which " + kinds +
                       " (the peer's channels that carry it) cannot move"};
      break;
    }
    default:
      s = local_refusal(t.local, t.local_offset, t.length, via(op->channel).memory);
      break;
  }
  return finish_now(op, {s.code(), std::string(op_name(op->kind, op->with_imm)) + " entry " +
                                       std::to_string(entry) + ": " + s.message()});
}

transport::OpState* PeerImpl::start_one_sided(OpKind kind, bool with_imm, uint32_t imm) {
  OpState* op = start_op(kind);
  op->with_imm = with_imm;
  op->imm = imm;
  return op;
}

std::optional<Future> PeerImpl::admit_batch(OpState* op, std::span<const Transfer> batch,
                                            uint64_t& slices, uint64_t& total, bool may_stage) {
  Access wanted = op->kind == OpKind::kRead ? Access::kRemoteRead : Access::kRemoteWrite;
  // Routed by the first entry's memory at both ends; an entry of another kind that the channel
  // cannot move is refused, or moves the batch (reroute), as a missing key does.
  MemoryKind remote_memory =
      !batch.empty() && batch[0].remote != nullptr ? batch[0].remote->memory : MemoryKind::kHost;
  MemoryKind local_memory = !batch.empty() && batch[0].local != nullptr
                                ? batch[0].local->location().kind
                                : MemoryKind::kHost;
  std::span<const uint8_t> order =
      routes.table.order(one_sided_class(*op), local_memory, remote_memory);
  if (order.empty()) [[unlikely]] {
    if (may_stage && local_memory == MemoryKind::kCuda &&
        !routes.table.order(one_sided_class(*op), MemoryKind::kHost, remote_memory).empty()) {
      return stage(op, batch);
    }
    return finish_now(
        op,
        {ErrorCode::kUnsupported,
         std::string(op_name(op->kind, op->with_imm)) +
             ": no channel of the peer carries it from " + std::string(to_string(local_memory)) +
             " to " + std::string(to_string(remote_memory)) + " memory (Peer::routes says why)"});
  }
  op->channel = order[0];
  Via via = this->via(op->channel);  // a copy the loop keeps in registers
  op->rails = via.rails;
  slices = 0;
  total = 0;
  // Kept across the op's reuses: one allocation at most.
  op->entries.reserve(batch.size());
  // Messages are built only on refusal: the success path allocates nothing.
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Transfer& t = batch[i];
    Refusal why = admit(op, t, wanted, via);
    if (why == Refusal::kNoKey && reroute(op, batch, i, order)) [[unlikely]] {
      via = this->via(op->channel);
      why = admit(op, t, wanted, via);
    }
    if (why != Refusal::kNone) [[unlikely]] {
      return refuse(op, i, t, why, order);
    }
    total += t.length;
  }
  // Cut for the channel the batch goes on (a reroute may have changed it).
  if (via.max_slice != 0 && via.max_slice < op->slice_bytes) op->slice_bytes = via.max_slice;
  slices = count_slices(batch, op->slice_bytes);
  return std::nullopt;
}

void PeerImpl::shape(OpState* op, uint64_t total, uint64_t& slices) const {
  if (op->kind != OpKind::kWrite || !via(op->channel).shapes_writes) return;
  uint64_t cut = op->slice_bytes;
  channels.at(op->channel).shape_write(*op, total);
  if (op->slice_bytes != cut)
    slices = count_slices<transport::OpEntry>(op->entries, op->slice_bytes);
}

Future PeerImpl::one_sided(OpKind kind, std::span<const Transfer> batch, bool with_imm,
                           uint32_t imm) {
  OpState* op = start_one_sided(kind, with_imm, imm);
  uint64_t slices = 0, total = 0;
  if (std::optional<Future> refused = admit_batch(op, batch, slices, total, true)) [[unlikely]] {
    return std::move(*refused);
  }
  shape(op, total, slices);
  return plan_and_post(op, slices, total);
}

Future PeerImpl::stage(OpState* op, std::span<const Transfer> batch) {
  auto job = std::make_unique<StagedJob>();
  std::string what = op_name(op->kind, op->with_imm);
  // The remote checks are the chunks' (each a one-sided operation of this peer); the local
  // regions are leased here, for as long as a copy may touch them.
  constexpr transport::MemoryKinds kEither =
      transport::memory_bit(MemoryKind::kHost) | transport::memory_bit(MemoryKind::kCuda);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Transfer& t = batch[i];
    auto refused = [&](const Status& s) {
      return finish_now(op, {s.code(), what + " entry " + std::to_string(i) + ": " + s.message()});
    };
    if (t.remote == nullptr) return refused({ErrorCode::kInvalidArgument, "no remote descriptor"});
    if (t.local == nullptr || !t.local->valid() || t.local->record_->engine.get() != engine.get())
      return refused(local_refusal(t.local, t.local_offset, t.length, kEither));
    if (t.length == 0) continue;
    const RegionRecord& rec = *t.local->record_;
    transport::RegionUse use;
    uint8_t* addr = nullptr;
    Status s = engine->regions().acquire(rec.id, rec.key, t.local_offset, t.length, Access::kLocal,
                                         &addr, use, kEither);
    if (!s.ok()) return refused({s.code(), "local " + s.message()});
    job->leases.push_back(std::move(use));
    auto remote = std::find_if(job->remotes.begin(), job->remotes.end(), [&](const Descriptor& d) {
      return d.engine_id == t.remote->engine_id && d.region_id == t.remote->region_id &&
             d.incarnation == t.remote->incarnation;
    });
    if (remote == job->remotes.end()) remote = job->remotes.insert(remote, *t.remote);
    job->pieces.push_back({reinterpret_cast<uint64_t>(addr), t.length,
                           static_cast<uint32_t>(remote - job->remotes.begin()), t.remote_offset,
                           rec.memory.kind == MemoryKind::kCuda ? rec.memory.device : 0});
    job->total += t.length;
  }
  if (job->pieces.empty()) return finish_now(op, {});
  op->started_ticks = 0;  // unmetered: its chunks are counted on the channels they take
  if (lost.load() || !link->pool->mark_posted(op)) {
    return finish_now(op, {ErrorCode::kPeerLost, "peer " + address + " is not connected"});
  }
  op->add_ref();  // the job's
  job->peer = shared_from_this();
  job->op = op;
  if (!engine->stager().post(std::move(job))) {
    // Shut down meanwhile: the job went with its reference and leases.
    link->pool->fail_posted(op, [](const OpState&) {
      return Status{ErrorCode::kCancelled, "engine shut down"};
    });
    op->release();
  }
  return Future(op);
}

std::shared_ptr<const PreparedImpl> PeerImpl::prepare(OpKind kind, std::span<const Transfer> batch,
                                                      bool with_imm, uint32_t imm) {
  // Checked by the op a write() or read() would post, which then completes unposted.
  OpState* op = start_one_sided(kind, with_imm, imm);
  auto p = std::make_shared<PreparedImpl>();
  if (std::optional<Future> refused = admit_batch(op, batch, p->slices, p->total)) {
    throw Error(refused->status());
  }
  p->peer = shared_from_this();
  p->kind = kind;
  p->with_imm = with_imm;
  p->imm = imm;
  p->channel = op->channel;
  p->slice_bytes = op->slice_bytes;
  p->entries = op->entries;
  p->rails = op->rails;
  p->keys = op->keys;
  // Each local region once, with the span of it the batch touches: a post leases it again.
  for (const Transfer& t : batch) {
    const RegionRecord& rec = *t.local->record_;
    auto it = std::find_if(p->locals.begin(), p->locals.end(),
                           [&](const PreparedImpl::Local& l) { return l.region_id == rec.id; });
    if (it == p->locals.end()) {
      p->locals.push_back({rec.id, rec.key, t.local_offset, t.local_offset + t.length});
    } else {
      it->begin = std::min(it->begin, t.local_offset);
      it->end = std::max(it->end, t.local_offset + t.length);
    }
  }
  finish_now(op, {});  // releases the leases taken while checking
  return p;
}

Future PeerImpl::post_prepared(const PreparedImpl& p) {
  OpState* op = start_one_sided(p.kind, p.with_imm, p.imm);
  transport::RegionTable& regions = engine->regions();
  const transport::MemoryKinds moves = via(p.channel).memory;
  for (const PreparedImpl::Local& l : p.locals) {
    uint8_t* addr = nullptr;
    transport::RegionSlot* slot = regions.try_acquire(l.region_id, l.key, l.begin, l.end - l.begin,
                                                      Access::kLocal, &addr, moves);
    if (slot == nullptr) [[unlikely]] {
      return finish_now(op, region_refusal(l.region_id, l.key, l.begin, l.end - l.begin, moves));
    }
    op->leases.push_back(slot);
  }
  op->channel = p.channel;
  op->slice_bytes = p.slice_bytes;
  // Capacity kept: no allocation.
  op->entries.assign(p.entries.begin(), p.entries.end());
  op->rails = p.rails;
  op->keys = p.keys;  // capacity kept: no allocation once warm
  uint64_t slices = p.slices;
  shape(op, p.total, slices);  // each post anew
  return plan_and_post(op, slices, p.total);
}

Future PeerImpl::plan_and_post(OpState* op, uint64_t slices, uint64_t total) {
  if (slices == 0) return finish_now(op, {});
  // Striping: small operations stay on one stream (chosen in turn), large ones use them all.
  int lanes = via(op->channel).lanes;
  if (total > engine->config.stripe_threshold && lanes > 1) {
    op->lane_count = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(lanes), slices));
    op->reserve_lanes(op->lane_count);
    op->first_lane = 0;
    for (int lane = 0; lane < op->lane_count; ++lane) {
      transport::LaneCursor& c = op->lanes[lane];
      c = {};
      transport::advance(*op, c, static_cast<uint64_t>(lane));
      c.remaining =
          slices / static_cast<uint64_t>(op->lane_count) +
          (static_cast<uint64_t>(lane) < slices % static_cast<uint64_t>(op->lane_count) ? 1 : 0);
    }
  } else {
    // The turn is a hint: a lost update between racing callers costs nothing, an atomic
    // increment costs every small operation.
    unsigned turn = next_lane_.load(std::memory_order_relaxed);
    next_lane_.store(turn + 1, std::memory_order_relaxed);
    op->lane_count = 1;
    op->first_lane = static_cast<int>(turn % static_cast<unsigned>(lanes));
    op->lanes[0] = {0, 0, slices};
  }
  // Published to the completing thread by the posting (pool and lane synchronisation).
  op->pending.store(static_cast<int64_t>(slices), std::memory_order_relaxed);
  op->bytes.store(total, std::memory_order_relaxed);
  return post(op);
}

Future PeerImpl::send(uint64_t tag, const Region& local, uint64_t offset, uint64_t length) {
  OpState* op = start_op(OpKind::kSend);
  op->tag = tag;
  if (length > UINT32_MAX) {
    return finish_now(op, {ErrorCode::kInvalidArgument, "send: messages are limited to 4 GiB - 1"});
  }
  uint8_t* addr = nullptr;
  uint32_t region_id = 0;
  if (Status s = take_local(op, &local, offset, length, &addr, &region_id); !s.ok()) {
    return finish_now(op, {s.code(), "send: " + s.message()});
  }
  std::span<const uint8_t> order = route(engine::OpClass::kMessage);
  if (order.empty()) [[unlikely]] {
    return finish_now(op,
                      {ErrorCode::kUnsupported,
                       "send: no channel of the peer carries messages (Peer::routes says why)"});
  }
  op->channel = order[0];
  op->entries.push_back(OpEntry{.local = addr, .length = length, .local_region = region_id});
  op->slice_bytes = length > 0 ? length : 1;  // one frame per message
  // All messages to a peer travel on one channel (fixed when it connected) and on its stream
  // (TCP) or queue pair (verbs) 0, so messages with one tag arrive in order.
  op->lane_count = 1;
  op->first_lane = 0;
  op->lanes[0] = {0, 0, 1};
  op->pending.store(1);
  op->bytes.store(length);
  return post(op);
}

Future PeerImpl::recv(uint64_t tag, const Region& local, uint64_t offset, uint64_t capacity) {
  OpState* op = start_op(OpKind::kRecv);
  op->tag = tag;
  uint8_t* addr = nullptr;
  uint32_t region_id = 0;
  if (Status s = take_local(op, &local, offset, capacity, &addr, &region_id); !s.ok()) {
    return finish_now(op, {s.code(), "recv: " + s.message()});
  }
  // Counted on the channel that carries messages (a message arrives on it).
  if (std::span<const uint8_t> order = route(engine::OpClass::kMessage); !order.empty()) {
    op->channel = order[0];
  }
  op->entries.push_back(OpEntry{.local = addr, .length = capacity, .local_region = region_id});
  op->pending.store(1);
  return post(op);
}

}  // namespace ferry::detail
