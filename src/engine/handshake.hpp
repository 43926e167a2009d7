// Control-connection messages (the bodies of control frames) and their codecs.
// Wire layout and the authentication exchange are specified in docs/protocol.md.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/crypto.hpp"
#include "core/frame.hpp"
#include "core/locality.hpp"
#include "ferry/error.hpp"
#include "ferry/types.hpp"

namespace ferry::engine {

constexpr uint32_t kMagic = 0x59525246;  // "FRRY" little-endian
// 2: an announced verbs message the receiver took is not ACKed (its FIN's delivery completes
// the send). 3: the authentication MACs cover both incarnations. 4: TCP rendezvous for large
// sends (SEND_CTS, SEND flags ANNOUNCE / RENDEZVOUS); group frames (WRITE_GROUP, READ_GROUP_REQ,
// READ_GROUP_DATA) carry many small slices of an operation; WRITE_ACK counts them. 5: verbs
// messages up to 64 KiB go eager (64 KiB receive buffers); one verbs ACK names up to 4 messages.
// 6: transports set themselves up: HELLO_ACK names the peer's channels, CHANNEL_ADDRESSES
// carries each one's opaque address, JOIN names its channel; the MACs cover offer and choice.
// 7: HELLO and HELLO_ACK carry each side's locality (host id, process), which decides the
// transports each side offers the other; the MACs cover it. 8: compact verbs messages (an eager
// message whose tag fits 32 bits goes as SEND_WITH_IMM of its payload alone, no header), named
// in ACKs by count. 9: engines are Ed25519 keys: HELLO and HELLO_ACK carry public keys instead of
// engine ids (an id is derived from its key), both sides sign the transcript, the client always
// sends AUTH (its signature, and its MAC with a secret) and its CHANNEL_ADDRESSES right after it;
// AUTH_OK is gone.
constexpr uint16_t kProtocolVersion = 9;
// Transports a peer may offer (and so channels a peer may have).
constexpr std::size_t kMaxOfferedTransports = 8;

using Nonce = std::array<uint8_t, 16>;
using Token = std::array<uint8_t, 16>;

// The engine id of the engine whose identity key is `key`: nobody can claim an id without
// proving its key (docs/protocol.md, "Identity and authentication").
uint64_t engine_id_of(const core::PublicKey& key);

struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  core::PublicKey key{};
  uint64_t incarnation = 0;
  core::Locality locality;
  std::vector<TransportKind> transports;
  Nonce nonce{};
  bool wants_auth = false;
  uint64_t engine_id() const { return engine_id_of(key); }
};

struct HelloAck {
  uint16_t version = kProtocolVersion;
  core::PublicKey key{};
  uint64_t incarnation = 0;
  core::Locality locality;
  // The peer's channels: the transports the client offered that the server can use and that
  // reach the client, in the server's order.
  std::vector<TransportKind> channels;
  Nonce nonce{};
  Token token{};
  core::Signature signature{};   // the server's, of the transcript
  std::optional<core::Mac> mac;  // present when the server has a secret
};

struct Auth {
  core::Signature signature{};   // the client's, of the transcript
  std::optional<core::Mac> mac;  // present when the client has a secret
};

// Each channel's address (transport::Channel::local_address), in HELLO_ACK's order: the
// client's first, then the server's answer.
struct ChannelAddress {
  TransportKind kind{};
  std::vector<uint8_t> bytes;
};
struct ChannelAddresses {
  std::vector<ChannelAddress> channels;
};

// A side connection of channel `kind` (transport::Channel::attach_side).
struct Join {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  Token token{};
  TransportKind kind{};
  uint16_t index = 0;
};

// How a listener's refusal begins when the client's host has too much under way (handshakes
// pending, peers still joining): the dialer tries again on it, within its connect_timeout (a
// legitimate burst from one host), and on no other refusal.
inline constexpr std::string_view kBusyRefusal = "busy: ";

struct ErrorMsg {
  ErrorCode code = ErrorCode::kProtocol;
  std::string message;
};

// A whole control frame: header + body.
std::vector<uint8_t> frame(core::FrameType type, std::span<const uint8_t> body);
std::vector<uint8_t> encode(const Hello& m);
std::vector<uint8_t> encode(const HelloAck& m);
std::vector<uint8_t> encode(const Auth& m);
std::vector<uint8_t> encode(const ChannelAddresses& m);
std::vector<uint8_t> encode(const Join& m);
std::vector<uint8_t> encode(const ErrorMsg& m);
std::vector<uint8_t> encode_empty(core::FrameType type);

// Body decoders: reject truncated, oversized or trailing input with kProtocol, a foreign magic
// with kProtocol and another version with kVersionMismatch.
Status decode(std::span<const uint8_t> body, Hello& out);
Status decode(std::span<const uint8_t> body, HelloAck& out);
Status decode(std::span<const uint8_t> body, Auth& out);
Status decode(std::span<const uint8_t> body, ChannelAddresses& out);
Status decode(std::span<const uint8_t> body, Join& out);
Status decode(std::span<const uint8_t> body, ErrorMsg& out);

// Who an engine claims to be; the signatures prove the keys, the MACs bind both claims to the
// secret.
struct Identity {
  core::PublicKey key{};
  uint64_t incarnation = 0;
  core::Locality locality;
  uint64_t engine_id() const { return engine_id_of(key); }
};

// What each side signs (and MACs, with a secret): its role, both nonces and both identities
// (key, incarnation, locality), so a signature or MAC cannot be replayed in another session,
// reflected back at its sender, or used by one incarnation of an engine to pass for another; and
// the transports the client offered and the channels the server chose, so nobody between them
// can steer the peers to a weaker transport (nor, by changing a locality, away from a same-host
// one).
struct Transcript {
  Nonce client_nonce{};
  Nonce server_nonce{};
  Identity client;
  Identity server;
  std::span<const TransportKind> offered;
  std::span<const TransportKind> chosen;
};
// The transcript of a handshake whose HELLO was `hello` and HELLO_ACK `ack` (it refers to both).
Transcript transcript_of(const Hello& hello, const HelloAck& ack);
core::Mac auth_mac(std::string_view secret, bool server, const Transcript& t);
core::Signature sign_transcript(const core::SigningKey& key, bool server, const Transcript& t);
// Whether `signature` is the server's (or the client's) own over `t`: made with the key `t` names.
bool transcript_signed(bool server, const Transcript& t, const core::Signature& signature);

}  // namespace ferry::engine
