#include "engine/handshake.hpp"

#include <algorithm>
#include <string>

#include "core/bytes.hpp"
#include "transport/contract.hpp"

namespace ferry::engine {

using core::ByteReader;
using core::ByteWriter;
using core::FrameType;

namespace {
constexpr std::size_t kMaxErrorMessage = 1024;

// Kinds this build does not know are still well-formed: a newer peer may offer them.
bool valid_transport(uint8_t t) { return t != 0; }

// A list of 1..kMaxOfferedTransports distinct kinds; `what` names it in errors.
Status read_kinds(ByteReader& r, std::vector<TransportKind>& out, const char* what) {
  std::size_t n = r.u8();
  if (!r.ok()) return {};
  if (n == 0 || n > kMaxOfferedTransports) {
    return {ErrorCode::kProtocol, std::string(what) + ": " + std::to_string(n) + " transports"};
  }
  for (std::size_t i = 0; i < n && r.ok(); ++i) {
    uint8_t t = r.u8();
    if (!r.ok()) break;
    auto kind = static_cast<TransportKind>(t);
    if (!valid_transport(t) || std::find(out.begin(), out.end(), kind) != out.end()) {
      return {ErrorCode::kProtocol,
              std::string(what) + ": transport " + std::to_string(t) + " invalid or repeated"};
    }
    out.push_back(kind);
  }
  return {};
}

void write_locality(ByteWriter& w, const core::Locality& l) {
  w.bytes(l.host);
  w.u32(l.process);
}

void read_locality(ByteReader& r, core::Locality& l) {
  r.bytes(l.host.data(), l.host.size());
  l.process = r.u32();
}

void write_kinds(ByteWriter& w, const std::vector<TransportKind>& kinds) {
  w.u8(static_cast<uint8_t>(kinds.size()));
  for (TransportKind t : kinds) w.u8(static_cast<uint8_t>(t));
}

// A flag byte, then the MAC when it is 1.
Status read_mac(ByteReader& r, std::optional<core::Mac>& out, const char* what) {
  uint8_t has_mac = r.u8();
  if (r.ok() && has_mac > 1) return {ErrorCode::kProtocol, std::string(what) + ": bad mac flag"};
  if (has_mac == 1) {
    core::Mac mac{};
    r.bytes(mac.data(), mac.size());
    out = mac;
  }
  return {};
}

Status finish(const ByteReader& r, const char* what) {
  if (!r.ok()) return {ErrorCode::kProtocol, std::string(what) + ": truncated or oversized"};
  if (!r.at_end()) return {ErrorCode::kProtocol, std::string(what) + ": trailing bytes"};
  return {};
}

Status check_version(uint16_t version, const char* what) {
  if (version != kProtocolVersion) {
    return {ErrorCode::kVersionMismatch, std::string(what) + ": peer speaks protocol version " +
                                             std::to_string(version) + ", this engine " +
                                             std::to_string(kProtocolVersion)};
  }
  return {};
}
}  // namespace

std::vector<uint8_t> frame(FrameType type, std::span<const uint8_t> body) {
  std::vector<uint8_t> out(core::kFrameHeaderSize);
  core::FrameHeader h;
  h.type = type;
  h.length = static_cast<uint32_t>(body.size());
  core::encode_header(h, out.data());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

std::vector<uint8_t> encode(const Hello& m) {
  std::vector<uint8_t> b;
  ByteWriter w(b);
  w.u32(m.magic);
  w.u16(m.version);
  w.bytes(m.key);
  w.u64(m.incarnation);
  write_locality(w, m.locality);
  write_kinds(w, m.transports);
  w.bytes(m.nonce);
  w.u8(m.wants_auth ? 1 : 0);
  return frame(FrameType::kHello, b);
}

std::vector<uint8_t> encode(const HelloAck& m) {
  std::vector<uint8_t> b;
  ByteWriter w(b);
  w.u16(m.version);
  w.bytes(m.key);
  w.u64(m.incarnation);
  write_locality(w, m.locality);
  write_kinds(w, m.channels);
  w.bytes(m.nonce);
  w.bytes(m.token);
  w.bytes(m.signature);
  w.u8(m.mac ? 1 : 0);
  if (m.mac) w.bytes(*m.mac);
  return frame(FrameType::kHelloAck, b);
}

std::vector<uint8_t> encode(const Auth& m) {
  std::vector<uint8_t> b;
  ByteWriter w(b);
  w.bytes(m.signature);
  w.u8(m.mac ? 1 : 0);
  if (m.mac) w.bytes(*m.mac);
  return frame(FrameType::kAuth, b);
}

std::vector<uint8_t> encode(const ChannelAddresses& m) {
  std::vector<uint8_t> b;
  ByteWriter w(b);
  w.u8(static_cast<uint8_t>(m.channels.size()));
  for (const ChannelAddress& c : m.channels) {
    w.u8(static_cast<uint8_t>(c.kind));
    w.u16(static_cast<uint16_t>(c.bytes.size()));
    w.bytes(c.bytes);
  }
  return frame(FrameType::kChannelAddresses, b);
}

std::vector<uint8_t> encode(const Join& m) {
  std::vector<uint8_t> b;
  ByteWriter w(b);
  w.u32(m.magic);
  w.u16(m.version);
  w.bytes(m.token);
  w.u8(static_cast<uint8_t>(m.kind));
  w.u16(m.index);
  return frame(FrameType::kJoin, b);
}

std::vector<uint8_t> encode(const ErrorMsg& m) {
  std::vector<uint8_t> b;
  ByteWriter w(b);
  w.u16(static_cast<uint16_t>(m.code));
  w.str(m.message.substr(0, kMaxErrorMessage));
  return frame(FrameType::kError, b);
}

std::vector<uint8_t> encode_empty(FrameType type) { return frame(type, {}); }

Status decode(std::span<const uint8_t> body, Hello& out) {
  ByteReader r(body);
  Hello m;
  m.magic = r.u32();
  if (r.ok() && m.magic != kMagic) return {ErrorCode::kProtocol, "hello: not a Ferry peer"};
  m.version = r.u16();
  if (r.ok()) {
    if (Status s = check_version(m.version, "hello"); !s.ok()) return s;
  }
  r.bytes(m.key.data(), m.key.size());
  m.incarnation = r.u64();
  read_locality(r, m.locality);
  if (Status s = read_kinds(r, m.transports, "hello"); !s.ok()) return s;
  r.bytes(m.nonce.data(), m.nonce.size());
  uint8_t flags = r.u8();
  if (r.ok() && flags > 1) return {ErrorCode::kProtocol, "hello: unknown flags"};
  m.wants_auth = flags == 1;
  if (Status s = finish(r, "hello"); !s.ok()) return s;
  out = std::move(m);
  return {};
}

Status decode(std::span<const uint8_t> body, HelloAck& out) {
  ByteReader r(body);
  HelloAck m;
  m.version = r.u16();
  if (r.ok()) {
    if (Status s = check_version(m.version, "hello-ack"); !s.ok()) return s;
  }
  r.bytes(m.key.data(), m.key.size());
  m.incarnation = r.u64();
  read_locality(r, m.locality);
  if (Status s = read_kinds(r, m.channels, "hello-ack"); !s.ok()) return s;
  r.bytes(m.nonce.data(), m.nonce.size());
  r.bytes(m.token.data(), m.token.size());
  r.bytes(m.signature.data(), m.signature.size());
  if (Status s = read_mac(r, m.mac, "hello-ack"); !s.ok()) return s;
  if (Status s = finish(r, "hello-ack"); !s.ok()) return s;
  out = m;
  return {};
}

Status decode(std::span<const uint8_t> body, Auth& out) {
  ByteReader r(body);
  Auth m;
  r.bytes(m.signature.data(), m.signature.size());
  if (Status s = read_mac(r, m.mac, "auth"); !s.ok()) return s;
  if (Status s = finish(r, "auth"); !s.ok()) return s;
  out = m;
  return {};
}

Status decode(std::span<const uint8_t> body, Join& out) {
  ByteReader r(body);
  Join m;
  m.magic = r.u32();
  if (r.ok() && m.magic != kMagic) return {ErrorCode::kProtocol, "join: not a Ferry peer"};
  m.version = r.u16();
  if (r.ok()) {
    if (Status s = check_version(m.version, "join"); !s.ok()) return s;
  }
  r.bytes(m.token.data(), m.token.size());
  uint8_t kind = r.u8();
  if (r.ok() && !valid_transport(kind)) return {ErrorCode::kProtocol, "join: no transport"};
  m.kind = static_cast<TransportKind>(kind);
  m.index = r.u16();
  if (Status s = finish(r, "join"); !s.ok()) return s;
  out = m;
  return {};
}

Status decode(std::span<const uint8_t> body, ChannelAddresses& out) {
  ByteReader r(body);
  ChannelAddresses m;
  std::size_t n = r.u8();
  if (r.ok() && (n == 0 || n > kMaxOfferedTransports)) {
    return {ErrorCode::kProtocol, "channel addresses: " + std::to_string(n) + " channels"};
  }
  for (std::size_t i = 0; i < n && r.ok(); ++i) {
    ChannelAddress c;
    uint8_t kind = r.u8();
    std::size_t length = r.u16();
    if (!r.ok()) break;
    if (!valid_transport(kind) || length > transport::kMaxAddressBytes) {
      return {ErrorCode::kProtocol, "channel addresses: transport " + std::to_string(kind) +
                                        " with " + std::to_string(length) + " bytes"};
    }
    c.kind = static_cast<TransportKind>(kind);
    c.bytes.resize(length);  // at most kMaxAddressBytes
    if (!r.bytes(c.bytes.data(), length)) break;
    m.channels.push_back(std::move(c));
  }
  if (Status s = finish(r, "channel addresses"); !s.ok()) return s;
  out = std::move(m);
  return {};
}

Status decode(std::span<const uint8_t> body, ErrorMsg& out) {
  ByteReader r(body);
  ErrorMsg m;
  uint16_t code = r.u16();
  if (r.ok() && (code == 0 || code > static_cast<uint16_t>(kLastErrorCode))) {
    return {ErrorCode::kProtocol, "error: unknown code " + std::to_string(code)};
  }
  m.code = static_cast<ErrorCode>(code);
  m.message = r.str(kMaxErrorMessage);
  if (Status s = finish(r, "error"); !s.ok()) return s;
  out = std::move(m);
  return {};
}

namespace {
// The transcript as bytes, after a label naming what is made of it and by whom.
std::vector<uint8_t> transcript_bytes(std::string_view label, const Transcript& t) {
  std::vector<uint8_t> msg;
  ByteWriter w(msg);
  w.bytes({reinterpret_cast<const uint8_t*>(label.data()), label.size()});
  w.bytes(t.client_nonce);
  w.bytes(t.server_nonce);
  for (const Identity* id : {&t.client, &t.server}) {
    w.bytes(id->key);
    w.u64(id->incarnation);
    write_locality(w, id->locality);
  }
  for (auto kinds : {t.offered, t.chosen}) {
    w.u8(static_cast<uint8_t>(kinds.size()));
    for (TransportKind k : kinds) w.u8(static_cast<uint8_t>(k));
  }
  return msg;
}

std::string_view signature_label(bool server) {
  return server ? "ferry-server-sig-v1" : "ferry-client-sig-v1";
}
}  // namespace

uint64_t engine_id_of(const core::PublicKey& key) {
  core::Mac digest = core::hmac_sha256("ferry-engine-id-v1", key);
  uint64_t id = core::load_le(digest.data(), 8);
  return id != 0 ? id : 1;  // 0 means "no engine" in descriptors and events
}

Transcript transcript_of(const Hello& hello, const HelloAck& ack) {
  return {hello.nonce,
          ack.nonce,
          {hello.key, hello.incarnation, hello.locality},
          {ack.key, ack.incarnation, ack.locality},
          hello.transports,
          ack.channels};
}

core::Mac auth_mac(std::string_view secret, bool server, const Transcript& t) {
  return core::hmac_sha256(secret,
                           transcript_bytes(server ? "ferry-server-v5" : "ferry-client-v5", t));
}

core::Signature sign_transcript(const core::SigningKey& key, bool server, const Transcript& t) {
  return key.sign(transcript_bytes(signature_label(server), t));
}

bool transcript_signed(bool server, const Transcript& t, const core::Signature& signature) {
  const core::PublicKey& key = server ? t.server.key : t.client.key;
  return core::signature_valid(key, transcript_bytes(signature_label(server), t), signature);
}

}  // namespace ferry::engine
