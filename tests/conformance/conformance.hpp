// The conformance suite (issue 17): the same cases for every transport in the registry
// (src/transport/transports.def), so a new transport runs them without a line here. A case's
// two engines offer only the transport under test; the case checks that their peers use it. A
// transport unusable here is skipped, unless FERRY_CONFORMANCE_REQUIRE names it
// (comma-separated, as `ferry info` spells the kinds): then it fails. The Soft-RoCE guest
// requires verbs.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "support/pair.hpp"
#include "transport/registry.hpp"

namespace ferry {
// Test names and failure messages print the transport's name.
inline void PrintTo(TransportKind kind, std::ostream* os) { *os << to_string(kind); }
}  // namespace ferry

namespace ferry::test {

inline bool conformance_required(TransportKind kind) {
  const char* env = std::getenv("FERRY_CONFORMANCE_REQUIRE");
  std::stringstream names(env != nullptr ? env : "");
  for (std::string name; std::getline(names, name, ',');) {
    if (name == to_string(kind)) return true;
  }
  return false;
}

// Several lanes and small slices, so that large operations are sliced and striped.
inline Config conformance_config(TransportKind kind) {
  Config c = test_config();
  c.transports = {kind};
  c.tcp.streams = 4;
  c.slice_bytes = 64 << 10;
  return c;
}

class Conformance : public ::testing::TestWithParam<TransportKind> {
 protected:
  void SetUp() override {
    TransportKind kind = GetParam();
    for (const TransportInfo& t : Engine::transports()) {
      if (t.kind != kind || t.usable) continue;
      if (conformance_required(kind)) FAIL() << to_string(kind) << " is required: " << t.detail;
      GTEST_SKIP() << to_string(kind) << " is not usable here: " << t.detail;
    }
    p_ = std::make_unique<Pair>(conformance_config(kind), conformance_config(kind));
    ASSERT_EQ(p_->peer.transport(), kind);
    ASSERT_EQ(p_->target_peer.transport(), kind);
  }
  Pair& pair() { return *p_; }

 private:
  std::unique_ptr<Pair> p_;
};

// Every transport built in, in transports.def order.
inline std::vector<TransportKind> registered_kinds() {
  std::vector<TransportKind> kinds;
  for (const auto* entry : transport::registered_transports()) kinds.push_back(entry->kind);
  return kinds;
}

inline std::string transport_case_name(const ::testing::TestParamInfo<TransportKind>& info) {
  return std::string(to_string(info.param));
}

}  // namespace ferry::test
