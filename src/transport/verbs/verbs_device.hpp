// One opened RDMA device: protection domain, chosen port and GID, and the memory
// registrations of the engine's regions (indexed by region slot for lock-free lookup).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "transport/contract.hpp"
#include "transport/verbs/devices.hpp"
#include "transport/verbs/verbs_api.hpp"

namespace ferry::transport::verbs {

struct VerbsOptions {
  std::string device;  // empty: the first device with an active port and a usable GID
  int gid_index = -1;  // -1: choose (routable RoCE v2 first)
  int qps_per_peer = 2;
  std::chrono::nanoseconds busy_poll{0};  // Config::busy_poll
  bool zero_copy_receives = false;        // Config::verbs.zero_copy_receives
};

class VerbsDevice final : public Transport {
 public:
  // Opens the device named in `options` (an unknown name is an error, never a fallback).
  // Returns null with `why` set when verbs is unusable here.
  static std::unique_ptr<VerbsDevice> open(const VerbsOptions& options, std::string& why);
  ~VerbsDevice() override;

  TransportKind kind() const override { return TransportKind::kVerbs; }
  Status register_region(uint32_t region_id, uint8_t* base, uint64_t length, Access access,
                         uint64_t table_key, KeySink& keys) override;
  void deregister_region(uint32_t region_id) override;
  Status make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) override;

  // The local key of a registered region, for scatter/gather entries; 0 if unknown.
  uint32_t lkey(uint32_t region_id) const;
  // The remote key of a registered region; 0 if unknown.
  uint32_t rkey(uint32_t region_id) const;

  // Size of one receive buffer: a message header and up to 64 KiB + 16 of payload. Larger
  // messages go by rendezvous, so this bounds what one eager SEND or CHUNK carries. 64 KiB
  // messages go eager because a rendezvous costs RTS, CTS and FIN, each a packet plus its RC
  // ACK: 23 packets against ib_send_bw's 17, and 64 KiB sends fell behind it by about that much;
  // eager, they came closer (docs/performance-history.md, "Sends at 64 KiB go eager"). The copy
  // out of the slot costs less than those packets.
  static constexpr uint32_t kRecvSlotBytes = 65536 + 64;
  // The shared receive queue every queue pair of the device takes its receives from: messages
  // (SEND) and WRITE_WITH_IMM notifications of every peer. Each receive owns one slot of a
  // registered buffer; whoever handles its completion posts it again.
  ibv_srq* srq() const { return srq_; }
  int srq_depth() const { return srq_depth_; }
  static constexpr uint64_t kSrqWrId = 3ull << 56;
  // The slot a receive completion filled (its wr_id), or -1 for a foreign wr_id.
  int slot_of_wr(uint64_t wr_id) const;
  const uint8_t* slot_data(int slot) const { return recv_buf_.get() + slot * kRecvSlotBytes; }
  Status repost_srq(int slot);

  const VerbsApi& api() const { return *api_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  ibv_mtu active_mtu() const { return mtu_; }
  int max_qp_wr() const { return max_qp_wr_; }
  int max_rd_atomic() const { return max_rd_atomic_; }
  const VerbsOptions& options() const { return options_; }
  std::string name() const { return name_; }

 private:
  VerbsDevice() = default;
  const VerbsApi* api_ = nullptr;
  VerbsOptions options_;
  std::string name_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  int gid_index_ = -1;
  ibv_gid gid_{};
  ibv_mtu mtu_ = IBV_MTU_1024;
  int max_qp_wr_ = 0;
  int max_rd_atomic_ = 1;
  bool relaxed_ordering_ = false;
  ibv_srq* srq_ = nullptr;
  int srq_depth_ = 0;
  std::unique_ptr<uint8_t[]> recv_buf_;  // srq_depth_ slots
  ibv_mr* recv_mr_ = nullptr;
  std::unique_ptr<std::atomic<ibv_mr*>[]> mrs_;  // by region slot
};

}  // namespace ferry::transport::verbs
