#include "engine/stager.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "core/cuda.hpp"
#include "core/log.hpp"
#include "engine/engine_impl.hpp"
#include "engine/peer_impl.hpp"

namespace ferry::detail {

namespace cu = core::cuda;

namespace {

// A chunk's child operation is waited for in steps of this, so that a wait never blocks for
// long; the child itself ends (done, or failed by the peer's liveness or close).
constexpr auto kChildWaitStep = std::chrono::seconds(1);

// One copy between a piece of device memory and its place in a buffer.
struct Copy {
  uint64_t buffer;  // address in the buffers
  uint64_t local;
  uint64_t length;
  int device;
};

Status copy(const cu::Driver& driver, const std::vector<Copy>& copies, bool into_buffers) {
  for (const Copy& c : copies) {
    try {
      cu::ScopedContext scope(driver, cu::primary_context(driver, c.device));
      cu::CUresult r = into_buffers ? driver.memcpy(c.buffer, c.local, c.length)
                                    : driver.memcpy(c.local, c.buffer, c.length);
      if (r != cu::kSuccess) {
        Status s = driver.status(r, "cuMemcpy");
        return {s.code(), "staged through host memory: " + s.message()};
      }
    } catch (const Error& e) {
      return {e.code(), "staged through host memory: " + e.status().message()};
    }
  }
  return {};
}

Status wait_child(const Future& child) {
  while (!child.test()) (void)child.wait(kChildWaitStep);
  return child.status();
}

}  // namespace

bool Stager::post(std::unique_ptr<StagedJob> job) {
  std::lock_guard lock(mu_);
  if (stopping_) return false;
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  queue_.push_back(std::move(job));
  cv_.notify_one();
  return true;
}

void Stager::stop() {
  std::deque<std::unique_ptr<StagedJob>> queued;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    queued.swap(queue_);
  }
  cv_.notify_all();
  for (auto& job : queued) finish(*job, {ErrorCode::kCancelled, "engine shut down"});
  if (thread_.joinable()) thread_.join();
  if (region_.valid()) region_.deregister();
  region_ = Region();
  free_buffers();
}

void Stager::free_buffers() {
  if (buffers_ == nullptr) return;
  const cu::Driver* driver = cu::Driver::get();
  try {
    cu::ScopedContext scope(*driver, cu::primary_context(*driver, buffers_device_));
    driver->check(driver->mem_free_host(buffers_), "cuMemFreeHost");
  } catch (const Error& e) {
    core::log(LogLevel::kError, "engine",
              [&] { return "staging buffers: " + e.status().to_string(); });
  }
  buffers_ = nullptr;
}

void Stager::run() {
  for (;;) {
    std::unique_ptr<StagedJob> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    finish(*job, stage(*job));
  }
}

void Stager::finish(StagedJob& job, const Status& status) {
  transport::OpState* op = job.op;
  job.leases.clear();  // no copy touches the local regions any more
  if (status.ok()) {
    op->bytes.store(job.total, std::memory_order_relaxed);
    op->finish_posted();
  } else {
    job.peer->link->pool->fail_posted(op, [&](const transport::OpState&) { return status; });
  }
  op->release();  // the job's reference
}

Status Stager::prepare_buffers(int device) {
  if (region_.valid()) return {};
  std::string why;
  const cu::Driver* driver = cu::Driver::get(&why);
  if (driver == nullptr) return {ErrorCode::kUnsupported, "staged through host memory: " + why};
  const Config& c = engine_.config;
  std::size_t bytes = c.staging_chunk_bytes * static_cast<std::size_t>(c.staging_chunks);
  try {
    // Portable: pinned for every context, though allocated in the first user's device's.
    cu::ScopedContext scope(*driver, cu::primary_context(*driver, device));
    driver->check(driver->mem_host_alloc(&buffers_, bytes, cu::kHostAllocPortable),
                  "cuMemHostAlloc " + std::to_string(bytes) + " bytes");
    buffers_device_ = device;
    region_ = engine_.register_memory(buffers_, bytes, Access::kLocal, nullptr);
  } catch (const Error& e) {
    free_buffers();
    return {e.code(), "staged through host memory: buffers: " + e.status().message()};
  }
  core::log(LogLevel::kInfo, "engine", [&] {
    return "staging buffers: " + std::to_string(c.staging_chunks) + " x " +
           std::to_string(c.staging_chunk_bytes) + " bytes of pinned host memory";
  });
  return {};
}

Status Stager::stage(StagedJob& job) {
  if (Status s = prepare_buffers(job.pieces.front().device); !s.ok()) return s;
  const cu::Driver& driver = *cu::Driver::get();
  transport::OpState& op = *job.op;
  const bool read = op.kind == transport::OpKind::kRead;
  const uint64_t chunk = engine_.config.staging_chunk_bytes;
  const auto base = reinterpret_cast<uint64_t>(buffers_);

  struct InFlight {
    int slot;
    Future child;
    std::vector<Copy> copies;  // for a read, into the device once the chunk arrived
  };
  std::deque<InFlight> flight;
  std::vector<int> free_slots;
  for (int i = engine_.config.staging_chunks; i-- > 0;) free_slots.push_back(i);
  Status first;
  auto retire = [&] {
    InFlight f = std::move(flight.front());
    flight.pop_front();
    Status s = wait_child(f.child);
    if (!s.ok()) {
      s = {s.code(), "staged through host memory: " + s.message()};
    } else if (read) {
      s = copy(driver, f.copies, false);
    }
    if (first.ok() && !s.ok()) first = s;
    free_slots.push_back(f.slot);
  };

  std::vector<Transfer> transfers;
  std::vector<Copy> copies;
  std::size_t piece = 0;
  uint64_t done = 0;  // of the piece
  while (piece < job.pieces.size() && first.ok()) {
    if (free_slots.empty()) {
      retire();
      if (!first.ok()) break;
    }
    int slot = free_slots.back();
    free_slots.pop_back();
    transfers.clear();
    copies.clear();
    uint64_t used = 0;
    while (piece < job.pieces.size() && used < chunk) {
      const StagedJob::Piece& p = job.pieces[piece];
      uint64_t take = std::min(p.length - done, chunk - used);
      uint64_t offset = static_cast<uint64_t>(slot) * chunk + used;
      copies.push_back({base + offset, p.local + done, take, p.device});
      transfers.push_back({&region_, offset, &job.remotes[p.remote], p.remote_offset + done, take});
      used += take;
      done += take;
      if (done == p.length) {
        ++piece;
        done = 0;
      }
    }
    if (!read) {
      if (Status s = copy(driver, copies, true); !s.ok()) {
        first = s;
        free_slots.push_back(slot);
        break;
      }
    }
    // The immediate goes with the last chunk, once every other one landed.
    bool imm = op.with_imm && piece == job.pieces.size();
    if (imm) {
      while (!flight.empty()) retire();
      if (!first.ok()) break;
    }
    Future child = job.peer->one_sided(op.kind, transfers, imm, op.imm);
    flight.push_back({slot, std::move(child), read ? copies : std::vector<Copy>{}});
  }
  while (!flight.empty()) retire();
  return first;
}

}  // namespace ferry::detail
