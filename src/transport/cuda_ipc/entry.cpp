// The CUDA IPC transport's line in the registry (transports.def).
#include "transport/cuda_ipc/cuda_ipc.hpp"
#include "transport/registry.hpp"

namespace ferry::transport {
namespace {

constexpr std::string_view kName = "cuda_ipc";

// Settings kept by name (no field in Config).
const Setting kSettings[] = {
    {"streams", SettingType::kCount,
     "CUDA streams per device a channel's copies go on (its lanes): not yet measured on a GPU", 1,
     16, nullptr, nullptr, "2"},
    {"mappings", SettingType::kCount,
     "peer regions one channel keeps mapped, and of its own regions it lets a peer map; the "
     "least recently used idle mapping is closed for a new one",
     1, 65536, nullptr, nullptr, "1024"},
};

std::unique_ptr<Transport> open(const Config& config, std::string& why) {
  cuda_ipc::Settings settings;
  settings.streams = static_cast<int>(number_setting(config, kName, kSettings[0]));
  settings.mappings = static_cast<int>(number_setting(config, kName, kSettings[1]));
  // Bound, not initialized: an engine that never meets CUDA memory leaves CUDA unstarted; a
  // CUDA region exists only once something in the process called cuInit.
  const core::cuda::Driver* driver = core::cuda::Driver::bound(&why);
  if (driver == nullptr) return nullptr;
  return std::make_unique<cuda_ipc::CudaIpcTransport>(*driver, settings);
}

TransportInfo describe() {
  CudaInfo cuda = core::cuda::inventory();
  TransportInfo info{cuda_ipc::kKind, cuda.driver && !cuda.gpus.empty(), {}, {}};
  if (!cuda.driver) {
    info.detail = cuda.why;
  } else if (cuda.gpus.empty()) {
    info.detail = "the CUDA driver sees no GPU with unified addressing";
  } else {
    info.detail = "GPU memory between processes of one host: legacy IPC handles, copied by the GPU";
  }
  for (const GpuInfo& g : cuda.gpus)
    info.devices.push_back("cuda:" + std::to_string(g.ordinal) + " " + g.name + " " + g.pci);
  return info;
}

// The frames queued for a peer that reads none, and the state of the mappings both ways.
std::size_t worst_case_channel_bytes(const Config& config) {
  auto mappings = static_cast<std::size_t>(number_setting(config, kName, kSettings[1]));
  return sizeof(cuda_ipc::CudaIpcChannel) + (std::size_t{1} << 20) + mappings * 512;
}

}  // namespace

const TransportEntry& cuda_ipc_entry() {
  static const TransportEntry entry{cuda_ipc::kKind,
                                    kName,
                                    kCapCrossProcess | kCapImm | kCapOneSided,
                                    memory_bit(MemoryKind::kCuda),
                                    open,
                                    describe,
                                    worst_case_channel_bytes,
                                    kSettings};
  return entry;
}

}  // namespace ferry::transport
