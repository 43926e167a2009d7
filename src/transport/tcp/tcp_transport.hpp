// The TCP transport's registration side and channel factory: the region table key is the TCP
// key, since the target's CPU checks every access against the region table.
#pragma once

#include "transport/contract.hpp"
#include "transport/tcp/tcp_channel.hpp"

namespace ferry::transport::tcp {

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TcpOptions& options) : options_(options) {}
  TransportKind kind() const override { return TransportKind::kTcp; }
  Status register_region(uint32_t, uint8_t*, uint64_t, Access, uint64_t table_key,
                         KeySink& keys) override {
    return table_key_as_key(table_key, keys);
  }
  // The region table revokes access; TCP holds no per-region state of its own.
  void deregister_region(uint32_t) override {}
  Status make_channel(ChannelArgs args, std::shared_ptr<Channel>& out) override {
    out = TcpChannel::create(args.host, std::move(args.link), options_, std::move(args.on_closed),
                             args.dialer);
    return {};
  }

 private:
  TcpOptions options_;
};

}  // namespace ferry::transport::tcp
