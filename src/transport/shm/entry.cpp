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

std::unique_ptr<Transport> open(const Config& config, std::string&) {
  if (config.shm.copy_threads < 0 || config.shm.copy_threads > shm::kMaxCopyThreads) {
    throw Error(ErrorCode::kInvalidArgument,
                "config: shm.copy_threads must be 0.." + std::to_string(shm::kMaxCopyThreads));
  }
  if (config.shm.stream_poll < Duration::zero() || config.shm.stream_poll > shm::kMaxStreamPoll) {
    throw Error(ErrorCode::kInvalidArgument, "config: shm.stream_poll must be 0 to 1 s");
  }
  return std::make_unique<shm::ShmTransport>(config.shm, no_cross_memory(config));
}

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
      TransportKind::kShm,           "shm", kCapCrossProcess | kCapMessages | kCapImm,
      memory_bit(MemoryKind::kHost), open,  describe,
      worst_case_channel_bytes};
  return entry;
}

}  // namespace ferry::transport
