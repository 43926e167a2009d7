#include <string>

#include "core/base64.hpp"
#include "core/bytes.hpp"
#include "ferry/ferry.hpp"

namespace ferry {

namespace {
constexpr uint8_t kDescriptorMagic0 = 'F';
constexpr uint8_t kDescriptorMagic1 = 'D';
constexpr uint8_t kDescriptorVersion = 1;
constexpr std::string_view kTextPrefix = "ferry1:";
}  // namespace

const Descriptor::Key* Descriptor::key_for(TransportKind transport) const noexcept {
  for (int i = 0; i < key_count && i < kMaxKeys; ++i) {
    if (keys[i].transport == transport) return &keys[i];
  }
  return nullptr;
}

std::vector<uint8_t> Descriptor::encode() const {
  std::vector<uint8_t> out;
  core::ByteWriter w(out);
  w.u8(kDescriptorMagic0);
  w.u8(kDescriptorMagic1);
  w.u8(kDescriptorVersion);
  w.u64(engine_id);
  w.u64(incarnation);
  w.u32(region_id);
  w.u64(address);
  w.u64(length);
  w.u8(static_cast<uint8_t>(access));
  w.u8(key_count);
  for (int i = 0; i < key_count; ++i) {
    w.u8(static_cast<uint8_t>(keys[i].transport));
    w.u8(keys[i].length);
    w.bytes({keys[i].bytes, keys[i].length});
  }
  return out;
}

std::string Descriptor::to_string() const {
  return std::string(kTextPrefix) + core::base64url_encode(encode());
}

Descriptor Descriptor::decode(std::span<const uint8_t> bytes) {
  auto bad = [](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument, "descriptor: " + why);
  };
  core::ByteReader r(bytes);
  if (r.u8() != kDescriptorMagic0 || r.u8() != kDescriptorMagic1)
    throw bad("not a Ferry descriptor");
  uint8_t version = r.u8();
  if (r.ok() && version != kDescriptorVersion) {
    throw Error(ErrorCode::kVersionMismatch, "descriptor: version " + std::to_string(version) +
                                                 ", this build reads version " +
                                                 std::to_string(kDescriptorVersion));
  }
  Descriptor d;
  d.engine_id = r.u64();
  d.incarnation = r.u64();
  d.region_id = r.u32();
  d.address = r.u64();
  d.length = r.u64();
  uint8_t access = r.u8();
  if (access > static_cast<uint8_t>(Access::kRemoteReadWrite)) throw bad("unknown access flags");
  d.access = static_cast<Access>(access);
  d.key_count = r.u8();
  if (d.key_count > kMaxKeys) throw bad("too many keys");
  for (int i = 0; i < d.key_count && r.ok(); ++i) {
    uint8_t transport = r.u8();
    // A kind this build lacks is kept (a newer peer's transport), never used: no key is found
    // for it.
    if (r.ok() && transport == 0) throw bad("key without a transport");
    d.keys[i].transport = static_cast<TransportKind>(transport);
    d.keys[i].length = r.u8();
    if (d.keys[i].length > sizeof d.keys[i].bytes) throw bad("key too long");
    r.bytes(d.keys[i].bytes, d.keys[i].length);
  }
  if (!r.ok()) throw bad("truncated");
  if (!r.at_end()) throw bad("trailing bytes");
  return d;
}

Descriptor Descriptor::parse(std::string_view text) {
  if (text.substr(0, kTextPrefix.size()) != kTextPrefix) {
    throw Error(ErrorCode::kInvalidArgument, "descriptor: text does not start with 'ferry1:'");
  }
  auto bytes = core::base64url_decode(text.substr(kTextPrefix.size()));
  if (!bytes) throw Error(ErrorCode::kInvalidArgument, "descriptor: not valid base64url");
  return decode(*bytes);
}

}  // namespace ferry
