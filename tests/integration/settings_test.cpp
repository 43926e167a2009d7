// Transport settings through the engine: FERRY_<TRANSPORT>_<NAME> variables, Engine::set and
// Engine::settings, and a setting's check when an engine starts.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

Config tcp_only(bool from_environment) {
  Config c = test_config();
  c.transports = {TransportKind::kTcp};
  c.settings_from_environment = from_environment;
  return c;
}

int tcp_lanes(const Config& target, const Config& initiator) {
  Pair p(target, initiator);
  return p.peer.stats().channel(TransportKind::kTcp)->lanes;
}

TEST(TransportSettings, AnEnvironmentVariableOverridesTheSettingItNames) {
  ScopedEnv env("FERRY_TCP_STREAMS", "3");
  // The listener's count decides what both share (its address says it).
  EXPECT_EQ(tcp_lanes(tcp_only(true), tcp_only(true)), 3);
  EXPECT_EQ(tcp_lanes(tcp_only(false), tcp_only(false)), Config{}.tcp.streams);
  std::vector<SettingInfo> listed = Engine::settings(tcp_only(true));
  auto streams = std::find_if(listed.begin(), listed.end(),
                              [](const SettingInfo& s) { return s.name == "tcp.streams"; });
  ASSERT_NE(streams, listed.end());
  EXPECT_EQ(streams->value, "3");
  EXPECT_EQ(streams->default_value, std::to_string(Config{}.tcp.streams));
  EXPECT_EQ(streams->range, "1..64");
  EXPECT_EQ(streams->type, "count");
  EXPECT_EQ(streams->environment, "FERRY_TCP_STREAMS");
  EXPECT_FALSE(streams->help.empty());
}

TEST(TransportSettings, ABadValueInTheEnvironmentStopsTheEngineNamingTheVariable) {
  ScopedEnv env("FERRY_SHM_STREAM_POLL", "soon");
  try {
    Engine e(tcp_only(true));
    FAIL() << "an engine started with FERRY_SHM_STREAM_POLL=soon";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(
                  "FERRY_SHM_STREAM_POLL=\"soon\": shm.stream_poll: 'soon' is not a duration"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(Engine{tcp_only(false)});
}

TEST(TransportSettings, EngineSetChecksAndAnEngineTakesWhatItSet) {
  Config c = tcp_only(false);
  Engine::set(c, "tcp.streams", "5");
  EXPECT_EQ(c.tcp.streams, 5);
  EXPECT_EQ(tcp_lanes(c, c), 5);
  try {
    Engine::set(c, "tcp.streams", "100");
    FAIL() << "tcp.streams took 100";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "invalid_argument: tcp.streams must be 1..64 (is 100)");
  }
  EXPECT_EQ(c.tcp.streams, 5);
  // The typed face is checked against the same declaration when an engine starts.
  c.tcp.streams = 0;
  try {
    Engine e(c);
    FAIL() << "an engine started with tcp.streams 0";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "invalid_argument: config: tcp.streams must be 1..64 (is 0)");
  }
}

}  // namespace
}  // namespace ferry::test
