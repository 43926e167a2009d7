// `ferry info`: version, transports, interface addresses.
#pragma once

#include <string>
#include <vector>

namespace ferry::cli {

struct InterfaceAddress {
  std::string name;     // "eth0"
  std::string address;  // numeric, "192.0.2.2", "fd00::2", "fe80::1%eth0"
  bool up = false;
};

std::vector<InterfaceAddress> interface_addresses();

int run_info(bool json);

}  // namespace ferry::cli
