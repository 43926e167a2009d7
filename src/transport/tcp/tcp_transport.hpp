// The TCP transport's registration side: the region table key is the TCP key.
#pragma once

#include <cstring>

#include "transport/contract.hpp"

namespace ferry::transport::tcp {

class TcpTransport final : public Transport {
 public:
  TransportKind kind() const override { return TransportKind::kTcp; }
  uint32_t capabilities() const override { return kCapCrossHost; }
  Status register_region(uint32_t, uint8_t*, uint64_t, Access, uint64_t table_key,
                         std::span<uint8_t> key, uint8_t& key_length) override {
    std::memcpy(key.data(), &table_key, sizeof table_key);
    key_length = sizeof table_key;
    return {};
  }
  // The region table revokes access; TCP holds no per-region state of its own.
  void deregister_region(uint32_t) override {}
};

}  // namespace ferry::transport::tcp
