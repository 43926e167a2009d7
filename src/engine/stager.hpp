// One-sided operations between CUDA memory here and host memory at a peer, over a channel that
// moves host memory only (TCP, shm, verbs without GPUDirect): bounced through pinned host
// buffers and pipelined, so that while one chunk is copied between the device and its buffer the
// others are on the wire (docs/gpu.md, "Staging").
//
// Each staged operation becomes chunks of at most Config::staging_chunk_bytes, each one child
// operation of the peer between a buffer and the remote regions. A write copies a chunk out of
// the device and posts it; a read posts the chunk and copies it in once it arrived. At most
// Config::staging_chunks are in flight. A write_with_imm's last chunk carries the immediate and
// is posted only once every other chunk completed, so the notification still means "all bytes
// landed". The first failure fails the operation, after every chunk in flight ended.
//
// One thread per engine, made on the first staged operation, runs them one after another. The
// buffers are allocated and registered then too (not on the data path after that), and go at
// shutdown. A staged operation allocates its chunk lists and copies of its descriptors: this is
// the path of memory no channel moves directly, not the zero-copy one.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"
#include "transport/op.hpp"
#include "transport/region_table.hpp"

namespace ferry::detail {

class EngineImpl;
class PeerImpl;

// A staged operation as the peer admitted it.
struct StagedJob {
  // A contiguous span of one local region and where it goes.
  struct Piece {
    uint64_t local;  // the address: device memory, or host memory of a batch that mixes them
    uint64_t length;
    uint32_t remote;  // index into `remotes`
    uint64_t remote_offset;
    int device;  // the CUDA device whose context copies it (0 for host memory)
  };
  std::shared_ptr<PeerImpl> peer;
  transport::OpState* op = nullptr;  // posted; the job holds a reference of its own
  std::vector<Piece> pieces;
  std::vector<Descriptor> remotes;
  std::vector<transport::RegionUse> leases;  // the local regions, until the last copy ended
  uint64_t total = 0;
};

class Stager {
 public:
  explicit Stager(EngineImpl& engine) : engine_(engine) {}
  ~Stager() { stop(); }
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Queues the job (its op posted); false once stopped (the caller fails the op).
  bool post(std::unique_ptr<StagedJob> job);
  // Fails what is queued with kCancelled, waits for the job under way (its peers are closed by
  // then, so its chunks end) and lets the buffers go.
  void stop();

 private:
  void run();
  Status stage(StagedJob& job);
  // The buffers, allocated (in `device`'s context) and registered on first use.
  Status prepare_buffers(int device);
  void finish(StagedJob& job, const Status& status);
  void free_buffers();

  EngineImpl& engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<StagedJob>> queue_;  // under mu_
  bool stopping_ = false;                         // under mu_
  std::thread thread_;                            // made by the first post()
  // The stager thread's alone once it runs; stop() clears them after joining it.
  void* buffers_ = nullptr;  // pinned: staging_chunks x staging_chunk_bytes
  int buffers_device_ = 0;   // in whose context they were allocated (and are freed)
  Region region_;            // the buffers, registered with the engine's host transports
};

}  // namespace ferry::detail
