// CUDA IPC: GPU memory between processes of one host, copied by the GPU (docs/gpu.md).
//
// A region's key carries the legacy IPC handle of its allocation (cuIpcGetMemHandle). Before an
// initiator maps a peer's region it asks the target over the channel's side connection (kOpen);
// the target checks the region's id, key and access as for any access and holds a use of the
// region for as long as the peer keeps it mapped. A deregistration asks the peer to give it
// back (kRevoke); the peer closes its mapping once its copies through it ended and says so
// (kClosed); only then does the deregistration end, so no mapping outlives its region. A peer
// that does not answer is cut off after Config::revoke_timeout.
//
// The initiator copies with cuMemcpyAsync on a stream of its own, one per lane, and records an
// event per operation; the progress thread polls the events (Reactor::Poller), completes the
// operations, and for write_with_imm sends the immediate after the bytes landed (kImm).
// Operations posted while a region's mapping is being asked for wait for the answer (kQueued).
// Peers in this process copy to the region's own address: the same checks, no handle.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda.hpp"
#include "core/net.hpp"
#include "core/reactor.hpp"
#include "transport/close_latch.hpp"
#include "transport/contract.hpp"
#include "transport/cuda_ipc/cuda_ipc_wire.hpp"

namespace ferry::transport::cuda_ipc {

constexpr TransportKind kKind = TransportKind::kCudaIpc;

struct Settings {
  int streams = 2;      // lanes: streams each device's copies go on
  int mappings = 1024;  // peer regions one channel keeps mapped, and peer mappings it lends
};

// What the transport keeps in an op (OpState::transport_area).
struct CudaIpcOpArea {
  uint32_t waiting;  // mappings the op waits for before its copies go out
  int32_t device;    // the device whose context and stream copy it
  uint8_t failed;    // a mapping it waited for was refused: it copies nothing
};

class CudaIpcChannel final : public Channel,
                             public core::Reactor::Handler,
                             public core::Reactor::Poller,
                             public std::enable_shared_from_this<CudaIpcChannel> {
 public:
  CudaIpcChannel(ChannelArgs args, const core::cuda::Driver& driver, Settings settings);
  ~CudaIpcChannel() override;

  TransportKind kind() const override { return kKind; }
  std::vector<uint8_t> local_address() const override;
  Status connect(std::span<const uint8_t> remote) override;
  // One TCP connection carries the frames (cuda_ipc_wire.hpp) both ways.
  int side_connections() const override { return 1; }
  Status attach_side(int index, core::Fd fd) override;
  int lanes() const override { return settings_.streams; }
  PostResult post(OpState* op) override;
  void close(const Status& reason) override;
  bool closed() const override { return latch_.closing(); }
  bool quiesced() const override { return latch_.quiesced(); }
  void stop_after_reactor() override;
  void cut_off(const uint8_t* base, uint64_t length, const Status& why) override;
  void revoking(uint32_t region_id) override;

  // Reactor::Handler: the side connection.
  void on_event(uint32_t events) override;
  // Reactor::Poller: the events of copies in flight. A CUDA event has no file descriptor to wake
  // a sleeping loop: while copies are in flight the loop keeps polling, and when it stops (or
  // was asleep when they went out) a task of ours on it polls and asks again (wake_poller).
  void begin_polling() override { loop_polling_.store(true); }
  bool poll() override;
  void end_polling() override;

 private:
  // A peer region this end maps (as initiator).
  struct Mapping {
    enum State : uint8_t { kAsking, kOpen };
    State state = kAsking;
    Access granted = Access::kLocal;  // what the target allowed
    Access asked = Access::kLocal;    // what the kOpen in flight asks
    Key key;
    core::cuda::CUdeviceptr base = 0;  // the mapped allocation (0 for a peer in this process)
    int device = 0;                    // whose context mapped it
    int uses = 0;                      // entries of operations posted through it and not yet ended
    bool give_back = false;            // the target revoked it: close once uses is 0
    uint64_t last_used = 0;
    std::vector<OpState*> waiting;  // ops posted while it was asked for
  };
  // An operation whose copies went out.
  struct InFlight {
    OpState* op;
    core::cuda::CUevent event;  // null when not even the event could be recorded
    bool failed;                // a copy could not be queued (the op records why)
  };
  // An operation whose copies ended, to complete outside mu_ (its callback may post again).
  struct Done {
    OpState* op;
    Status outcome;
    bool failed;
  };
  // A region of ours the peer maps (as target): held until it gives it back.
  struct Lent {
    RegionUse use;
    Access access = Access::kLocal;
  };

  // Forgets the mappings of the op's regions that were made for it and never asked for (it was
  // refused before asking). Caller holds mu_.
  void forget_unasked(const OpState& op);
  // Puts the op's copies on a stream and records its event. Caller holds mu_.
  void start_copies(OpState* op);
  // Queues the copy of entry `e` through mapping `m`.
  core::cuda::CUresult copy_entry(const OpState& op, const OpEntry& e, const Mapping& m,
                                  core::cuda::CUstream stream);
  // The op ended: its mappings are free of it (one given back meanwhile closes). Caller holds
  // mu_.
  void release_mappings(const OpState& op);
  // Fails `ops` (waiting for a mapping) with `why`; those waiting for nothing else let go of
  // their mappings and go to `finished`, to complete without mu_. Caller holds mu_.
  void fail_waiting(std::vector<OpState*>& ops, const Status& why, std::vector<OpState*>& finished);
  // Fails the ops waiting for `region`'s mapping and forgets it. Caller holds mu_.
  void fail_mapping(uint32_t region, const Status& why, std::vector<OpState*>& finished);
  // An event of `device`'s context, from its pool or made; and back. Caller holds mu_.
  core::cuda::CUevent take_event(int device);
  void give_event(int device, core::cuda::CUevent event);
  // Closes `region`'s mapping and tells the target. Caller holds mu_.
  void unmap(uint32_t region);
  // Makes room for one more mapping: closes the least recently used idle one. Caller holds mu_.
  bool make_room();
  void handle(const Frame& frame);
  void on_opened(const Frame& frame);
  // The target's answer for mapping `m`, which was asked for. Caller holds mu_.
  void answered(Mapping& m, const Frame& frame, std::vector<OpState*>& finished);
  void on_open(const Frame& frame);
  // Queues a frame to the peer; false when the channel is closing.
  bool send(const Frame& frame);
  Status flush_locked();
  // Every copy ended: unmaps, lets go of lent regions, leaves the reactor, reports closed.
  void finish_closing();
  // Lane `lane`'s stream on `device`, made on first use. Caller holds mu_.
  core::cuda::CUstream stream_for(int device, int lane);
  // Copies are in flight: the loop polls them, now if it sleeps.
  void wake_poller();

  Host& host_;
  std::shared_ptr<PeerLink> link_;
  const core::cuda::Driver& driver_;
  const Settings settings_;
  const int loop_;
  CloseLatch latch_;
  bool same_process_ = false;

  core::Fd fd_;
  std::shared_ptr<CudaIpcChannel> keep_alive_;  // while in the reactor

  std::mutex mu_;  // mappings, lent regions, copies in flight
  std::unordered_map<uint32_t, Mapping> mappings_;
  std::unordered_map<uint32_t, Lent> lent_;  // regions the peer maps (as target)
  std::vector<InFlight> in_flight_;
  std::vector<Done> done_;                 // poll()'s, kept across calls
  std::vector<OpState*> waiting_;          // on_opened's, kept across calls
  std::atomic<bool> loop_polling_{false};  // between begin_polling and end_polling
  std::atomic<bool> poll_task_{false};     // a task that polls is queued on the loop
  std::vector<std::vector<core::cuda::CUevent>> free_events_;  // by device
  std::vector<core::cuda::CUstream> streams_;  // device-major, settings_.streams each
  uint64_t use_clock_ = 0;
  bool stopping_ = false;  // closing: no new copies; finish_closing once in_flight_ is empty
  bool stopped_ = false;

  std::mutex send_mu_;  // the side connection's output
  std::vector<uint8_t> out_;
  bool send_closed_ = false;
  std::vector<uint8_t> in_;  // the loop thread's partial frame
};

class CudaIpcTransport final : public Transport {
 public:
  CudaIpcTransport(const core::cuda::Driver& driver, Settings settings)
      : driver_(driver), settings_(settings) {}
  TransportKind kind() const override { return kKind; }
  // The key of the allocation holding [base, base + length): the region must lie in memory from
  // cuMemAlloc (which cudaMalloc and PyTorch's caching allocator use); memory the legacy handle
  // cannot export (VMM allocations, such as PyTorch's expandable segments) fails the
  // registration with the driver's reason.
  Status register_region(uint32_t region_id, uint8_t* base, uint64_t length, Access access,
                         uint64_t table_key, KeySink& keys) override;
  void deregister_region(uint32_t) override {}
  Status make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) override;

 private:
  const core::cuda::Driver& driver_;
  Settings settings_;
};

}  // namespace ferry::transport::cuda_ipc
