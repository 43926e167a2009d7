// How the engine picks the channel an operation travels on: choose() is the one decision,
// made from the channels' capabilities and memory kinds, the memory kinds of both ends and this
// engine's order (Config::transports). Reach (same process, same host, other host) decides
// earlier which channels a peer gets at all: the handshake offers a transport only to peers it
// can reach. A peer's decisions are made once, when its channels are set up, into a RouteTable that
// the data path reads with one load.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/handshake.hpp"
#include "ferry/config.hpp"
#include "ferry/ferry.hpp"
#include "transport/contract.hpp"

namespace ferry::engine {

enum class OpClass : uint8_t { kOneSided, kWriteImm, kMessage };
constexpr int kOpClasses = 3;
std::string_view to_string(OpClass op);

// Whether a transport with these capabilities reaches a peer that far away.
bool reaches(uint32_t capabilities, Reach reach);

// One channel of a peer, as routing sees it.
struct Candidate {
  TransportKind kind{};
  uint32_t capabilities = 0;        // transport::Capability bits
  transport::MemoryKinds memory{};  // what it moves, on both ends
  int rank = 0;                     // position in this engine's Config::transports
  std::string unusable;             // why the connected channel carries nothing ("" if it can)
  uint32_t lacks = 0;               // capabilities the connected channel lacks (Channel::lacks)
  std::string lacks_why;
};

enum class Verdict : uint8_t {
  kChosen,        // carries the operations
  kFallback,      // carries one whose remote descriptors have no key of the better ones
  kNoCapability,  // cannot do this kind of operation
  kLocalMemory,   // cannot move this engine's memory of that kind
  kRemoteMemory,  // cannot move the peer's memory of that kind
  kUnusable,      // connected, but cannot carry anything (Channel::unusable)
};

struct Decision {
  // Candidates (their indexes) that can carry the operation, best first.
  std::array<uint8_t, kMaxOfferedTransports> order{};
  uint8_t usable = 0;
  std::array<Verdict, kMaxOfferedTransports> verdicts{};  // per candidate
};

// The rules, in order; a candidate gets the first it fails: a channel that cannot carry
// anything carries nothing; messages need kCapMessages and
// write_with_imm kCapImm (write / read need nothing: a transport without kCapOneSided has the
// target's CPU serve them); the local memory kind and the remote one must be among the
// transport's (the peer's build is assumed alike: its descriptor carries a key only where its
// transport registered the region); then the lowest rank wins and the others follow in rank
// order.
Decision choose(std::span<const Candidate> candidates, OpClass op, MemoryKind local,
                MemoryKind remote);

// The decisions for every operation class and memory kinds, by channel index.
class RouteTable {
 public:
  void set(OpClass op, MemoryKind local, MemoryKind remote, const Decision& d);
  // The channels that can carry `op` between those memory kinds, best first; empty: none.
  std::span<const uint8_t> order(OpClass op, MemoryKind local, MemoryKind remote) const {
    const Entry& e = entries_[index(op, local, remote)];
    return {e.order.data(), e.count};
  }

 private:
  struct Entry {
    std::array<uint8_t, kMaxOfferedTransports> order{};
    uint8_t count = 0;
  };
  static std::size_t index(OpClass op, MemoryKind local, MemoryKind remote) {
    return (static_cast<std::size_t>(op) * kMemoryKinds + static_cast<std::size_t>(local)) *
               kMemoryKinds +
           static_cast<std::size_t>(remote);
  }
  std::array<Entry, kOpClasses * kMemoryKinds * kMemoryKinds> entries_{};
};

struct Routes {
  RouteTable table;
  std::vector<RouteInfo> info;  // what Peer::routes() shows
};

// The routes to a peer whose channels are `channels` (their kinds, in the channel set's order)
// at `reach`. `unusable_here` says why this engine cannot use a configured transport, or the
// peer's channel of that kind cannot carry operations, or "" when it can; configured
// transports that are not channels and channels that cannot carry say so in each why.
// `lacks_here` gives the capabilities a connected channel lacks (Channel::lacks), and why.
Routes plan_routes(
    const Config& config, std::span<const TransportKind> channels, Reach reach,
    const std::function<std::string(TransportKind)>& unusable_here,
    const std::function<uint32_t(TransportKind, std::string&)>& lacks_here = nullptr);

}  // namespace ferry::engine
