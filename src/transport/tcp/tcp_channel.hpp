// TCP transport: one-sided semantics served by the target's progress threads.
//
// A peer connection is several sockets ("streams"). The initiator sends kWrite / kReadReq /
// kSend frames; the target validates each access against its region table (id, key,
// permission, bounds) and answers with acks or data, so nothing reaches memory that was not
// granted. Payloads go straight between user memory and the socket (writev from the region,
// recv into the region) except for small frames, which are parsed out of a staging buffer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/frame.hpp"
#include "core/net.hpp"
#include "core/ring.hpp"
#include "transport/close_latch.hpp"
#include "transport/contract.hpp"

namespace ferry::transport::tcp {

struct TcpOptions {
  int streams = 2;
  int slices_in_flight_per_stream = 64;
  // Messages above this are announced and sent once a receive takes them (Config).
  std::size_t eager_bytes = 1 << 20;
  // After serving small requests, the progress thread polls this long for more (Config).
  std::chrono::nanoseconds request_poll = std::chrono::microseconds(20);
};

// A wake-up that received at most this many bytes and served requests was small operations:
// only those start TcpOptions::request_poll. Above it, with 64 KiB and 1 MiB writes, the
// polling thread took CPU from the threads moving the bytes on a 2-core VM (docs/performance.md,
// "Small operations and wake-ups").
constexpr std::size_t kRequestPollWakeBytes = 16 << 10;

class TcpChannel final : public Channel, public std::enable_shared_from_this<TcpChannel> {
 public:
  // `on_closed` runs once, on a progress thread, after every stream stopped. A `dialer` takes
  // the listener's number of streams when it connects.
  static std::shared_ptr<TcpChannel> create(Host& host, std::shared_ptr<PeerLink> link,
                                            const TcpOptions& options,
                                            std::function<void(const Status&)> on_closed,
                                            bool dialer = false);
  ~TcpChannel() override;

  // The most memory one channel can hold whatever its peer sends (docs/architecture.md,
  // "Limits"); unmatched messages are counted by the peer's matcher, not here.
  static std::size_t worst_case_bytes(const TcpOptions& options);

  TransportKind kind() const override { return TransportKind::kTcp; }
  // The address is the listener's number of streams (u16): the dialer opens that many.
  std::vector<uint8_t> local_address() const override;
  Status connect(std::span<const uint8_t> remote) override;
  int side_connections() const override { return static_cast<int>(streams_.size()); }
  // Hands a connected socket to stream `index`. Every stream must be attached before post().
  Status attach_side(int index, core::Fd fd) override;

  int lanes() const override { return static_cast<int>(streams_.size()); }
  PostResult post(OpState* op) override;
  void close(const Status& reason) override;
  bool closed() const override { return latch_.closing(); }
  void cut_off(const uint8_t* base, uint64_t length, const Status& why) override;
  // Every stream has stopped and the in-flight operations have been failed.
  bool quiesced() const override { return latch_.quiesced(); }
  // Stops the remaining streams on the calling thread; only once the reactor has stopped.
  void stop_after_reactor() override;

  // What each attached stream holds now (diagnostics, tests), read on its progress thread:
  // blocks until they answer, so never call it on a progress thread. A stopped stream reads 0.
  struct StreamUsage {
    std::size_t receive_buffer = 0;    // staging buffer allocated
    std::size_t message_buffer = 0;    // buffer allocated for an unmatched message arriving
    std::size_t message_bytes = 0;     // bytes of that message received so far
    std::size_t queued_responses = 0;  // acks and read data owed to the peer, not yet staged
    bool reading_paused = false;       // too many queued: the peer's frames are not read
  };
  std::vector<StreamUsage> usage();

  struct Stream;

 private:
  TcpChannel(Host& host, std::shared_ptr<PeerLink> link, const TcpOptions& options,
             std::function<void(const Status&)> on_closed, bool dialer);
  friend struct Stream;
  // (Re)creates the streams, none attached yet.
  void make_streams(int count);
  void stream_stopped();
  // write_with_imm accounting: a frame of op `op_id` spread over `streams` streams failed, or
  // was its `last` on its stream; once every stream's last arrived and none failed, the
  // notification is delivered. An error when too many are in progress (the peer is dropped).
  Status imm_progress(uint64_t op_id, uint32_t streams, uint32_t imm, bool last, bool failed);

  Host& host_;
  std::shared_ptr<PeerLink> link_;
  TcpOptions options_;
  CloseLatch latch_;
  const bool dialer_;
  std::vector<std::shared_ptr<Stream>> streams_;
  std::atomic<int> live_streams_{0};

  struct ImmProgress {
    uint32_t streams_done;
    bool failed;
  };
  std::mutex imm_mu_;
  std::unordered_map<uint64_t, ImmProgress> imm_progress_;  // ops with streams still to finish
};

}  // namespace ferry::transport::tcp
