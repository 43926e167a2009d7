// GID selection rules (the device probing itself runs in the Soft-RoCE guest suite).
#include <gtest/gtest.h>

#include "transport/verbs/devices.hpp"

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

}  // namespace
}  // namespace ferry::transport::verbs
