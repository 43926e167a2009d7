#include "info.hpp"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "ferry/ferry.hpp"

namespace ferry::cli {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

namespace {

const char* json_bool(bool b) { return b ? "true" : "false"; }

std::string memory_text(const RouteInfo& r) {
  return std::string(to_string(r.local)) + "->" + std::string(to_string(r.remote));
}

std::string transport_text(const RouteInfo& r) {
  return r.transport ? std::string(to_string(*r.transport)) : std::string("none");
}

// How a NIC could reach the GPU's memory directly (GPUDirect RDMA), or why it cannot.
std::string gpudirect_text(const GpuInfo& g, const CudaInfo& cuda) {
  if (g.dmabuf) return "dmabuf";
  if (g.gpudirect_rdma && cuda.peer_memory_module) return "peer memory (nvidia-peermem)";
  if (g.gpudirect_rdma) return "no: nvidia-peermem is not loaded and the GPU exports no dmabuf";
  return "no: the GPU does not support it";
}

std::string driver_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string cuda_json(const CudaInfo& cuda) {
  std::string out = std::string("{\"driver\":") + json_bool(cuda.driver) +
                    ",\"why\":" + json_string(cuda.why) + ",\"driver_version\":" +
                    json_string(cuda.driver ? driver_version_text(cuda.driver_version) : "") +
                    ",\"peer_memory_module\":" + json_bool(cuda.peer_memory_module) + ",\"gpus\":[";
  for (std::size_t i = 0; i < cuda.gpus.size(); ++i) {
    const GpuInfo& g = cuda.gpus[i];
    out += std::string(i ? "," : "") + "{\"ordinal\":" + std::to_string(g.ordinal) +
           ",\"name\":" + json_string(g.name) + ",\"pci\":" + json_string(g.pci) +
           ",\"memory_bytes\":" + std::to_string(g.memory_bytes) +
           ",\"vmm_posix_fd\":" + json_bool(g.vmm_posix_fd) +
           ",\"gpudirect_rdma\":" + json_string(gpudirect_text(g, cuda)) + "}";
  }
  return out + "]}";
}

void print_gpus(const CudaInfo& cuda) {
  if (!cuda.driver) {
    std::cout << "\ngpus: none (" << cuda.why << ")\n";
    return;
  }
  std::cout << "\ngpus (CUDA driver " << driver_version_text(cuda.driver_version)
            << "):" << (cuda.gpus.empty() ? " none" : "") << "\n";
  for (const GpuInfo& g : cuda.gpus) {
    std::cout << "  " << g.ordinal << "  " << g.name << "  " << g.pci << "  "
              << g.memory_bytes / (1U << 20)
              << " MiB  VMM handles as file descriptors: " << (g.vmm_posix_fd ? "yes" : "no")
              << "  GPUDirect RDMA: " << gpudirect_text(g, cuda) << "\n";
  }
}

// The routes an engine with the default configuration would take, by the peer's reach.
constexpr Reach kShownReach[] = {Reach::kSameHost, Reach::kOtherHost};

void print_json(const std::vector<TransportInfo>& transports,
                const std::vector<InterfaceAddress>& interfaces) {
  std::string out = "{\"version\":" + json_string(Engine::version()) + ",\"transports\":[";
  for (std::size_t i = 0; i < transports.size(); ++i) {
    const auto& t = transports[i];
    out += std::string(i ? "," : "") + "{\"name\":" + json_string(to_string(t.kind)) +
           ",\"usable\":" + json_bool(t.usable) + ",\"detail\":" + json_string(t.detail) +
           ",\"devices\":[";
    for (std::size_t d = 0; d < t.devices.size(); ++d)
      out += (d ? "," : "") + json_string(t.devices[d]);
    out += "]}";
  }
  out += "],\"configured\":{\"by\":";
  out +=
      json_string(std::getenv(Engine::kTransportsVariable) != nullptr ? Engine::kTransportsVariable
                                                                      : "default");
  out += ",\"transports\":[";
  std::vector<TransportKind> configured = Engine::with_environment(Config{}).transports;
  for (std::size_t i = 0; i < configured.size(); ++i)
    out += (i ? "," : "") + json_string(to_string(configured[i]));
  out += "]},\"routes\":{";
  for (Reach reach : kShownReach) {
    out += std::string(reach == kShownReach[0] ? "" : ",") + json_string(to_string(reach)) + ":" +
           routes_json(Engine::routes(Config{}, reach));
  }
  out += "},\"settings\":[";
  std::vector<SettingInfo> settings = Engine::settings();
  for (std::size_t i = 0; i < settings.size(); ++i) {
    const SettingInfo& s = settings[i];
    out += std::string(i ? "," : "") + "{\"name\":" + json_string(s.name) +
           ",\"type\":" + json_string(s.type) + ",\"value\":" + json_string(s.value) +
           ",\"default\":" + json_string(s.default_value) + ",\"range\":" + json_string(s.range) +
           ",\"environment\":" + json_string(s.environment) + ",\"help\":" + json_string(s.help) +
           "}";
  }
  out += "],\"cuda\":" + cuda_json(Engine::gpus()) + ",\"interfaces\":[";
  for (std::size_t i = 0; i < interfaces.size(); ++i) {
    const auto& a = interfaces[i];
    out += std::string(i ? "," : "") + "{\"name\":" + json_string(a.name) +
           ",\"address\":" + json_string(a.address) + ",\"up\":" + json_bool(a.up) + "}";
  }
  std::cout << out << "]}" << std::endl;
}

// Left-aligned in a column as wide as the widest entry, two spaces apart.
std::string pad(const std::string& s, std::size_t width) {
  return s + std::string(width - s.size() + 2, ' ');
}

template <class T, class F>
std::size_t widest(const std::vector<T>& items, F field) {
  std::size_t w = 0;
  for (const auto& item : items) w = std::max(w, field(item).size());
  return w;
}

// Each transport setting: its value (the environment applied), range, default and help.
void print_settings() {
  std::vector<SettingInfo> settings = Engine::settings();
  std::cout << "\ntransport settings (set with FERRY_<TRANSPORT>_<NAME>, Engine::set, Python's "
               "settings=, ferry bench --set NAME=VALUE):\n";
  auto assignment = [](const SettingInfo& s) { return s.name + " = " + s.value; };
  auto range = [](const SettingInfo& s) {
    return s.range.empty() ? s.type : s.type + " " + s.range;
  };
  std::size_t assignment_w = widest(settings, assignment), range_w = widest(settings, range);
  for (const SettingInfo& s : settings) {
    std::string was = s.value == s.default_value ? "" : " (default " + s.default_value + ")";
    std::cout << "  " << pad(assignment(s), assignment_w) << pad(range(s), range_w) << s.help << was
              << "\n";
  }
}

void print_text(const std::vector<TransportInfo>& transports,
                const std::vector<InterfaceAddress>& interfaces) {
  std::cout << "ferry " << Engine::version() << "\n\ntransports:\n";
  auto name = [](const TransportInfo& t) { return std::string(to_string(t.kind)); };
  auto state = [](const TransportInfo& t) { return std::string(t.usable ? "usable" : "unusable"); };
  std::size_t name_w = widest(transports, name), state_w = widest(transports, state);
  std::vector<std::string> rdma_devices;
  for (const auto& t : transports) {
    std::cout << "  " << pad(name(t), name_w) << pad(state(t), state_w) << t.detail << "\n";
    if (t.kind == TransportKind::kVerbs) rdma_devices = t.devices;
  }
  std::string configured;
  for (TransportKind kind : Engine::with_environment(Config{}).transports) {
    configured += (configured.empty() ? "" : ", ") + std::string(to_string(kind));
  }
  const char* from_environment = std::getenv(Engine::kTransportsVariable);
  std::cout << "\nroutes with the "
            << (from_environment
                    ? std::string("transports ") + Engine::kTransportsVariable + " names"
                    : std::string("default transports"))
            << " (" << configured << "), to a peer configured alike:\n";
  for (Reach reach : kShownReach) {
    std::cout << "  peer on " << (reach == Reach::kSameHost ? "this host" : "another host")
              << ":\n";
    print_routes(std::cout, Engine::routes(Config{}, reach), "    ");
  }
  print_settings();
  std::cout << "\nnetwork interfaces (tcp):\n";
  std::size_t if_w = widest(interfaces, [](const InterfaceAddress& a) { return a.name; });
  std::size_t addr_w = widest(interfaces, [](const InterfaceAddress& a) { return a.address; });
  for (const auto& a : interfaces) {
    std::string line = "  " + pad(a.name, if_w) + pad(a.address, addr_w) + (a.up ? "" : "(down)");
    line.erase(line.find_last_not_of(' ') + 1);
    std::cout << line << "\n";
  }
  std::cout << "\nrdma devices:" << (rdma_devices.empty() ? " none" : "") << "\n";
  for (const auto& d : rdma_devices) std::cout << "  " << d << "\n";
  print_gpus(Engine::gpus());
}

}  // namespace

std::vector<InterfaceAddress> interface_addresses() {
  std::vector<InterfaceAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char host[NI_MAXHOST];
    socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(a->ifa_addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) continue;
    bool link_local =
        family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    out.push_back({a->ifa_name, host, family == AF_INET6, (a->ifa_flags & IFF_UP) != 0,
                   (a->ifa_flags & IFF_LOOPBACK) != 0, link_local});
  }
  freeifaddrs(list);
  return out;
}

void print_routes(std::ostream& out, const std::vector<RouteInfo>& routes,
                  const std::string& indent) {
  std::size_t op_w = widest(routes, [](const RouteInfo& r) { return r.operations; });
  std::size_t mem_w = widest(routes, memory_text);
  std::size_t tr_w = widest(routes, transport_text);
  for (const RouteInfo& r : routes) {
    out << indent << pad(r.operations, op_w) << pad(memory_text(r), mem_w)
        << pad(transport_text(r), tr_w) << r.why << "\n";
  }
}

std::string routes_json(const std::vector<RouteInfo>& routes) {
  std::string out = "[";
  for (const RouteInfo& r : routes) {
    out += std::string(out.size() > 1 ? "," : "") + "{\"operations\":" + json_string(r.operations) +
           ",\"local\":" + json_string(to_string(r.local)) +
           ",\"remote\":" + json_string(to_string(r.remote)) + ",\"transport\":" +
           (r.transport ? json_string(to_string(*r.transport)) : std::string("null")) +
           ",\"why\":" + json_string(r.why) + "}";
  }
  return out + "]";
}

int run_info(bool json) {
  std::vector<TransportInfo> transports = Engine::transports();
  std::vector<InterfaceAddress> interfaces = interface_addresses();
  if (json) {
    print_json(transports, interfaces);
  } else {
    print_text(transports, interfaces);
  }
  return 0;
}

int run_identity(const std::string& identity_file, bool json) {
  Config config;
  config.listen = false;
  config.identity_file = identity_file;
  config.transports = {TransportKind::kTcp};
  config.transports_from_environment = false;
  Engine engine(config);
  if (json) {
    std::cout << "{\"engine_id\":" << engine.id()
              << ",\"public_key\":" << json_string(engine.public_key()) << "}" << std::endl;
  } else {
    std::cout << "engine id   " << engine.id() << "\npublic key  " << engine.public_key()
              << std::endl;
  }
  return 0;
}

}  // namespace ferry::cli
