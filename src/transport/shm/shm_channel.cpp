// ShmChannel: set-up, the send side (requests and answers encoded into the peer's ring) and
// closing; the receive side is in shm_channel_receive.cpp.
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
#include <utility>

#include "core/crypto.hpp"
#include "core/sys.hpp"
#include "transport/shm/shm_socket.hpp"

namespace ferry::transport::shm {

namespace {

// Connections the listener's socket queues: the dialer's, plus room for strangers who read the
// name in /proc/net/unix and connected first (refused by their pid, never served).
constexpr int kBacklog = 4;
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
                       std::string no_cross_memory, const ShmConfig& config)
    : host_(args.host),
      pool_(std::move(pool)),
      link_(std::move(args.link)),
      latch_(std::move(args.on_closed)),
      dialer_(args.dialer),
      loop_(args.host.reactor().pick_loop()),
      no_cross_memory_(std::move(no_cross_memory)),
      ring_copies_up_to_(config.ring_copies_up_to),
      measure_paths_(config.measure_paths),
      stream_poll_(config.stream_poll),
      request_poll_(config.request_poll),
      answers_(2 * kRequestsInFlight),
      controls_(kControlRecords) {}

ShmChannel::~ShmChannel() { unmap_all(); }

Status ShmChannel::create(ChannelArgs args, std::shared_ptr<CopyPool> pool,
                          std::string no_cross_memory, const ShmConfig& config,
                          std::shared_ptr<ShmChannel>& out) {
  std::shared_ptr<ShmChannel> channel(
      new ShmChannel(std::move(args), std::move(pool), std::move(no_cross_memory), config));
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

void ShmChannel::shape_write(OpState& op, uint64_t total) {
  // A write in the window rides in records, cut to their size, unless the chooser sends it to
  // be pulled.
  if (!in_ring_window(total) || op.slice_bytes <= kInlineBytes) return;
  bool bounced = true;
  if (measure_paths_) {
    bounced = write_paths_.bounce(total);
    ShmOpArea& area = op.transport_area<ShmOpArea>();
    area.route = bounced ? ShmOpArea::kBounced : ShmOpArea::kDirect;
    area.routed_ns = PathChooser::now_ns();
  }
  if (bounced) op.slice_bytes = kInlineBytes;
}

void ShmChannel::finish_answered(OpState* op, int64_t answered) {
  if (!op->finish_slices(answered)) return;
  const ShmOpArea& area = op->transport_area<ShmOpArea>();
  if (area.route != ShmOpArea::kUnrouted && (op->watchers.load() & OpState::kError) == 0) {
    PathChooser& paths = op->kind == OpKind::kSend ? message_paths_ : write_paths_;
    paths.finished(op->bytes.load(std::memory_order_relaxed), area.route == ShmOpArea::kBounced,
                   area.routed_ns, PathChooser::now_ns());
  }
  op->finish_posted();
}

void ShmChannel::report_paths(std::vector<PathStats>& out) const {
  auto add = [&](const char* transfers, const PathChooser& chooser) {
    for (int k = 0; k < PathChooser::kClasses; ++k) {
      PathChooser::ClassState c = chooser.state(k);
      if (c.bounced + c.direct == 0) continue;
      auto mb_per_s = [](double ns_per_mib) {
        return ns_per_mib > 0 ? static_cast<double>(1 << 20) * 1e3 / ns_per_mib : 0.0;
      };
      out.push_back({transfers, PathChooser::class_floor(k), c.bounced, c.direct,
                     mb_per_s(c.bounce_ns_per_mib), mb_per_s(c.direct_ns_per_mib)});
    }
  };
  add("write", write_paths_);
  add("send", message_paths_);
}

Status ShmChannel::start() {
  in_.resize(kMaxRecordBytes);
  out_.resize(kMaxRecordBytes);
  local_iov_.reserve(kMaxEntries);
  remote_iov_.reserve(kMaxEntries);
  uses_.reserve(kMaxEntries);
  grants_.reserve(kRequestsInFlight);
  bell_handler_.channel = this;
  std::lock_guard lock(latch_.lock());
  if (latch_.closing()) return {ErrorCode::kPeerLost, "shm: connection already closed"};
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
  on_wire(*op).store(0, std::memory_order_relaxed);  // a prepared op's earlier post may have failed
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
    last = encode_send_locked(op, h, table);
  } else if (op->lanes[0].remaining == 0) {
    encode_imm_locked(op, h, table);
  } else {
    last = encode_slices_locked(op, h, table);
  }
  put_header(h, out_.data());
  // Counted from now on: the peer may answer the record as soon as it is in the ring. A
  // message's one answer is due only once its last record is.
  if ((h.flags & kFlagMore) == 0) {
    on_wire(*op).fetch_add(
        h.type == Record::kRead && (h.flags & kFlagInline) == 0 ? h.imm : h.count,
        std::memory_order_relaxed);
  }
  out_length_ = kHeaderBytes + std::size_t{h.count} * kEntryBytes + h.payload - out_payload_.size();
  if (last) {
    queue_head_ = op->lane_next[0];
    if (queue_head_ == nullptr) queue_tail_ = nullptr;
  }
}

bool ShmChannel::encode_send_locked(OpState* op, Header& h, uint8_t* table) {
  const OpEntry& e = op->entries[0];
  h.type = Record::kSend;
  h.tag = op->tag;
  h.count = 1;
  Entry x;
  x.length = e.length;
  x.address = reinterpret_cast<uint64_t>(e.local);
  bool last = true;
  // Messages in the window writes are cut for go through the rings too, in records, or
  // (measured) the way that moved messages of their size faster lately: decided at the
  // first record and kept for the rest.
  bool in_records = e.length <= kInlineBytes;
  if (!in_records && e.length <= kMessageRingCopiesUpTo && in_ring_window(e.length)) {
    ShmOpArea& area = op->transport_area<ShmOpArea>();
    if (measure_paths_ && area.route == ShmOpArea::kUnrouted) {
      area.route = message_paths_.bounce(e.length) ? ShmOpArea::kBounced : ShmOpArea::kDirect;
      area.routed_ns = PathChooser::now_ns();
    }
    in_records = !measure_paths_ || area.route == ShmOpArea::kBounced;
  }
  if (in_records) {
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
  return last;
}

void ShmChannel::encode_imm_locked(OpState* op, Header& h, uint8_t* table) {
  // A write_with_imm whose bytes post_mapped copied: only its notification is left.
  h.type = Record::kImm;
  h.imm = op->imm;
  h.count = 1;
  const OpEntry& e = op->entries[0];
  Entry x;
  x.region = e.remote_region;
  x.key = e.remote_key;
  put_entry(x, table);
}

bool ShmChannel::encode_slices_locked(OpState* op, Header& h, uint8_t* table) {
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
    if (count > 0 && (inline_bytes ? bytes + length > kInlineBytes
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
  bool last = c.remaining == 0;
  if (last && write && op->with_imm) {
    h.flags |= kFlagImm;
    h.imm = op->imm;
  }
  return last;
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

// ---------------------------------------------------------------- closing

void ShmChannel::close(const Status& reason) {
  bool in_reactor = false;
  bool began = latch_.begin(reason, [&] {
    in_reactor = started_;
    if (in_reactor) {
      // The fd stays open until the channel is destroyed, so this never hits a reused number.
      ::shutdown(fd_.get(), SHUT_RDWR);
      host_.reactor().post(loop_, [self = shared_from_this()] { self->stop(); });
    }
  });
  if (began && !in_reactor) latch_.report();  // never in the reactor: nothing of it runs
}

void ShmChannel::cut_off(const uint8_t* base, uint64_t length, const Status& why) {
  if (latch_.closing()) return;
  host_.reactor().post(loop_, [self = shared_from_this(), base, length, why] {
    self->polling_.lock();
    bool touched = false;
    for (const auto* held : {&self->grants_, &self->lent_}) {
      for (const Held& h : *held) touched = touched || overlaps(h.base, h.length, base, length);
    }
    if (const OpState* filling = self->arriving_.recv; filling != nullptr) {
      const OpEntry& dst = filling->entries[0];
      touched = touched || overlaps(dst.local, dst.length, base, length);
    }
    self->polling_.unlock();
    if (touched) self->close(why);
  });
}

void ShmChannel::stop() {
  if (stopped_) return;
  link_->pool->clear_progress(this);  // callers' waits poll the ring no more
  polling_.lock();
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
  polling_.unlock();
  host_.reactor().retire(loop_, std::move(keep_alive_));
  latch_.report();
}

void ShmChannel::stop_after_reactor() {
  latch_.begin({ErrorCode::kCancelled, "engine shut down"});
  bool started = false;
  {
    std::lock_guard lock(latch_.lock());
    started = started_;
  }
  if (started) {
    stop();
  } else {
    latch_.report();
  }
}

Status ShmTransport::make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) {
  std::shared_ptr<ShmChannel> channel;
  if (Status s = ShmChannel::create(std::move(args), pool_, no_cross_memory_, config_, channel);
      !s.ok()) {
    return s;
  }
  out = std::move(channel);
  return {};
}

}  // namespace ferry::transport::shm
