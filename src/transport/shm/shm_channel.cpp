#include "transport/shm/shm_channel.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>
#include <utility>

#include "core/crypto.hpp"
#include "core/sys.hpp"
#include "transport/shm/shm_socket.hpp"

namespace ferry::transport::shm {

namespace {

// The channel whose records this thread handles now (a completion callback runs inside).
thread_local const ShmChannel* polling_channel = nullptr;

// Connections the listener's socket queues: the dialer's, plus room for strangers who read the
// name in /proc/net/unix and connected first (refused by their pid, never served).
constexpr int kBacklog = 4;
// An address in the peer's process, for process_vm_readv's remote iovec: never dereferenced
// here (the kernel reads it in the peer's address space).
void* peer_address(uint64_t address) {
  return reinterpret_cast<void*>(address);  // NOLINT(performance-no-int-to-ptr)
}

// The slices of the op an answer finishes: an ack's and read data's count, else one.
int64_t answered_slices(const Header& h) {
  switch (h.type) {
    case Record::kAck:
    case Record::kReadData:
      return h.count;
    case Record::kGrant:
      return h.imm;  // the slices of one entry the grant covers
    default:
      return 1;
  }
}

// Compares secrets in time independent of where they differ.
bool same_bytes(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

bool overlaps(const uint8_t* a, uint64_t a_len, const uint8_t* b, uint64_t b_len) {
  return a < b + b_len && b < a + a_len;
}

}  // namespace

bool cross_memory_allowed(std::string& why) {
  // Reading one byte of our own memory passes every check but seccomp's and the kernel's.
  uint8_t from = 1, to = 0;
  iovec local{&to, 1}, remote{&from, 1};
  if (::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 1 && to == 1) return true;
  why = core::sys_status("process_vm_readv").message();
  return false;
}

ShmChannel::ShmChannel(ChannelArgs args, std::shared_ptr<CopyPool> pool,
                       std::string no_cross_memory, uint64_t ring_copies_up_to)
    : host_(args.host),
      pool_(std::move(pool)),
      link_(std::move(args.link)),
      on_closed_(std::move(args.on_closed)),
      dialer_(args.dialer),
      loop_(args.host.reactor().pick_loop()),
      no_cross_memory_(std::move(no_cross_memory)),
      ring_copies_up_to_(ring_copies_up_to),
      answers_(2 * kRequestsInFlight),
      controls_(kControlRecords) {}

ShmChannel::~ShmChannel() { unmap_all(); }

Status ShmChannel::create(ChannelArgs args, std::shared_ptr<CopyPool> pool,
                          std::string no_cross_memory, uint64_t ring_copies_up_to,
                          std::shared_ptr<ShmChannel>& out) {
  std::shared_ptr<ShmChannel> channel(new ShmChannel(
      std::move(args), std::move(pool), std::move(no_cross_memory), ring_copies_up_to));
  core::random_bytes(channel->probe_);
  if (!channel->dialer_) {
    if (Status s = channel->listen(); !s.ok()) return s;
  }
  out = std::move(channel);
  return {};
}

std::size_t ShmChannel::worst_case_bytes() {
  // The receive buffer, the request being sent, every queued answer at its largest, a pull's
  // iovecs and region uses, an inline answer's scratch, the grants, the control records, the
  // regions lent and our ring. (Mapped regions and the peer's ring cost address space and a
  // descriptor each, not memory: their pages are the peer's.)
  return sizeof(ShmChannel) + kRingFileBytes + 3 * kMaxRecordBytes +
         2 * kRequestsInFlight * kMaxRecordBytes +
         kMaxEntries * (2 * sizeof(iovec) + sizeof(RegionUse)) + kRequestsInFlight * sizeof(Held) +
         kControlRecords * sizeof(Control) + kMaxMappings * sizeof(Held);
}

Status ShmChannel::listen() {
  core::random_bytes(socket_name_);
  core::random_bytes(token_);
  core::Fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return core::sys_status("socket(AF_UNIX, SOCK_SEQPACKET)");
  sockaddr_un addr;
  socklen_t len = abstract_address(socket_name_, addr);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    return core::sys_status("bind (abstract Unix socket)");
  }
  if (::listen(fd.get(), kBacklog) != 0) return core::sys_status("listen (Unix socket)");
  listener_ = std::move(fd);
  return {};
}

std::vector<uint8_t> ShmChannel::local_address() const {
  Address a;
  a.pid = static_cast<uint32_t>(::getpid());
  a.reads_peer = reads_peer_;
  a.socket = socket_name_;
  a.token = token_;
  a.probe_address = reinterpret_cast<uint64_t>(probe_.data());
  a.probe = probe_;
  return encode(a);
}

bool ShmChannel::probe_peer(const Address& peer) const {
  Nonce seen{};
  iovec local{seen.data(), seen.size()};
  iovec remote{peer_address(peer.probe_address), peer.probe.size()};
  ssize_t n = ::process_vm_readv(static_cast<pid_t>(peer.pid), &local, 1, &remote, 1, 0);
  return n == static_cast<ssize_t>(seen.size()) && same_bytes(seen, peer.probe);
}

Status ShmChannel::check_peer_credentials(int fd) const {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return core::sys_status("getsockopt SO_PEERCRED");
  }
  if (cred.pid != peer_pid_) {
    return {ErrorCode::kAuthFailed, "shm: the socket's peer is process " +
                                        std::to_string(cred.pid) + ", not the peer's process " +
                                        std::to_string(peer_pid_)};
  }
  return {};
}

Status ShmChannel::connect(std::span<const uint8_t> remote) {
  Address a;
  if (Status s = decode(remote, a); !s.ok()) return s;
  peer_pid_ = static_cast<pid_t>(a.pid);
  reads_peer_ = no_cross_memory_.empty() && probe_peer(a);
  if (!dialer_) return {};  // the dialer connects to our socket, checked in attach_side
  peer_reads_ = a.reads_peer;
  core::Fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return core::sys_status("socket(AF_UNIX, SOCK_SEQPACKET)");
  sockaddr_un addr;
  socklen_t len = abstract_address(a.socket, addr);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    return core::sys_status("connect (the peer's shm socket)", errno, ErrorCode::kConnectFailed);
  }
  if (Status s = check_peer_credentials(fd.get()); !s.ok()) return s;
  if (Status s = make_ring(); !s.ok()) return s;
  std::array<uint8_t, kHelloBytes> hello{};
  std::memcpy(hello.data(), a.token.data(), a.token.size());
  hello.back() = reads_peer_ ? 1 : 0;
  if (Status s = send_ring(fd.get(), hello); !s.ok()) return s;
  fd_ = std::move(fd);
  return {};
}

Status ShmChannel::make_ring() {
  if (Status s = Ring::create(inbound_); !s.ok()) return s;
  bell_ = core::Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!bell_.valid()) return core::sys_status("eventfd (shm bell)");
  return {};
}

Status ShmChannel::send_ring(int fd, std::span<const uint8_t> payload) {
  std::array<uint8_t, kHeaderBytes + kHelloBytes> record{};
  Header h;
  h.type = Record::kHello;
  h.payload = static_cast<uint32_t>(payload.size());
  put_header(h, record.data());
  std::memcpy(record.data() + kHeaderBytes, payload.data(), payload.size());
  const int files[] = {inbound_.file(), bell_.get()};
  bool full = false;
  Status s = send_with_files(fd, {record.data(), kHeaderBytes + payload.size()}, files, full);
  if (s.ok() && full) s = {ErrorCode::kConnectFailed, "shm: the socket took no hello"};
  return s;
}

Status ShmChannel::take_ring(int fd, std::vector<uint8_t>& hello) {
  std::array<uint8_t, kHeaderBytes + kHelloBytes + 1> record{};
  Files files;
  std::size_t length = 0, count = 0;
  if (Status s = receive_with_files(fd, record, length, files, count); !s.ok()) return s;
  View v;
  if (length == 0 || !parse({record.data(), length}, v).ok() || v.header.type != Record::kHello ||
      v.payload.size() != kHelloBytes || count != 2) {
    return {ErrorCode::kProtocol, "shm: the peer's hello is not a ring, its bell and " +
                                      std::to_string(kHelloBytes) + " bytes"};
  }
  if (Status s = check_bell(files[1].get()); !s.ok()) return s;
  Ring ring;
  if (Status s = Ring::open(std::move(files[0]), ring); !s.ok()) return s;
  hello.assign(v.payload.begin(), v.payload.end());
  std::lock_guard lock(send_mu_);
  outbound_ = std::move(ring);
  peer_bell_ = std::move(files[1]);
  return {};
}

Status ShmChannel::attach_side(int index, core::Fd barrier) {
  if (index != 0) {
    return {ErrorCode::kProtocol, "join: shm side connection " + std::to_string(index)};
  }
  barrier.reset();  // it only held the peer back until the socket was ours
  if (!dialer_) {
    // The dialer connected and said hello before it opened the barrier connection: both are
    // queued here already.
    for (int tries = 0; !fd_.valid(); ++tries) {
      core::Fd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!conn.valid()) {
        if (errno == EAGAIN || tries > 0) {
          return {ErrorCode::kProtocol, "shm: the peer opened no valid socket connection"};
        }
        return core::sys_status("accept4 (shm socket)");
      }
      if (!check_peer_credentials(conn.get()).ok()) continue;  // a stranger: refused
      std::vector<uint8_t> hello;
      Status s = take_ring(conn.get(), hello);
      if (!s.ok() || !same_bytes(std::span(hello).first(token_.size()), token_)) {
        return {ErrorCode::kProtocol,
                "shm: the peer's socket did not present the session token and its ring" +
                    (s.ok() ? std::string() : " (" + s.message() + ")")};
      }
      peer_reads_ = hello[token_.size()] != 0;
      if (s = make_ring(); !s.ok()) return s;
      std::array<uint8_t, kHelloBytes> reply{};
      if (s = send_ring(conn.get(), reply); !s.ok()) return s;
      fd_ = std::move(conn);
    }
    listener_.reset();
  }
  if (!fd_.valid()) return {ErrorCode::kProtocol, "shm: side connection before the address"};
  // Without cross-memory attach both ways, nothing is pulled: small slices ride in the
  // records, engine-allocated regions are mapped, and messages take the next channel.
  if (!no_cross_memory_.empty()) {
    no_cross_memory_ = "cross-memory attach is off here: " + no_cross_memory_;
  } else if (!reads_peer_) {
    no_cross_memory_ = "process_vm_readv of the peer (process " + std::to_string(peer_pid_) +
                       ") is refused here (kernel.yama.ptrace_scope, another user, or seccomp)";
  } else if (!peer_reads_) {
    no_cross_memory_ = "the peer (process " + std::to_string(peer_pid_) +
                       ") may not read this process with process_vm_readv";
  }
  return start();
}

uint32_t ShmChannel::lacks(std::string& why) const {
  if (no_cross_memory_.empty()) return 0;
  why = no_cross_memory_;
  return kCapMessages;  // a large message is pulled into its receive
}

uint64_t ShmChannel::max_slice_bytes() const {
  return no_cross_memory_.empty() ? 0 : kInlineBytes;  // every slice rides in its record
}

ShmChannel::BounceWrites ShmChannel::bounce_writes() const {
  return {kRingCopiesFrom, ring_copies_up_to_, kInlineBytes};
}

Status ShmChannel::start() {
  in_.resize(kMaxRecordBytes);
  out_.resize(kMaxRecordBytes);
  local_iov_.reserve(kMaxEntries);
  remote_iov_.reserve(kMaxEntries);
  uses_.reserve(kMaxEntries);
  grants_.reserve(kRequestsInFlight);
  bell_handler_.channel = this;
  std::lock_guard lock(close_mu_);
  if (closing_.load()) return {ErrorCode::kPeerLost, "shm: connection already closed"};
  keep_alive_ = shared_from_this();
  // The dialer reads the listener's hello (its ring) from the socket; after it, the socket is
  // read only when a record announces a file on it.
  uint32_t events = EPOLLRDHUP | (dialer_ ? uint32_t{EPOLLIN} : 0u);
  Status s = host_.reactor().add(loop_, fd_.get(), events, this);
  if (s.ok()) {
    s = host_.reactor().add(loop_, bell_.get(), EPOLLIN, &bell_handler_);
    if (!s.ok()) host_.reactor().remove(loop_, fd_.get());
  }
  if (!s.ok()) {
    keep_alive_.reset();
    return s;
  }
  started_ = true;
  link_->pool->set_progress(this);
  host_.reactor().post(loop_, [self = shared_from_this()] {
    if (!self->stopped_) self->host_.reactor().add_poller(self->loop_, self.get());
  });
  return {};
}

// ---------------------------------------------------------------- send side

PostResult ShmChannel::post(OpState* op) {
  if (op->kind != OpKind::kSend && post_mapped(op)) return PostResult::kAccepted;
  Status failed;
  bool queued = false;
  {
    std::lock_guard lock(send_mu_);
    if (send_closed_) return PostResult::kAccepted;  // the close path fails the op
    failed = enqueue_locked(op);
    queued = queue_head_ != nullptr;
  }
  if (!failed.ok()) close(failed);
  return queued ? PostResult::kQueued : PostResult::kAccepted;
}

Status ShmChannel::enqueue_locked(OpState* op) {
  op->lane_next[0] = nullptr;
  op->on_wire.store(0, std::memory_order_relaxed);  // a prepared op's earlier post may have failed
  if (queue_tail_ != nullptr) {
    queue_tail_->lane_next[0] = op;
  } else {
    queue_head_ = op;
  }
  queue_tail_ = op;
  return pump_locked();
}

void ShmChannel::send_locked(std::span<const uint8_t> a, bool& full, std::span<const uint8_t> b) {
  full = !outbound_.valid() || !outbound_.write(a, b);
}

Status ShmChannel::send_file_locked(uint32_t region, int file, bool& full) {
  uint8_t body[sizeof region];
  std::memcpy(body, &region, sizeof region);
  return send_with_files(fd_.get(), body, std::span(&file, 1), full);
}

Status ShmChannel::pump_locked() {
  if (send_closed_) return {};
  const uint64_t published = written_;
  Status s;
  bool full = false;
  bool socket_full = false;
  while (!full) {
    if (control_count_ > 0) {
      Control& c = controls_[control_head_];
      if (c.file.valid() && !c.file_sent) {
        // The file goes first: its record, once the peer reads it, finds it on the socket.
        if (s = send_file_locked(c.region, c.file.get(), socket_full); !s.ok() || socket_full) {
          break;
        }
        c.file_sent = true;
      }
      send_locked({c.bytes.data(), c.length}, full);
      if (full) break;
      c.file.reset();
      c.file_sent = false;
      control_head_ = (control_head_ + 1) % controls_.size();
      --control_count_;
    } else if (answer_count_ > 0) {
      send_locked(answers_[answer_head_], full);
      if (full) break;
      answer_head_ = (answer_head_ + 1) % answers_.size();
      --answer_count_;
    } else if (!late_answers_.empty()) {
      send_locked(late_answers_.front(), full);
      if (full) break;
      late_answers_.pop_front();
    } else {
      if (!request_pending_) {
        if (queue_head_ == nullptr) break;
        // A message's later records ride on the credit its first took: one answer for all.
        const bool continues =
            queue_head_->kind == OpKind::kSend && queue_head_->lanes[0].offset > 0;
        if (!continues && credits_ == 0) break;
        encode_request_locked(queue_head_);
        request_pending_ = true;
        if (!continues) --credits_;
      }
      send_locked({out_.data(), out_length_}, full, out_payload_);
      if (full) {
        // It waits for room: its bytes move into out_, so that the record no longer refers to
        // the caller's memory, which a lying answer could have the caller free meanwhile.
        if (!out_payload_.empty()) {
          std::memcpy(out_.data() + out_length_, out_payload_.data(), out_payload_.size());
          out_length_ += out_payload_.size();
          out_payload_ = {};
        }
        break;
      }
      request_pending_ = false;
    }
    ++written_;
  }
  arm_locked(socket_full);
  room_awaited_.store(full && outbound_.valid(), std::memory_order_relaxed);
  // One bell for what this pump wrote, when the peer polls its ring no more.
  if (written_ != published && outbound_.wake_needed()) ring_bell(peer_bell_.get());
  return s;
}

void ShmChannel::arm_locked(bool out) {
  if (out == want_out_ || !started_) return;
  want_out_ = out;
  (void)host_.reactor().modify(loop_, fd_.get(), socket_events_locked(), this);
}

uint32_t ShmChannel::socket_events_locked() const {
  return EPOLLRDHUP | (want_out_ ? uint32_t{EPOLLOUT} : 0u) |
         (outbound_.valid() ? 0u : uint32_t{EPOLLIN});
}

void ShmChannel::encode_request_locked(OpState* op) {
  Header h;
  h.op_id = op->id.load(std::memory_order_relaxed);
  uint8_t* table = out_.data() + kHeaderBytes;
  out_payload_ = {};
  bool last = true;  // the op's last record: it leaves the queue
  if (op->kind == OpKind::kSend) {
    const OpEntry& e = op->entries[0];
    h.type = Record::kSend;
    h.tag = op->tag;
    h.count = 1;
    Entry x;
    x.length = e.length;
    x.address = reinterpret_cast<uint64_t>(e.local);
    // Messages in the window writes are cut for go through the rings too, in records.
    if (e.length <= kInlineBytes || bounce_writes().covers(e.length)) {
      // The whole message, or its next kInlineBytes; the cursor's offset counts bytes sent.
      LaneCursor& c = op->lanes[0];
      uint64_t n = std::min<uint64_t>(e.length - c.offset, kInlineBytes);
      x.entry_offset = c.offset;
      h.flags = kFlagInline;
      h.payload = static_cast<uint32_t>(n);
      out_payload_ = {e.local + c.offset, n};
      c.offset += n;
      if (c.offset < e.length) {
        h.flags |= kFlagMore;
        last = false;
      }
    }
    put_entry(x, table);
  } else if (op->lanes[0].remaining == 0) {
    // A write_with_imm whose bytes post_mapped copied: only its notification is left.
    h.type = Record::kImm;
    h.imm = op->imm;
    h.count = 1;
    const OpEntry& e = op->entries[0];
    Entry x;
    x.region = e.remote_region;
    x.key = e.remote_key;
    put_entry(x, table);
  } else {
    bool write = op->kind == OpKind::kWrite;
    h.type = write ? Record::kWrite : Record::kRead;
    LaneCursor& c = op->lanes[0];
    auto slice_length = [&](const LaneCursor& at) {
      const OpEntry& e = op->entries[at.entry];
      return std::min<uint64_t>(e.length - at.offset, op->slice_bytes);
    };
    // Small slices travel inline, as many as fit; larger ones are pulled, up to
    // kPullRecordBytes per record: a write's several, a read's consecutive ones of one entry
    // as one range under one grant (the slice count travels in `imm`).
    bool inline_bytes = slice_length(c) <= kInlineBytes;
    // First which slices the record takes, then their entries and (inline) bytes in place.
    uint64_t bytes = 0;
    uint32_t count = 0;
    for (LaneCursor at = c; at.remaining > 0 && count < kMaxEntries; ++count) {
      uint64_t length = slice_length(at);
      if (count > 0 &&
          (inline_bytes ? bytes + length > kInlineBytes
                        : length <= kInlineBytes || bytes + length > kPullRecordBytes ||
                              (!write && at.entry != c.entry))) {
        break;
      }
      bytes += length;
      advance(*op, at, 1);
      --at.remaining;
    }
    uint8_t* payload = table + std::size_t{count} * kEntryBytes;
    // The slice (or range) at `at`, as a table entry.
    auto entry_at = [&](const LaneCursor& at, uint64_t length) {
      const OpEntry& e = op->entries[at.entry];
      Entry x;
      x.index = at.entry;
      x.region = e.remote_region;
      x.key = e.remote_key;
      x.offset = e.remote_offset + at.offset;
      x.entry_offset = at.offset;
      x.length = length;
      x.address = reinterpret_cast<uint64_t>(e.local + at.offset);
      return x;
    };
    if (!write && !inline_bytes) {
      put_entry(entry_at(c, bytes), table);
      h.imm = count;
      advance(*op, c, count);
      c.remaining -= count;
      count = 1;
    }
    for (uint32_t i = 0; i < count && (write || inline_bytes); ++i) {
      const OpEntry& e = op->entries[c.entry];
      Entry x = entry_at(c, slice_length(c));
      put_entry(x, table + std::size_t{i} * kEntryBytes);
      if (inline_bytes && write && count == 1) {
        out_payload_ = {e.local + c.offset, x.length};
      } else if (inline_bytes && write && x.length > 0) {
        std::memcpy(payload, e.local + c.offset, x.length);
        payload += x.length;
      }
      advance(*op, c, 1);
      --c.remaining;
    }
    h.count = count;
    if (inline_bytes) h.flags = kFlagInline;
    if (inline_bytes && write) h.payload = static_cast<uint32_t>(bytes);
    last = c.remaining == 0;
    if (last && write && op->with_imm) {
      h.flags |= kFlagImm;
      h.imm = op->imm;
    }
  }
  put_header(h, out_.data());
  // Counted from now on: the peer may answer the record as soon as it is in the ring. A
  // message's one answer is due only once its last record is.
  if ((h.flags & kFlagMore) == 0) {
    op->on_wire.fetch_add(h.type == Record::kRead && (h.flags & kFlagInline) == 0 ? h.imm : h.count,
                          std::memory_order_relaxed);
  }
  out_length_ = kHeaderBytes + std::size_t{h.count} * kEntryBytes + h.payload - out_payload_.size();
  if (last) {
    queue_head_ = op->lane_next[0];
    if (queue_head_ == nullptr) queue_tail_ = nullptr;
  }
}

Status ShmChannel::respond(const Header& h, std::span<const uint8_t> table,
                           std::span<const uint8_t> payload, bool held) {
  std::lock_guard lock(send_mu_);
  if (send_closed_) return {};
  if (held) {
    std::vector<uint8_t>& late = late_answers_.emplace_back(kHeaderBytes + payload.size());
    put_header(h, late.data());
    if (!payload.empty()) std::memcpy(late.data() + kHeaderBytes, payload.data(), payload.size());
    return pump_locked();
  }
  if (answer_count_ == answers_.size()) {
    return {ErrorCode::kResourceExhausted, "shm: the peer asks faster than it reads the answers (" +
                                               std::to_string(answer_count_) + " queued)"};
  }
  std::vector<uint8_t>& slot = answers_[(answer_head_ + answer_count_) % answers_.size()];
  slot.resize(kHeaderBytes + table.size() + payload.size());
  put_header(h, slot.data());
  if (!table.empty()) std::memcpy(slot.data() + kHeaderBytes, table.data(), table.size());
  if (!payload.empty()) {
    std::memcpy(slot.data() + kHeaderBytes + table.size(), payload.data(), payload.size());
  }
  ++answer_count_;
  return pump_locked();
}

Status ShmChannel::respond_status(Record type, uint64_t op_id, uint32_t count, const Status& status,
                                  bool held) {
  Header h;
  h.type = type;
  h.op_id = op_id;
  h.count = count;
  h.status = static_cast<uint16_t>(status.code());
  std::string_view text = status.ok() ? std::string_view() : status.message();
  text = text.substr(0, kMaxTextBytes);
  h.payload = static_cast<uint32_t>(text.size());
  return respond(h, {}, {reinterpret_cast<const uint8_t*>(text.data()), text.size()}, held);
}

Status ShmChannel::send_control(const Header& h, const Entry* entry, core::Fd file) {
  std::lock_guard lock(send_mu_);
  if (send_closed_) return {};
  if (control_count_ == controls_.size()) {
    return {ErrorCode::kResourceExhausted,
            "shm: the peer lends or returns mappings faster than it reads (" +
                std::to_string(control_count_) + " records queued)"};
  }
  Control& c = controls_[(control_head_ + control_count_) % controls_.size()];
  put_header(h, c.bytes.data());
  c.length = kHeaderBytes;
  if (entry != nullptr) {
    put_entry(*entry, c.bytes.data() + kHeaderBytes);
    c.length += kEntryBytes;
    c.region = entry->region;
  }
  c.file = std::move(file);
  ++control_count_;
  return pump_locked();
}

// ---------------------------------------------------------------- receive side

void ShmChannel::on_event(uint32_t events) {
  if (stopped_) return;
  Status s;
  if (events & EPOLLIN) {
    bool waiting;
    {
      std::lock_guard lock(send_mu_);
      waiting = !outbound_.valid();
    }
    if (waiting) {
      std::vector<uint8_t> hello;
      s = take_ring(fd_.get(), hello);
      if (s.ok()) {
        std::lock_guard lock(send_mu_);
        (void)host_.reactor().modify(loop_, fd_.get(), socket_events_locked(), this);
        // What waited for the ring goes now; and the listener may wait for room already.
        s = pump_locked();
        ring_bell(peer_bell_.get());
      }
    }
  }
  if (s.ok() && (events & EPOLLOUT)) {
    std::lock_guard lock(send_mu_);
    s = pump_locked();
  }
  if (s.ok() && (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
    // What the peer wrote before it hung up is still handled: its last answers complete ops.
    bool more = false;
    lock_polling();
    if (!stopped_) s = consume(false, more);
    unlock_polling();
    if (s.ok()) s = {ErrorCode::kPeerLost, "shm: the peer closed the connection"};
  }
  if (!s.ok()) close(s);
}

void ShmChannel::on_bell() {
  if (stopped_) return;
  eventfd_t rings = 0;
  (void)::eventfd_read(bell_.get(), &rings);
  inbound_.woken();
  Status s;
  {
    std::lock_guard lock(send_mu_);  // the peer rings for room it freed, too
    s = pump_locked();
  }
  bool more = false;
  if (s.ok()) {
    lock_polling();
    if (!stopped_) s = consume(true, more);
    unlock_polling();
  }
  if (!s.ok()) {
    close(s);
  } else if (more) {
    // The loop serves its other channels first; the bell need not ring for what waits.
    host_.reactor().post(loop_, [self = shared_from_this()] { self->on_bell(); });
  }
}

Status ShmChannel::consume(bool budget, bool& more) {
  more = false;
  std::size_t pulled = 0;
  Status s;
  for (int i = 0;; ++i) {
    if (budget && (i >= kRecordsPerWake || pulled >= kPullBytesPerWake)) {
      more = inbound_.pending();
      break;
    }
    // Inline bytes are copied into place from the ring, the rest from our copy in in_.
    const uint8_t* at = nullptr;
    std::size_t length = 0;
    if (s = inbound_.peek(in_.size(), at, length); !s.ok() || length == 0) break;
    View v;
    s = parse_in_place({at, length}, in_, v);
    if (s.ok() && v.header.type == Record::kMap) {
      core::Fd file;
      s = receive_file(v.entry(0).region, file);
      if (s.ok()) s = on_map(v, std::move(file));
    } else if (s.ok()) {
      s = handle(v, pulled);
    }
    inbound_.release();
    if (!s.ok()) break;
  }
  if (inbound_.room_wanted()) {
    std::lock_guard lock(send_mu_);
    if (peer_bell_.valid()) ring_bell(peer_bell_.get());
  }
  return s;
}

Status ShmChannel::receive_file(uint32_t region, core::Fd& file) {
  uint8_t body[sizeof region + 1];
  Files files;
  std::size_t length = 0, count = 0;
  if (Status s = receive_with_files(fd_.get(), body, length, files, count); !s.ok()) return s;
  uint32_t named = 0;
  if (length == sizeof region) std::memcpy(&named, body, sizeof named);
  if (length != sizeof region || named != region || count != 1) {
    return {ErrorCode::kProtocol,
            "shm: region " + std::to_string(region) + " lent without its file on the socket"};
  }
  file = std::move(files[0]);
  return {};
}

bool ShmChannel::try_lock_polling() {
  if (polling_.exchange(true, std::memory_order_acquire)) return false;
  polling_channel = this;
  return true;
}

void ShmChannel::lock_polling() {
  while (!try_lock_polling()) std::this_thread::yield();  // a waiter's turn is one budget
}

void ShmChannel::unlock_polling() {
  polling_channel = nullptr;
  polling_.store(false, std::memory_order_release);
}

bool ShmChannel::polling_on_this_thread() const { return polling_channel == this; }

void ShmChannel::begin_polling() { inbound_.poll_begin(); }

bool ShmChannel::poll() {
  if (!inbound_.pending()) return false;
  try_consume();  // else a waiter takes them
  return true;
}

bool ShmChannel::try_consume() {
  if (!try_lock_polling()) return false;
  bool more = false;
  Status s = stopped_ ? Status() : consume(true, more);
  unlock_polling();
  if (!s.ok()) close(s);
  return true;
}

void ShmChannel::end_polling() {
  if (inbound_.poll_end()) ring_bell(bell_.get());
}

void ShmChannel::progress() {
  // Holding a reference: a completion callback may drop the last other one.
  std::shared_ptr<ShmChannel> self = weak_from_this().lock();
  if (self && !polling_on_this_thread()) try_consume();
}

void ShmChannel::spin(const std::atomic<bool>& done, std::chrono::nanoseconds budget, bool) {
  std::shared_ptr<ShmChannel> self = weak_from_this().lock();
  if (!self) return;
  inbound_.poll_begin();  // the peer rings no bell while we look
  // A wait inside a completion callback cannot poll: the poll it runs in holds the right.
  const bool nested = polling_on_this_thread();
  std::chrono::steady_clock::time_point until;
  for (unsigned i = 0; !done.load(std::memory_order_acquire); ++i) {
    if (!nested && inbound_.pending()) try_consume();
    // The clock every few polls: a clock read costs as much as a look at the ring.
    if (i % 8 == 7) {
      auto now = std::chrono::steady_clock::now();
      if (i == 7) until = now + budget;
      if (now >= until) break;
      if (room_awaited_.load(std::memory_order_relaxed)) refill();
    }
  }
  end_polling();  // records that came while we looked and nobody took: the progress thread's
}

void ShmChannel::refill() {
  Status s;
  {
    // Never waits: whoever holds the lock is writing already.
    std::unique_lock lock(send_mu_, std::try_to_lock);
    if (!lock.owns_lock() || send_closed_ || !outbound_.room_freed()) return;
    s = pump_locked();
  }
  if (!s.ok()) close(s);
}

void ShmChannel::unwatched() {
  std::shared_ptr<ShmChannel> self = weak_from_this().lock();
  if (!self) return;
  begin_polling();
  end_polling();
}

Status ShmChannel::handle(const View& r, std::size_t& pulled) {
  bool bodiless = r.header.type == Record::kImm || r.header.type == Record::kRevoke ||
                  r.header.type == Record::kUnmapped || r.header.type == Record::kRelease;
  if (bodiless && !r.payload.empty()) return {ErrorCode::kProtocol, "shm record: stray bytes"};
  switch (r.header.type) {
    case Record::kWrite:
      return on_write(r, pulled);
    case Record::kRead:
      return on_read(r);
    case Record::kSend:
      return on_send(r, pulled);
    case Record::kRelease:
      return on_release(r);
    case Record::kImm:
      return on_imm(r);
    case Record::kRevoke:
      return on_revoke(r);
    case Record::kUnmapped:
      return on_unmapped(r);
    case Record::kAck:
    case Record::kReadData:
    case Record::kGrant:
    case Record::kSendAck:
      return on_answer(r, pulled);
    case Record::kHello:
    case Record::kMap:  // taken with its file in consume()
      break;
  }
  return {ErrorCode::kProtocol, "shm record: hello after set-up"};
}

Status ShmChannel::pull(const iovec* local, const iovec* remote, std::size_t n,
                        uint64_t total) const {
  if (!no_cross_memory_.empty()) {
    return {ErrorCode::kProtocol, "shm: asked to pull where " + no_cross_memory_};
  }
  return pool_->pull(peer_pid_, local, remote, n, total);
}

Status ShmChannel::on_write(const View& r, std::size_t& pulled) {
  const Header& h = r.header;
  if (h.op_id != imm_op_) {  // an op's records arrive one after the other
    imm_op_ = h.op_id;
    imm_op_failed_ = false;
  }
  const bool inline_bytes = (h.flags & kFlagInline) != 0;
  const uint8_t* src = r.payload.data();
  std::size_t inline_left = r.payload.size();
  if (!inline_bytes && inline_left != 0) return {ErrorCode::kProtocol, "shm write: stray bytes"};
  // The uses taken below go whichever way this returns: a use left behind would hold its
  // region's deregistration forever.
  struct Release {
    std::vector<RegionUse>& uses;
    ~Release() { uses.clear(); }
  } release{uses_};
  Status status;
  uint64_t total = 0;
  local_iov_.clear();
  remote_iov_.clear();
  for (uint32_t i = 0; i < h.count; ++i) {
    Entry e = r.entry(i);
    if (inline_bytes && e.length > inline_left) {
      return {ErrorCode::kProtocol, "shm write: entries longer than the bytes carried"};
    }
    uint8_t* dst = nullptr;
    RegionUse use;  // held while the bytes land: a deregistration waits for it
    Status s = host_.regions().acquire(e.region, e.key ^ ShmTransport::kKeyFlip, e.offset, e.length,
                                       Access::kRemoteWrite, &dst, use);
    if (s.ok()) {
      if (Status l = lend(e, use); !l.ok()) return l;
    }
    if (!s.ok()) {
      if (status.ok())
        status = {s.code(), "write entry " + std::to_string(e.index) + ": " + s.message()};
    } else if (inline_bytes) {
      if (e.length > 0) std::memcpy(dst, src, e.length);
    } else if (e.length > 0) {
      local_iov_.push_back({dst, e.length});
      remote_iov_.push_back({peer_address(e.address), e.length});
      uses_.push_back(std::move(use));
      total += e.length;
    }
    if (inline_bytes) {
      src += e.length;
      inline_left -= e.length;
    }
  }
  if (inline_left != 0) return {ErrorCode::kProtocol, "shm write: bytes beyond its entries"};
  if (!local_iov_.empty()) {
    Status s = pull(local_iov_.data(), remote_iov_.data(), local_iov_.size(), total);
    if (!s.ok() && status.ok()) status = s;
    pulled += total;
  }
  uses_.clear();
  if (!status.ok()) imm_op_failed_ = true;
  // Every byte of the op landed: the notification comes after them, as RC and TCP order it.
  if ((h.flags & kFlagImm) && !imm_op_failed_) host_.deliver_imm(*link_, h.imm);
  return respond_status(Record::kAck, h.op_id, h.count, status);
}

Status ShmChannel::on_read(const View& r) {
  const Header& h = r.header;
  if (!r.payload.empty()) return {ErrorCode::kProtocol, "shm read: stray bytes"};
  Status status;
  if (h.flags & kFlagInline) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < h.count; ++i)
      total += std::min<uint64_t>(r.entry(i).length, kInlineBytes + 1);
    if (total > kInlineBytes) return {ErrorCode::kProtocol, "shm read: too many bytes inline"};
    scratch_.resize(total);
    uint8_t* at = scratch_.data();
    for (uint32_t i = 0; i < h.count && status.ok(); ++i) {
      Entry e = r.entry(i);
      uint8_t* src = nullptr;
      RegionUse use;
      Status s = host_.regions().acquire(e.region, e.key ^ ShmTransport::kKeyFlip, e.offset,
                                         e.length, Access::kRemoteRead, &src, use);
      if (!s.ok()) {
        status = {s.code(), "read entry " + std::to_string(e.index) + ": " + s.message()};
      } else if (Status l = lend(e, use); !l.ok()) {
        return l;
      } else if (e.length > 0) {
        std::memcpy(at, src, e.length);
      }
      at += e.length;
    }
    if (!status.ok()) return respond_status(Record::kAck, h.op_id, h.count, status);
    Header a;
    a.type = Record::kReadData;
    a.op_id = h.op_id;
    a.count = h.count;
    a.payload = static_cast<uint32_t>(total);
    return respond(a, r.table, scratch_);
  }
  if (h.count != 1 || h.imm == 0) {
    return {ErrorCode::kProtocol, "shm read: a pulled read takes one entry of one or more slices"};
  }
  Entry e = r.entry(0);
  uint8_t* src = nullptr;
  RegionUse use;
  Status s = host_.regions().acquire(e.region, e.key ^ ShmTransport::kKeyFlip, e.offset, e.length,
                                     Access::kRemoteRead, &src, use);
  if (!s.ok()) {  // answers every slice the range covers
    return respond_status(Record::kAck, h.op_id, h.imm,
                          {s.code(), "read entry " + std::to_string(e.index) + ": " + s.message()});
  }
  if (grants_.size() >= static_cast<std::size_t>(kRequestsInFlight)) {
    return {ErrorCode::kResourceExhausted,
            "shm: the peer holds " + std::to_string(grants_.size()) + " read grants"};
  }
  if (Status l = lend(e, use); !l.ok()) return l;
  // Held until the peer released it: a deregistration waits for the peer's pull.
  grants_.push_back({next_grant_++, std::move(use), src, e.length});
  e.address = reinterpret_cast<uint64_t>(src);
  uint8_t table[kEntryBytes];
  put_entry(e, table);
  Header a;
  a.type = Record::kGrant;
  a.op_id = h.op_id;
  a.count = 1;
  a.tag = grants_.back().id;
  a.imm = h.imm;
  return respond(a, table);
}

Status ShmChannel::on_imm(const View& r) {
  // Its bytes were copied before it was sent; it notifies only a peer that may still write.
  Entry e = r.entry(0);
  uint8_t* unused = nullptr;
  RegionUse use;
  Status s = host_.regions().acquire(e.region, e.key ^ ShmTransport::kKeyFlip, 0, 0,
                                     Access::kRemoteWrite, &unused, use);
  if (s.ok()) host_.deliver_imm(*link_, r.header.imm);
  return respond_status(Record::kAck, r.header.op_id, 1,
                        s.ok() ? s : Status{s.code(), "write_with_imm: " + s.message()});
}

Status ShmChannel::on_release(const View& r) {
  auto it = std::find_if(grants_.begin(), grants_.end(),
                         [&](const Held& g) { return g.id == r.header.tag; });
  if (it == grants_.end()) {
    return {ErrorCode::kProtocol,
            "shm: release of grant " + std::to_string(r.header.tag) + ", which is not held"};
  }
  *it = std::move(grants_.back());
  grants_.pop_back();
  return {};
}

namespace {
// A large message that found no receive posted: its bytes stay with the sender until one is.
struct HeldSend final : Rendezvous {
  HeldSend(std::weak_ptr<ShmChannel> channel, uint64_t op_id, uint64_t tag, const Entry& e)
      : channel(std::move(channel)), op_id(op_id), tag(tag), entry(e) {}
  void matched(OpState* recv) override {
    // Without the channel the peer is gone: the receive fails with it.
    if (auto c = channel.lock()) c->taken_later(op_id, tag, entry, recv);
  }
  std::weak_ptr<ShmChannel> channel;
  uint64_t op_id, tag;
  Entry entry;
};
}  // namespace

Status ShmChannel::on_send(const View& r, std::size_t& pulled) {
  const Header& h = r.header;
  if ((h.flags & kFlagInline) != 0) return on_message_bytes(r, pulled);
  if (!r.payload.empty()) return {ErrorCode::kProtocol, "shm send: bytes beside a pulled message"};
  if (arriving_.active) return message_out_of_place(h.op_id);
  return hold_or_pull(h.op_id, h.tag, r.entry(0), pulled);
}

Status ShmChannel::hold_or_pull(uint64_t op_id, uint64_t tag, const Entry& e, std::size_t& pulled) {
  Status refused;
  OpState* recv = link_->matcher.announce(
      tag, 0, std::make_shared<HeldSend>(weak_from_this(), op_id, tag, e), refused);
  if (!refused.ok()) return respond_status(Record::kSendAck, op_id, 1, refused);
  if (recv == nullptr) {
    // Held: the sender gets its credit back, so that its other requests go on meanwhile.
    return respond_status(Record::kSendAck, op_id, 1, {ErrorCode::kInProgress, ""});
  }
  return into_receive(recv, op_id, tag, e, false, pulled);
}

Status ShmChannel::message_out_of_place(uint64_t op_id) const {
  std::string arriving =
      arriving_.active ? "op " + std::to_string(arriving_.op_id) + "'s arrives" : "none arrives";
  return {ErrorCode::kProtocol, "shm send: a record of op " + std::to_string(op_id) +
                                    " out of place (of the messages in several records, " +
                                    arriving + ")"};
}

Status ShmChannel::on_message_bytes(const View& r, std::size_t& pulled) {
  const Header& h = r.header;
  Entry e = r.entry(0);
  Arriving& m = arriving_;
  if (e.entry_offset == 0) {
    if (m.active) return message_out_of_place(h.op_id);
    m.active = true;
    m.op_id = h.op_id;
    m.tag = h.tag;
    m.length = e.length;
    m.received = 0;
    m.address = e.address;
    Matcher::Arrival a = link_->matcher.arrive(h.tag, e.length);
    m.recv = a.recv;
    m.counted = a.error.ok() && a.recv == nullptr;
    // One of several records that the limits leave no room to buffer is held instead, once
    // its last record is in, as a pulled message is: the receive that takes it pulls it.
    m.held = !a.error.ok() && (h.flags & kFlagMore) != 0;
    m.refused = m.held ? Status() : a.error;
  } else if (!m.active || h.op_id != m.op_id || h.tag != m.tag || e.length != m.length ||
             e.entry_offset != m.received) {
    return message_out_of_place(h.op_id);
  }
  const std::size_t n = r.payload.size();
  const uint64_t left = m.length - m.received;
  const bool more = (h.flags & kFlagMore) != 0;
  if (more ? n == 0 || n >= left : n != left) {
    return {ErrorCode::kProtocol, "shm send: its length and its bytes disagree"};
  }
  if (m.recv != nullptr) {
    const OpEntry& dst = m.recv->entries[0];
    if (m.received < dst.length) {
      std::memcpy(dst.local + m.received, r.payload.data(),
                  std::min<uint64_t>(n, dst.length - m.received));
    }
  } else if (m.counted) {
    if (m.buffer.capacity() < m.length) m.buffer.reserve(m.length);  // arrive() counted it
    m.buffer.insert(m.buffer.end(), r.payload.begin(), r.payload.end());
  }
  m.received += n;
  if (more) return {};
  m.active = false;
  if (m.recv != nullptr)
    return complete_receive(std::exchange(m.recv, nullptr), m.op_id, m.tag, m.length, {}, false);
  if (m.held) {
    Entry whole;
    whole.length = m.length;
    whole.address = m.address;
    return hold_or_pull(m.op_id, m.tag, whole, pulled);
  }
  if (!m.counted) return respond_status(Record::kSendAck, m.op_id, 1, m.refused);
  m.counted = false;
  Status queued = respond_status(Record::kSendAck, m.op_id, 1, {});
  messages.received.fetch_add(1, std::memory_order_relaxed);
  link_->matcher.commit(m.tag, std::exchange(m.buffer, {}));
  return queued;
}

Status ShmChannel::into_receive(OpState* recv, uint64_t op_id, uint64_t tag, const Entry& e,
                                bool held, std::size_t& pulled) {
  const OpEntry& dst = recv->entries[0];
  uint64_t n = std::min(e.length, dst.length);
  Status s;
  if (n > 0) {
    iovec local{dst.local, n}, remote{peer_address(e.address), n};
    pulled += n;
    s = pull(&local, &remote, 1, n);
  }
  return complete_receive(recv, op_id, tag, e.length, s, held);
}

Status ShmChannel::complete_receive(OpState* recv, uint64_t op_id, uint64_t tag, uint64_t length,
                                    const Status& copied, bool held) {
  const uint64_t capacity = recv->entries[0].length;
  Status answer = copied;
  if (copied.ok() && length > capacity) answer = Matcher::truncated_send(tag, capacity);
  // The ack is queued before the receiver can run: anything it sends next goes out after it.
  Status queued = respond_status(Record::kSendAck, op_id, 1, answer, held);
  if (copied.ok()) {
    messages.received.fetch_add(1, std::memory_order_relaxed);
    Matcher::settle(recv, length);
  } else {
    recv->record_error(copied);
  }
  recv->finish_posted();
  return queued;
}

void ShmChannel::taken_later(uint64_t op_id, uint64_t tag, const Entry& e, OpState* recv) {
  link_->matcher.release(0);
  host_.reactor().post(loop_, [self = shared_from_this(), op_id, tag, e, recv] {
    self->lock_polling();
    std::size_t pulled = 0;
    // Once stopped, closing fails the receive with the peer's other ops.
    Status s = self->stopped_ ? Status() : self->into_receive(recv, op_id, tag, e, true, pulled);
    self->unlock_polling();
    if (!s.ok()) self->close(s);
  });
}

OpState* ShmChannel::answered_op(const View& r, Status& error) const {
  OpState* op = link_->pool->lookup(r.header.op_id);
  bool fits = op != nullptr;
  if (fits) {
    switch (r.header.type) {
      case Record::kAck:  // a write's, or a read's refusal
        fits = op->kind == OpKind::kWrite || op->kind == OpKind::kRead;
        break;
      case Record::kSendAck:
        fits = op->kind == OpKind::kSend;
        break;
      default:
        fits = op->kind == OpKind::kRead;
    }
  }
  if (!fits) {
    error = {ErrorCode::kProtocol,
             "shm: an answer for op " + std::to_string(r.header.op_id) + ", which is not asking"};
    return nullptr;
  }
  int64_t count = answered_slices(r.header);
  if (count < 1 || count > op->on_wire.load()) {
    error = {ErrorCode::kProtocol, "shm: an answer for " + std::to_string(count) +
                                       " slices of op " + std::to_string(r.header.op_id)};
    return nullptr;
  }
  // Every echoed entry must be one the op has.
  for (std::size_t i = 0; i < r.table.size() / kEntryBytes; ++i) {
    Entry e = r.entry(i);
    if (e.index >= op->entries.size() || e.entry_offset > op->entries[e.index].length ||
        e.length > op->entries[e.index].length - e.entry_offset) {
      error = {ErrorCode::kProtocol, "shm: an answer names bytes op " +
                                         std::to_string(r.header.op_id) + " does not have"};
      return nullptr;
    }
  }
  return op;
}

Status ShmChannel::on_answer(const View& r, std::size_t& pulled) {
  const Header& h = r.header;
  Status error;
  OpState* op = answered_op(r, error);
  if (op == nullptr) return error;
  if (h.type == Record::kSendAck && h.status == static_cast<uint16_t>(ErrorCode::kInProgress)) {
    // Held until the peer posts a receive: the credit comes back now, the op stays.
    if (op->peer_token != 0 || !r.payload.empty()) {
      return {ErrorCode::kProtocol, "shm: send " + std::to_string(h.op_id) + " held twice"};
    }
    op->peer_token = 1;
    std::lock_guard lock(send_mu_);
    if (Status s = take_credit_back_locked(); !s.ok()) return s;
    return pump_locked();
  }
  if (h.status != 0) {
    op->record_error(
        {static_cast<ErrorCode>(h.status),
         std::string(reinterpret_cast<const char*>(r.payload.data()), r.payload.size())});
  }
  if (h.type == Record::kSendAck &&
      (h.status == 0 || h.status == static_cast<uint16_t>(ErrorCode::kTruncated))) {
    messages.sent.fetch_add(1, std::memory_order_relaxed);
  }
  if (h.type == Record::kReadData) {
    const uint8_t* src = r.payload.data();
    std::size_t left = r.payload.size();
    for (uint32_t i = 0; i < h.count; ++i) {
      Entry e = r.entry(i);
      if (e.length > left) return {ErrorCode::kProtocol, "shm read data: fewer bytes than asked"};
      if (e.length > 0) std::memcpy(op->entries[e.index].local + e.entry_offset, src, e.length);
      src += e.length;
      left -= e.length;
    }
    if (left != 0) return {ErrorCode::kProtocol, "shm read data: more bytes than asked"};
  } else if (h.type == Record::kGrant) {
    Entry e = r.entry(0);
    iovec local{op->entries[e.index].local + e.entry_offset, e.length};
    iovec remote{peer_address(e.address), e.length};
    Status s = e.length > 0 ? pull(&local, &remote, 1, e.length) : Status();
    pulled += e.length;
    if (!s.ok())
      op->record_error({s.code(), "read entry " + std::to_string(e.index) + ": " + s.message()});
    Header release;
    release.type = Record::kRelease;
    release.tag = h.tag;
    if (Status q = respond(release); !q.ok()) return q;
  }
  // A held send's credit came back with its first answer. The credit comes back before the op
  // completes: a caller that posts again at once finds none of its requests on the wire.
  if (!(h.type == Record::kSendAck && op->peer_token != 0)) {
    std::lock_guard lock(send_mu_);
    if (Status s = take_credit_back_locked(); !s.ok()) return s;
  }
  int64_t answered = answered_slices(h);
  op->on_wire.fetch_sub(answered, std::memory_order_relaxed);
  if (op->finish_slices(answered)) op->finish_posted();
  std::lock_guard lock(send_mu_);
  return pump_locked();
}

Status ShmChannel::take_credit_back_locked() {
  if (credits_ == kRequestsInFlight) {
    return {ErrorCode::kProtocol, "shm: more answers than requests"};
  }
  ++credits_;
  return {};
}

// ---------------------------------------------------------------- closing

void ShmChannel::close(const Status& reason) {
  {
    std::lock_guard lock(close_mu_);
    if (closing_.exchange(true)) return;
    close_reason_ = reason;
    if (started_) {
      // The fd stays open until the channel is destroyed, so this never hits a reused number.
      ::shutdown(fd_.get(), SHUT_RDWR);
      host_.reactor().post(loop_, [self = shared_from_this()] { self->stop(); });
      return;
    }
  }
  report_closed();  // never in the reactor: nothing of it runs
}

void ShmChannel::cut_off(const uint8_t* base, uint64_t length, const Status& why) {
  if (closing_.load()) return;
  host_.reactor().post(loop_, [self = shared_from_this(), base, length, why] {
    self->lock_polling();
    bool touched = false;
    for (const auto* held : {&self->grants_, &self->lent_}) {
      for (const Held& h : *held) touched = touched || overlaps(h.base, h.length, base, length);
    }
    if (const OpState* filling = self->arriving_.recv; filling != nullptr) {
      const OpEntry& dst = filling->entries[0];
      touched = touched || overlaps(dst.local, dst.length, base, length);
    }
    self->unlock_polling();
    if (touched) self->close(why);
  });
}

void ShmChannel::stop() {
  if (stopped_) return;
  link_->pool->clear_progress(this);  // callers' waits poll the ring no more
  lock_polling();
  stopped_ = true;
  host_.reactor().remove_poller(loop_, this);
  host_.reactor().remove(loop_, fd_.get());
  host_.reactor().remove(loop_, bell_.get());
  {
    std::lock_guard lock(send_mu_);
    send_closed_ = true;
    queue_head_ = queue_tail_ = nullptr;
    answer_count_ = 0;
    late_answers_.clear();
    for (; control_count_ > 0; --control_count_) {
      controls_[control_head_].file.reset();
      control_head_ = (control_head_ + 1) % controls_.size();
    }
  }
  // A message cut short: its receive fails with the peer's other ops; its buffer counts no more.
  if (arriving_.counted) link_->matcher.abandon(arriving_.length);
  arriving_ = {};
  grants_.clear();  // the peer pulls no more: the regions may go
  lent_.clear();    // what it mapped holds memory the engine frees only after deregistration
  unmap_all();
  unlock_polling();
  host_.reactor().retire(loop_, std::move(keep_alive_));
  report_closed();
}

void ShmChannel::stop_after_reactor() {
  bool started = false;
  {
    std::lock_guard lock(close_mu_);
    if (!closing_.exchange(true)) close_reason_ = {ErrorCode::kCancelled, "engine shut down"};
    started = started_;
  }
  if (started) {
    stop();
  } else {
    report_closed();
  }
}

void ShmChannel::report_closed() {
  if (quiesced_.exchange(true)) return;
  Status reason;
  {
    std::lock_guard lock(close_mu_);
    reason = close_reason_;
  }
  if (on_closed_) on_closed_(reason);
}

Status ShmTransport::make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) {
  std::shared_ptr<ShmChannel> channel;
  if (Status s =
          ShmChannel::create(std::move(args), pool_, no_cross_memory_, ring_copies_up_to_, channel);
      !s.ok()) {
    return s;
  }
  out = std::move(channel);
  return {};
}

}  // namespace ferry::transport::shm
