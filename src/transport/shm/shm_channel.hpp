// The same-host transport: two processes of one host move bytes with cross-memory attach
// (process_vm_readv), one copy from the source's memory to the destination's, and exchange
// requests and answers as records in shared-memory rings, one per direction (shm_ring.hpp).
//
// The process whose memory changes does the copy ("destination pulls"): a write is pulled by
// the target into its region, after its region table allowed the access, exactly where TCP
// receives one; a read is granted by the target (the access checked, the region held) and
// pulled by the initiator into its own buffer; a large message is pulled by the receiver into
// the posted receive. No process ever writes into the other, so a stopped or crashed peer
// cannot touch our memory, and a deregistration waits for every pull and grant (RegionUse).
// Small payloads ride inside the records.
//
// Memory the target's engine allocated (Engine::allocate: a memory file holding exactly the
// region) is lent instead: on the first access the target sends the file (SCM_RIGHTS), read-only
// unless the region grants remote write, and the initiator maps it and from then on copies with
// plain memcpy on the posting thread, without a record or a system call. A deregistration asks
// for the mapping back (kRevoke) and waits until the peer unmapped it (kUnmapped), or cuts the
// channel off after Config::revoke_timeout; the engine frees the memory only after that, so a
// peer that keeps writing into its mapping writes into memory nobody else uses.
//
// Records reach a consumer without a system call while one of its threads polls its ring: a
// caller waiting for an op (Future::wait spins over the ring as over a completion queue) or
// the progress thread. Otherwise the producer rings the consumer's bell, an eventfd in its
// progress thread's epoll set. Whoever polls handles every record (requests too), one thread
// at a time (polling_).
//
// Set-up (docs/architecture.md, "Same-host specifics"): the listener binds an abstract socket
// with a random name, sent only over the (authenticated) control connection; the dialer
// connects, and both check the other's pid with SO_PEERCRED and prove cross-memory attach by
// reading a nonce from the other's memory. Each side sends its ring and bell over the socket
// (SCM_RIGHTS), which then carries only the files of regions lent and tells of a hang-up. The
// engine's one side connection is the barrier: the listener publishes its peer only once the
// socket is accepted and checked.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "core/net.hpp"
#include "core/polling_right.hpp"
#include "transport/close_latch.hpp"
#include "transport/contract.hpp"
#include "transport/op.hpp"
#include "transport/shm/copy_pool.hpp"
#include "transport/shm/path_chooser.hpp"
#include "transport/shm/shm_ring.hpp"
#include "transport/shm/shm_wire.hpp"

namespace ferry::transport::shm {

// Requests (records that get an answer) an initiator keeps unanswered on a channel; the target
// queues at most this many answers for a peer that does not read them, and holds at most this
// many grants, and closes a channel whose peer goes beyond.
constexpr int kRequestsInFlight = 32;
// Records a channel handles per wake-up before its loop serves other sockets (TCP's
// kFramesPerEvent): one flooding peer cannot monopolise a progress thread.
constexpr int kRecordsPerWake = 64;
// Bytes a channel pulls per wake-up before it reads no more records, for the same reason: a
// peer flooding large writes leaves other peers' small ones a turn after at most this much
// copying plus one record's (kPullRecordBytes).
constexpr std::size_t kPullBytesPerWake = 1 << 20;
// ShmConfig::stream_poll's and request_poll's ceiling: a progress thread that polls longer
// after each piece or request is a busy-polling one (Config::busy_poll says so instead).
constexpr std::chrono::nanoseconds kMaxStreamPoll = std::chrono::seconds(1);
// Bytes of a write's large slices one record asks the target to pull: one process_vm_readv,
// split over the copy threads. Against one process_vm_readv stream, 64 MiB writes fell behind in
// 1 MiB records (a slice) and pulled well ahead in records of 4-16 MiB, 8 MiB among the best
// (docs/performance-history.md, "Mapped regions, copy threads, and the comparison with memcpy
// and UCX"). A record holds the target's progress thread for its copy, so records are no larger.
constexpr uint64_t kPullRecordBytes = 8 << 20;
// Regions of one peer mapped at once (each costs a mapping and a file descriptor): the least
// recently used one is given back to make room. The target lends no more than this either.
constexpr int kMaxMappings = 32;
// Records other than requests and answers queued to send: one kMap per region lent, one
// kRevoke per region lent, one kUnmapped per mapping the peer offered.
constexpr int kControlRecords = 3 * kMaxMappings;

// Whether this process may call process_vm_readv at all (seccomp, kernel), and why not.
bool cross_memory_allowed(std::string& why);

// What a same-host channel keeps in each op (OpState::transport_area).
struct ShmOpArea {
  // Slices sent and not yet answered: an answer for more is a peer's lie, which must not
  // complete an op whose later records are still queued here. Shared by the sending thread and
  // whoever polls the answers (std::atomic_ref).
  int64_t on_wire;
  // A send the receiver holds until it posts a receive (its credit came back early): once only.
  bool held;
  // The way a write or message in the rings' window took, which the PathChooser that routed it
  // (ShmConfig::measure_paths) learns when it finishes: routed at `routed_ns`
  // (PathChooser::now_ns()). kUnrouted for every other op.
  enum Route : uint8_t { kUnrouted, kBounced, kDirect };
  Route route;
  int64_t routed_ns;
};
inline std::atomic_ref<int64_t> on_wire(OpState& op) {
  return std::atomic_ref<int64_t>(op.transport_area<ShmOpArea>().on_wire);
}

class ShmChannel final : public Channel,
                         public core::Reactor::Handler,
                         public core::Reactor::Poller,
                         public ProgressSource,
                         public std::enable_shared_from_this<ShmChannel> {
 public:
  // `no_cross_memory`: why this process may not use process_vm_readv ("" when it may).
  static Status create(ChannelArgs args, std::shared_ptr<CopyPool> pool,
                       std::string no_cross_memory, const ShmConfig& config,
                       std::shared_ptr<ShmChannel>& out);
  ~ShmChannel() override;

  static std::size_t worst_case_bytes();
  // A held send's final answer, queued: header, error text, the buffer's and deque's share.
  static constexpr std::size_t kLateAnswerBytes = kHeaderBytes + kMaxTextBytes + 64;

  TransportKind kind() const override { return TransportKind::kShm; }
  std::vector<uint8_t> local_address() const override;
  Status connect(std::span<const uint8_t> remote) override;
  // The engine's side connection is a barrier: the socket is checked when it arrives.
  int side_connections() const override { return 1; }
  Status attach_side(int index, core::Fd fd) override;
  uint32_t lacks(std::string& why) const override;
  uint64_t max_slice_bytes() const override;
  bool shapes_writes() const override { return ring_copies_up_to_ >= kRingCopiesFrom; }
  void shape_write(OpState& op, uint64_t total) override;
  void report_paths(std::vector<PathStats>& out) const override;
  int lanes() const override { return 1; }
  PostResult post(OpState* op) override;
  void close(const Status& reason) override;
  bool closed() const override { return latch_.closing(); }
  bool quiesced() const override { return latch_.quiesced(); }
  void stop_after_reactor() override;
  void cut_off(const uint8_t* base, uint64_t length, const Status& why) override;

  void revoking(uint32_t region_id) override;

  // The socket: a hang-up, room to send a lent region's file, or (dialer) the listener's ring.
  void on_event(uint32_t events) override;

  // While the progress thread busy-polls (Config::busy_poll), it polls our ring too.
  void begin_polling() override;
  bool poll() override;
  void end_polling() override;

  // ProgressSource: a watching caller consumes the ring, and writes records waiting for room.
  void progress() override;
  std::shared_ptr<void> watch_begin() override;
  void watch_poll(bool messages) override;
  void watch_end() override;

  // A held message was matched by a receive (Rendezvous::matched; any thread).
  void taken_later(uint64_t op_id, uint64_t tag, const Entry& e, OpState* recv);

 private:
  ShmChannel(ChannelArgs args, std::shared_ptr<CopyPool> pool, std::string no_cross_memory,
             const ShmConfig& config);
  Status listen();
  Status check_peer_credentials(int fd) const;
  // Reads the peer's probe nonce from its memory: whether cross-memory attach works that way.
  bool probe_peer(const Address& peer) const;
  Status start();
  // Our ring and bell, created for the peer to produce into.
  Status make_ring();
  // Sends a kHello record with our ring and bell attached.
  Status send_ring(int fd, std::span<const uint8_t> payload);
  // Takes the peer's ring and bell from a kHello record received on `fd`.
  Status take_ring(int fd, std::vector<uint8_t>& hello);
  // From a polling thread: pump_locked() once the peer freed room that records wait for;
  // whether it wrote any.
  bool refill();

  // ---- send side, under send_mu_ ----
  // Writes the records owed (control records, answers), then requests while credits last,
  // until the peer's ring is full; arms EPOLLOUT when a lent region's file waits for the
  // socket; rings the peer's bell once for what it wrote. An error closes the channel (the caller,
  // outside the lock).
  Status pump_locked();
  // Appends `op` to the send queue, then pump_locked().
  Status enqueue_locked(OpState* op);
  // Writes one record into the peer's ring; `full` when it lacks room (the peer rings our bell
  // once it freed some).
  // One record, `a` then `b`.
  void send_locked(std::span<const uint8_t> a, bool& full, std::span<const uint8_t> b = {});
  // Sends a lent region's file over the socket, ahead of its kMap record.
  Status send_file_locked(uint32_t region, int file, bool& full);
  // Encodes the queue head's next request into out_ (and out_payload_).
  void encode_request_locked(OpState* op);
  // Its record by kind, into header `h` and the entry table at `table`; true when it is the
  // op's last record. A message (in records when it rides in the rings):
  bool encode_send_locked(OpState* op, Header& h, uint8_t* table);
  // The notification of a write_with_imm whose bytes a mapping took:
  void encode_imm_locked(OpState* op, Header& h, uint8_t* table);
  // A write's or read's next slices: inline as many as fit, or pulled ranges.
  bool encode_slices_locked(OpState* op, Header& h, uint8_t* table);
  void arm_locked(bool out);
  uint32_t socket_events_locked() const;
  // An answer gave back a request's credit.
  Status take_credit_back_locked();
  // Whether a write or message of `total` bytes is in the rings' window
  // (kRingCopiesFrom .. ShmConfig::ring_copies_up_to).
  bool in_ring_window(uint64_t total) const {
    return total >= kRingCopiesFrom && total <= ring_copies_up_to_;
  }
  // Accounts `answered` slices of `op`; the last completes it, and tells the chooser that
  // routed it how long it took.
  void finish_answered(OpState* op, int64_t answered);
  // Queues an answer (the polling right's holder).
  // `held`: the final answer to a send the receiver held (its credit came back already), queued
  // apart from the answers that requests in flight bound.
  Status respond(const Header& h, std::span<const uint8_t> table = {},
                 std::span<const uint8_t> payload = {}, bool held = false);
  Status respond_status(Record type, uint64_t op_id, uint32_t count, const Status& status,
                        bool held = false);
  // Queues a record of the mapped path (kMap with its file, kRevoke, kUnmapped).
  Status send_control(const Header& h, const Entry* entry = nullptr, core::Fd fd = {});

  // ---- receive side: whoever holds polling_ ----
  // Our bell rang (the progress thread).
  void on_bell();
  // Handles records from our ring, at most a wake-up's budget (`budget`) or all (a hang-up);
  // `more`: records wait beyond the budget.
  Status consume(bool budget, bool& more);
  // Handles a budget of records if the polling right is free (false when it is not); a
  // failure closes the channel.
  bool try_consume();
  // The file a kMap record announced, from the socket.
  Status receive_file(uint32_t region, core::Fd& file);
  Status handle(const View& r, std::size_t& pulled);
  Status on_write(const View& r, std::size_t& pulled);
  Status on_read(const View& r);
  Status on_send(const View& r, std::size_t& pulled);
  // A message's bytes in its record, or in one of its records (kFlagMore): into the receive
  // it matched or a buffer; its last answers the sender.
  Status on_message_bytes(const View& r, std::size_t& pulled);
  // Rendezvous for a message whose bytes stay with the sender (`e`: its length and address):
  // pulled into a posted receive, else only its announcement is held (counted like an empty
  // message) until a receive takes it (taken_later).
  Status hold_or_pull(uint64_t op_id, uint64_t tag, const Entry& e, std::size_t& pulled);
  Status message_out_of_place(uint64_t op_id) const;
  // Pulls a message into a posted receive, then complete_receive().
  Status into_receive(OpState* recv, uint64_t op_id, uint64_t tag, const Entry& e, bool held,
                      std::size_t& pulled);
  // A message of `length` bytes is in `recv` (unless `copied` failed): answers the sender and
  // completes the receive.
  Status complete_receive(OpState* recv, uint64_t op_id, uint64_t tag, uint64_t length,
                          const Status& copied, bool held);
  Status on_imm(const View& r);
  Status on_release(const View& r);
  Status on_answer(const View& r, std::size_t& pulled);
  Status on_grant(OpState* op, const View& r);
  // ---- mapped path (shm_mapped.cpp) ----
  // Copies a write or read whose every entry lies in a region the peer lent us, on this
  // thread; false when it cannot (nothing copied then).
  bool post_mapped(OpState* op);
  // Target: lends the file behind the region `use` holds if it has one, the peer may read it
  // and does not hold it yet.
  Status lend(const Entry& e, const RegionUse& use);
  Status on_map(const View& r, core::Fd file);
  Status on_revoke(const View& r);
  Status on_unmapped(const View& r);
  void unmap_all();
  // map_mu_ alone, for the loop (or closing): copies starting meanwhile take the records path.
  std::unique_lock<std::shared_mutex> lock_mappings();

  // Pulls `n` pieces from the peer's memory into ours (process_vm_readv), large ones split
  // over the copy pool.
  Status pull(const iovec* local, const iovec* remote, std::size_t n, uint64_t total) const;
  // The op an answer names, checked against what was asked.
  OpState* answered_op(const View& r, Status& error) const;
  void stop();

  Host& host_;
  std::shared_ptr<CopyPool> pool_;
  std::shared_ptr<PeerLink> link_;
  CloseLatch latch_;
  const bool dialer_;
  const int loop_;
  Nonce probe_{};  // read by the peer: proves cross-memory attach into this process
  Nonce token_{};
  Nonce socket_name_{};
  core::Fd listener_;  // listener side, until the peer's connection is accepted
  core::Fd fd_;        // the socket
  pid_t peer_pid_ = 0;
  bool reads_peer_ = false;  // we read the peer's probe
  bool peer_reads_ = false;  // the peer read ours
  // Why the two processes cannot pull from each other ("" when they can); set before the
  // channel is published.
  std::string no_cross_memory_;
  const uint64_t ring_copies_up_to_;  // ShmConfig::ring_copies_up_to
  const bool measure_paths_;          // ShmConfig::measure_paths
  // Which way the peer's writes, and its messages, in the rings' window go (measure_paths_):
  // each learns its own rates.
  PathChooser write_paths_;
  PathChooser message_paths_;
  const std::chrono::nanoseconds stream_poll_;   // ShmConfig::stream_poll
  const std::chrono::nanoseconds request_poll_;  // ShmConfig::request_poll

  std::atomic<bool> started_{false};        // in the reactor (set under latch_.lock())
  std::atomic<bool> stopped_{false};        // set with the polling right held
  std::shared_ptr<ShmChannel> keep_alive_;  // while in the reactor

  // Our ring, which the peer produces into, and its bell (in the reactor).
  Ring inbound_;
  core::Fd bell_;
  struct Bell final : core::Reactor::Handler {
    ShmChannel* channel = nullptr;
    void on_event(uint32_t) override { channel->on_bell(); }
  } bell_handler_;
  core::PollingRight polling_;  // the right to consume inbound_ and handle its records

  // Send side.
  std::mutex send_mu_;
  bool send_closed_ = false;
  bool want_out_ = false;  // a lent region's file waits for room in the socket
  Ring outbound_;          // the peer's ring (the dialer's: once the listener's hello came)
  core::Fd peer_bell_;
  uint64_t written_ = 0;          // records written into outbound_
  bool request_pending_ = false;  // out_ holds a request the ring did not take yet
  // The last pump left records for want of room in outbound_: a caller spinning on this
  // channel, or our polling progress thread, writes them once the peer read on, sooner than
  // the bell wakes a sleeping one (sends of a few MiB refill the ring several times each).
  std::atomic<bool> room_awaited_{false};
  int credits_ = kRequestsInFlight;
  OpState* queue_head_ = nullptr;
  OpState* queue_tail_ = nullptr;
  // kMaxRecordBytes; the request being sent is its first out_length_, then out_payload_.
  std::vector<uint8_t> out_;
  std::size_t out_length_ = 0;
  // The request's inline bytes where they are one slice: they go from the caller's memory
  // straight into the ring, not through out_ (one copy less for every mid-size write), unless
  // the ring has no room for them at once.
  std::span<const uint8_t> out_payload_;
  std::vector<std::vector<uint8_t>> answers_;  // a ring of queued answers
  std::size_t answer_head_ = 0, answer_count_ = 0;
  // Final answers to held sends: one per message the matcher holds, which its limits bound.
  std::deque<std::vector<uint8_t>> late_answers_;
  struct Control {
    std::array<uint8_t, kHeaderBytes + kEntryBytes> bytes{};
    std::size_t length = 0;
    core::Fd file;        // sent over the socket ahead of the record
    uint32_t region = 0;  // the file's (a kMap's entry)
    bool file_sent = false;
  };
  std::vector<Control> controls_;  // a ring of queued control records
  std::size_t control_head_ = 0, control_count_ = 0;

  // Receive side (the polling right's holder).
  std::vector<uint8_t> in_;  // kMaxRecordBytes: the header and table of the record handled
  std::vector<iovec> local_iov_, remote_iov_;
  std::vector<RegionUse> uses_;
  std::vector<uint8_t> scratch_;  // an inline answer's table and bytes
  uint64_t imm_op_ = 0;           // the write whose records arrive now, and whether one failed
  bool imm_op_failed_ = false;
  // The message whose records arrive now (a sender sends one message's records in a row).
  struct Arriving {
    bool active = false;
    uint64_t op_id = 0;
    uint64_t tag = 0;
    uint64_t length = 0;      // the whole message's
    uint64_t received = 0;    // bytes so far
    uint64_t address = 0;     // where the sender holds it
    OpState* recv = nullptr;  // the posted receive it fills, if one was posted;
    bool counted = false;     // else buffered in `buffer`, which the matcher counted;
    std::vector<uint8_t> buffer;
    bool held = false;  // else (over the limits, several records) held once its last is in;
    Status refused;     // else (over the limits, one record) refused
  };
  Arriving arriving_;
  // A region held for the peer beyond one record: a deregistration waits for it.
  struct Held {
    uint64_t id = 0;  // the grant's id, or the lent region's
    RegionUse use;
    const uint8_t* base = nullptr;
    uint64_t length = 0;
  };
  std::vector<Held> grants_;  // reads the peer pulls
  uint64_t next_grant_ = 1;
  std::vector<Held> lent_;  // regions the peer mapped, until it unmapped them

  // Regions the peer lent us. Copiers hold map_mu_ shared while they copy; the loop holds it
  // alone to map or unmap, so a mapping never goes while a copy uses it.
  struct Mapping {
    uint32_t region = 0;  // 0: a free slot
    uint64_t key = 0;     // the region's shm key, as ops carry it
    uint8_t* base = nullptr;
    std::size_t mapped = 0;  // the file's size
    uint64_t length = 0;     // the region's
    bool writable = false;
    std::atomic<uint64_t> last_used{0};
  };
  std::shared_mutex map_mu_;
  std::array<Mapping, kMaxMappings> mappings_;
  std::atomic<bool> any_mapping_{false};  // lets posts skip the lookups until a first map
  std::atomic<bool> remapping_{false};    // the loop waits for map_mu_ alone
  std::atomic<uint64_t> use_clock_{0};
};

class ShmTransport final : public Transport {
 public:
  // `no_cross_memory`: why this process may not use process_vm_readv ("" when it may).
  ShmTransport(const ShmConfig& config, std::string no_cross_memory)
      : pool_(std::make_shared<CopyPool>(config.copy_threads)),
        no_cross_memory_(std::move(no_cross_memory)),
        config_(config) {}
  TransportKind kind() const override { return TransportKind::kShm; }
  // The target's region table checks every access (as over TCP), under its own key.
  static constexpr uint64_t kKeyFlip = 0x73686d5f6b657921ULL;
  Status register_region(uint32_t, uint8_t*, uint64_t, Access, uint64_t table_key,
                         KeySink& keys) override {
    return table_key_as_key(table_key ^ kKeyFlip, keys);
  }
  void deregister_region(uint32_t) override {}
  Status make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) override;

 private:
  std::shared_ptr<CopyPool> pool_;  // shared with the channels, which may outlive this
  std::string no_cross_memory_;
  ShmConfig config_;
};

}  // namespace ferry::transport::shm
