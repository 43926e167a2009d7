// The public handles (Engine, Peer, Region) forward to the engine layer.
#include <algorithm>
#include <system_error>

#include "core/callback_scope.hpp"
#include "core/cuda.hpp"
#include "core/fork.hpp"
#include "core/sys.hpp"
#include "engine/engine_impl.hpp"
#include "ferry/ferry.hpp"
#include "transport/registry.hpp"

namespace ferry {

// ---- Region ----
Region::Region(std::shared_ptr<detail::RegionRecord> record) : record_(std::move(record)) {}
Region::Region(Region&&) noexcept = default;
Region& Region::operator=(Region&& o) noexcept {
  if (this != &o) {
    release();
    record_ = std::move(o.record_);
  }
  return *this;
}
Region::~Region() { release(); }

void Region::release() noexcept {
  if (!record_) return;
  std::shared_ptr<detail::RegionRecord> record = std::move(record_);
  // In a forked child the registration is the parent's to end.
  if (core::fork_generation() != record->engine->born) return;
  if (core::CallbackScope::inside()) {
    try {
      core::run_detached([record] { record->engine->deregister(*record); });
      return;
    } catch (const std::system_error&) {
      // No thread to hand the wait to: it is waited here, as outside a callback.
    }
  }
  record->engine->deregister(*record);
}

void* Region::data() const noexcept { return record_ ? record_->base : nullptr; }
std::size_t Region::size() const noexcept { return record_ ? record_->length : 0; }
Access Region::access() const noexcept { return record_ ? record_->access : Access::kLocal; }
Memory Region::location() const noexcept { return record_ ? record_->memory : Memory::host(); }
Descriptor Region::descriptor() const {
  if (!record_) throw Error(ErrorCode::kInvalidArgument, "descriptor: empty region");
  return record_->descriptor;
}
std::shared_ptr<void> Region::memory() const {
  if (!record_ || !record_->owned) return nullptr;
  return {record_->owned, record_->base};
}
void Region::publish(std::string_view name) const {
  if (!record_) throw Error(ErrorCode::kInvalidArgument, "Region::publish: empty region");
  core::refuse_in_forked_child(record_->engine->born, "Region::publish");
  if (!record_->registered.load()) {
    throw Error(ErrorCode::kRevoked, "Region::publish: the region was deregistered");
  }
  record_->engine->directory("Region::publish")
      .publish_region(name, record_->id, record_->descriptor.to_string(), record_->registered);
}
void Region::deregister() {
  if (!record_) return;
  core::refuse_in_forked_child(record_->engine->born, "Region::deregister");
  if (core::CallbackScope::inside())
    throw Error(ErrorCode::kInvalidArgument,
                "Region::deregister() from a completion callback: it waits for the region's "
                "operations to end, which this thread ends; drop the Region instead (it is "
                "deregistered once they end) or deregister from another thread");
  record_->engine->deregister(*record_);
  record_.reset();
}

// ---- Peer ----
namespace {
[[noreturn]] void empty_peer() {
  throw Error(ErrorCode::kInvalidArgument, "operation on an empty Peer handle");
}
// The peer behind a handle, for a call that acts on it: not from an empty handle, nor in a
// forked child.
detail::PeerImpl& usable(const std::shared_ptr<detail::PeerImpl>& peer, const char* call) {
  if (!peer) empty_peer();
  core::refuse_in_forked_child(peer->engine->born, call);
  return *peer;
}
}  // namespace

Future Peer::write(std::span<const Transfer> batch) const {
  return usable(impl_, "Peer::write").one_sided(transport::OpKind::kWrite, batch, false, 0);
}
Future Peer::read(std::span<const Transfer> batch) const {
  return usable(impl_, "Peer::read").one_sided(transport::OpKind::kRead, batch, false, 0);
}
Future Peer::write_with_imm(std::span<const Transfer> batch, uint32_t imm) const {
  return usable(impl_, "Peer::write_with_imm")
      .one_sided(transport::OpKind::kWrite, batch, true, imm);
}
Prepared Peer::prepare_write(std::span<const Transfer> batch) const {
  return Prepared(
      usable(impl_, "Peer::prepare_write").prepare(transport::OpKind::kWrite, batch, false, 0));
}
Prepared Peer::prepare_read(std::span<const Transfer> batch) const {
  return Prepared(
      usable(impl_, "Peer::prepare_read").prepare(transport::OpKind::kRead, batch, false, 0));
}
Prepared Peer::prepare_write_with_imm(std::span<const Transfer> batch, uint32_t imm) const {
  return Prepared(usable(impl_, "Peer::prepare_write_with_imm")
                      .prepare(transport::OpKind::kWrite, batch, true, imm));
}
Future Prepared::post() const {
  if (!impl_) throw Error(ErrorCode::kInvalidArgument, "post() on an empty Prepared handle");
  return usable(impl_->peer, "Prepared::post").post_prepared(*impl_);
}
Future Peer::send(uint64_t tag, const Region& local, uint64_t offset, uint64_t length) const {
  return usable(impl_, "Peer::send").send(tag, local, offset, length);
}
Future Peer::recv(uint64_t tag, const Region& local, uint64_t offset, uint64_t capacity) const {
  return usable(impl_, "Peer::recv").recv(tag, local, offset, capacity);
}
uint64_t Peer::engine_id() const { return impl_ ? impl_->engine_id : 0; }
uint64_t Peer::incarnation() const { return impl_ ? impl_->incarnation : 0; }
std::string Peer::public_key() const {
  return impl_ ? detail::public_key_text(impl_->public_key) : std::string();
}
std::string Peer::address() const { return impl_ ? impl_->address : std::string(); }
TransportKind Peer::transport() const {
  if (!impl_) empty_peer();
  return impl_->transport();
}
std::vector<RouteInfo> Peer::routes() const {
  return impl_ ? impl_->routes.info : std::vector<RouteInfo>();
}
Reach Peer::reach() const { return impl_ ? impl_->reach : Reach::kOtherHost; }
bool Peer::connected() const {
  if (!impl_) return false;
  core::refuse_in_forked_child(impl_->engine->born, "Peer::connected");
  return !impl_->lost.load();
}
PeerStats Peer::stats() const {
  PeerStats s;
  if (!impl_) return s;
  core::refuse_in_forked_child(impl_->engine->born, "Peer::stats");
  for (const auto& c : impl_->channels.all()) {
    s.channels.push_back({c->kind(), c->lanes(), c->messages.sent.load(),
                          c->messages.received.load(), c->messages.zero_copy.load(),
                          c->messages.compact.load()});
  }
  for (const auto& c : impl_->channels.all()) c->report_paths(s.paths);
  transport::Matcher::Usage unexpected = impl_->link->matcher.usage();
  s.unexpected_messages = unexpected.messages;
  s.unexpected_bytes = unexpected.bytes;
  return s;
}
PeerMetrics Peer::metrics() const {
  return impl_ ? usable(impl_, "Peer::metrics").metrics() : PeerMetrics();
}
void Peer::close() const {
  if (impl_) usable(impl_, "Peer::close").close({ErrorCode::kCancelled, "peer closed locally"});
}

Descriptor Peer::region_named(std::string_view name) const {
  detail::PeerImpl& peer = usable(impl_, "Peer::region_named");
  const std::string text =
      peer.engine->directory("region_named").region_of(peer.engine_id, peer.incarnation, name);
  Descriptor d = Descriptor::parse(text);
  if (d.engine_id != peer.engine_id || d.incarnation != peer.incarnation) {
    throw Error(ErrorCode::kProtocol, "region_named '" + std::string(name) +
                                          "': the directory's descriptor is another engine's");
  }
  return d;
}

// ---- Watch ----
Watch::Watch(Watch&&) noexcept = default;
Watch& Watch::operator=(Watch&& o) noexcept {
  if (this != &o) {
    stop();
    state_ = std::move(o.state_);
  }
  return *this;
}
Watch::~Watch() { stop(); }
void Watch::stop() {
  if (state_) std::exchange(state_, nullptr)->stop();
}

// ---- Engine ----
namespace {
detail::EngineImpl& usable(const std::shared_ptr<detail::EngineImpl>& engine, const char* call) {
  core::refuse_in_forked_child(engine->born, call);
  return *engine;
}
}  // namespace

Engine::Engine(const Config& config) : impl_(std::make_shared<detail::EngineImpl>(config)) {
  impl_->start();
}
Engine::~Engine() {
  if (core::fork_generation() != impl_->born) {
    // A forked child's copy: its threads are the parent's, and tearing it down would close the
    // parent's connections. It stays as it is for the process's life (kept reachable, so leak
    // checkers do not count it).
    // Out of memory here ends the process, as any allocation in a destructor does.
    // NOLINTNEXTLINE(bugprone-unhandled-exception-at-new)
    static auto* inherited = new std::vector<std::shared_ptr<detail::EngineImpl>>;
    inherited->push_back(std::move(impl_));
    return;
  }
  shutdown();
}

std::string Engine::address() const {
  return impl_->advertised.empty() ? std::string() : impl_->advertised.front();
}
std::vector<std::string> Engine::addresses() const { return impl_->advertised; }
uint16_t Engine::port() const { return impl_->port; }
uint64_t Engine::id() const { return impl_->id; }
uint64_t Engine::incarnation() const { return impl_->incarnation; }
std::string Engine::public_key() const {
  return detail::public_key_text(impl_->identity_key.public_key());
}
const Config& Engine::config() const { return impl_->config; }
Region Engine::register_memory(void* data, std::size_t length, Access access,
                               std::shared_ptr<void> keep_alive) {
  return usable(impl_, "Engine::register_memory")
      .register_memory(data, length, access, std::move(keep_alive));
}
Region Engine::allocate(std::size_t length, Access access, Memory memory) {
  return usable(impl_, "Engine::allocate").allocate(length, access, memory);
}
void Engine::publish(std::string_view name) {
  usable(impl_, "Engine::publish").directory("publish").publish_engine(name);
}
void Engine::unpublish(std::string_view name) {
  usable(impl_, "Engine::unpublish").directory("unpublish").unpublish_engine(name);
}
NamedEngine Engine::resolve(std::string_view name) {
  return usable(impl_, "Engine::resolve").directory("resolve").resolve(name);
}
Peer Engine::connect_named(std::string_view name, const std::stop_token& stop) {
  return usable(impl_, "Engine::connect_named").connect_named(name, stop);
}
Watch Engine::watch(std::string_view name, std::function<void(const NamedEngine&)> fn) {
  return usable(impl_, "Engine::watch").watch(name, std::move(fn));
}
Peer Engine::connect(std::string_view host_port, const std::stop_token& stop) {
  return usable(impl_, "Engine::connect").connect(host_port, stop);
}
std::optional<Peer> Engine::accept(Duration timeout) {
  return usable(impl_, "Engine::accept").accept(timeout);
}
std::optional<ImmEvent> Engine::next_imm(Duration timeout) {
  ImmEvent event;
  if (usable(impl_, "Engine::next_imm").next_imms({&event, 1}, timeout) == 0) return std::nullopt;
  return event;
}
std::size_t Engine::next_imms(std::span<ImmEvent> out, Duration timeout) {
  return usable(impl_, "Engine::next_imms").next_imms(out, timeout);
}
void Engine::on_imm(std::function<void(const ImmEvent&)> fn) {
  usable(impl_, "Engine::on_imm").on_imm(std::move(fn));
}
void Engine::shutdown() { usable(impl_, "Engine::shutdown").shutdown(); }
EngineStats Engine::stats() const { return usable(impl_, "Engine::stats").stats(); }
EngineMetrics Engine::metrics() const { return usable(impl_, "Engine::metrics").metrics(); }

std::string_view Engine::version() { return FERRY_VERSION; }

std::vector<TransportInfo> Engine::transports() {
  std::vector<TransportInfo> out;
  for (const transport::TransportEntry* entry : transport::registered_transports())
    out.push_back(entry->describe());
  return out;
}

CudaInfo Engine::gpus() { return core::cuda::inventory(); }

Config Engine::with_environment(const Config& config) { return detail::apply_environment(config); }

std::vector<SettingInfo> Engine::settings(const Config& given) {
  Config config = detail::apply_environment(given);
  Config defaults;
  std::vector<SettingInfo> out;
  for (const transport::NamedSetting& n : transport::declared_settings()) {
    const transport::Setting& s = *n.setting;
    out.push_back({n.full_name(), std::string(transport::setting_type_name(s.type)),
                   transport::setting_text(config, n.transport, s),
                   transport::setting_text(defaults, n.transport, s), transport::setting_range(s),
                   transport::environment_variable(n.transport, s), s.help});
  }
  return out;
}

void Engine::set(Config& config, std::string_view name, std::string_view value) {
  core::throw_if_error(transport::set_setting(config, name, value));
}

std::vector<RouteInfo> Engine::routes(const Config& given, Reach reach) {
  Config config = detail::apply_environment(given);
  std::vector<TransportInfo> here = transports();
  auto unusable_here = [&](TransportKind kind) -> std::string {
    for (const TransportInfo& info : here) {
      if (info.kind == kind) return info.usable ? std::string() : info.detail;
    }
    return "not built into this version";
  };
  std::vector<TransportKind> channels;  // a like-configured peer's, on a host like this one
  for (TransportKind kind : config.transports) {
    const transport::TransportEntry* entry = transport::find_transport(kind);
    if (entry != nullptr && unusable_here(kind).empty() &&
        engine::reaches(entry->capabilities, reach) &&
        std::find(channels.begin(), channels.end(), kind) == channels.end()) {
      channels.push_back(kind);
    }
  }
  return engine::plan_routes(config, channels, reach, unusable_here).info;
}

}  // namespace ferry
