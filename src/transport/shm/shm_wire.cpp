#include "transport/shm/shm_wire.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/bytes.hpp"

namespace ferry::transport::shm {

namespace {

Status malformed(const std::string& what) { return {ErrorCode::kProtocol, "shm record: " + what}; }

template <typename T>
void store(uint8_t*& p, T v) {
  for (std::size_t i = 0; i < sizeof v; ++i) *p++ = static_cast<uint8_t>(uint64_t{v} >> (8 * i));
}
template <typename T>
T load(const uint8_t*& p) {
  uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{*p++} << (8 * i);
  return static_cast<T>(v);
}

bool has_table(Record type) {
  switch (type) {
    case Record::kWrite:
    case Record::kRead:
    case Record::kSend:
    case Record::kReadData:
    case Record::kGrant:
    case Record::kMap:
    case Record::kImm:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::vector<uint8_t> encode(const Address& a) {
  std::vector<uint8_t> out;
  core::ByteWriter w(out);
  w.u8(kAddressVersion);
  w.u8(a.reads_peer ? 1 : 0);
  w.u32(a.pid);
  w.bytes(a.socket);
  w.bytes(a.token);
  w.u64(a.probe_address);
  w.bytes(a.probe);
  return out;
}

Status decode(std::span<const uint8_t> in, Address& out) {
  core::ByteReader r(in);
  uint8_t version = r.u8();
  uint8_t flags = r.u8();
  Address a;
  a.pid = r.u32();
  r.bytes(a.socket.data(), a.socket.size());
  r.bytes(a.token.data(), a.token.size());
  a.probe_address = r.u64();
  r.bytes(a.probe.data(), a.probe.size());
  if (!r.ok() || !r.at_end()) return {ErrorCode::kProtocol, "shm address: malformed"};
  if (version != kAddressVersion) {
    return {ErrorCode::kProtocol, "shm address: version " + std::to_string(version) + ", this " +
                                      "build speaks " + std::to_string(kAddressVersion)};
  }
  if ((flags & ~1u) != 0 || a.pid == 0) return {ErrorCode::kProtocol, "shm address: malformed"};
  a.reads_peer = flags != 0;
  out = a;
  return {};
}

void put_header(const Header& h, uint8_t* out) {
  uint8_t* p = out;
  store(p, static_cast<uint8_t>(h.type));
  store(p, h.flags);
  store(p, h.status);
  store(p, h.count);
  store(p, h.op_id);
  store(p, h.tag);
  store(p, h.imm);
  store(p, h.payload);
}

void put_entry(const Entry& e, uint8_t* out) {
  uint8_t* p = out;
  store(p, e.index);
  store(p, e.region);
  store(p, e.key);
  store(p, e.offset);
  store(p, e.entry_offset);
  store(p, e.length);
  store(p, e.address);
}

Entry View::entry(std::size_t i) const {
  const uint8_t* p = table.data() + i * kEntryBytes;
  Entry e;
  e.index = load<uint32_t>(p);
  e.region = load<uint32_t>(p);
  e.key = load<uint64_t>(p);
  e.offset = load<uint64_t>(p);
  e.entry_offset = load<uint64_t>(p);
  e.length = load<uint64_t>(p);
  e.address = load<uint64_t>(p);
  return e;
}

namespace {
// put_header's fields back, unchecked (kHeaderBytes at `in`).
Header get_header(const uint8_t* in) {
  const uint8_t* p = in;
  Header h;
  h.type = static_cast<Record>(load<uint8_t>(p));
  h.flags = load<uint8_t>(p);
  h.status = load<uint16_t>(p);
  h.count = load<uint32_t>(p);
  h.op_id = load<uint64_t>(p);
  h.tag = load<uint64_t>(p);
  h.imm = load<uint32_t>(p);
  h.payload = load<uint32_t>(p);
  return h;
}
}  // namespace

Status parse(std::span<const uint8_t> record, View& out) {
  if (record.size() < kHeaderBytes) return malformed(std::to_string(record.size()) + " bytes");
  const Header h = get_header(record.data());
  const auto type = static_cast<uint8_t>(h.type);
  if (type < static_cast<uint8_t>(Record::kHello) ||
      type > static_cast<uint8_t>(Record::kUnmapped)) {
    return malformed("type " + std::to_string(type));
  }
  if ((h.flags & ~(kFlagInline | kFlagImm | kFlagWritable | kFlagMore)) != 0 ||
      ((h.flags & kFlagWritable) != 0 && h.type != Record::kMap) ||
      ((h.flags & kFlagMore) != 0 && (h.type != Record::kSend || (h.flags & kFlagInline) == 0))) {
    return malformed("flags " + std::to_string(h.flags));
  }
  std::size_t table = 0;
  if (has_table(h.type)) {
    if (h.count == 0 || h.count > kMaxEntries)
      return malformed(std::to_string(h.count) + " entries");
    if ((h.type == Record::kSend || h.type == Record::kGrant || h.type == Record::kMap ||
         h.type == Record::kImm) &&
        h.count != 1) {
      return malformed(std::to_string(h.count) + " entries where one belongs");
    }
    table = std::size_t{h.count} * kEntryBytes;
  }
  if (record.size() != kHeaderBytes + table + h.payload) {
    return malformed(std::to_string(record.size()) + " bytes where the header says " +
                     std::to_string(kHeaderBytes + table + h.payload));
  }
  out.header = h;
  out.table = record.subspan(kHeaderBytes, table);
  out.payload = record.subspan(kHeaderBytes + table);
  return {};
}

Status parse_in_place(std::span<const uint8_t> record, std::span<uint8_t> copy, View& out) {
  if (record.size() > copy.size()) return malformed(std::to_string(record.size()) + " bytes");
  // The header, then as much table as it says (parse checks the rest): read from the copy
  // only, as the peer may change the ring meanwhile.
  std::size_t head = std::min(record.size(), kHeaderBytes);
  std::memcpy(copy.data(), record.data(), head);
  if (head == kHeaderBytes) {
    uint64_t entries = std::min<uint32_t>(get_header(copy.data()).count, kMaxEntries);
    head = std::min<std::size_t>(record.size(), kHeaderBytes + entries * kEntryBytes);
    std::memcpy(copy.data() + kHeaderBytes, record.data() + kHeaderBytes, head - kHeaderBytes);
  }
  if (Status s = parse({copy.data(), record.size()}, out); !s.ok()) return s;
  out.payload = record.last(out.payload.size());
  return {};
}

}  // namespace ferry::transport::shm
