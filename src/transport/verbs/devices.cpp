#include "transport/verbs/devices.hpp"

#include <arpa/inet.h>

#include <cstring>
#include <fstream>

namespace ferry::transport::verbs {

namespace {

int mtu_bytes(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return 256;
    case IBV_MTU_512:
      return 512;
    case IBV_MTU_1024:
      return 1024;
    case IBV_MTU_2048:
      return 2048;
    case IBV_MTU_4096:
      return 4096;
  }
  return 0;
}

// Older libibverbs has no _ibv_query_gid_ex: the kernel publishes the type in sysfs.
std::string gid_type_from_sysfs(const std::string& device, int port, int index) {
  std::ifstream f("/sys/class/infiniband/" + device + "/ports/" + std::to_string(port) +
                  "/gid_attrs/types/" + std::to_string(index));
  std::string line;
  std::getline(f, line);
  if (line == "RoCE v2") return "RoCE v2";
  if (line.rfind("IB/RoCE v1", 0) == 0 || line == "RoCE v1") return "RoCE v1";
  return line;
}

}  // namespace

int choose_gid(const PortInfo& port, int wanted_index) {
  if (wanted_index >= 0) {
    for (const GidInfo& g : port.gids) {
      if (g.index == wanted_index) return wanted_index;
    }
    return -1;
  }
  for (const GidInfo& g : port.gids) {
    if (g.type == "RoCE v2" && g.ipv4_mapped) return g.index;
  }
  for (const GidInfo& g : port.gids) {
    if (g.type == "RoCE v2") return g.index;
  }
  return port.gids.empty() ? -1 : port.gids.front().index;
}

std::vector<DeviceInfo> discover(const VerbsApi& api, std::string& why) {
  std::vector<DeviceInfo> out;
  int count = 0;
  ibv_device** list = api.get_device_list(&count);
  if (list == nullptr) {
    int err = errno;
    why = std::string(err == ENOSYS ? "this kernel has no RDMA stack (" : "(") +
          "ibv_get_device_list: " + std::strerror(err) + ")";
    return out;
  }
  if (count == 0) why = "no RDMA devices (ibv_get_device_list found none)";
  for (int d = 0; d < count; ++d) {
    DeviceInfo dev;
    dev.name = api.get_device_name(list[d]);
    ibv_context* ctx = api.open_device(list[d]);
    if (ctx == nullptr) {
      why = "ibv_open_device " + dev.name + ": " + std::strerror(errno);
      continue;
    }
    ibv_device_attr attr{};
    if (api.query_device(ctx, &attr) == 0) {
      dev.max_qp_wr = attr.max_qp_wr;
      dev.max_sge = attr.max_sge;
      dev.max_qp_rd_atom = attr.max_qp_rd_atom;
      dev.max_srq_wr = attr.max_srq_wr;
      for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (api.query_port(ctx, p, reinterpret_cast<_compat_ibv_port_attr*>(&pa)) != 0) continue;
        PortInfo port;
        port.number = p;
        port.active = pa.state == IBV_PORT_ACTIVE;
        port.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
        port.active_mtu = mtu_bytes(pa.active_mtu);
        for (int i = 0; i < pa.gid_tbl_len; ++i) {
          ibv_gid gid{};
          if (api.query_gid(ctx, p, i, &gid) != 0) break;
          static const uint8_t zero[16] = {};
          if (std::memcmp(gid.raw, zero, 16) == 0) continue;
          GidInfo g;
          g.index = i;
          char text[INET6_ADDRSTRLEN] = {};
          inet_ntop(AF_INET6, gid.raw, text, sizeof text);
          g.address = text;
          static const uint8_t mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
          g.ipv4_mapped = std::memcmp(gid.raw, mapped_prefix, 12) == 0;
          if (pa.link_layer != IBV_LINK_LAYER_ETHERNET) {
            g.type = "IB";
          } else if (api.query_gid_ex != nullptr) {
            ibv_gid_entry entry{};
            if (api.query_gid_ex(ctx, p, static_cast<uint32_t>(i), &entry, 0, sizeof entry) == 0) {
              g.type = entry.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "RoCE v1";
            }
          } else {
            g.type = gid_type_from_sysfs(dev.name, p, i);
          }
          port.gids.push_back(std::move(g));
        }
        port.chosen_gid = choose_gid(port, -1);
        dev.ports.push_back(std::move(port));
      }
    }
    api.close_device(ctx);
    out.push_back(std::move(dev));
  }
  api.free_device_list(list);
  return out;
}

std::string describe(const DeviceInfo& device, const PortInfo& port) {
  std::string s = device.name + " port " + std::to_string(port.number) + ": " + port.link_layer +
                  (port.active ? "" : " (down)") + ", mtu " + std::to_string(port.active_mtu);
  for (const GidInfo& g : port.gids) {
    if (g.index == port.chosen_gid) {
      s += ", gid[" + std::to_string(g.index) + "] " + g.address + " (" + g.type + ")";
    }
  }
  if (port.chosen_gid < 0) s += ", no usable gid";
  return s;
}

}  // namespace ferry::transport::verbs
