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

// Several lanes and small slices, so that large operations are sliced and striped. A
// transport whose key length is a setting (<transport>.key_bytes) runs with keys of 64 bytes,
// a CUDA IPC handle's, which descriptors keep apart from the short ones.
inline Config conformance_config(TransportKind kind) {
  Config c = test_config();
  c.transports = {kind};
  c.tcp.streams = 4;
  c.slice_bytes = 64 << 10;
  std::string key_bytes = std::string(to_string(kind)) + ".key_bytes";
  for (const SettingInfo& s : Engine::settings(c)) {
    if (s.name == key_bytes) Engine::set(c, key_bytes, "64");
  }
  return c;
}

// Flips a bit of the key `d` holds for `kind` on device 0, wherever the descriptor keeps it
// (a long key is not among the inline ones).
inline void forge_key(Descriptor& d, TransportKind kind) {
  for (int i = 0; i < d.key_count; ++i) {
    if (d.keys[i].transport == kind && d.keys[i].device == 0) {
      d.keys[i].bytes[0] ^= 0x40;
      return;
    }
  }
  for (Descriptor::MoreKey& k : d.more_keys) {
    if (k.transport == kind && k.device == 0) {
      k.bytes[0] ^= 0x40;
      return;
    }
  }
  ADD_FAILURE() << "the descriptor has no key for " << to_string(kind);
}

// Expectations branch on what a transport can do (its registry entry), never on its name.
class Conformance : public ::testing::TestWithParam<TransportKind> {
 protected:
  void SetUp() override {
    TransportKind kind = GetParam();
    // The cases move host memory; a transport of device memory alone has its own suite.
    const transport::TransportEntry* entry = transport::find_transport(kind);
    if (entry != nullptr && (entry->memory & transport::kHostMemory) == 0) {
      GTEST_SKIP() << to_string(kind) << " moves no host memory (tests/cuda covers it)";
    }
    for (const TransportInfo& t : Engine::transports()) {
      if (t.kind != kind || t.usable) continue;
      if (conformance_required(kind)) FAIL() << to_string(kind) << " is required: " << t.detail;
      GTEST_SKIP() << to_string(kind) << " is not usable here: " << t.detail;
    }
  }
  // The case's settings: only the transport under test.
  Config config() const { return conformance_config(GetParam()); }
  // Two engines configured so, whose peers use the transport under test.
  std::unique_ptr<Pair> connect(const Config& target, const Config& initiator) const {
    auto p = std::make_unique<Pair>(target, initiator);
    if (p->peer.transport() != GetParam() || p->target_peer.transport() != GetParam()) {
      throw Error(ErrorCode::kUnsupported, "the peers did not take the transport under test");
    }
    return p;
  }
  // A pair with the case's settings, made on first use.
  Pair& pair() {
    if (!p_) p_ = connect(config(), config());
    return *p_;
  }
  // Whether the transport has every one of these transport::Capability bits.
  bool can(uint32_t capabilities) const {
    const transport::TransportEntry* entry = transport::find_transport(GetParam());
    return entry != nullptr && (entry->capabilities & capabilities) == capabilities;
  }
  // Its NIC, not the target's CPU, serves write and read: a refused access fails the queue pair
  // and with it the channel, as RDMA does.
  bool nic_served() const { return can(transport::kCapOneSided); }
  // It reaches peers in other processes.
  bool crosses_processes() const {
    return can(transport::kCapCrossProcess) || can(transport::kCapCrossHost);
  }

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
