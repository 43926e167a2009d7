#include "engine/engine_impl.hpp"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/base64.hpp"
#include "core/callback_scope.hpp"
#include "core/crypto.hpp"
#include "core/cuda.hpp"
#include "core/cycle_clock.hpp"
#include "core/log.hpp"
#include "core/sys.hpp"
#include "transport/registry.hpp"

namespace ferry::detail {

using transport::OpState;

namespace {
// How often liveness checks peers and pings idle ones (each is pinged after a quarter of
// peer_timeout of quiet): the check reads a clock and a few atomics per peer.
constexpr Duration kLivenessPeriod = std::chrono::milliseconds(100);

// "peer 42 at 127.0.0.1:5000 (same host): write/read over shm (shm: chosen (rank 0); ...)".
std::string describe_routes(const PeerImpl& peer) {
  std::string out = "peer " + std::to_string(peer.engine_id) + " at " + peer.address + " (" +
                    std::string(to_string(peer.reach)) + ", " +
                    (peer.incoming ? "connected to us" : "we connected") + "):";
  const char* separator = " ";
  for (const RouteInfo& r : peer.routes.info) {
    if (r.local != MemoryKind::kHost || r.remote != MemoryKind::kHost) continue;
    out += separator + r.operations + " over " +
           (r.transport ? std::string(to_string(*r.transport)) : std::string("nothing")) + " (" +
           r.why + ")";
    separator = "; ";
  }
  return out;
}

uint64_t nonzero_random() {
  uint64_t v;
  do v = core::random_u64();
  while (v == 0);
  return v;
}

std::vector<core::PublicKey> decode_trusted_keys(const std::vector<std::string>& listed) {
  std::vector<core::PublicKey> out;
  for (const std::string& text : listed) {
    auto bytes = core::base64url_decode(text);
    if (!bytes || bytes->size() != core::PublicKey{}.size()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "config: trusted_keys: '" + text +
                      "' is not a public key (Engine::public_key(): 43 base64url characters)");
    }
    core::PublicKey& key = out.emplace_back();
    std::copy(bytes->begin(), bytes->end(), key.begin());
  }
  return out;
}
}  // namespace

std::string public_key_text(const core::PublicKey& key) { return core::base64url_encode(key); }

Status EngineImpl::check_trusted(const core::PublicKey& key) const {
  if (trusted_keys.empty() ||
      std::find(trusted_keys.begin(), trusted_keys.end(), key) != trusted_keys.end()) {
    return {};
  }
  return {ErrorCode::kAuthFailed,
          "engine key " + public_key_text(key) + " is not among this engine's trusted_keys"};
}

EngineImpl::EngineImpl(const Config& cfg)
    : config([&] {
        Config c = apply_environment(cfg);
        validate(c);
        return c;
      }()),
      identity_key(config.identity_file.empty()
                       ? core::SigningKey::generate()
                       : core::SigningKey::load_or_create(config.identity_file)),
      id(engine::engine_id_of(identity_key.public_key())),
      incarnation(nonzero_random()),
      trusted_keys(decode_trusted_keys(config.trusted_keys)) {
  if (config.metrics) core::CycleClock::calibrate();
  for (TransportKind kind : config.transports) {
    if (transport_of(kind) != nullptr) continue;  // listed twice
    const transport::TransportEntry* entry = transport::find_transport(kind);
    if (entry == nullptr) {
      throw Error(ErrorCode::kUnsupported, "config: transport " + std::string(to_string(kind)) +
                                               " is not built into this version");
    }
    std::string why;
    if (auto t = entry->open(config, why)) {
      transports_.push_back(std::move(t));
    } else {
      core::log(LogLevel::kInfo, "engine", [&] {
        return "transport " + std::string(to_string(kind)) + " is not usable here: " + why;
      });
      unusable_.emplace_back(kind, why);
    }
  }
  warn_about(config);
  if (transports_.empty()) {
    std::string why;
    for (const auto& [kind, reason] : unusable_)
      why += "; " + std::string(to_string(kind)) + ": " + reason;
    throw Error(ErrorCode::kUnsupported,
                "config: none of the configured transports is usable here (" + why.substr(2) + ")");
  }
  reactor_ = std::make_unique<core::Reactor>(config.progress_threads, config.busy_poll);
  core::Fd socket;
  if (config.listen) {
    core::HostPort where{config.listen_host, config.listen_port};
    core::throw_if_error(core::listen_tcp(where, socket, port));
    for (auto& host : core::reachable_hosts(config.listen_host))
      advertised.push_back(core::HostPort{std::move(host), port}.to_string());
  }
  listener_ = std::make_unique<Listener>(*this, std::move(socket));
  connect_cancel_ = core::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!connect_cancel_.valid()) throw Error(core::sys_status("eventfd"));
}

EngineImpl::~EngineImpl() {
  shutdown();
  // After the queue pairs the teardown thread may still be destroying: a device closes last.
  auto transports = std::make_shared<decltype(transports_)>(std::move(transports_));
  teardown_.post("closing the transports", [transports] { transports->clear(); });
}

void EngineImpl::start() {
  listener_->start();
  liveness_ = std::make_unique<core::Periodic>(kLivenessPeriod, [this] { housekeeping(); });
}

void EngineImpl::deliver_imm(transport::PeerLink& link, uint32_t imm) {
  link.imms_received.fetch_add(1, std::memory_order_relaxed);
  auto peer = std::static_pointer_cast<PeerImpl>(link.owner.lock());
  ImmEvent event{link.remote_engine_id, imm, peer ? Peer(peer) : Peer()};
  std::unique_lock lock(imm_mu_);
  if (imm_callback_) {
    auto fn = imm_callback_;
    lock.unlock();
    core::CallbackScope in_callback;
    fn(event);
    return;
  }
  if (peer && (peer->queued_imms.load() >= config.max_queued_imms ||
               imms_.size() >= config.max_queued_imms_total)) {
    lock.unlock();
    peer->close({ErrorCode::kResourceExhausted,
                 "write_with_imm notifications from " + peer->address +
                     " are not being taken: " + std::to_string(peer->queued_imms.load()) +
                     " of this peer and " + std::to_string(imms_.size()) +
                     " in all wait for next_imm() (max_queued_imms " +
                     std::to_string(config.max_queued_imms) + ", max_queued_imms_total " +
                     std::to_string(config.max_queued_imms_total) + ")"});
    return;
  }
  if (peer) peer->queued_imms.fetch_add(1);
  imms_.push_back(std::move(event));
  imms_waiting_.store(true, std::memory_order_release);
  lock.unlock();
  imm_cv_.notify_one();
}

ImmEvent EngineImpl::pop_imm_locked() {
  ImmEvent e = std::move(imms_.front());
  imms_.pop_front();
  imms_waiting_.store(!imms_.empty(), std::memory_order_relaxed);
  if (e.peer.impl_) e.peer.impl_->queued_imms.fetch_sub(1);
  return e;
}

std::size_t EngineImpl::next_imms(std::span<ImmEvent> out, Duration timeout) {
  if (out.empty()) return 0;
  // The events a previous call left there let go of their peers here, not under imm_mu_: the
  // last reference to a closed peer tears its channels down.
  for (ImmEvent& e : out) e.peer = Peer();
  // Spins first, as Future::wait does: a notification that comes within Config::wait_spin then
  // costs no wake-up of this thread, nor a futex call on the progress thread delivering it.
  // It lowered p50 and p99 of ferry emulate's frames through a TCP ferry stream, end to end
  // (docs/performance-history.md, "Streaming"). The spin polls the peers' same-host rings and
  // completion queues itself, so their notifications need no progress thread woken either: a
  // write_with_imm ping-pong over shm, each side in next_imm, became many times faster
  // (docs/performance-history.md, "Notifications taken by a polling next_imm, 32 KiB records,
  // 2 MiB through the rings").
  Duration spin = std::min(timeout, config.wait_spin);
  if (spin.count() > 0 && !imms_waiting_.load(std::memory_order_acquire)) {
    std::shared_ptr<const PolledPools> polled;
    {
      std::lock_guard lock(polled_mu_);
      polled = polled_;
    }
    transport::OpPool::spin_any(polled->pools, imms_waiting_, spin, true);
  }
  std::unique_lock lock(imm_mu_);
  if (!imm_cv_.wait_for(lock, timeout, [&] { return !imms_.empty() || stopping_.load(); }))
    return 0;
  // Everything queued goes in this one turn of the lock, which the progress threads delivering
  // notifications also take.
  std::size_t taken = 0;
  for (; taken < out.size() && !imms_.empty(); ++taken) out[taken] = pop_imm_locked();
  return taken;
}

void EngineImpl::update_polled_locked() {
  auto built = std::make_shared<PolledPools>();
  for (const auto& p : peers_) {
    if (built->pools.size() == transport::OpPool::kMaxSpinPools) break;
    const std::shared_ptr<transport::OpPool>& pool = p->link->pool;
    if (!pool->pollable()) continue;
    built->owners.push_back(pool);
    built->pools.push_back(pool.get());
  }
  std::shared_ptr<const PolledPools> polled = std::move(built);
  std::lock_guard lock(polled_mu_);
  polled_.swap(polled);  // the old one goes outside the lock
}

void EngineImpl::on_imm(std::function<void(const ImmEvent&)> fn) {
  std::vector<ImmEvent> queued;
  std::function<void(const ImmEvent&)> deliver;
  {
    std::lock_guard lock(imm_mu_);
    imm_callback_ = std::move(fn);
    if (imm_callback_) {
      while (!imms_.empty()) queued.push_back(pop_imm_locked());
      deliver = imm_callback_;
    }
  }
  for (const ImmEvent& e : queued) deliver(e);  // nothing already received is dropped
}

namespace {
// A transport's keys for a region, into its descriptor.
class DescriptorKeys final : public transport::KeySink {
 public:
  DescriptorKeys(Descriptor& d, TransportKind kind) : d_(d), kind_(kind) {}
  Status add(uint8_t device, std::span<const uint8_t> key) override {
    try {
      d_.add_key(kind_, device, key);
      return {};
    } catch (const Error& e) {
      return {e.code(), std::string(to_string(kind_)) + " keys: " + e.status().message()};
    }
  }

 private:
  Descriptor& d_;
  TransportKind kind_;
};
}  // namespace

void EngineImpl::check_registration(const char* call, Access access) const {
  if (stopping_.load())
    throw Error(ErrorCode::kCancelled, std::string(call) + ": engine shut down");
  if (static_cast<uint8_t>(access) > static_cast<uint8_t>(Access::kRemoteReadWrite)) {
    throw Error(ErrorCode::kInvalidArgument, std::string(call) + ": unknown access flags");
  }
}

Region EngineImpl::register_memory(void* data, std::size_t length, Access access,
                                   std::shared_ptr<void> keep_alive) {
  check_registration("register_memory", access);
  if (data == nullptr || length == 0) {
    throw Error(ErrorCode::kInvalidArgument, "register_memory: null pointer or zero length");
  }
  auto rec = std::make_shared<RegionRecord>();
  rec->base = static_cast<uint8_t*>(data);
  rec->length = length;
  rec->keep_alive = std::move(keep_alive);
  core::cuda::PointerInfo where = core::cuda::pointer_info(data);
  if (where.device) {
    auto start = reinterpret_cast<uint64_t>(data);
    if (start - where.range_start > where.range_size ||
        length > where.range_size - (start - where.range_start)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "register_memory: " + std::to_string(length) + " bytes from a pointer " +
                      std::to_string(start - where.range_start) +
                      " bytes into a CUDA allocation of " + std::to_string(where.range_size) +
                      " bytes run past its end");
    }
    rec->memory = Memory::cuda(where.ordinal);
  }
  return add_region(std::move(rec), access);
}

namespace {
// Frees Engine::allocate's CUDA memory with the region record, in its device's context.
struct CudaAllocation {
  const core::cuda::Driver* driver;
  int device;
  core::cuda::CUdeviceptr pointer;
  CudaAllocation(const core::cuda::Driver* d, int dev, core::cuda::CUdeviceptr p)
      : driver(d), device(dev), pointer(p) {}
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;
  ~CudaAllocation() {
    try {
      core::cuda::use_device(*driver, device);
      Status s = driver->status(driver->mem_free(pointer), "cuMemFree");
      if (!s.ok()) throw Error(s);
    } catch (const Error& e) {
      core::log(LogLevel::kError, "engine", [&] { return std::string(e.what()); });
    }
  }
};
}  // namespace

Region EngineImpl::allocate_cuda(std::size_t length, Access access, int device) {
  std::string where =
      "allocate " + std::to_string(length) + " bytes on " + to_string(Memory::cuda(device));
  if (length == 0) throw Error(ErrorCode::kInvalidArgument, where + ": zero length");
  std::string why;
  const core::cuda::Driver* driver = core::cuda::Driver::get(&why);
  if (driver == nullptr) throw Error(ErrorCode::kUnsupported, where + ": " + why);
  auto fail = [&](const Error& e) { return Error(e.code(), where + ": " + e.status().message()); };
  std::shared_ptr<CudaAllocation> memory;
  try {
    core::cuda::use_device(*driver, device);
    core::cuda::CUdeviceptr pointer = 0;
    driver->check(driver->mem_alloc(&pointer, length), "cuMemAlloc");
    memory = std::make_shared<CudaAllocation>(driver, device, pointer);
    driver->check(driver->memset_d8(pointer, 0, length), "cuMemsetD8");
  } catch (const Error& e) {
    throw fail(e);
  }
  auto rec = std::make_shared<RegionRecord>();
  // A device address, never dereferenced here: the CUDA paths hand it back to the driver.
  rec->base = reinterpret_cast<uint8_t*>(memory->pointer);  // NOLINT(performance-no-int-to-ptr)
  rec->length = length;
  rec->memory = Memory::cuda(device);
  rec->keep_alive = std::move(memory);
  return add_region(std::move(rec), access);
}

Region EngineImpl::allocate(std::size_t length, Access access, Memory memory) {
  check_registration("allocate", access);
  if (memory.kind == MemoryKind::kCuda) return allocate_cuda(length, access, memory.device);
  auto rec = std::make_shared<RegionRecord>();
  rec->owned = std::make_shared<core::SharedMemory>();
  // Memory no peer may write is sealed so that the kernel, not only our checks, refuses writes:
  // a read-only lent file reopened for writing still maps read-only.
  if (Status s =
          core::SharedMemory::create(length, *rec->owned, !allows(access, Access::kRemoteWrite));
      !s.ok()) {
    throw Error(s.code(), "allocate " + std::to_string(length) + " bytes: " + s.message());
  }
  rec->base = rec->owned->data();
  rec->length = length;
  return add_region(std::move(rec), access);
}

Region EngineImpl::add_region(std::shared_ptr<RegionRecord> rec, Access access) {
  uint64_t length = rec->length;
  rec->engine = shared_from_this();
  rec->access = access;
  rec->key = nonzero_random();
  rec->id = regions_.insert(rec->base, length, access, rec->key, rec->owned ? rec->owned->fd() : -1,
                            rec->memory);

  Descriptor& d = rec->descriptor;
  d.engine_id = id;
  d.incarnation = incarnation;
  d.region_id = rec->id;
  d.address = reinterpret_cast<uint64_t>(rec->base);
  d.length = length;
  d.access = access;
  d.memory = rec->memory.kind;
  d.memory_device = static_cast<uint8_t>(rec->memory.device);
  for (auto& t : transports_) {
    // A transport registers only the memory it moves: the descriptor has no key of the others,
    // so no peer routes that memory to them.
    const transport::TransportEntry* entry = transport::find_transport(t->kind());
    if (entry == nullptr || (entry->memory & transport::memory_bit(d.memory)) == 0) continue;
    DescriptorKeys keys(d, t->kind());
    Status s = t->register_region(rec->id, rec->base, length, access, rec->key, keys);
    if (!s.ok()) {
      deregister(*rec);
      throw Error(s);
    }
  }
  return Region(std::move(rec));
}

void EngineImpl::deregister(RegionRecord& record) {
  if (!record.registered.exchange(false)) return;
  if (Directory* names = made_directory()) names->region_gone(record.id);
  // Revocation waits for the operations using the region: their completions must be handled
  // even if nobody waits for them.
  for (auto& p : peers_with_channels()) {
    p->link->pool->unwatched();
    // A receive posted into the region and not yet matched would hold it forever.
    for (OpState* recv : p->link->matcher.take_posted_into(record.id)) {
      p->link->pool->fail_posted(recv, [&](const OpState& op) {
        return Status(ErrorCode::kRevoked, "recv tag " + std::to_string(op.tag) + ": region " +
                                               std::to_string(record.id) +
                                               " was deregistered while it waited");
      });
    }
  }
  // The peers are listed again once the region refuses new accesses: one that arrived in
  // between may hold it too.
  auto ask_back = [&] {
    for (auto& p : peers_with_channels()) p->channels.revoking(record.id);
  };
  auto cut_off = [&] {
    Status why{ErrorCode::kRevoked,
               "region " + std::to_string(record.id) + " was deregistered and its accesses " +
                   "did not end within revoke_timeout (" +
                   std::to_string(
                       std::chrono::duration_cast<std::chrono::milliseconds>(config.revoke_timeout)
                           .count()) +
                   " ms)"};
    for (auto& p : peers_with_channels()) {
      // An operation of ours from or into the region waits for this peer: it fails with it.
      if (p->link->pool->posted_uses_region(record.id)) {
        p->close(why);
        continue;
      }
      p->channels.cut_off(record.base, record.length, why);
    }
  };
  regions_.revoke(record.id, config.revoke_timeout, ask_back, cut_off);
  for (auto& t : transports_) t->deregister_region(record.id);
  // Memory kept past its registration (Region::memory) is this process's alone from now on:
  // a peer cut off with a mapping still open keeps pages nobody else sees. Where the copy
  // cannot be made the memory stays shared with such a peer; nothing else changes.
  if (record.owned && record.owned.use_count() > 1) (void)record.owned->detach();
}

std::vector<std::shared_ptr<PeerImpl>> EngineImpl::peers_with_channels() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<PeerImpl>> all = peers_;
  for (const auto& j : joining_) all.push_back(j.second.peer);
  all.insert(all.end(), connecting_.begin(), connecting_.end());
  return all;
}

transport::Transport* EngineImpl::transport_of(TransportKind kind) const {
  for (const auto& t : transports_) {
    if (t->kind() == kind) return t.get();
  }
  return nullptr;
}

std::vector<TransportKind> EngineImpl::usable_transports() const {
  std::vector<TransportKind> out;
  for (const auto& t : transports_) out.push_back(t->kind());
  return out;
}

std::vector<TransportKind> EngineImpl::channels_for(std::span<const TransportKind> offered,
                                                    Reach reach) const {
  std::vector<TransportKind> out;
  for (const auto& t : transports_) {
    if (std::find(offered.begin(), offered.end(), t->kind()) != offered.end() &&
        engine::reaches(transport::find_transport(t->kind())->capabilities, reach)) {
      out.push_back(t->kind());
    }
  }
  return out;
}

std::string EngineImpl::unusable_reason(TransportKind kind) const {
  for (const auto& [k, why] : unusable_) {
    if (k == kind) return why;
  }
  return {};
}

Status EngineImpl::make_channels(const std::shared_ptr<PeerImpl>& peer,
                                 std::span<const TransportKind> kinds, bool dialer) {
  std::weak_ptr<PeerImpl> weak = peer;
  for (TransportKind kind : kinds) {
    transport::Transport* t = transport_of(kind);
    if (t == nullptr) {
      return {ErrorCode::kProtocol, "peer chose transport " + std::string(to_string(kind)) +
                                        ", which this engine did not offer"};
    }
    if (!engine::reaches(transport::find_transport(kind)->capabilities, peer->reach)) {
      return {ErrorCode::kProtocol, "peer chose transport " + std::string(to_string(kind)) +
                                        ", which cannot reach it (" +
                                        std::string(to_string(peer->reach)) + ")"};
    }
    std::shared_ptr<transport::Channel> channel;
    transport::ChannelArgs args{*this, peer->link,
                                [weak](const Status& why) {
                                  if (auto p = weak.lock()) p->channel_closed(why);
                                },
                                dialer};
    if (Status s = t->make_channel(std::move(args), channel); !s.ok()) return s;
    peer->open_channels.fetch_add(1);
    peer->channels.add(std::move(channel));
  }
  if (config.metrics) peer->link->pool->meter_channels(peer->channels.size());
  return {};
}

void EngineImpl::plan_routes(PeerImpl& peer) const {
  peer.settle();
  std::vector<TransportKind> kinds;
  for (const auto& c : peer.channels.all()) kinds.push_back(c->kind());
  peer.routes = engine::plan_routes(
      config, kinds, peer.reach,
      [&](TransportKind kind) {
        if (const transport::Channel* c = peer.channels.find(kind)) {
          if (std::string why = c->unusable(); !why.empty()) return why;
        }
        return unusable_reason(kind);
      },
      [&](TransportKind kind, std::string& why) {
        const transport::Channel* c = peer.channels.find(kind);
        return c != nullptr ? c->lacks(why) : 0u;
      });
  peer.established.store(true);
  core::log(LogLevel::kInfo, "engine", [&] { return describe_routes(peer); });
}

std::vector<uint8_t> EngineImpl::channel_addresses(const PeerImpl& peer) {
  engine::ChannelAddresses m;
  for (const auto& c : peer.channels.all()) m.channels.push_back({c->kind(), c->local_address()});
  return engine::encode(m);
}

Status EngineImpl::connect_channels(const PeerImpl& peer, std::span<const uint8_t> body) {
  engine::ChannelAddresses m;
  if (Status s = engine::decode(body, m); !s.ok()) return s;
  auto ours = peer.channels.all();
  if (m.channels.size() != ours.size()) {
    return {ErrorCode::kProtocol, "channel addresses: " + std::to_string(m.channels.size()) +
                                      " channels, the handshake set up " +
                                      std::to_string(ours.size())};
  }
  for (std::size_t i = 0; i < ours.size(); ++i) {
    if (m.channels[i].kind != ours[i]->kind()) {
      return {ErrorCode::kProtocol,
              "channel addresses: " + std::string(to_string(m.channels[i].kind)) + " where " +
                  std::string(to_string(ours[i]->kind())) + " was agreed"};
    }
    if (Status s = ours[i]->connect(m.channels[i].bytes); !s.ok()) return s;
  }
  return {};
}

EngineStats EngineImpl::stats() const {
  EngineStats s;
  {
    std::lock_guard lock(mu_);
    s.peers = peer_count_locked();
    s.peers_admitted = admitted_;
  }
  s.pending_handshakes = listener_->pending();
  s.refused_connections = listener_->refused();
  s.accept_failures = listener_->accept_failures();
  return s;
}

EngineMetrics EngineImpl::metrics() const {
  EngineMetrics m;
  std::vector<std::shared_ptr<PeerImpl>> peers;
  {
    std::lock_guard lock(mu_);
    peers = peers_;
    m.peers_admitted = admitted_;
  }
  m.refused_connections = listener_->refused();
  m.peers.reserve(peers.size());
  for (const auto& p : peers) m.peers.push_back(p->metrics());
  return m;
}

EngineImpl::MemoryBound EngineImpl::memory_bound(const Config& c) {
  std::size_t channels = 0;  // a peer has at most one channel per configured transport
  for (TransportKind kind : c.transports) {
    if (const transport::TransportEntry* entry = transport::find_transport(kind))
      channels += entry->worst_case_channel_bytes(c);
  }
  MemoryBound b{};
  b.per_handshake = Listener::worst_case_handshake_bytes();
  b.per_peer_fixed = sizeof(PeerImpl) + sizeof(transport::PeerLink) + sizeof(transport::OpPool) +
                     kControlBytes + channels;
  if (c.metrics) b.per_peer_fixed += c.transports.size() * sizeof(transport::ChannelMeter);
  b.per_peer = b.per_peer_fixed + c.max_unexpected_bytes + c.max_queued_imms * kQueuedImmBytes;
  b.engine = c.max_handshakes * b.per_handshake + c.max_peers * b.per_peer_fixed +
             std::min(c.max_peers * c.max_unexpected_bytes, c.max_unexpected_bytes_total) +
             std::min(c.max_peers * c.max_queued_imms, c.max_queued_imms_total) * kQueuedImmBytes;
  return b;
}

void EngineImpl::peer_closed(PeerImpl* peer) {
  {
    std::lock_guard lock(mu_);
    auto same = [peer](const auto& p) { return p.get() == peer; };
    if (std::erase_if(peers_, same) != 0) update_polled_locked();
    std::erase_if(accepted_, same);  // a peer nobody accepted leaves the queue when it closes
    // A client told that all its connections joined may use the peer and leave before we
    // publish it: it connected, and a target waiting for one initiator to come and go
    // (stats().peers_admitted) must see it, however fast it left.
    std::erase_if(joining_, [&](const auto& j) {
      if (j.second.peer.get() != peer) return false;
      if (j.second.told == j.second.expected) ++admitted_;
      return true;
    });
    std::erase_if(connecting_, same);
  }
  accept_cv_.notify_all();
}

Status EngineImpl::check_admission(const engine::Hello& hello, const std::string& source) {
  const uint64_t engine_id = hello.engine_id();
  std::shared_ptr<PeerImpl> replaced;
  {
    std::lock_guard lock(mu_);
    auto holder = [&]() -> std::shared_ptr<PeerImpl> {
      for (auto& p : peers_) {
        if (p->incoming && p->engine_id == engine_id && !p->lost.load()) return p;
      }
      for (auto& j : joining_) {
        if (j.second.peer->engine_id == engine_id) return j.second.peer;
      }
      return nullptr;
    }();
    if (holder && holder->control_alive() && holder->incarnation == hello.incarnation) {
      return {ErrorCode::kInvalidArgument, "engine " + std::to_string(engine_id) +
                                               " is already connected to this engine (from " +
                                               holder->address + "); use that connection"};
    }
    replaced = std::move(holder);
    std::size_t count = peer_count_locked() - (replaced ? 1 : 0);
    if (count >= config.max_peers) {
      return {ErrorCode::kResourceExhausted, std::to_string(count) +
                                                 " peers connected (max_peers " +
                                                 std::to_string(config.max_peers) + ")"};
    }
    // One source's share: its admitted peers, and of them those not yet proven by their joins.
    auto from_source = [&](const std::shared_ptr<PeerImpl>& p) {
      return p != replaced && p->incoming && p->source == source;
    };
    std::size_t joining = 0, held = 0;
    for (const auto& j : joining_) joining += from_source(j.second.peer);
    for (const auto& p : peers_) held += from_source(p);
    if (joining >= config.max_joining_per_source) {
      return {ErrorCode::kResourceExhausted,
              std::string(engine::kBusyRefusal) + std::to_string(joining) + " peers from " +
                  source + " are still joining (max_joining_per_source " +
                  std::to_string(config.max_joining_per_source) + ")"};
    }
    if (held + joining >= config.max_peers_per_source) {
      return {ErrorCode::kResourceExhausted,
              std::to_string(held + joining) + " peers connected from " + source +
                  " (max_peers_per_source " + std::to_string(config.max_peers_per_source) + ")"};
    }
  }
  if (replaced) {
    replaced->close({ErrorCode::kPeerLost, "replaced by incarnation " +
                                               std::to_string(hello.incarnation) + " of engine " +
                                               std::to_string(engine_id)});
  }
  return {};
}

Status EngineImpl::create_peer(const engine::Hello& hello, const std::string& address,
                               const std::vector<TransportKind>& channels, core::Fd& control,
                               std::shared_ptr<PeerImpl>& out) {
  if (stopping_.load()) return {ErrorCode::kCancelled, "engine shut down"};
  out = PeerImpl::create(shared_from_this(), {hello.key, hello.incarnation, hello.locality},
                         address, true, std::move(control));
  return make_channels(out, channels, false);
}

void EngineImpl::add_joining(const engine::Token& token, std::shared_ptr<PeerImpl> peer,
                             Clock::time_point deadline) {
  std::lock_guard lock(mu_);
  int expected = peer->channels.side_connections();
  joining_.push_back({token, Joining{std::move(peer), 0, expected, deadline}});
}

std::shared_ptr<PeerImpl> EngineImpl::find_joining(const engine::Token& token) {
  std::lock_guard lock(mu_);
  for (auto& j : joining_) {
    if (j.first == token) return j.second.peer;
  }
  return nullptr;
}

void EngineImpl::told_joined(const engine::Token& token, int delta) {
  std::lock_guard lock(mu_);
  for (auto& j : joining_) {
    if (j.first == token) j.second.told += delta;
  }
}

void EngineImpl::attach_side(const std::shared_ptr<PeerImpl>& peer, const engine::Join& join,
                             core::Fd fd) {
  transport::Channel* channel = peer->channels.find(join.kind);
  Status s = channel != nullptr
                 ? channel->attach_side(join.index, std::move(fd))
                 : Status(ErrorCode::kProtocol, "join: the peer has no " +
                                                    std::string(to_string(join.kind)) + " channel");
  if (!s.ok()) {
    peer->close(s);
    return;
  }
  {
    std::lock_guard lock(mu_);
    auto it = std::find_if(joining_.begin(), joining_.end(),
                           [&](const auto& j) { return j.first == join.token; });
    if (it == joining_.end() || ++it->second.joined != it->second.expected) return;
  }
  publish(peer);
}

void EngineImpl::publish(const std::shared_ptr<PeerImpl>& peer) {
  // Started before anyone can see the peer: accept() may close it at once. (shutdown() waits
  // for this thread before it collects the peers, so none is missed in between.)
  plan_routes(*peer);  // every channel is set up and knows whether it can carry
  peer->start_control();
  {
    // It leaves joining_ and enters peers_ in one step, so it is counted all along; a peer
    // that closed while joining (its client came and went) is not brought back. It was
    // admitted all the same, here or by peer_closed() if that took it out of joining_ first.
    std::lock_guard lock(mu_);
    if (std::erase_if(joining_, [&](const auto& j) { return j.second.peer == peer; }) != 0) {
      ++admitted_;
    }
    if (peer->lost.load()) return;
    peers_.push_back(peer);
    update_polled_locked();
    accepted_.push_back(peer);
  }
  accept_cv_.notify_all();
}

std::optional<Peer> EngineImpl::accept(Duration timeout) {
  std::unique_lock lock(mu_);
  if (!accept_cv_.wait_for(lock, timeout, [&] { return !accepted_.empty() || stopping_.load(); }) ||
      accepted_.empty()) {
    return std::nullopt;
  }
  auto p = std::move(accepted_.front());
  accepted_.pop_front();
  return Peer(std::move(p));
}

void EngineImpl::housekeeping() {
  auto now = Clock::now();
  std::vector<std::shared_ptr<PeerImpl>> expired, live;
  {
    std::lock_guard lock(mu_);
    for (auto it = joining_.begin(); it != joining_.end();) {
      if (now > it->second.deadline) {
        expired.push_back(it->second.peer);
        it = joining_.erase(it);
      } else {
        ++it;
      }
    }
    live = peers_;
  }
  for (auto& p : expired)
    p->close({ErrorCode::kTimeout, "peer did not open all its streams in time"});
  for (auto& p : live) p->housekeeping(now);
}

void EngineImpl::shutdown() {
  if (!stopping_.exchange(true)) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t woke = ::write(connect_cancel_.get(), &one, sizeof one);
    Status cancelled{ErrorCode::kCancelled, "engine shut down"};
    for (auto& p : peers_with_channels()) p->close(cancelled);
  }
  // From a callback the rest would join the thread running it: it goes to a thread of its own,
  // which holds the engine until done. The peers are closed either way, so what follows this
  // call fails at once.
  if (core::CallbackScope::inside()) {
    auto self = weak_from_this().lock();
    std::lock_guard lock(finish_mu_);
    if (finish_ != Finish::kNotStarted || !self) return;
    try {
      core::run_detached([self] { self->finish_shutdown(); });
      finish_ = Finish::kRunning;
    } catch (const std::system_error& e) {
      // Left to the next shutdown() outside a callback (the engine's destructor at the latest).
      core::log(LogLevel::kError, "engine",
                [&] { return std::string("shutdown: no thread to finish it: ") + e.what(); });
    }
    return;
  }
  {
    std::unique_lock lock(finish_mu_);
    if (finish_ != Finish::kNotStarted) {
      finish_cv_.wait(lock, [&] { return finish_ == Finish::kDone; });
      return;
    }
    finish_ = Finish::kRunning;
  }
  finish_shutdown();
}

Directory& EngineImpl::directory(const char* call) {
  if (config.etcd.empty()) {
    throw Error(ErrorCode::kUnsupported,
                std::string(call) + ": no directory (set Config::etcd or " + Engine::kEtcdVariable +
                    " to etcd's http://host:port)");
  }
  std::lock_guard lock(directory_mu_);
  if (stopping_.load())
    throw Error(ErrorCode::kCancelled, std::string(call) + ": engine shut down");
  if (!directory_) {
    directory_ = std::make_unique<Directory>(
        config,
        Directory::Self{id, incarnation, advertised, public_key_text(identity_key.public_key())});
  }
  return *directory_;
}

Directory* EngineImpl::made_directory() {
  std::lock_guard lock(directory_mu_);
  return directory_.get();
}

Watch EngineImpl::watch(std::string_view name, std::function<void(const NamedEngine&)> fn) {
  if (!fn) throw Error(ErrorCode::kInvalidArgument, "watch: no callback");
  return Watch(directory("watch").watch(name, std::move(fn)));
}

void EngineImpl::finish_shutdown() {
  // The names go first, so that nobody looks this engine up while it goes. Not under
  // directory_mu_: a watch's callback may be calling into the directory meanwhile.
  if (Directory* names = made_directory()) names->stop();
  listener_->stop();
  if (liveness_) liveness_->stop();

  // Those admitted since shutdown() closed the peers are closed too.
  std::vector<std::shared_ptr<PeerImpl>> all = peers_with_channels();
  Status cancelled{ErrorCode::kCancelled, "engine shut down"};
  for (auto& p : all) p->close(cancelled);
  // Let the progress threads stop the streams, which fails what was in flight.
  auto deadline = Clock::now() + std::chrono::seconds(2);
  for (auto& p : all) {
    while (!p->channels.quiesced() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // Its chunks failed with their peers; before the reactor, which may be completing them.
  stager_.stop();
  reactor_->stop();
  for (auto& p : all) p->channels.stop_after_reactor();
  {
    std::lock_guard lock(mu_);
    peers_.clear();
    update_polled_locked();
    joining_.clear();
    connecting_.clear();
    accepted_.clear();
  }
  {
    std::lock_guard lock(imm_mu_);  // queued events hold their peers, which hold this engine
    imms_.clear();
    imm_callback_ = nullptr;
  }
  accept_cv_.notify_all();
  imm_cv_.notify_all();
  {
    std::lock_guard lock(finish_mu_);
    finish_ = Finish::kDone;
  }
  finish_cv_.notify_all();
}

}  // namespace ferry::detail
