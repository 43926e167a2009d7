// VerbsChannel: its address, set-up (queue pairs taken through INIT, RTR and RTS) and closing.
// Posting and completions are in verbs_channel.cpp, tagged messages in
// verbs_channel_messages.cpp.
#include <fcntl.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/bytes.hpp"
#include "core/crypto.hpp"
#include "transport/verbs/verbs_channel.hpp"
#include "transport/verbs/verbs_channel_parts.hpp"

namespace ferry::transport::verbs {

namespace {
// Send queue depth per queue pair: enough to keep a 1 MiB-sliced stream busy while completions
// come back; capped by the device.
constexpr int kSendDepth = 256;
// Writes up to this size travel inline in the work request, if the device allows.
constexpr uint32_t kWantedInline = 64;
constexpr int kMaxReadsInFlight = 16;
// How long a closing channel waits for its queue pairs' flush (stop_queue_pairs), on the thread
// that closes it: Soft-RoCE flushes from a tasklet within microseconds, hardware as fast; this
// bounds what one lost peer can cost the others served by the same thread.
constexpr std::chrono::milliseconds kDrainWait{50};

std::string modify_error(const char* step, int rc) {
  return std::string("ibv_modify_qp ") + step + ": " + std::strerror(rc);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Addressing

std::vector<uint8_t> VerbsAddress::encode() const {
  // Fixed offsets (not ByteWriter's appends, which trip GCC 12's -Wstringop-overflow here).
  std::vector<uint8_t> out(sizeof gid + 2 + 1 + 4 + 1 + 4 * qpns.size());
  uint8_t* p = out.data();
  std::memcpy(p, gid, sizeof gid);
  p += sizeof gid;
  core::store_le(p, lid, 2);
  p += 2;
  *p++ = mtu;
  core::store_le(p, psn, 4);
  p += 4;
  *p++ = static_cast<uint8_t>(qpns.size());
  for (uint32_t q : qpns) {
    core::store_le(p, q, 4);
    p += 4;
  }
  return out;
}

Status VerbsAddress::decode(std::span<const uint8_t> bytes, VerbsAddress& out) {
  core::ByteReader r(bytes);
  VerbsAddress a;
  r.bytes(a.gid, sizeof a.gid);
  a.lid = r.u16();
  a.mtu = r.u8();
  a.psn = r.u32();
  std::size_t n = r.u8();
  if (r.ok() && (a.mtu < IBV_MTU_256 || a.mtu > IBV_MTU_4096)) {
    return {ErrorCode::kProtocol, "verbs address: unknown mtu " + std::to_string(a.mtu)};
  }
  if (r.ok() && (n == 0 || n > kMaxQps)) {
    return {ErrorCode::kProtocol, "verbs address: " + std::to_string(n) + " queue pairs"};
  }
  for (std::size_t i = 0; i < n && r.ok(); ++i) {
    uint32_t qpn = r.u32();
    if (r.ok() && qpn > 0xffffff) {
      return {ErrorCode::kProtocol, "verbs address: queue pair number over 24 bits"};
    }
    a.qpns.push_back(qpn);
  }
  if (!r.ok()) return {ErrorCode::kProtocol, "verbs address: truncated"};
  if (!r.at_end()) return {ErrorCode::kProtocol, "verbs address: trailing bytes"};
  out = std::move(a);
  return {};
}

// ---------------------------------------------------------------------------------------------
// Set-up

std::shared_ptr<VerbsChannel> VerbsChannel::create(Host& host, VerbsDevice& device,
                                                   std::shared_ptr<PeerLink> link,
                                                   const Options& options,
                                                   std::function<void(const Status&)> on_closed) {
  std::shared_ptr<VerbsChannel> ch(
      new VerbsChannel(host, device, std::move(link), std::move(on_closed)));
  ch->busy_poll_ = options.busy_poll;
  ch->zero_copy_receives_ = options.zero_copy_receives;
  if (Status s = ch->init(options.qps); !s.ok()) throw Error(s);
  return ch;
}

Status VerbsDevice::make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) {
  try {
    out = VerbsChannel::create(
        args.host, *this, std::move(args.link),
        {options_.qps_per_peer, options_.busy_poll, options_.zero_copy_receives},
        std::move(args.on_closed));
  } catch (const Error& e) {
    return e.status();  // no queue pairs for this peer: it is refused, the engine goes on
  }
  return {};
}

std::size_t VerbsChannel::worst_case_bytes(int qps) {
  return sizeof(VerbsChannel) +
         static_cast<std::size_t>(qps) * (sizeof(Lane) + kSendDepth * std::size_t{kHeaderSlot});
}

VerbsChannel::VerbsChannel(Host& host, VerbsDevice& device, std::shared_ptr<PeerLink> link,
                           std::function<void(const Status&)> on_closed)
    : host_(host),
      dev_(device),
      api_(device.api()),
      link_(std::move(link)),
      latch_(std::move(on_closed)) {}

Status VerbsChannel::init(int qps) {
  if (qps < 1 || qps > static_cast<int>(VerbsAddress::kMaxQps)) {
    return {ErrorCode::kInvalidArgument,
            "verbs.qps must be 1.." + std::to_string(VerbsAddress::kMaxQps)};
  }
  int send_depth = std::min(kSendDepth, std::max(dev_.max_qp_wr(), 1));
  send_depth_ = send_depth;
  // Header slot `posted % send_depth` is free again when reused: at most send_depth - 1
  // requests of a lane are outstanding (sq_free), and a request is freed only after the
  // completion covering it, so the NIC has read its header.
  std::size_t header_bytes = static_cast<std::size_t>(qps) * send_depth * kHeaderSlot;
  headers_.reset(new uint8_t[header_bytes]());
  headers_mr_ = api_.reg_mr(dev_.pd(), headers_.get(), header_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (headers_mr_ == nullptr)
    return {ErrorCode::kSystem,
            std::string("ibv_reg_mr (message headers): ") + std::strerror(errno)};
  comp_ = api_.create_comp_channel(dev_.context());
  if (comp_ == nullptr)
    return {ErrorCode::kSystem, std::string("ibv_create_comp_channel: ") + std::strerror(errno)};
  // Every send request may be signaled; receives are bounded by the shared queue's depth.
  send_cq_ = api_.create_cq(dev_.context(), qps * send_depth, this, comp_, 0);
  if (send_cq_ == nullptr)
    return {ErrorCode::kSystem, std::string("ibv_create_cq: ") + std::strerror(errno)};
  recv_cq_ = api_.create_cq(dev_.context(), dev_.srq_depth(), this, comp_, 0);
  if (recv_cq_ == nullptr)
    return {ErrorCode::kSystem, std::string("ibv_create_cq: ") + std::strerror(errno)};
  psn_ = static_cast<uint32_t>(core::random_u64()) & 0xffffff;
  for (int i = 0; i < qps; ++i) {
    auto lane = std::make_unique<Lane>();
    ibv_qp_init_attr attr{};
    attr.send_cq = send_cq_;
    attr.recv_cq = recv_cq_;
    attr.srq = dev_.srq();
    attr.cap.max_send_wr = static_cast<uint32_t>(send_depth);
    attr.cap.max_send_sge = 2;  // a message: header + payload
    attr.cap.max_inline_data = kWantedInline;
    attr.qp_type = IBV_QPT_RC;
    lane->qp = api_.create_qp(dev_.pd(), &attr);
    if (lane->qp == nullptr) {
      attr.cap.max_inline_data = 0;  // some devices refuse inline data
      lane->qp = api_.create_qp(dev_.pd(), &attr);
    }
    if (lane->qp == nullptr)
      return {ErrorCode::kSystem, std::string("ibv_create_qp: ") + std::strerror(errno)};
    max_inline_ = attr.cap.max_inline_data;
    lane->sq_free = send_depth - 1;  // one slot kept for draining
    lane->single_wr.wr_id = wr_id(kWrOp, i);
    lane->single_wr.sg_list = &lane->single_sge;
    lane->single_wr.num_sge = 1;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = dev_.port();
    // Queue-pair level; each memory registration narrows it to what its owner granted.
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    int rc = api_.modify_qp(lane->qp, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc != 0) return {ErrorCode::kSystem, modify_error("RESET->INIT", rc)};
    lanes_.push_back(std::move(lane));
  }
  return {};
}

VerbsChannel::~VerbsChannel() {
  link_->pool->clear_progress(this);
  take_resources().destroy();  // nothing left if the channel was closed after connecting
}

VerbsAddress VerbsChannel::queue_pairs() const {
  VerbsAddress a;
  std::memcpy(a.gid, dev_.gid().raw, sizeof a.gid);
  a.mtu = static_cast<uint8_t>(dev_.active_mtu());
  a.psn = psn_;
  for (const auto& lane : lanes_) a.qpns.push_back(lane->qp->qp_num);
  return a;
}

Status VerbsChannel::connect(std::span<const uint8_t> address) {
  VerbsAddress remote;
  if (Status s = VerbsAddress::decode(address, remote); !s.ok()) return s;
  if (remote.qpns.size() != lanes_.size()) {
    return {ErrorCode::kProtocol, "verbs: peer has " + std::to_string(remote.qpns.size()) +
                                      " queue pairs, this side " + std::to_string(lanes_.size())};
  }
  auto mtu = static_cast<ibv_mtu>(std::min<int>(remote.mtu, dev_.active_mtu()));
  uint8_t rd = static_cast<uint8_t>(std::min(dev_.max_rd_atomic(), kMaxReadsInFlight));
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = remote.qpns[i];
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = rd;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev_.gid_index());
    a.ah_attr.grh.hop_limit = 64;  // routable RoCE v2: never 1
    a.ah_attr.dlid = remote.lid;
    a.ah_attr.port_num = dev_.port();
    int rc = api_.modify_qp(lanes_[i]->qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0) return {ErrorCode::kConnectFailed, modify_error("INIT->RTR", rc)};
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = 14;   // 4.096 us * 2^14 = 67 ms per try
    s.retry_cnt = 7;  // a silent peer fails after about half a second
    s.rnr_retry = 7;  // receiver not ready: retry without limit (receives are re-posted at once)
    s.sq_psn = psn_;
    s.max_rd_atomic = rd;
    rc = api_.modify_qp(lanes_[i]->qp, &s,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) return {ErrorCode::kConnectFailed, modify_error("RTR->RTS", rc)};
  }
  int flags = fcntl(comp_->fd, F_GETFL);
  fcntl(comp_->fd, F_SETFL, flags | O_NONBLOCK);
  for (ibv_cq* cq : {send_cq_, recv_cq_}) {
    if (int rc = ibv_req_notify_cq(cq, 0); rc != 0) {
      return {ErrorCode::kSystem, std::string("ibv_req_notify_cq: ") + std::strerror(rc)};
    }
  }
  loop_ = host_.reactor().pick_loop();
  keep_alive_ = shared_from_this();
  if (Status s = host_.reactor().add(loop_, comp_->fd, EPOLLIN, this); !s.ok()) {
    keep_alive_.reset();
    return s;
  }
  registered_ = true;
  link_->pool->set_progress(this);
  return {};
}

// ---------------------------------------------------------------------------------------------
// Closing. Destroying a queue pair is the one barrier every provider honours: once
// ibv_destroy_qp returns, the device no longer touches the memory of its requests. (Waiting for
// flush completions instead hung on Soft-RoCE, whose 6.1 receive queues do not always flush.)

void VerbsChannel::close(const Status& reason) {
  if (!latch_.begin(reason)) return;
  if (!registered_) {
    // Never connected: no request reached the wire, nothing to wait for.
    take_resources().destroy();
    stopped_.store(true);
    latch_.report();
    return;
  }
  std::shared_ptr<VerbsChannel> self = shared_from_this();
  host_.reactor().post(loop_, [self] { self->quiesce(); });
}

void VerbsChannel::Resources::destroy() {
  for (ibv_qp* qp : qps) api->destroy_qp(qp);
  // ibv_destroy_cq waits until every completion event was acknowledged.
  if (events_armed) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (api->get_cq_event(comp, &cq, &ctx) == 0) api->ack_cq_events(cq, 1);
  }
  if (headers_mr != nullptr) api->dereg_mr(headers_mr);
  if (send_cq != nullptr) api->destroy_cq(send_cq);
  if (recv_cq != nullptr) api->destroy_cq(recv_cq);
  if (comp != nullptr) api->destroy_comp_channel(comp);
  *this = Resources{};
}

VerbsChannel::Resources VerbsChannel::take_resources() {
  Resources r;
  r.api = &api_;
  for (auto& lane : lanes_) {
    std::lock_guard lock(lane->mu);
    lane->dead = true;
    lane->head = lane->tail = nullptr;
    lane->imm_pending.clear();
    lane->outbox.clear();
    lane->signaled.clear();
    if (lane->qp != nullptr) r.qps.push_back(lane->qp);
    lane->qp = nullptr;
  }
  outstanding_.store(0);
  r.comp = std::exchange(comp_, nullptr);
  r.events_armed = registered_ && r.comp != nullptr;
  r.send_cq = std::exchange(send_cq_, nullptr);
  r.recv_cq = std::exchange(recv_cq_, nullptr);
  r.headers_mr = std::exchange(headers_mr_, nullptr);
  r.headers = std::move(headers_);
  return r;
}

void VerbsChannel::stop_queue_pairs() {
  int markers = 0;
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    std::lock_guard lock(lane.mu);
    lane.dead = true;
    if (lane.qp == nullptr) continue;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (api_.modify_qp(lane.qp, &a, IBV_QP_STATE) != 0) continue;  // then destroy_qp is the barrier
    // The slot kept free for draining (sq_free starts one short of the depth).
    ibv_send_wr marker{};
    marker.wr_id = wr_id(kWrDrain, static_cast<int>(i));
    marker.opcode = IBV_WR_SEND;
    marker.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(lane.qp, &marker, &bad) == 0) ++markers;
  }
  // Every request before a marker flushes first: the device processes a queue in order.
  auto until = std::chrono::steady_clock::now() + kDrainWait;
  ibv_wc wcs[kPollBatch];
  while (markers > 0 && std::chrono::steady_clock::now() < until) {
    int n = ibv_poll_cq(send_cq_, kPollBatch, wcs);
    for (int i = 0; i < n; ++i) {
      if (kind_of(wcs[i].wr_id) == kWrDrain) --markers;
    }
  }
}

void VerbsChannel::quiesce() {
  // No caller may be handling completions while the queue pairs stop (a callback that shuts the
  // engine down from inside a poll already holds the right).
  bool held_here = polling_.held_here();
  if (!held_here) polling_.lock();
  bool already = stopped_.exchange(true);
  if (!already) {
    stop_queue_pairs();
    drain_receives();
  }
  if (!held_here) polling_.unlock();
  if (already) return;
  if (registered_) host_.reactor().remove(loop_, comp_->fd);
  // The queue pairs are stopped: the operations may fail now, before they are destroyed.
  latch_.report();
  auto resources = std::make_shared<Resources>(take_resources());
  std::string what = "ibv_destroy_qp of queue pair";
  for (ibv_qp* qp : resources->qps) what += " " + std::to_string(qp->qp_num);
  host_.teardown().post(std::move(what), [resources] { resources->destroy(); });
  host_.reactor().retire(loop_, std::move(keep_alive_));
}

void VerbsChannel::drain_receives() {
  // What arrived before the close is handled, not dropped: a FIN whose sender completed on its
  // delivery, a message to buffer, an immediate. (Answers go nowhere: the lanes are dead.) Every
  // slot then goes back to the shared receive queue, which serves every peer.
  while (poll_recv() > 0) {
  }
}

void VerbsChannel::stop_after_reactor() {
  if (!registered_) return;
  quiesce();
  keep_alive_.reset();
}

}  // namespace ferry::transport::verbs
