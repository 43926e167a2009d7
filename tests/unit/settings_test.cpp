// Transport settings declared once (transport/settings.hpp): parsed by type, checked against
// their range, stored in their typed field or by name, and named FERRY_<TRANSPORT>_<NAME>.
#include "transport/settings.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "ferry/ferry.hpp"

namespace ferry::transport {
namespace {

TEST(Settings, EveryDefaultIsInItsRangeAndEveryOneHasHelp) {
  EXPECT_TRUE(check_settings(Config{}).ok()) << check_settings(Config{}).to_string();
  for (const NamedSetting& n : declared_settings()) {
    EXPECT_GT(std::string(n.setting->help).size(), 10u) << n.full_name();
    EXPECT_EQ(find_setting(n.full_name()), n.setting);
  }
  EXPECT_NE(find_setting("tcp.streams"), nullptr);
  EXPECT_EQ(find_setting("tcp.nope"), nullptr);
}

TEST(Settings, TextOfEachTypeReachesItsTypedField) {
  Config c;
  ASSERT_TRUE(set_setting(c, "tcp.streams", "4").ok());
  EXPECT_EQ(c.tcp.streams, 4);
  ASSERT_TRUE(set_setting(c, "tcp.eager_bytes", "256K").ok());
  EXPECT_EQ(c.tcp.eager_bytes, 256u << 10);
  ASSERT_TRUE(set_setting(c, "shm.ring_copies_up_to", "2MiB").ok());
  EXPECT_EQ(c.shm.ring_copies_up_to, 2u << 20);
  ASSERT_TRUE(set_setting(c, "shm.stream_poll", "2ms").ok());
  EXPECT_EQ(c.shm.stream_poll, std::chrono::milliseconds(2));
  ASSERT_TRUE(set_setting(c, "shm.stream_poll", "35").ok());  // a bare number: microseconds
  EXPECT_EQ(c.shm.stream_poll, std::chrono::microseconds(35));
  ASSERT_TRUE(set_setting(c, "shm.cross_memory", "off").ok());
  EXPECT_FALSE(c.shm.cross_memory);
  ASSERT_TRUE(set_setting(c, "verbs.device", "rxe1").ok());
  EXPECT_EQ(c.verbs.device, "rxe1");
  ASSERT_TRUE(set_setting(c, "verbs.gid_index", "-1").ok());
  EXPECT_EQ(setting_text(c, "shm", *find_setting("shm.stream_poll")), "35us");
  EXPECT_EQ(setting_text(c, "tcp", *find_setting("tcp.eager_bytes")), "256K");
  EXPECT_EQ(setting_text(c, "shm", *find_setting("shm.ring_copies_up_to")), "2M");
  EXPECT_EQ(setting_text(c, "tcp", *find_setting("tcp.streams")), "4");
  EXPECT_TRUE(check_settings(c).ok());
}

TEST(Settings, AValueItDoesNotTakeIsRefusedNamedAndChangesNothing) {
  Config c;
  Status s = set_setting(c, "tcp.streams", "0");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tcp.streams must be 1..64 (is 0)");
  EXPECT_EQ(set_setting(c, "tcp.streams", "two").message(), "tcp.streams: 'two' is not a count");
  EXPECT_EQ(set_setting(c, "shm.cross_memory", "maybe").message(),
            "shm.cross_memory: 'maybe' is not a bool");
  EXPECT_EQ(set_setting(c, "shm.stream_poll", "2s").message(),
            "shm.stream_poll must be 0..1s (is 2s)");
  EXPECT_EQ(set_setting(c, "tcp.eager_bytes", "99999999999999999999G").code(),
            ErrorCode::kInvalidArgument);
  Status unknown = set_setting(c, "tcp.stream", "2");
  EXPECT_NE(unknown.message().find("no setting named 'tcp.stream' (known: tcp.streams, "),
            std::string::npos)
      << unknown.message();
  EXPECT_EQ(c.tcp.streams, Config{}.tcp.streams);
  EXPECT_TRUE(c.transport_settings.empty());
  // A value out of range written to the typed field is caught when an engine starts.
  c.tcp.streams = 65;
  EXPECT_EQ(check_settings(c).message(), "tcp.streams must be 1..64 (is 65)");
}

TEST(Settings, OneWithoutAFieldIsKeptByNameWithItsDefaultUntilSet) {
  const Setting* key_bytes = find_setting("loopback.key_bytes");
  ASSERT_NE(key_bytes, nullptr);
  Config c;
  EXPECT_EQ(number_setting(c, "loopback", *key_bytes), 8);
  ASSERT_TRUE(set_setting(c, "loopback.key_bytes", "64").ok());
  ASSERT_TRUE(set_setting(c, "loopback.key_bytes", "32").ok());  // set again: one entry
  ASSERT_EQ(c.transport_settings.size(), 1u);
  EXPECT_EQ(c.transport_settings[0].first, "loopback.key_bytes");
  EXPECT_EQ(number_setting(c, "loopback", *key_bytes), 32);
  EXPECT_EQ(set_setting(c, "loopback.key_bytes", "7").message(),
            "loopback.key_bytes must be 8..255 (is 7)");
  // Written by hand to a name nobody declared: refused when an engine starts.
  c.transport_settings.emplace_back("loopback.keys", "1");
  EXPECT_EQ(check_settings(c).message(), "no setting named 'loopback.keys'");
}

TEST(Settings, EachHasAnEnvironmentVariable) {
  EXPECT_EQ(environment_variable("tcp", *find_setting("tcp.streams")), "FERRY_TCP_STREAMS");
  EXPECT_EQ(environment_variable("shm", *find_setting("shm.stream_poll")),
            "FERRY_SHM_STREAM_POLL");
}

}  // namespace
}  // namespace ferry::transport
