#include <cstring>
#include <string>

#include "core/base64.hpp"
#include "core/bytes.hpp"
#include "ferry/ferry.hpp"

namespace ferry {

namespace {
constexpr uint8_t kDescriptorMagic0 = 'F';
constexpr uint8_t kDescriptorMagic1 = 'D';
// 2: a device per key, the memory kind, up to kMaxAllKeys keys of up to 255 bytes.
// 3: the CUDA device of CUDA memory.
constexpr uint8_t kDescriptorVersion = 3;
constexpr std::string_view kTextPrefix = "ferry1:";  // the text form's own version
constexpr std::size_t kMaxKeyBytes = 255;

Error bad_descriptor(const std::string& why) {
  return Error(ErrorCode::kInvalidArgument, "descriptor: " + why);
}
}  // namespace

const Descriptor::Key* Descriptor::key_for(TransportKind transport, uint8_t device) const noexcept {
  for (int i = 0; i < key_count && i < kMaxKeys; ++i) {
    if (keys[i].transport == transport && keys[i].device == device) return &keys[i];
  }
  return nullptr;
}

std::span<const uint8_t> Descriptor::find_key(TransportKind transport,
                                              uint8_t device) const noexcept {
  if (const Key* key = key_for(transport, device)) return key->view();
  for (const MoreKey& key : more_keys) {
    if (key.transport == transport && key.device == device) return key.bytes;
  }
  return {};
}

void Descriptor::add_key(TransportKind transport, uint8_t device, std::span<const uint8_t> key) {
  if (transport == TransportKind{}) throw bad_descriptor("key without a transport");
  if (key.empty() || key.size() > kMaxKeyBytes) {
    throw bad_descriptor("a key of " + std::to_string(key.size()) + " bytes (1 to " +
                         std::to_string(kMaxKeyBytes) + ")");
  }
  if (!find_key(transport, device).empty()) {
    throw bad_descriptor("two keys for " + std::string(ferry::to_string(transport)) + " device " +
                         std::to_string(device));
  }
  if (key_count + more_keys.size() >= static_cast<std::size_t>(kMaxAllKeys)) {
    throw bad_descriptor("more than " + std::to_string(kMaxAllKeys) + " keys");
  }
  if (key_count < kMaxKeys && key.size() <= sizeof(Key::bytes)) {
    Key& k = keys[key_count++];
    k = Key{transport, device, static_cast<uint8_t>(key.size()), {}};
    std::memcpy(k.bytes, key.data(), key.size());
  } else {
    more_keys.push_back({transport, device, {key.begin(), key.end()}});
  }
}

std::vector<uint8_t> Descriptor::encode() const {
  // The fields are public: what decode() would refuse is refused here too.
  if (key_count > kMaxKeys)
    throw bad_descriptor("more than " + std::to_string(kMaxKeys) + " inline keys");
  if (key_count + more_keys.size() > static_cast<std::size_t>(kMaxAllKeys))
    throw bad_descriptor("more than " + std::to_string(kMaxAllKeys) + " keys");
  for (int i = 0; i < key_count; ++i) {
    if (keys[i].length == 0 || keys[i].length > sizeof(Key::bytes))
      throw bad_descriptor("an inline key of " + std::to_string(keys[i].length) + " bytes");
  }
  for (const MoreKey& key : more_keys) {
    if (key.bytes.empty() || key.bytes.size() > kMaxKeyBytes)
      throw bad_descriptor("a key of " + std::to_string(key.bytes.size()) + " bytes");
  }
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
  w.u8(static_cast<uint8_t>(memory));
  w.u8(memory_device);
  w.u8(static_cast<uint8_t>(key_count + more_keys.size()));
  auto put = [&](TransportKind transport, uint8_t device, std::span<const uint8_t> bytes) {
    w.u8(static_cast<uint8_t>(transport));
    w.u8(device);
    w.u8(static_cast<uint8_t>(bytes.size()));
    w.bytes(bytes);
  };
  for (int i = 0; i < key_count; ++i) put(keys[i].transport, keys[i].device, keys[i].view());
  for (const MoreKey& key : more_keys) put(key.transport, key.device, key.bytes);
  return out;
}

std::string Descriptor::to_string() const {
  return std::string(kTextPrefix) + core::base64url_encode(encode());
}

Descriptor Descriptor::decode(std::span<const uint8_t> bytes) {
  core::ByteReader r(bytes);
  if (r.u8() != kDescriptorMagic0 || r.u8() != kDescriptorMagic1)
    throw bad_descriptor("not a Ferry descriptor");
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
  if (access > static_cast<uint8_t>(Access::kRemoteReadWrite))
    throw bad_descriptor("unknown access flags");
  d.access = static_cast<Access>(access);
  uint8_t memory = r.u8();
  if (r.ok() && memory >= kMemoryKinds)
    throw bad_descriptor("unknown memory kind " + std::to_string(memory));
  d.memory = static_cast<MemoryKind>(memory);
  d.memory_device = r.u8();
  if (r.ok() && d.memory == MemoryKind::kHost && d.memory_device != 0)
    throw bad_descriptor("a device for host memory");
  uint8_t count = r.u8();
  if (count > kMaxAllKeys) throw bad_descriptor("too many keys");
  for (int i = 0; i < count && r.ok(); ++i) {
    // A kind this build lacks is kept (a newer peer's transport), never used: no channel
    // looks for it.
    auto transport = static_cast<TransportKind>(r.u8());
    uint8_t device = r.u8();
    uint8_t length = r.u8();
    std::span<const uint8_t> key = r.view(length);
    if (!r.ok()) break;
    // One encoding per descriptor: the inline keys come first.
    if (!d.more_keys.empty() && d.key_count < kMaxKeys && length <= sizeof(Key::bytes))
      throw bad_descriptor("keys out of order");
    d.add_key(transport, device, key);
  }
  if (!r.ok()) throw bad_descriptor("truncated");
  if (!r.at_end()) throw bad_descriptor("trailing bytes");
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
