#include "transport/verbs/devices.hpp"

#include <arpa/inet.h>

#include <algorithm>
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

const char* gid_type_name(uint32_t type) {
  return type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "RoCE v1";
}

struct GidEntry {
  int index;
  ibv_gid gid;
  std::string type;
};

// A port's non-zero GIDs with their types: from one table query where libibverbs has it, else
// entry by entry.
std::vector<GidEntry> valid_gids(const VerbsApi& api, ibv_context* ctx, const std::string& device,
                                 uint8_t port, const ibv_port_attr& pa) {
  std::vector<GidEntry> out;
  bool ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (api.query_gid_table != nullptr && pa.gid_tbl_len > 0) {
    // The table spans every port of the device; the port's own length bounds it well enough
    // for one-port devices, and a short answer falls back below.
    std::vector<ibv_gid_entry> entries(static_cast<std::size_t>(pa.gid_tbl_len) * 4);
    ssize_t n = api.query_gid_table(ctx, entries.data(), entries.size(), 0, sizeof(ibv_gid_entry));
    if (n >= 0) {
      for (ssize_t i = 0; i < n; ++i) {
        const ibv_gid_entry& e = entries[static_cast<std::size_t>(i)];
        if (e.port_num != port) continue;
        out.push_back(
            {static_cast<int>(e.gid_index), e.gid, ethernet ? gid_type_name(e.gid_type) : "IB"});
      }
      std::sort(out.begin(), out.end(),
                [](const GidEntry& a, const GidEntry& b) { return a.index < b.index; });
      return out;
    }
  }
  for (int i = 0; i < pa.gid_tbl_len; ++i) {
    GidEntry e{i, {}, {}};
    if (api.query_gid(ctx, port, i, &e.gid) != 0) break;
    static const uint8_t zero[16] = {};
    if (std::memcmp(e.gid.raw, zero, 16) == 0) continue;
    if (!ethernet) {
      e.type = "IB";
    } else if (api.query_gid_ex != nullptr) {
      ibv_gid_entry entry{};
      if (api.query_gid_ex(ctx, port, static_cast<uint32_t>(i), &entry, 0, sizeof entry) == 0) {
        e.type = gid_type_name(entry.gid_type);
      }
    } else {
      e.type = gid_type_from_sysfs(device, port, i);
    }
    out.push_back(std::move(e));
  }
  return out;
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
        for (const GidEntry& e : valid_gids(api, ctx, dev.name, p, pa)) {
          GidInfo g;
          g.index = e.index;
          char text[INET6_ADDRSTRLEN] = {};
          inet_ntop(AF_INET6, e.gid.raw, text, sizeof text);
          g.address = text;
          static const uint8_t mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
          g.ipv4_mapped = std::memcmp(e.gid.raw, mapped_prefix, 12) == 0;
          g.type = e.type;
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
