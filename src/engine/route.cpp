#include "engine/route.hpp"

#include <algorithm>

#include "transport/registry.hpp"

namespace ferry::engine {
namespace {

constexpr std::array<MemoryKind, kMemoryKinds> kAllMemory{MemoryKind::kHost, MemoryKind::kCuda};
constexpr std::array<OpClass, kOpClasses> kAllOps{OpClass::kOneSided, OpClass::kWriteImm,
                                                  OpClass::kMessage};

uint32_t needed(OpClass op) {
  switch (op) {
    case OpClass::kWriteImm:
      return transport::kCapImm;
    case OpClass::kMessage:
      return transport::kCapMessages;
    case OpClass::kOneSided:
      break;
  }
  return 0;
}

bool moves(transport::MemoryKinds set, MemoryKind kind) {
  return (set & transport::memory_bit(kind)) != 0;
}

std::string rank_text(const Candidate& c) { return "rank " + std::to_string(c.rank + 1); }

std::string verdict_text(const Candidate& c, Verdict v, OpClass op, MemoryKind local,
                         MemoryKind remote, TransportKind chosen) {
  switch (v) {
    case Verdict::kChosen:
      return "chosen (" + rank_text(c) + ")";
    case Verdict::kFallback:
      return "fallback (" + rank_text(c) + ", for descriptors without a " +
             std::string(to_string(chosen)) + " key)";
    case Verdict::kNoCapability:
      return "cannot carry " + std::string(to_string(op)) +
             ((c.lacks & needed(op)) != 0 ? " here: " + c.lacks_why : std::string());
    case Verdict::kUnusable:
      return "not usable here: " + c.unusable;
    case Verdict::kLocalMemory:
      return "cannot move " + std::string(to_string(local)) + " memory here";
    case Verdict::kRemoteMemory:
      return "cannot move the peer's " + std::string(to_string(remote)) + " memory";
  }
  return {};
}

// Why a configured transport is not one of the peer's channels.
std::string absent_reason(TransportKind kind, Reach reach,
                          const std::function<std::string(TransportKind)>& unusable_here) {
  const transport::TransportEntry* entry = transport::find_transport(kind);
  if (entry == nullptr) return "not built into this version";
  if (std::string why = unusable_here(kind); !why.empty()) return "not usable here: " + why;
  if (!reaches(entry->capabilities, reach)) {
    return reach == Reach::kOtherHost ? "cannot reach another host"
                                      : "cannot reach another process";
  }
  return "the peer does not offer it or cannot use it";
}

}  // namespace

std::string_view to_string(OpClass op) {
  switch (op) {
    case OpClass::kOneSided:
      return "write/read";
    case OpClass::kWriteImm:
      return "write_with_imm";
    case OpClass::kMessage:
      return "send/recv";
  }
  return "unknown";
}

bool reaches(uint32_t capabilities, Reach reach) {
  switch (reach) {
    case Reach::kSameProcess:
      return true;
    case Reach::kSameHost:
      return (capabilities & (transport::kCapCrossProcess | transport::kCapCrossHost)) != 0;
    case Reach::kOtherHost:
      return (capabilities & transport::kCapCrossHost) != 0;
  }
  return false;
}

Decision choose(std::span<const Candidate> candidates, OpClass op, MemoryKind local,
                MemoryKind remote) {
  Decision d;
  for (std::size_t i = 0; i < candidates.size() && i < d.verdicts.size(); ++i) {
    const Candidate& c = candidates[i];
    if (!c.unusable.empty()) {
      d.verdicts[i] = Verdict::kUnusable;
    } else if ((c.capabilities & ~c.lacks & needed(op)) != needed(op)) {
      d.verdicts[i] = Verdict::kNoCapability;
    } else if (!moves(c.memory, local)) {
      d.verdicts[i] = Verdict::kLocalMemory;
    } else if (!moves(c.memory, remote)) {
      d.verdicts[i] = Verdict::kRemoteMemory;
    } else {
      d.order[d.usable++] = static_cast<uint8_t>(i);
    }
  }
  std::stable_sort(d.order.begin(), d.order.begin() + d.usable,
                   [&](uint8_t a, uint8_t b) { return candidates[a].rank < candidates[b].rank; });
  for (uint8_t n = 0; n < d.usable; ++n) {
    d.verdicts[d.order[n]] = n == 0 ? Verdict::kChosen : Verdict::kFallback;
  }
  return d;
}

void RouteTable::set(OpClass op, MemoryKind local, MemoryKind remote, const Decision& d) {
  Entry& e = entries_[index(op, local, remote)];
  e.order = d.order;
  e.count = d.usable;
}

Routes plan_routes(const Config& config, std::span<const TransportKind> channels, Reach reach,
                   const std::function<std::string(TransportKind)>& unusable_here,
                   const std::function<uint32_t(TransportKind, std::string&)>& lacks_here) {
  std::vector<Candidate> candidates;
  for (TransportKind kind : channels) {
    const transport::TransportEntry* entry = transport::find_transport(kind);
    auto rank = std::find(config.transports.begin(), config.transports.end(), kind);
    Candidate& c = candidates.emplace_back(
        Candidate{kind, entry != nullptr ? entry->capabilities : 0,
                  entry != nullptr ? entry->memory : transport::MemoryKinds{},
                  static_cast<int>(rank - config.transports.begin()), unusable_here(kind)});
    if (lacks_here) c.lacks = lacks_here(kind, c.lacks_why);
  }
  // Configured transports in this engine's order, each once, with its channel (an index) or,
  // when it is none of the peer's channels, why not: the same for every row.
  struct Configured {
    TransportKind kind;
    std::size_t channel;
    std::string absent;
  };
  std::vector<Configured> configured;
  for (TransportKind kind : config.transports) {
    if (std::any_of(configured.begin(), configured.end(),
                    [&](const Configured& c) { return c.kind == kind; })) {
      continue;
    }
    auto channel = std::find(channels.begin(), channels.end(), kind);
    configured.push_back(
        {kind, static_cast<std::size_t>(channel - channels.begin()),
         channel == channels.end() ? absent_reason(kind, reach, unusable_here) : std::string()});
  }
  transport::MemoryKinds any_memory = 0;
  for (const Candidate& c : candidates) any_memory |= c.memory;

  Routes routes;
  for (OpClass op : kAllOps) {
    for (MemoryKind local : kAllMemory) {
      for (MemoryKind remote : kAllMemory) {
        Decision d = choose(candidates, op, local, remote);
        routes.table.set(op, local, remote, d);
        // Shown only for memory some channel moves: host memory at least.
        bool shown = (local == MemoryKind::kHost && remote == MemoryKind::kHost) ||
                     (moves(any_memory, local) && moves(any_memory, remote));
        if (!shown) continue;
        RouteInfo info;
        info.operations = std::string(to_string(op));
        info.local = local;
        info.remote = remote;
        if (d.usable > 0) info.transport = candidates[d.order[0]].kind;
        for (const Configured& c : configured) {
          info.why += (info.why.empty() ? "" : "; ") + std::string(to_string(c.kind)) + ": " +
                      (c.channel == channels.size()
                           ? c.absent
                           : verdict_text(candidates[c.channel], d.verdicts[c.channel], op, local,
                                          remote, info.transport.value_or(TransportKind{})));
        }
        routes.info.push_back(std::move(info));
      }
    }
  }
  return routes;
}

}  // namespace ferry::engine
