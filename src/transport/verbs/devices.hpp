// RDMA device discovery and GID selection.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "transport/verbs/verbs_api.hpp"

namespace ferry::transport::verbs {

struct GidInfo {
  int index = -1;
  std::string address;  // textual IPv6 form
  std::string type;     // "RoCE v2", "RoCE v1", "IB"
  bool ipv4_mapped = false;
};

struct PortInfo {
  uint8_t number = 0;
  bool active = false;
  std::string link_layer;  // "Ethernet" or "InfiniBand"
  int active_mtu = 0;      // bytes
  std::vector<GidInfo> gids;
  int chosen_gid = -1;  // index into the port's GID table, -1: none usable
};

struct DeviceInfo {
  std::string name;
  int max_qp_wr = 0;
  int max_sge = 0;
  int max_qp_rd_atom = 0;
  int max_srq_wr = 0;
  std::vector<PortInfo> ports;
};

// Prefers RoCE v2 with an IPv4-mapped address (routable), then any RoCE v2, then the first
// non-zero GID. `wanted_index` >= 0 forces that index, which must exist.
int choose_gid(const PortInfo& port, int wanted_index);
// An active port with a GID to use (the one at `wanted_index` when >= 0).
inline bool usable(const PortInfo& port, int wanted_index = -1) {
  return port.active && choose_gid(port, wanted_index) >= 0;
}

// Every device with its ports and GIDs; `why` says what failed when the list is empty.
std::vector<DeviceInfo> discover(const VerbsApi& api, std::string& why);

// "rxe0 port 1: Ethernet, mtu 1024, gid[1] ::ffff:10.99.0.1 (RoCE v2)"
std::string describe(const DeviceInfo& device, const PortInfo& port);

}  // namespace ferry::transport::verbs
