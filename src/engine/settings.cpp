// An engine's settings as it takes them: FERRY_<TRANSPORT>_<NAME> and FERRY_TRANSPORTS applied,
// every value checked (the transports' against their declarations, transport/settings.hpp), and
// warnings for the settings that work but deserve a second look.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "core/log.hpp"
#include "core/sys.hpp"
#include "engine/engine_impl.hpp"
#include "transport/registry.hpp"

namespace ferry::detail {

namespace {
// Largest slice: a frame's length field is 32 bits, and bigger slices only delay acks.
constexpr std::size_t kMaxSliceBytes = 64 << 20;
constexpr std::size_t kMinSliceBytes = 4 << 10;
// staging_chunks x staging_chunk_bytes of pinned host memory: bounded so a setting cannot pin
// all of it.
constexpr std::size_t kMaxStagingChunkBytes = std::size_t{1} << 30;

// What names the environment variable may hold, for its error message.
std::string known_transport_names() {
  std::string out;
  for (const transport::TransportEntry* e : transport::registered_transports())
    out += (out.empty() ? "" : ", ") + std::string(e->name);
  return out;
}

}  // namespace

void validate(const Config& c) {
  auto bad = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "config: " + what);
  };
  if (c.progress_threads < 1 || c.progress_threads > 64) bad("progress_threads must be 1..64");
  if (c.slice_bytes < kMinSliceBytes || c.slice_bytes > kMaxSliceBytes) {
    bad("slice_bytes must be 4 KiB..64 MiB");
  }
  if (c.staging_chunk_bytes < kMinSliceBytes || c.staging_chunk_bytes > kMaxStagingChunkBytes) {
    bad("staging_chunk_bytes must be 4 KiB..1 GiB");
  }
  if (c.staging_chunks < 2 || c.staging_chunks > 64) bad("staging_chunks must be 2..64");
  if (c.peer_timeout.count() <= 0 || c.connect_timeout.count() <= 0) bad("timeouts must be > 0");
  if (c.revoke_timeout.count() < 0) bad("revoke_timeout must be >= 0");
  if (c.max_peers < 1 || c.max_handshakes < 1 || c.max_handshakes_per_source < 1 ||
      c.max_peers_per_source < 1 || c.max_joining_per_source < 1) {
    bad("max_peers, max_handshakes, max_handshakes_per_source, max_peers_per_source and "
        "max_joining_per_source must be >= 1");
  }
  if (c.transports.empty()) bad("transports is empty");
  if (c.etcd_ttl < std::chrono::seconds(2) || c.etcd_ttl > std::chrono::hours(1) ||
      c.etcd_ttl % std::chrono::seconds(1) != Duration::zero()) {
    bad("etcd_ttl must be whole seconds, 2 s..1 h");
  }
  if (c.etcd_timeout.count() <= 0) bad("etcd_timeout must be > 0");
  if (Status s = transport::check_settings(c); !s.ok()) bad(s.message());
}

void warn_about(const Config& c) {
  if (std::getenv(Engine::kTransportsVariable) != nullptr && !c.transports_from_environment) {
    core::log(LogLevel::kWarn, "config", [] {
      return std::string(Engine::kTransportsVariable) +
             " is set but not used: this engine was given its transports "
             "(Config::transports_from_environment is false)";
    });
  }
  if (c.listen && c.secret.empty() && c.trusted_keys.empty() &&
      (c.listen_host == "0.0.0.0" || c.listen_host == "::" || c.listen_host.empty())) {
    core::log(LogLevel::kWarn, "config", [&] {
      return "listening on every interface (" + c.listen_host +
             ") without a shared secret or trusted_keys: any host that reaches the port can "
             "connect (a region's descriptor is still needed to touch its memory)";
    });
  }
  for (std::size_t i = 0; i < c.transports.size(); ++i) {
    if (std::find(c.transports.begin(), c.transports.begin() + static_cast<std::ptrdiff_t>(i),
                  c.transports[i]) != c.transports.begin() + static_cast<std::ptrdiff_t>(i)) {
      core::log(LogLevel::kWarn, "config", [&] {
        return "transport " + std::string(to_string(c.transports[i])) +
               " is listed more than once; its first place counts";
      });
    }
  }
}

Config apply_environment(const Config& config) {
  Config out = config;
  if (config.settings_from_environment) {
    core::throw_if_error(transport::apply_setting_environment(out));
    if (const char* etcd = std::getenv(Engine::kEtcdVariable)) out.etcd = etcd;
    if (const char* prefix = std::getenv(Engine::kEtcdPrefixVariable)) out.etcd_prefix = prefix;
  }
  const char* value = std::getenv(Engine::kTransportsVariable);
  if (value == nullptr || !config.transports_from_environment) return out;
  auto bad = [&](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, std::string(Engine::kTransportsVariable) + "=\"" +
                                                 value + "\": " + what +
                                                 " (known: " + known_transport_names() + ")");
  };
  out.transports.clear();
  std::string_view rest = value;
  while (true) {
    std::size_t comma = rest.find(',');
    std::string_view name = rest.substr(0, comma);
    if (name.empty()) bad("an empty name");
    std::optional<TransportKind> kind = transport_named(name);
    if (!kind) bad("unknown transport '" + std::string(name) + "'");
    out.transports.push_back(*kind);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace ferry::detail
