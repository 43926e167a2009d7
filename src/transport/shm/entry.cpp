// The same-host transport's line in the registry (transports.def).
#include "transport/registry.hpp"
#include "transport/shm/shm_channel.hpp"

namespace ferry::transport {
namespace {

// Why this process may not use process_vm_readv, or "" when it may.
std::string no_cross_memory(const Config& config) {
  if (!config.shm.cross_memory) return "Config::shm.cross_memory is false";
  std::string why;
  if (!shm::cross_memory_allowed(why)) return "process_vm_readv is refused (" + why + ")";
  return {};
}

// Checked by the engine against these ranges before it opens the transport.
std::unique_ptr<Transport> open(const Config& config, std::string&) {
  return std::make_unique<shm::ShmTransport>(config.shm, no_cross_memory(config));
}

// Writes through the rings up to this many bytes at most: past it one pull is always cheaper
// than the records' bookkeeping.
constexpr int64_t kMaxRingCopies = int64_t{1} << 30;

const Setting kSettings[] = {
    bound<&Config::shm, &ShmConfig::cross_memory>(
        {"cross_memory", SettingType::kBool,
         "copy between the two processes with process_vm_readv (one copy); off: mapped memory "
         "and the rings only"}),
    bound<&Config::shm, &ShmConfig::copy_threads>(
        {"copy_threads", SettingType::kCount,
         "threads besides the progress thread that split a large copy: two streams beat one "
         "at 64 MiB, three or four did not (docs/performance.md, settings table)",
         0, shm::kMaxCopyThreads}),
    bound<&Config::shm, &ShmConfig::ring_copies_up_to>(
        {"ring_copies_up_to", SettingType::kBytes,
         "writes of 256 KiB up to this may travel through the rings (docs/performance.md, "
         "\"Each transfer the faster way\")",
         0, kMaxRingCopies}),
    bound<&Config::shm, &ShmConfig::measure_paths>(
        {"measure_paths", SettingType::kBool,
         "each write in that window takes the way that moved writes of its size faster lately"}),
    bound<&Config::shm, &ShmConfig::stream_poll>(
        {"stream_poll", SettingType::kDuration,
         "how long the progress thread keeps polling the rings while a transfer streams through "
         "them (docs/performance.md)",
         0, shm::kMaxStreamPoll.count()}),
    bound<&Config::shm, &ShmConfig::request_poll>(
        {"request_poll", SettingType::kDuration,
         "how long the progress thread keeps polling the rings for the next request after one "
         "(docs/performance.md, \"Small operations and wake-ups\")",
         0, shm::kMaxStreamPoll.count()}),
};

TransportInfo describe() {
  TransportInfo info{TransportKind::kShm, true, {}, {}};
  std::string why = no_cross_memory(Config{});
  info.detail =
      why.empty()
          ? "processes of this host: one copy with process_vm_readv, records in shared-memory "
            "rings (each pair proves it may read the other when it connects)"
          : why +
                ": engine-allocated regions are mapped, other writes and reads travel "
                "through shared-memory rings (two copies), messages over the next transport";
  return info;
}

std::size_t worst_case_channel_bytes(const Config& config) {
  // Plus the final answers to held sends, one per message the matcher holds at most.
  return shm::ShmChannel::worst_case_bytes() +
         config.max_unexpected_messages * shm::ShmChannel::kLateAnswerBytes;
}

}  // namespace

const TransportEntry& shm_entry() {
  static const TransportEntry entry{
      TransportKind::kShm,           "shm",    kCapCrossProcess | kCapMessages | kCapImm,
      memory_bit(MemoryKind::kHost), open,     describe,
      worst_case_channel_bytes,      kSettings};
  return entry;
}

}  // namespace ferry::transport
