#include "transport/verbs/verbs_device.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry::transport::verbs {

namespace {
uint32_t slot_of(uint32_t region_id) { return region_id & (RegionTable::kMaxRegions - 1); }
// Receives kept posted on the shared receive queue: the messages and WRITE_WITH_IMM
// notifications of all peers that can be in flight before the progress threads repost
// (rnr_retry covers a burst beyond it); capped by the device. 256 slots of 64 KiB hold 16 MiB
// per device, pinned: one sender's full send queue (256) of eager messages or chunks. (1024
// slots of 64 KiB took 64 MiB per engine, four engines in one guest process a quarter of its
// memory.)
constexpr int kSrqDepth = 256;
}  // namespace

std::unique_ptr<VerbsDevice> VerbsDevice::open(const VerbsOptions& options, std::string& why) {
  const VerbsApi* api = VerbsApi::get(&why);
  if (api == nullptr) return nullptr;
  std::vector<DeviceInfo> devices = discover(*api, why);
  const DeviceInfo* chosen_dev = nullptr;
  const PortInfo* chosen_port = nullptr;
  for (const DeviceInfo& d : devices) {
    if (!options.device.empty() && d.name != options.device) continue;
    for (const PortInfo& p : d.ports) {
      if (!usable(p, options.gid_index)) continue;
      chosen_dev = &d;
      chosen_port = &p;
      break;
    }
    if (chosen_dev != nullptr) break;
    if (!options.device.empty()) {
      why = "rdma device " + options.device + " has no active port with " +
            (options.gid_index >= 0 ? "gid index " + std::to_string(options.gid_index)
                                    : "a usable gid");
      return nullptr;
    }
  }
  if (chosen_dev == nullptr) {
    if (!options.device.empty()) {
      why = "rdma device '" + options.device + "' not found";
    } else if (!devices.empty()) {
      why = "no RDMA device has an active port with a usable gid";
    }
    return nullptr;
  }

  std::unique_ptr<VerbsDevice> dev(new VerbsDevice);
  dev->api_ = api;
  dev->options_ = options;
  dev->name_ = chosen_dev->name;
  dev->port_ = chosen_port->number;
  dev->gid_index_ = choose_gid(*chosen_port, options.gid_index);
  dev->max_qp_wr_ = chosen_dev->max_qp_wr;
  dev->max_rd_atomic_ = chosen_dev->max_qp_rd_atom > 0 ? chosen_dev->max_qp_rd_atom : 1;
  int count = 0;
  ibv_device** list = api->get_device_list(&count);
  for (int i = 0; list != nullptr && i < count; ++i) {
    if (dev->name_ == api->get_device_name(list[i])) dev->ctx_ = api->open_device(list[i]);
  }
  if (list != nullptr) api->free_device_list(list);
  if (dev->ctx_ == nullptr) {
    why = "ibv_open_device " + dev->name_ + ": " + std::strerror(errno);
    return nullptr;
  }
  dev->pd_ = api->alloc_pd(dev->ctx_);
  if (dev->pd_ == nullptr) {
    why = "ibv_alloc_pd " + dev->name_ + ": " + std::strerror(errno);
    return nullptr;
  }
  ibv_port_attr pa{};
  if (api->query_port(dev->ctx_, dev->port_, reinterpret_cast<_compat_ibv_port_attr*>(&pa)) != 0 ||
      api->query_gid(dev->ctx_, dev->port_, dev->gid_index_, &dev->gid_) != 0) {
    why = "ibv_query_port/ibv_query_gid " + dev->name_ + ": " + std::strerror(errno);
    return nullptr;
  }
  dev->mtu_ = pa.active_mtu;
  dev->relaxed_ordering_ = api->reg_mr_iova2 != nullptr;
  dev->mrs_.reset(new std::atomic<ibv_mr*>[RegionTable::kMaxRegions]());
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = static_cast<uint32_t>(
      std::min(kSrqDepth, chosen_dev->max_srq_wr > 0 ? chosen_dev->max_srq_wr : kSrqDepth));
  sa.attr.max_sge = 1;
  dev->srq_ = api->create_srq(dev->pd_, &sa);
  if (dev->srq_ == nullptr) {
    why = "ibv_create_srq " + dev->name_ + ": " + std::strerror(errno);
    return nullptr;
  }
  dev->srq_depth_ = static_cast<int>(sa.attr.max_wr);
  std::size_t buf_bytes = static_cast<std::size_t>(dev->srq_depth_) * kRecvSlotBytes;
  dev->recv_buf_.reset(new uint8_t[buf_bytes]);
  dev->recv_mr_ = api->reg_mr(dev->pd_, dev->recv_buf_.get(), buf_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (dev->recv_mr_ == nullptr) {
    why = "ibv_reg_mr " + dev->name_ + " (receive buffers): " + std::strerror(errno);
    return nullptr;
  }
  for (int slot = 0; slot < dev->srq_depth_; ++slot) {
    if (Status s = dev->repost_srq(slot); !s.ok()) {
      why = s.message();
      return nullptr;
    }
  }
  return dev;
}

VerbsDevice::~VerbsDevice() {
  if (mrs_) {
    for (uint32_t i = 0; i < RegionTable::kMaxRegions; ++i) {
      if (ibv_mr* mr = mrs_[i].load()) api_->dereg_mr(mr);
    }
  }
  if (srq_ != nullptr) api_->destroy_srq(srq_);
  if (recv_mr_ != nullptr) api_->dereg_mr(recv_mr_);
  if (pd_ != nullptr) api_->dealloc_pd(pd_);
  if (ctx_ != nullptr) api_->close_device(ctx_);
}

Status VerbsDevice::register_region(uint32_t region_id, uint8_t* base, uint64_t length,
                                    Access granted, uint64_t, KeySink& keys) {
  // The NIC enforces exactly what was granted: a peer holding the rkey of a read-only region
  // cannot write it. Local writes are always allowed (reads land in local regions).
  int access = IBV_ACCESS_LOCAL_WRITE;
  if (allows(granted, Access::kRemoteRead)) access |= IBV_ACCESS_REMOTE_READ;
  if (allows(granted, Access::kRemoteWrite)) access |= IBV_ACCESS_REMOTE_WRITE;
  ibv_mr* mr = nullptr;
  if (relaxed_ordering_) {
    // Relaxed ordering is optional: devices without it ignore the flag.
    mr = api_->reg_mr_iova2(pd_, base, length, reinterpret_cast<uint64_t>(base),
                            static_cast<unsigned>(access | IBV_ACCESS_RELAXED_ORDERING));
  } else {
    mr = api_->reg_mr(pd_, base, length, access);
  }
  if (mr == nullptr) {
    return {ErrorCode::kSystem, "ibv_reg_mr " + name_ + " (" + std::to_string(length) +
                                    " bytes): " + std::strerror(errno)};
  }
  mrs_[slot_of(region_id)].store(mr);
  uint8_t rkey[sizeof mr->rkey];
  std::memcpy(rkey, &mr->rkey, sizeof mr->rkey);
  return keys.add(0, rkey);
}

void VerbsDevice::deregister_region(uint32_t region_id) {
  if (ibv_mr* mr = mrs_[slot_of(region_id)].exchange(nullptr)) api_->dereg_mr(mr);
}

int VerbsDevice::slot_of_wr(uint64_t wr_id) const {
  if ((wr_id & ~0xffffffffull) != kSrqWrId) return -1;
  auto slot = static_cast<int64_t>(wr_id & 0xffffffffull);
  return slot < srq_depth_ ? static_cast<int>(slot) : -1;
}

Status VerbsDevice::repost_srq(int slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(recv_buf_.get() + slot * kRecvSlotBytes);
  sge.length = kRecvSlotBytes;
  sge.lkey = recv_mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = kSrqWrId | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_srq_recv(srq_, &wr, &bad); rc != 0) {
    return {ErrorCode::kSystem, "ibv_post_srq_recv " + name_ + ": " + std::strerror(rc)};
  }
  return {};
}

uint32_t VerbsDevice::lkey(uint32_t region_id) const {
  ibv_mr* mr = mrs_[slot_of(region_id)].load(std::memory_order_acquire);
  return mr != nullptr ? mr->lkey : 0;
}

uint32_t VerbsDevice::rkey(uint32_t region_id) const {
  ibv_mr* mr = mrs_[slot_of(region_id)].load(std::memory_order_acquire);
  return mr != nullptr ? mr->rkey : 0;
}

}  // namespace ferry::transport::verbs
