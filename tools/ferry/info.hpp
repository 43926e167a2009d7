// `ferry info` and the host's interface addresses, which `ferry bench --listen` shows too.
#pragma once

#include <string>
#include <vector>

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

}  // namespace ferry::cli
