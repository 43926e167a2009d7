// `ferry info` and the host's interface addresses, which `ferry bench --listen` shows too.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::cli {

struct InterfaceAddress {
  std::string name;     // "eth0"
  std::string address;  // numeric, "192.0.2.2", "fd00::2", "fe80::1%eth0"
  bool ipv6 = false;
  bool up = false;
  bool loopback = false;
  bool link_local = false;  // IPv6 fe80::/10: usable only with the remote side's own scope
};

std::vector<InterfaceAddress> interface_addresses();

int run_info(bool json);
// `ferry info --identity FILE`: the engine id and public key an engine with that identity file
// has (the file is created if missing, as the engine would).
int run_identity(const std::string& identity_file, bool json);

// `s` as a JSON string, quoted and escaped.
std::string json_string(std::string_view s);
// One line per route: operations, memory kinds, transport and why, each line after `indent`.
void print_routes(std::ostream& out, const std::vector<RouteInfo>& routes,
                  const std::string& indent);
// A JSON array of the routes.
std::string routes_json(const std::vector<RouteInfo>& routes);

}  // namespace ferry::cli
