// Wire codecs: frame header, handshake bodies, descriptors, base64url.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "core/base64.hpp"
#include "core/crypto.hpp"
#include "core/frame.hpp"
#include "engine/handshake.hpp"
#include "ferry/ferry.hpp"
#include "support/pair.hpp"
#include "transport/contract.hpp"
#include "transport/tcp/tcp_frame.hpp"

namespace ferry {
namespace {

namespace tcp = transport::tcp;

using core::FrameHeader;
using core::FrameType;

TEST(Base64, RoundTripsEveryLength) {
  for (std::size_t n = 0; n < 40; ++n) {
    std::vector<uint8_t> in(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(i * 37 + 11);
    auto text = core::base64url_encode(in);
    auto out = core::base64url_decode(text);
    ASSERT_TRUE(out.has_value()) << n;
    EXPECT_EQ(in, *out);
  }
}

TEST(Base64, RejectsBadCharactersAndDanglingBits) {
  EXPECT_FALSE(core::base64url_decode("ab+c").has_value());
  EXPECT_FALSE(core::base64url_decode("A").has_value());   // 6 bits cannot make a byte
  EXPECT_FALSE(core::base64url_decode("AB").has_value());  // non-zero padding bits
  EXPECT_TRUE(core::base64url_decode("AA").has_value());
}

TEST(Base64, StandardFormIsPaddedAndMatchesKnownText) {
  // RFC 4648 section 10's test vectors.
  const char* plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  const char* coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(core::base64_encode(std::string_view(plain[i])), coded[i]);
    auto back = core::base64_decode(coded[i]);
    ASSERT_TRUE(back.has_value()) << coded[i];
    EXPECT_EQ(std::string(back->begin(), back->end()), plain[i]);
  }
  std::vector<uint8_t> high{0xfb, 0xff, 0xbf};  // the two characters where the alphabets differ
  EXPECT_EQ(core::base64_encode(high), "+/+/");
  EXPECT_EQ(core::base64url_encode(high), "-_-_");
}

TEST(Base64, StandardFormRefusesWrongPadding) {
  for (const char* bad : {"Zg", "Zg=", "Zg===", "Z===", "Zm=v", "=Zm9", "Zm9v====", "Zm9-"}) {
    EXPECT_FALSE(core::base64_decode(bad).has_value()) << bad;
  }
}

TEST(FrameHeader, RoundTrips) {
  FrameHeader h;
  h.type = tcp::TcpFrame::kWrite;
  h.flags = tcp::kFlagImm | tcp::kFlagLastOnStream;
  h.region_id = 0xdeadbeef;
  h.length = 1 << 20;
  h.aux32 = 77;
  h.op_id = 0x0102030405060708ull;
  h.key = ~0ull;
  h.offset = 12345;
  h.aux64 = 4;
  uint8_t raw[core::kFrameHeaderSize];
  core::encode_header(h, raw);
  FrameHeader back;
  ASSERT_TRUE(core::decode_header(raw, back).ok());
  EXPECT_EQ(back.type, h.type);
  EXPECT_EQ(back.flags, h.flags);
  EXPECT_EQ(back.region_id, h.region_id);
  EXPECT_EQ(back.length, h.length);
  EXPECT_EQ(back.aux32, h.aux32);
  EXPECT_EQ(back.op_id, h.op_id);
  EXPECT_EQ(back.key, h.key);
  EXPECT_EQ(back.offset, h.offset);
  EXPECT_EQ(back.aux64, h.aux64);
  EXPECT_EQ(tcp::payload_length(back), h.length);
}

// A header as a TCP stream takes it: the core's checks, then TCP's for a data frame.
Status decode_as_stream(const uint8_t* raw, FrameHeader& out) {
  FrameHeader h;
  if (Status s = core::decode_header(raw, h); !s.ok()) return s;
  if (!core::is_control(h.type)) {
    if (Status s = tcp::check_data_header(h); !s.ok()) return s;
  }
  out = h;
  return {};
}

Status decode_modified(void (*change)(FrameHeader&), int raw_byte = -1, uint8_t raw_value = 0) {
  FrameHeader h;
  h.type = tcp::TcpFrame::kWriteAck;
  change(h);
  uint8_t raw[core::kFrameHeaderSize];
  core::encode_header(h, raw);
  if (raw_byte >= 0) raw[raw_byte] = raw_value;
  FrameHeader out;
  out.op_id = 42;
  Status s = decode_as_stream(raw, out);
  if (!s.ok()) {
    EXPECT_EQ(out.op_id, 42u) << "a rejected decode must not change its output";
  }
  return s;
}

TEST(FrameHeader, RejectsMalformedHeaders) {
  auto same = [](FrameHeader&) {};
  EXPECT_TRUE(decode_modified(same).ok());
  EXPECT_EQ(decode_modified(same, 0, 0).code(), ErrorCode::kProtocol);   // type 0
  EXPECT_EQ(decode_modified(same, 0, 12).code(), ErrorCode::kProtocol);  // gap in types
  EXPECT_EQ(decode_modified(same, 0, core::kRetiredControlType).code(),
            ErrorCode::kProtocol);  // AUTH_OK, gone since version 9
  EXPECT_EQ(decode_modified(same, 0, 200).code(), ErrorCode::kProtocol);
  EXPECT_EQ(decode_modified(same, 0, 30).code(), ErrorCode::kProtocol);  // a data type not TCP's
  // The core passes a data type it does not know to the transport, and refuses flags on
  // control frames.
  uint8_t foreign[core::kFrameHeaderSize] = {30};
  FrameHeader h;
  EXPECT_TRUE(core::decode_header(foreign, h).ok());
  EXPECT_EQ(decode_modified([](FrameHeader& f) {
              f.type = FrameType::kPing;
              f.flags = 1;
            }).code(),
            ErrorCode::kProtocol);
  EXPECT_EQ(decode_modified([](FrameHeader& h) { h.flags = tcp::kFlagImm; }).code(),
            ErrorCode::kProtocol);
  EXPECT_EQ(decode_modified([](FrameHeader& h) { h.status = 999; }).code(), ErrorCode::kProtocol);
  EXPECT_EQ(decode_modified([](FrameHeader& h) { h.length = 5; }).code(), ErrorCode::kProtocol);
  EXPECT_EQ(decode_modified([](FrameHeader& h) {
              h.type = FrameType::kHello;
              h.length = core::kMaxControlPayload + 1;
            }).code(),
            ErrorCode::kProtocol);
  EXPECT_EQ(decode_modified([](FrameHeader& h) {
              h.status = static_cast<uint16_t>(ErrorCode::kOutOfBounds);
              h.length = tcp::kMaxErrorText + 1;
            }).code(),
            ErrorCode::kProtocol);
}

Status decode_group(FrameType type, uint32_t n, uint32_t length, uint16_t status = 0) {
  FrameHeader h;
  h.type = type;
  h.region_id = n;
  h.length = length;
  h.status = status;
  uint8_t raw[core::kFrameHeaderSize];
  core::encode_header(h, raw);
  FrameHeader out;
  return decode_as_stream(raw, out);
}

TEST(FrameHeader, GroupFramesAnnounceABoundedTableTheyCanHold) {
  constexpr uint32_t kRec = tcp::kGroupEntrySize;
  EXPECT_TRUE(decode_group(tcp::TcpFrame::kWriteGroup, 2, 2 * kRec + 100).ok());
  EXPECT_TRUE(decode_group(tcp::TcpFrame::kWriteGroup, 256, 256 * kRec).ok());
  EXPECT_TRUE(decode_group(tcp::TcpFrame::kReadGroupReq, 3, 3 * kRec).ok());
  EXPECT_TRUE(decode_group(tcp::TcpFrame::kReadGroupData, 3, 3 * kRec + 7).ok());
  EXPECT_TRUE(decode_group(tcp::TcpFrame::kReadGroupData, 3, 10, 5).ok());  // error text
  EXPECT_EQ(decode_group(tcp::TcpFrame::kWriteGroup, 0, 0).code(), ErrorCode::kProtocol);
  EXPECT_EQ(decode_group(tcp::TcpFrame::kWriteGroup, 257, 257 * kRec).code(), ErrorCode::kProtocol);
  EXPECT_EQ(decode_group(tcp::TcpFrame::kWriteGroup, 2, 2 * kRec - 1).code(), ErrorCode::kProtocol);
  EXPECT_EQ(decode_group(tcp::TcpFrame::kReadGroupReq, 2, 2 * kRec + 1).code(),
            ErrorCode::kProtocol);
  EXPECT_EQ(decode_group(tcp::TcpFrame::kReadGroupReq, 2, 2 * kRec, 5).code(),
            ErrorCode::kProtocol);
  EXPECT_EQ(decode_group(tcp::TcpFrame::kReadGroupData, 2, 2 * kRec - 1).code(),
            ErrorCode::kProtocol);
  EXPECT_EQ(decode_group(tcp::TcpFrame::kReadGroupData, 2, tcp::kMaxErrorText + 1, 5).code(),
            ErrorCode::kProtocol);
  // WRITE_ACK counts at most a group's entries.
  EXPECT_TRUE(decode_modified([](FrameHeader& h) { h.aux32 = 256; }).ok());
  EXPECT_EQ(decode_modified([](FrameHeader& h) { h.aux32 = 257; }).code(), ErrorCode::kProtocol);
}

TEST(FrameHeader, GroupTableRoundTripsAndRejectsDamage) {
  tcp::GroupEntry in[2] = {{7, 4096, 0x1122334455667788ull, 1ull << 40, 9},
                           {8, 0, 1, 2, 0xFFFFFFFFu}};
  uint8_t raw[2 * tcp::kGroupEntrySize];
  tcp::encode_group_entry(in[0], raw);
  tcp::encode_group_entry(in[1], raw + tcp::kGroupEntrySize);
  tcp::GroupEntry out[2];
  uint64_t total = 0;
  ASSERT_TRUE(tcp::decode_group_table(raw, sizeof raw, 2, out, total).ok());
  EXPECT_EQ(total, 4096u);
  EXPECT_EQ(out[0].region_id, 7u);
  EXPECT_EQ(out[0].key, 0x1122334455667788ull);
  EXPECT_EQ(out[0].offset, 1ull << 40);
  EXPECT_EQ(out[0].index, 9u);
  EXPECT_EQ(out[1].index, 0xFFFFFFFFu);
  EXPECT_EQ(tcp::decode_group_table(raw, sizeof raw - 1, 2, out, total).code(),
            ErrorCode::kProtocol);
  EXPECT_EQ(tcp::decode_group_table(raw, sizeof raw, 3, out, total).code(), ErrorCode::kProtocol);
  EXPECT_EQ(tcp::decode_group_table(raw, 0, 0, out, total).code(), ErrorCode::kProtocol);
  raw[tcp::kGroupEntrySize + 30] = 1;  // reserved
  out[1].index = 5;
  EXPECT_EQ(tcp::decode_group_table(raw, sizeof raw, 2, out, total).code(), ErrorCode::kProtocol);
  EXPECT_EQ(out[1].index, 5u) << "a rejected table must not change the output";
}

std::vector<uint8_t> body_of(const std::vector<uint8_t>& frame) {
  return {frame.begin() + core::kFrameHeaderSize, frame.end()};
}

TEST(Handshake, HelloRoundTripsAndRejectsDamage) {
  engine::Hello h;
  h.key[0] = 1;
  h.incarnation = 2;
  h.locality = {{7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8}, 4242};
  h.transports = {TransportKind::kVerbs, TransportKind::kTcp};
  h.nonce[3] = 9;
  h.wants_auth = true;
  auto body = body_of(engine::encode(h));
  engine::Hello back;
  ASSERT_TRUE(engine::decode(body, back).ok());
  EXPECT_EQ(back.key, h.key);
  EXPECT_EQ(back.engine_id(), engine::engine_id_of(h.key));
  EXPECT_EQ(back.incarnation, 2u);
  EXPECT_EQ(back.locality.host, h.locality.host);
  EXPECT_EQ(back.locality.process, 4242u);
  EXPECT_EQ(back.transports, h.transports);
  EXPECT_EQ(back.nonce, h.nonce);
  EXPECT_TRUE(back.wants_auth);

  for (std::size_t cut = 0; cut < body.size(); ++cut) {
    engine::Hello out;
    EXPECT_EQ(engine::decode({body.data(), cut}, out).code(), ErrorCode::kProtocol) << cut;
  }
  auto longer = body;
  longer.push_back(0);
  EXPECT_EQ(engine::decode(longer, back).code(), ErrorCode::kProtocol);

  auto foreign = body;
  foreign[0] ^= 0xff;
  EXPECT_EQ(engine::decode(foreign, back).code(), ErrorCode::kProtocol);

  auto newer = body;
  newer[4] = engine::kProtocolVersion + 1;  // version
  Status s = engine::decode(newer, back);
  EXPECT_EQ(s.code(), ErrorCode::kVersionMismatch);
  EXPECT_NE(s.message().find("version " + std::to_string(engine::kProtocolVersion + 1)),
            std::string::npos)
      << s.message();
}

TEST(Handshake, HelloAckJoinAuthErrorRoundTrip) {
  engine::HelloAck a;
  a.key[31] = 5;
  a.signature[63] = 6;
  a.locality.host[15] = 3;
  a.locality.process = 77;
  a.channels = {TransportKind::kVerbs, TransportKind::kTcp};
  a.token[0] = 1;
  a.mac = core::Mac{};
  (*a.mac)[31] = 7;
  engine::HelloAck a2;
  ASSERT_TRUE(engine::decode(body_of(engine::encode(a)), a2).ok());
  EXPECT_EQ(a2.key, a.key);
  EXPECT_EQ(a2.signature, a.signature);
  EXPECT_EQ(a2.channels, a.channels);
  EXPECT_EQ(a2.locality.host, a.locality.host);
  EXPECT_EQ(a2.locality.process, 77u);
  ASSERT_TRUE(a2.mac.has_value());
  EXPECT_EQ((*a2.mac)[31], 7);

  // No channel, a channel twice, too many: each refused.
  for (auto channels :
       {std::vector<TransportKind>{},
        std::vector<TransportKind>{TransportKind::kTcp, TransportKind::kTcp},
        std::vector<TransportKind>(engine::kMaxOfferedTransports + 1, TransportKind::kTcp)}) {
    a.channels = channels;
    EXPECT_EQ(engine::decode(body_of(engine::encode(a)), a2).code(), ErrorCode::kProtocol)
        << channels.size();
  }
  // A kind this build does not know is well-formed (a newer peer's transport).
  a.channels = {static_cast<TransportKind>(200)};
  ASSERT_TRUE(engine::decode(body_of(engine::encode(a)), a2).ok());
  EXPECT_EQ(a2.channels, a.channels);

  engine::Join j;
  j.kind = TransportKind::kTcp;
  j.index = 300;
  j.token[15] = 8;
  engine::Join j2;
  auto join = body_of(engine::encode(j));
  ASSERT_TRUE(engine::decode(join, j2).ok());
  EXPECT_EQ(j2.kind, TransportKind::kTcp);
  EXPECT_EQ(j2.index, 300);
  EXPECT_EQ(j2.token, j.token);
  j.kind = TransportKind{};
  EXPECT_EQ(engine::decode(body_of(engine::encode(j)), j2).code(), ErrorCode::kProtocol);
  for (std::size_t cut = 0; cut < join.size(); ++cut) {
    EXPECT_EQ(engine::decode({join.data(), cut}, j2).code(), ErrorCode::kProtocol) << cut;
  }

  engine::ErrorMsg e{ErrorCode::kAuthFailed, "nope"};
  engine::ErrorMsg e2;
  ASSERT_TRUE(engine::decode(body_of(engine::encode(e)), e2).ok());
  EXPECT_EQ(e2.code, ErrorCode::kAuthFailed);
  EXPECT_EQ(e2.message, "nope");

  // AUTH: the signature, and the MAC when there is one; anything else is refused.
  for (bool with_mac : {false, true}) {
    engine::Auth au;
    au.signature[0] = 4;
    if (with_mac) au.mac = core::Mac{9};
    auto auth = body_of(engine::encode(au));
    engine::Auth au2;
    ASSERT_TRUE(engine::decode(auth, au2).ok());
    EXPECT_EQ(au2.signature, au.signature);
    EXPECT_EQ(au2.mac, au.mac);
    for (std::size_t cut = 0; cut < auth.size(); ++cut) {
      EXPECT_EQ(engine::decode({auth.data(), cut}, au2).code(), ErrorCode::kProtocol) << cut;
    }
    auth.push_back(0);
    EXPECT_EQ(engine::decode(auth, au2).code(), ErrorCode::kProtocol);
  }
}

TEST(Identity, KeysSignAndOthersCannot) {
  core::SigningKey a = core::SigningKey::generate(), b = core::SigningKey::generate();
  EXPECT_NE(a.public_key(), b.public_key());
  EXPECT_NE(engine::engine_id_of(a.public_key()), engine::engine_id_of(b.public_key()));
  const std::vector<uint8_t> message{1, 2, 3};
  core::Signature sig = a.sign(message);
  EXPECT_TRUE(core::signature_valid(a.public_key(), message, sig));
  EXPECT_FALSE(core::signature_valid(b.public_key(), message, sig));
  EXPECT_FALSE(core::signature_valid(a.public_key(), {message.data(), 2}, sig));
  sig[10] ^= 1;
  EXPECT_FALSE(core::signature_valid(a.public_key(), message, sig));
  core::PublicKey not_a_point{};
  not_a_point.fill(0xff);
  EXPECT_FALSE(core::signature_valid(not_a_point, message, a.sign(message)));
}

TEST(Identity, AKeyFileIsCreatedOnceKeptPrivateAndReadBack) {
  test::ScratchPath path("identity.pem");
  core::SigningKey made = core::SigningKey::load_or_create(path.str());
  struct stat st {};
  ASSERT_EQ(::stat(path.str().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(core::SigningKey::load_or_create(path.str()).public_key(), made.public_key());
  // Others may read it: refused, as ssh refuses such a key.
  ASSERT_EQ(::chmod(path.str().c_str(), 0644), 0);
  try {
    core::SigningKey::load_or_create(path.str());
    ADD_FAILURE() << "a key file others can read was used";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  // Not a key: refused, and left as it was.
  ASSERT_EQ(::chmod(path.str().c_str(), 0600), 0);
  { std::ofstream(path.str()) << "not a key\n"; }
  try {
    core::SigningKey::load_or_create(path.str());
    ADD_FAILURE() << "a file holding no key was used";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  std::ifstream kept(path.str());
  std::string line;
  std::getline(kept, line);
  EXPECT_EQ(line, "not a key");
}

TEST(Handshake, ChannelAddressesRoundTripAndRejectDamage) {
  engine::ChannelAddresses m;
  m.channels.push_back({TransportKind::kVerbs, std::vector<uint8_t>(40, 7)});
  m.channels.push_back({TransportKind::kTcp, {2, 0}});
  m.channels.push_back({static_cast<TransportKind>(9), {}});  // an empty address is well-formed
  auto body = body_of(engine::encode(m));
  engine::ChannelAddresses back;
  ASSERT_TRUE(engine::decode(body, back).ok());
  ASSERT_EQ(back.channels.size(), 3u);
  EXPECT_EQ(back.channels[0].kind, TransportKind::kVerbs);
  EXPECT_EQ(back.channels[0].bytes, m.channels[0].bytes);
  EXPECT_EQ(back.channels[1].bytes, m.channels[1].bytes);
  EXPECT_TRUE(back.channels[2].bytes.empty());

  for (std::size_t cut = 0; cut < body.size(); ++cut) {
    engine::ChannelAddresses out;
    EXPECT_EQ(engine::decode({body.data(), cut}, out).code(), ErrorCode::kProtocol) << cut;
    EXPECT_TRUE(out.channels.empty()) << "a rejected frame must not change the output";
  }
  auto longer = body;
  longer.push_back(0);
  EXPECT_EQ(engine::decode(longer, back).code(), ErrorCode::kProtocol);

  engine::ChannelAddresses big;
  big.channels.push_back(
      {TransportKind::kTcp, std::vector<uint8_t>(transport::kMaxAddressBytes + 1)});
  EXPECT_EQ(engine::decode(body_of(engine::encode(big)), back).code(), ErrorCode::kProtocol);
  engine::ChannelAddresses none;
  EXPECT_EQ(engine::decode(body_of(engine::encode(none)), back).code(), ErrorCode::kProtocol);
}

// What binds a transcript, the MAC of a shared secret and each side's signature alike: a
// change to anything in it is seen.
TEST(Handshake, MacsAndSignaturesBindRoleNoncesIdentitiesAndTransports) {
  const std::vector<TransportKind> offered{TransportKind::kVerbs, TransportKind::kTcp};
  const std::vector<TransportKind> chosen{TransportKind::kVerbs, TransportKind::kTcp};
  const core::SigningKey client_key = core::SigningKey::generate();
  const core::SigningKey server_key = core::SigningKey::generate();
  engine::Transcript t;
  t.client_nonce[0] = 1;
  t.server_nonce[0] = 2;
  t.client = {client_key.public_key(), 100, {}};
  t.server = {server_key.public_key(), 200, {}};
  t.offered = offered;
  t.chosen = chosen;
  auto server_mac = engine::auth_mac("k", true, t);
  auto server_signature = engine::sign_transcript(server_key, true, t);
  ASSERT_TRUE(engine::transcript_signed(true, t, server_signature));
  ASSERT_TRUE(engine::transcript_signed(false, t, engine::sign_transcript(client_key, false, t)));
  // Whether `other` (in role `as_server`) is told apart from `t` by the MAC and the signature.
  auto differs = [&](bool as_server, const engine::Transcript& other) {
    bool mac = !core::mac_equal(server_mac, engine::auth_mac("k", as_server, other));
    bool signature = !engine::transcript_signed(as_server, other, server_signature);
    EXPECT_EQ(mac, signature) << "the MAC and the signature disagree";
    return mac && signature;
  };
  EXPECT_TRUE(differs(false, t));  // reflected at the server
  EXPECT_FALSE(core::mac_equal(server_mac, engine::auth_mac("other", true, t)));
  // The client's key cannot sign for the server, nor the server's for the client.
  EXPECT_FALSE(engine::transcript_signed(true, t, engine::sign_transcript(client_key, true, t)));
  EXPECT_FALSE(engine::transcript_signed(false, t, engine::sign_transcript(server_key, false, t)));
  engine::Transcript swapped = t;
  std::swap(swapped.client_nonce, swapped.server_nonce);
  EXPECT_TRUE(differs(true, swapped));
  engine::Transcript other_engine = t;
  other_engine.client.key[0] ^= 1;
  EXPECT_TRUE(differs(true, other_engine));
  // Another incarnation of either engine cannot pass for this one.
  engine::Transcript incarnation = t;
  incarnation.client.incarnation = 101;
  EXPECT_TRUE(differs(true, incarnation));
  incarnation = t;
  incarnation.server.incarnation = 201;
  EXPECT_TRUE(differs(true, incarnation));
  // Nor can anyone move a peer to another host or process (and so away from the transports
  // that only reach within one).
  engine::Transcript moved = t;
  moved.client.locality.host[0] ^= 1;
  EXPECT_TRUE(differs(true, moved));
  moved = t;
  moved.server.locality.process = 9;
  EXPECT_TRUE(differs(true, moved));
  // Nobody in between can take verbs out of the offer or the choice unnoticed.
  const std::vector<TransportKind> tcp_only{TransportKind::kTcp};
  engine::Transcript downgraded = t;
  downgraded.offered = tcp_only;
  EXPECT_TRUE(differs(true, downgraded));
  downgraded = t;
  downgraded.chosen = tcp_only;
  EXPECT_TRUE(differs(true, downgraded));
  EXPECT_FALSE(differs(true, t));
}

Descriptor sample_descriptor() {
  Descriptor d;
  d.engine_id = 0x1111;
  d.incarnation = 0x2222;
  d.region_id = 0x3333;
  d.address = 0x7fff0000;
  d.length = 1 << 20;
  d.access = Access::kRemoteRead;
  d.add_key(TransportKind::kTcp, 0, std::vector<uint8_t>{0xaa, 0, 0, 0, 0, 0, 0, 0});
  d.add_key(TransportKind::kVerbs, 0, std::vector<uint8_t>{0, 0, 0, 0xbb});
  return d;
}

// Offsets in the binary form (docs/protocol.md).
constexpr std::size_t kAccessAt = 2 + 1 + 8 + 8 + 4 + 8 + 8;
constexpr std::size_t kMemoryAt = kAccessAt + 1;
constexpr std::size_t kMemoryDeviceAt = kMemoryAt + 1;
constexpr std::size_t kKeyCountAt = kMemoryDeviceAt + 1;
constexpr std::size_t kFirstKeyAt = kKeyCountAt + 1;

TEST(Descriptor, RoundTripsBinaryAndText) {
  Descriptor d = sample_descriptor();
  for (const Descriptor& back :
       {Descriptor::decode(d.encode()), Descriptor::parse(d.to_string())}) {
    EXPECT_EQ(back.engine_id, d.engine_id);
    EXPECT_EQ(back.incarnation, d.incarnation);
    EXPECT_EQ(back.region_id, d.region_id);
    EXPECT_EQ(back.address, d.address);
    EXPECT_EQ(back.length, d.length);
    EXPECT_EQ(back.access, d.access);
    EXPECT_EQ(back.memory, MemoryKind::kHost);
    ASSERT_EQ(back.key_count, 2);
    ASSERT_NE(back.key_for(TransportKind::kVerbs), nullptr);
    EXPECT_EQ(back.key_for(TransportKind::kVerbs)->bytes[3], 0xbb);
    EXPECT_EQ(back.key_for(TransportKind::kShm), nullptr);
  }
  EXPECT_EQ(d.to_string().rfind("ferry1:", 0), 0u);
}

ErrorCode decode_error(std::vector<uint8_t> bytes) {
  try {
    Descriptor::decode(bytes);
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kOk;
}

TEST(Descriptor, RejectsMalformedInput) {
  auto good = sample_descriptor().encode();
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_EQ(decode_error({good.begin(), good.begin() + static_cast<long>(cut)}),
              ErrorCode::kInvalidArgument)
        << cut;
  }
  auto trailing = good;
  trailing.push_back(1);
  EXPECT_EQ(decode_error(trailing), ErrorCode::kInvalidArgument);
  auto version = good;
  version[2] = 9;
  EXPECT_EQ(decode_error(version), ErrorCode::kVersionMismatch);
  auto access = good;
  access[kAccessAt] = 0xf0;
  EXPECT_EQ(decode_error(access), ErrorCode::kInvalidArgument);
  auto memory = good;
  memory[kMemoryAt] = kMemoryKinds;
  EXPECT_EQ(decode_error(memory), ErrorCode::kInvalidArgument);
  auto host_device = good;  // good is host memory, which has no device
  host_device[kMemoryDeviceAt] = 1;
  EXPECT_EQ(decode_error(host_device), ErrorCode::kInvalidArgument);
  auto too_many = good;
  too_many[kKeyCountAt] = Descriptor::kMaxAllKeys + 1;
  EXPECT_EQ(decode_error(too_many), ErrorCode::kInvalidArgument);
  EXPECT_THROW(Descriptor::parse("ferry2:AAAA"), Error);
  EXPECT_THROW(Descriptor::parse("ferry1:not base64!"), Error);
  auto keyless = good;
  keyless[kFirstKeyAt] = 0;  // the first key's transport
  EXPECT_EQ(decode_error(keyless), ErrorCode::kInvalidArgument);
  auto empty_key = good;
  empty_key[kFirstKeyAt + 2] = 0;  // the first key's length
  EXPECT_EQ(decode_error(empty_key), ErrorCode::kInvalidArgument);
  auto twice = good;
  twice[kFirstKeyAt + 3 + 8] = static_cast<uint8_t>(TransportKind::kTcp);  // 2nd key's kind
  EXPECT_EQ(decode_error(twice), ErrorCode::kInvalidArgument);
  auto version1 = good;
  version1[2] = 1;  // before devices and memory kinds
  EXPECT_EQ(decode_error(version1), ErrorCode::kVersionMismatch);
  auto version2 = good;
  version2[2] = 2;  // before the memory's device
  EXPECT_EQ(decode_error(version2), ErrorCode::kVersionMismatch);
}

TEST(Descriptor, CarriesAKeyPerDeviceAndKeysBeyondTheInlineOnes) {
  Descriptor d = sample_descriptor();
  d.memory = MemoryKind::kCuda;
  d.memory_device = 7;
  // Verbs on three more devices, and a 64-byte key (as a CUDA IPC handle is).
  for (uint8_t device = 1; device <= 3; ++device)
    d.add_key(TransportKind::kVerbs, device, std::vector<uint8_t>{device, 0, 0, 0});
  std::vector<uint8_t> handle(64);
  for (std::size_t i = 0; i < handle.size(); ++i) handle[i] = static_cast<uint8_t>(i);
  const auto ipc = static_cast<TransportKind>(0x90);
  d.add_key(ipc, 0, handle);
  EXPECT_EQ(d.key_count, Descriptor::kMaxKeys);
  EXPECT_EQ(d.more_keys.size(), 2u);
  EXPECT_THROW(d.add_key(TransportKind::kVerbs, 2, std::vector<uint8_t>{1}), Error)
      << "a second key for one device";
  EXPECT_THROW(d.add_key(ipc, 1, std::vector<uint8_t>(256)), Error) << "over 255 bytes";

  Descriptor back = Descriptor::parse(d.to_string());
  EXPECT_EQ(back.memory, MemoryKind::kCuda);
  EXPECT_EQ(back.memory_device, 7);
  EXPECT_EQ(back.encode(), d.encode());
  for (uint8_t device = 0; device <= 3; ++device) {
    std::span<const uint8_t> key = back.find_key(TransportKind::kVerbs, device);
    ASSERT_EQ(key.size(), 4u) << int{device};
    EXPECT_EQ(key[0], device == 0 ? 0 : device);
  }
  EXPECT_EQ(back.key_for(TransportKind::kVerbs, 3), nullptr) << "held beyond the inline keys";
  std::span<const uint8_t> long_key = back.find_key(ipc, 0);
  EXPECT_TRUE(std::equal(long_key.begin(), long_key.end(), handle.begin(), handle.end()));
  EXPECT_TRUE(back.find_key(TransportKind::kVerbs, 4).empty());

  // One encoding only: a long key before a short one that would be held inline is refused.
  Descriptor ordered;
  ordered.add_key(TransportKind::kTcp, 0, std::vector<uint8_t>(8, 1));
  ordered.add_key(ipc, 0, handle);
  std::vector<uint8_t> bytes = ordered.encode();
  std::size_t first = kFirstKeyAt, second = first + 3 + 8;
  std::vector<uint8_t> swapped(bytes.begin(), bytes.begin() + static_cast<long>(first));
  swapped.insert(swapped.end(), bytes.begin() + static_cast<long>(second), bytes.end());
  swapped.insert(swapped.end(), bytes.begin() + static_cast<long>(first),
                 bytes.begin() + static_cast<long>(second));
  EXPECT_EQ(decode_error(swapped), ErrorCode::kInvalidArgument);
  EXPECT_EQ(decode_error(bytes), ErrorCode::kOk);

  // Fields set by hand are checked before encoding, as decoding checks them.
  Descriptor hand = sample_descriptor();
  hand.keys[0].length = 0;
  EXPECT_THROW(hand.encode(), Error);
  hand = sample_descriptor();
  hand.key_count = Descriptor::kMaxKeys + 1;
  EXPECT_THROW(hand.encode(), Error);
  hand = sample_descriptor();
  hand.more_keys.push_back({ipc, 1, std::vector<uint8_t>(256)});
  EXPECT_THROW(hand.encode(), Error);

  // No more than kMaxAllKeys in all.
  Descriptor full;
  for (int i = 0; i < Descriptor::kMaxAllKeys; ++i)
    full.add_key(TransportKind::kVerbs, static_cast<uint8_t>(i), std::vector<uint8_t>{1});
  EXPECT_THROW(full.add_key(TransportKind::kTcp, 0, std::vector<uint8_t>{1}), Error);
  EXPECT_EQ(Descriptor::decode(full.encode()).more_keys.size(),
            static_cast<std::size_t>(Descriptor::kMaxAllKeys - Descriptor::kMaxKeys));
}

TEST(Descriptor, KeepsTheKeyOfATransportThisBuildLacks) {
  Descriptor d = sample_descriptor();
  const auto newer = static_cast<TransportKind>(0x90);  // a later version's transport
  d.keys[1].transport = newer;  // its key as a newer peer's descriptor would carry it
  Descriptor back = Descriptor::decode(d.encode());
  ASSERT_NE(back.key_for(newer), nullptr);
  EXPECT_EQ(back.key_for(newer)->bytes[3], 0xbb);
  EXPECT_EQ(back.encode(), d.encode());
  EXPECT_EQ(to_string(newer), "unknown");
  EXPECT_EQ(to_string(TransportKind::kTcp), "tcp");
  EXPECT_EQ(to_string(TransportKind::kShm), "shm");
  EXPECT_EQ(to_string(TransportKind::kCudaIpc), "cuda_ipc");  // reserved, not built in
}

}  // namespace
}  // namespace ferry
