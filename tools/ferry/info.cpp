#include "info.hpp"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "ferry/ferry.hpp"

namespace ferry::cli {
namespace {

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

const char* json_bool(bool b) { return b ? "true" : "false"; }

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
  out += "],\"interfaces\":[";
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

}  // namespace ferry::cli
