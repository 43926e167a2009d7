// The verbs transport's line in the registry (transports.def).
#include <algorithm>

#include "transport/registry.hpp"
#include "transport/verbs/devices.hpp"
#include "transport/verbs/verbs_api.hpp"
#include "transport/verbs/verbs_channel.hpp"
#include "transport/verbs/verbs_device.hpp"

namespace ferry::transport {
namespace {

// Checked by the engine against its settings' ranges before it opens the transport.
std::unique_ptr<Transport> open(const Config& config, std::string& why) {
  verbs::VerbsOptions options{config.verbs.device, config.verbs.gid_index, config.verbs.qps,
                              config.busy_poll, config.verbs.zero_copy_receives};
  auto device = verbs::VerbsDevice::open(options, why);
  if (!device && (!config.verbs.device.empty() || config.verbs.gid_index >= 0)) {
    // Asked for by name or index: never fall back silently.
    throw Error(ErrorCode::kUnsupported, "verbs: " + why);
  }
  return device;
}

// The largest GID table index a port has (ibv_query_gid takes an int; tables hold up to 256).
constexpr int64_t kMaxGidIndex = 255;

const Setting kSettings[] = {
    bound<&Config::verbs, &VerbsConfig::device>(
        {"device", SettingType::kText,
         "device name (empty: the first with an active port; an unknown name is an error)"}),
    bound<&Config::verbs, &VerbsConfig::gid_index>({"gid_index", SettingType::kCount,
                                                    "GID index (-1: the routable RoCE v2 GID)", -1,
                                                    kMaxGidIndex}),
    bound<&Config::verbs, &VerbsConfig::qps>({"qps", SettingType::kCount, "RC queue pairs per peer",
                                              1,
                                              static_cast<int64_t>(verbs::VerbsAddress::kMaxQps)}),
    bound<&Config::verbs, &VerbsConfig::zero_copy_receives>(
        {"zero_copy_receives", SettingType::kBool,
         "large messages written by the sender straight into a posted receive that grants "
         "remote write (the sender learns that region's key)"}),
};

TransportInfo describe() {
  TransportInfo info{TransportKind::kVerbs, false, {}, {}};
  std::string why;
  const auto* api = verbs::VerbsApi::get(&why);
  if (api == nullptr) {
    info.detail = why;
    return info;
  }
  auto devices = verbs::discover(*api, why);
  for (const auto& d : devices) {
    for (const auto& p : d.ports) info.devices.push_back(verbs::describe(d, p));
  }
  info.usable = std::any_of(devices.begin(), devices.end(), [](const auto& d) {
    return std::any_of(d.ports.begin(), d.ports.end(),
                       [](const auto& p) { return verbs::usable(p); });
  });
  info.detail = devices.empty() ? why
                : info.usable   ? "RC queue pairs: write, read, write_with_imm, send/recv"
                                : "no device has an active port with a usable gid";
  return info;
}

std::size_t worst_case_channel_bytes(const Config& config) {
  return verbs::VerbsChannel::worst_case_bytes(config.verbs.qps);
}

}  // namespace

const TransportEntry& verbs_entry() {
  static const TransportEntry entry{
      TransportKind::kVerbs,
      "verbs",
      kCapOneSided | kCapCrossHost | kCapCrossProcess | kCapInlineSmall | kCapMessages | kCapImm,
      memory_bit(MemoryKind::kHost),
      open,
      describe,
      worst_case_channel_bytes,
      kSettings};
  return entry;
}

}  // namespace ferry::transport
