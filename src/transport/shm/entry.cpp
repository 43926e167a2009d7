// The same-host transport's line in the registry (transports.def).
#include "transport/registry.hpp"
#include "transport/shm/shm_channel.hpp"

namespace ferry::transport {
namespace {

std::unique_ptr<Transport> open(const Config& config, std::string& why) {
  if (!config.shm.cross_memory) {
    why = "cross-memory attach is off (Config::shm.cross_memory)";
    return nullptr;
  }
  if (config.shm.copy_threads < 0 || config.shm.copy_threads > shm::kMaxCopyThreads) {
    throw Error(ErrorCode::kInvalidArgument,
                "config: shm.copy_threads must be 0.." + std::to_string(shm::kMaxCopyThreads));
  }
  if (!shm::cross_memory_allowed(why)) return nullptr;
  return std::make_unique<shm::ShmTransport>(config.shm.copy_threads);
}

TransportInfo describe() {
  TransportInfo info{TransportKind::kShm, false, {}, {}};
  std::string why;
  info.usable = shm::cross_memory_allowed(why);
  info.detail = info.usable
                    ? "processes of this host: one copy with process_vm_readv, records over a "
                      "Unix socket (each pair proves it may read the other when it connects)"
                    : "process_vm_readv is refused in this process: " + why;
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
