// The same-host transport's wire: the channel address the engine carries over the control
// connection, and the records the two processes exchange over their Unix socket. Every decoder
// takes untrusted bytes (the peer may be hostile) and rejects what it cannot use.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::transport::shm {

// 2: rings; 3: messages in several records; 4: 32 KiB inline, 512 KiB rings (protocol.md).
constexpr uint8_t kAddressVersion = 4;
using Nonce = std::array<uint8_t, 16>;

// What one side tells the other to connect (Channel::local_address).
struct Address {
  uint32_t pid = 0;            // the sender as it sees itself; checked against SO_PEERCRED
  bool reads_peer = false;     // listener only: it read the dialer's probe nonce
  Nonce socket{};              // listener only: its abstract socket's name
  Nonce token{};               // listener only: what the dialer presents on the socket
  uint64_t probe_address = 0;  // where the sender keeps `probe`, for the peer to read
  Nonce probe{};
};
std::vector<uint8_t> encode(const Address& a);
Status decode(std::span<const uint8_t> in, Address& out);

enum class Record : uint8_t {
  kHello = 1,     // dialer -> listener, first on the socket: token, whether it read the probe
  kWrite = 2,     // entries; inline bytes follow the table, else the target pulls them
  kRead = 3,      // entries; answered with kReadData (inline) or kGrant (one entry, pulled)
  kSend = 4,      // one entry (length, address); inline bytes, else the target pulls them;
                  // inline, a message may come in several records (kFlagMore)
  kRelease = 5,   // the initiator is done with grant `tag`
  kAck = 6,       // `count` slices done; `status`, error text as payload
  kReadData = 7,  // the request's table echoed, then the bytes
  kGrant = 8,     // the request's one entry echoed, `address` = where to pull; grant id `tag`
  kSendAck = 9,   // status, error text
  // Mapped regions (memory from Engine::allocate, a memory file): the target lends the file.
  kImm = 10,       // the initiator copied a write_with_imm's bytes into a mapping: deliver `imm`
                   // if the entry (its first region and key) still grants remote write
  kMap = 11,       // target -> initiator, with the file (SCM_RIGHTS): one entry (region, key,
                   // length); kFlagWritable when the region grants remote write
  kRevoke = 12,    // target -> initiator: give region `tag`'s mapping back
  kUnmapped = 13,  // initiator -> target: it holds no mapping of region `tag` (declined,
                   // evicted, or given back)
};

// Records a target serves and answers: what an initiator posts, one operation after another.
constexpr bool is_request(Record type) {
  return type == Record::kWrite || type == Record::kRead || type == Record::kSend;
}

// Header flags.
constexpr uint8_t kFlagInline = 1;    // the bytes travel in the record
constexpr uint8_t kFlagImm = 2;       // a write's last record: deliver `imm` once it landed
constexpr uint8_t kFlagWritable = 4;  // kMap: the peer may map the file writable
// kSend, inline: more of the message follows in the next records of the same op, each with
// the message's length and its bytes' offset (entry_offset) in the entry.
constexpr uint8_t kFlagMore = 8;

struct Header {
  Record type{};
  uint8_t flags = 0;
  uint16_t status = 0;   // ErrorCode of a response
  uint32_t count = 0;    // table entries (requests, read data) or slices done (acks)
  uint64_t op_id = 0;    // the initiator's op, echoed by responses
  uint64_t tag = 0;      // message tag (kSend) or grant id (kGrant, kRelease)
  uint32_t imm = 0;      // write_with_imm's; for a pulled read (kRead, kGrant): its slices
  uint32_t payload = 0;  // bytes after the table
};
constexpr std::size_t kHeaderBytes = 32;

// One slice of an operation.
struct Entry {
  uint32_t index = 0;         // the op's entry
  uint32_t region = 0;        // the target's region
  uint64_t key = 0;           // its shm key
  uint64_t offset = 0;        // in the target's region
  uint64_t entry_offset = 0;  // in the op's entry
  uint64_t length = 0;
  uint64_t address = 0;  // the bytes' address in the process that holds them (pulls)
};
constexpr std::size_t kEntryBytes = 48;

// An Entry's address, for process_vm_readv's remote iovec: never dereferenced here (the kernel
// reads it in the peer's address space).
inline void* peer_address(uint64_t address) {
  return reinterpret_cast<void*>(address);  // NOLINT(performance-no-int-to-ptr)
}

// Slices one record carries at most: one header and one answer for a scattered batch's small
// entries (TCP groups as many), and one process_vm_readv's iovecs (Linux takes 1024).
constexpr uint32_t kMaxEntries = 256;
// Bytes that travel inside a record instead of being pulled, and the slices of writes and
// messages through the rings: below this a copy through the ring costs less than the
// process_vm_readv call and its page walk, and each record costs its header, table and answer.
// 16 -> 32 KiB (with 512 KiB rings) moved 1 MiB writes and sends 8 in flight faster and cut the
// p50 of 1 MiB writes and 24 KiB sends one at a time; 64 KiB slices (1 MiB rings) moved writes
// as much, sends less (docs/performance-history.md, "Notifications taken by a polling next_imm,
// 32 KiB records, 2 MiB through the rings").
constexpr std::size_t kInlineBytes = 32 << 10;
// Writes and messages from this many bytes in all (up to ShmConfig::ring_copies_up_to, 16 MiB
// by default; messages up to kMessageRingCopiesUpTo) ride in records too, cut into kInlineBytes
// slices, although process_vm_readv could pull them: the rings' copies run in cache, pipelined
// on both sides, where one process_vm_readv of 512 KiB-1 MiB walks its pages alone. Through
// the rings, writes of 256 KiB to 1 MiB moved faster than pulled, one at a time and 8 in flight;
// 128 KiB moved slower and 2 MiB no faster (16 KiB slices then; with 32 KiB ones 2 MiB gains
// too, and 16 MiB with ShmConfig::stream_poll: ShmConfig; docs/performance-history.md, "Real
// bytes on both sides, and mid-size writes through the rings"). Below 256 KiB a pull is one
// record where the rings take several, each a chance to find the target's vCPU idle and wait for
// its wake-up.
constexpr std::size_t kRingCopiesFrom = 256 << 10;
// Messages ride in records only up to this size, whatever ShmConfig::ring_copies_up_to: one
// that finds no receive posted is buffered whole at the receiver (a pulled one waits at the
// sender, no copy), and then moves twice more. One at a time, where the receiver posts the next
// receive only after taking a message, 4-16 MiB sends moved less through the rings than pulled
// (docs/performance-history.md, "Streams through the rings").
constexpr std::size_t kMessageRingCopiesUpTo = 2 << 20;
// An error text in a response.
constexpr std::size_t kMaxTextBytes = 512;
// The largest record: a full table and the inline bytes.
constexpr std::size_t kMaxRecordBytes = kHeaderBytes + kMaxEntries * kEntryBytes + kInlineBytes;

void put_header(const Header& h, uint8_t* out);
void put_entry(const Entry& e, uint8_t* out);
// A received record: its header, `count` entries when the type has a table, and the payload.
// Rejects sizes that disagree, unknown types, flags or a table longer than kMaxEntries.
struct View {
  Header header;
  std::span<const uint8_t> table;
  std::span<const uint8_t> payload;
  Entry entry(std::size_t i) const;
};
Status parse(std::span<const uint8_t> record, View& out);
// The same for a record that lies in memory the peer can still write (a ring): its header and
// table are copied into `copy` (kMaxRecordBytes) and checked and read there; the payload, only
// ever copied, stays where it lies.
Status parse_in_place(std::span<const uint8_t> record, std::span<uint8_t> copy, View& out);

}  // namespace ferry::transport::shm
