// GID selection rules and the verbs wire encodings (the device probing itself runs in the
// Soft-RoCE guest suite).
#include <gtest/gtest.h>

#include "transport/verbs/devices.hpp"
#include "transport/verbs/verbs_channel.hpp"
#include "transport/verbs/verbs_message.hpp"

namespace ferry::transport::verbs {
namespace {

PortInfo roce_port() {
  PortInfo p;
  p.link_layer = "Ethernet";
  p.gids = {{0, "fe80::1", "RoCE v1", false},
            {1, "fe80::1", "RoCE v2", false},
            {2, "::ffff:10.0.0.1", "RoCE v1", true},
            {3, "::ffff:10.0.0.1", "RoCE v2", true}};
  return p;
}

TEST(GidChoice, PrefersRoutableRoceV2) {
  EXPECT_EQ(choose_gid(roce_port(), -1), 3);
  PortInfo no_v4 = roce_port();
  no_v4.gids.pop_back();
  EXPECT_EQ(choose_gid(no_v4, -1), 1);
  PortInfo ib;
  ib.gids = {{0, "fe80::2", "IB", false}};
  EXPECT_EQ(choose_gid(ib, -1), 0);
  EXPECT_EQ(choose_gid(PortInfo{}, -1), -1);
}

TEST(GidChoice, OverrideMustExist) {
  EXPECT_EQ(choose_gid(roce_port(), 2), 2);
  EXPECT_EQ(choose_gid(roce_port(), 7), -1) << "an unknown index is an error, not a fallback";
}

TEST(VerbsApi, UnavailableIsExplained) {
  std::string why;
  const VerbsApi* api = VerbsApi::get(&why);
  if (api == nullptr) {
    EXPECT_FALSE(why.empty());
    return;
  }
  std::vector<DeviceInfo> devices = discover(*api, why);
  if (devices.empty()) {
    EXPECT_FALSE(why.empty()) << "no devices and no reason";
  }
}

TEST(MsgHeader, RoundTripsAndRejectsDamage) {
  MsgHeader h;
  h.type = MsgType::kCts;
  h.status = 17;
  h.rkey = 0xdeadbeef;
  h.tag = ~0ull;
  h.id = 1ull << 40;
  h.a = 0x7fff00001234;
  h.b = 9;
  h.c = 5 << 20;
  uint8_t bytes[MsgHeader::kSize + 3] = {};
  h.encode(bytes);
  MsgHeader d;
  ASSERT_TRUE(MsgHeader::decode({bytes, sizeof bytes}, d).ok()) << "payload may follow";
  EXPECT_EQ(d.type, h.type);
  EXPECT_EQ(d.status, h.status);
  EXPECT_EQ(d.rkey, h.rkey);
  EXPECT_EQ(d.tag, h.tag);
  EXPECT_EQ(d.id, h.id);
  EXPECT_EQ(d.a, h.a);
  EXPECT_EQ(d.b, h.b);
  EXPECT_EQ(d.c, h.c);
  EXPECT_EQ(MsgHeader::decode({bytes, MsgHeader::kSize - 1}, d).code(), ErrorCode::kProtocol);
  for (uint8_t type : {0, 7, 255}) {
    bytes[0] = type;
    EXPECT_EQ(MsgHeader::decode({bytes, sizeof bytes}, d).code(), ErrorCode::kProtocol) << +type;
  }
  bytes[0] = static_cast<uint8_t>(MsgType::kAck);
  bytes[1] = 1;
  EXPECT_EQ(MsgHeader::decode({bytes, sizeof bytes}, d).code(), ErrorCode::kProtocol);
}

MsgHeader ack(uint16_t status, uint64_t compact, std::array<uint64_t, 4> ids) {
  MsgHeader h;
  h.type = MsgType::kAck;
  h.status = status;
  h.tag = compact;
  h.id = ids[0];
  h.a = ids[1];
  h.b = ids[2];
  h.c = ids[3];
  return h;
}

TEST(AckNames, NameMessagesByIdAndCompactOnesByCount) {
  AckNames n;
  ASSERT_TRUE(AckNames::decode(ack(0, 0, {5, 6, 0, 0}), n).ok());
  EXPECT_EQ(n.count, 2u);
  EXPECT_EQ(n.ids[1], 6u);
  EXPECT_EQ(n.compact, 0u);
  ASSERT_TRUE(AckNames::decode(ack(0, 7, {0, 0, 0, 0}), n).ok());
  EXPECT_EQ(n.count, 0u);
  EXPECT_EQ(n.compact, 7u);
  ASSERT_TRUE(AckNames::decode(ack(0, 3, {1, 2, 3, 4}), n).ok());
  EXPECT_EQ(n.count, 4u);
  EXPECT_EQ(n.compact, 3u);
  // An error names one message, by id or as the next compact one.
  auto truncated = static_cast<uint16_t>(ErrorCode::kTruncated);
  ASSERT_TRUE(AckNames::decode(ack(truncated, 0, {9, 0, 0, 0}), n).ok());
  EXPECT_EQ(n.count, 1u);
  ASSERT_TRUE(AckNames::decode(ack(truncated, 1, {0, 0, 0, 0}), n).ok());
  EXPECT_EQ(n.compact, 1u);
}

TEST(AckNames, RejectGapsEmptyListsAndErrorsNamingSeveral) {
  auto truncated = static_cast<uint16_t>(ErrorCode::kTruncated);
  AckNames n;
  n.compact = 99;
  for (const MsgHeader& bad :
       {ack(0, 0, {0, 0, 0, 0}), ack(0, 0, {1, 0, 2, 0}), ack(0, 1, {0, 3, 0, 0}),
        ack(truncated, 0, {0, 0, 0, 0}), ack(truncated, 0, {1, 2, 0, 0}),
        ack(truncated, 1, {1, 0, 0, 0}), ack(truncated, 2, {0, 0, 0, 0}),
        // Counts that would wrap to one.
        ack(truncated, ~uint64_t{0}, {1, 1, 0, 0})}) {
    EXPECT_EQ(AckNames::decode(bad, n).code(), ErrorCode::kProtocol);
  }
  EXPECT_EQ(n.compact, 99u) << "a rejected ACK changes nothing";
}

}  // namespace
}  // namespace ferry::transport::verbs

namespace ferry::transport::verbs {
namespace {

TEST(VerbsAddress, RoundTripsAndRejectsDamage) {
  VerbsAddress a;
  a.gid[15] = 7;
  a.lid = 3;
  a.mtu = IBV_MTU_4096;
  a.psn = 0x123456;
  a.qpns = {17, 0xffffff};
  std::vector<uint8_t> bytes = a.encode();
  VerbsAddress b;
  ASSERT_TRUE(VerbsAddress::decode(bytes, b).ok());
  EXPECT_EQ(b.qpns, a.qpns);
  EXPECT_EQ(b.psn, a.psn);
  EXPECT_EQ(b.gid[15], 7);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_EQ(VerbsAddress::decode({bytes.data(), cut}, b).code(), ErrorCode::kProtocol) << cut;
  }
  auto trailing = bytes;
  trailing.push_back(0);
  EXPECT_EQ(VerbsAddress::decode(trailing, b).code(), ErrorCode::kProtocol);
  auto bad_mtu = bytes;
  bad_mtu[18] = 9;
  EXPECT_EQ(VerbsAddress::decode(bad_mtu, b).code(), ErrorCode::kProtocol);
  VerbsAddress wide = a;
  wide.qpns[0] = 0x1000000;  // queue pair numbers are 24-bit
  EXPECT_EQ(VerbsAddress::decode(wide.encode(), b).code(), ErrorCode::kProtocol);
  VerbsAddress none = a;
  none.qpns.clear();
  EXPECT_EQ(VerbsAddress::decode(none.encode(), b).code(), ErrorCode::kProtocol);
}

}  // namespace
}  // namespace ferry::transport::verbs
