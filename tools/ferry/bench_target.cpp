// `ferry bench --listen`: the target. It registers what an initiator asks for, serves its
// receives and ping-pong rounds, and reports what it saw (bench_session.hpp).
#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <iostream>
#include <optional>

#include "bench_session.hpp"
#include "info.hpp"

namespace ferry::cli::bench {
namespace {

// ---------------------------------------------------------------------------------------------
// Target: registers what an initiator asks for and serves it until told to stop.

// One initiator's session; `imms` counts its immediates, which `count_imms` (the engine's
// on_imm callback) does, except while an imm_pingpong takes them from next_imm.
void serve(Engine& engine, Mailbox& mail, const std::atomic<uint64_t>& imms,
           const std::function<void(const ImmEvent&)>& count_imms) {
  const Peer& peer = mail.peer();
  // Setup: "<bytes> <allocate> 0": the buffer's size, and 1 for memory from Engine::allocate.
  uint64_t bytes = 0, allocate = 0, unused = 0;
  read_fields(mail.recv(kTagSetup), bytes, allocate, unused);
  refuse_if(bytes == 0 || bytes > physical_memory(), "setup: a buffer of " + std::to_string(bytes) +
                                                         " bytes asked for; this host has " +
                                                         human_memory(physical_memory()));
  std::vector<uint8_t> owned;
  Region region;
  if (allocate == 1) {
    region = engine.allocate(bytes, Access::kRemoteReadWrite);
  } else {
    try {
      owned.resize(bytes);
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::kResourceExhausted, "setup: cannot allocate " + human_memory(bytes));
    }
  }
  std::span<uint8_t> buf =
      allocate == 1 ? std::span(static_cast<uint8_t*>(region.data()), bytes) : std::span(owned);
  fill(buf.data(), bytes, bytes);
  if (allocate != 1) region = engine.register_memory(buf.data(), bytes, Access::kRemoteReadWrite);
  mail.send(kTagDescriptor, region.descriptor().to_string());

  // Serve send(): keep receives posted into rotating slots and check every message.
  uint64_t bad_messages = 0;
  for (;;) {
    // Between commands the initiator may run one-sided operations for long: its liveness, not
    // this wait, tells whether it is still there.
    std::string cmd = mail.recv(kTagSetup, kIdleTimeout);
    if (cmd == "done") break;
    bool notify = cmd.starts_with("imm_pingpong ");
    if (notify || cmd.starts_with("pingpong ")) {
      // "[imm_]pingpong <rounds> <size> <initiator's descriptor> <prepared>": answer every round.
      std::string word, desc;
      uint64_t rounds = 0, size = 0;
      bool prepared = false;
      read_fields(cmd, word, rounds, size, desc, prepared);
      refuse_if(size == 0 || size > bytes / 2,
                "ping-pong: size " + std::to_string(size) + " does not fit twice in the buffer");
      Descriptor initiator = Descriptor::parse(desc);
      fill(buf.data() + size, size, size);
      PingPongWriter writer(peer, region, buf.data(), initiator, size, prepared, notify);
      // Notifications queue for next_imm meanwhile; counted again after, however this ends (a
      // listener serves the next initiator after a failed one).
      struct Counting {
        Engine& engine;
        const std::function<void(const ImmEvent&)>* fn;
        ~Counting() {
          if (fn != nullptr) engine.on_imm(*fn);
        }
      } counting{engine, notify ? &count_imms : nullptr};
      if (notify) {
        engine.on_imm(nullptr);
        mail.send(kTagReport, "ready");
      }
      for (uint64_t r = 0; r < rounds; ++r) {
        await_answer(engine, peer, buf.data(), size, r, notify);
        pingpong_wait(writer.post(r));
      }
      continue;
    }
    // "<count> <size> <window> <same area>": receive `count` messages, `window` receives
    // posted, each into its own slot or (same area, as ib_send_bw posts them) all into the first.
    uint64_t count = 0, size = 0, window = 0;
    bool same_area = false;
    read_fields(cmd, count, size, window, same_area);
    refuse_if(size == 0 || size > bytes || window == 0, "send: size " + std::to_string(size) +
                                                            " or window " + std::to_string(window) +
                                                            " out of range");
    uint64_t slots = same_area ? 1 : std::min(window, bytes / size);
    std::deque<std::pair<Future, uint64_t>> posted;
    uint64_t next = 0;
    for (uint64_t done = 0; done < count;) {
      while (next < count && posted.size() < (same_area ? window : slots)) {
        uint64_t slot = next % slots;
        posted.emplace_back(peer.recv(kTagData, region, slot * size, size), slot);
        ++next;
      }
      auto [f, slot] = posted.front();
      posted.pop_front();
      check(f.wait(kOpTimeout), "recv");
      if (f.bytes() != size || !sampled_matches(buf.data() + slot * size, size, size))
        ++bad_messages;
      if (++done % kSendCreditEvery == 0) mail.send(kTagCredit, std::to_string(done));
    }
    mail.send(kTagReport, std::to_string(bad_messages));
  }
  mail.send(kTagReport, std::to_string(imms.load()) + " " + std::to_string(bad_messages));
}

// Serves one initiator; false if the session failed. A listener reports every failure; the
// target `ferry bench` started (--once) leaves that to its initiator, which prints its own
// failure or the one we told it.
bool serve_one(Engine& engine, const Peer& peer, const std::atomic<uint64_t>& imms,
               const std::function<void(const ImmEvent&)>& count_imms, bool once) {
  Mailbox mail(engine, peer);
  try {
    serve(engine, mail, imms, count_imms);
    return true;
  } catch (const std::exception& e) {
    std::optional<std::string> theirs = mail.their_failure();
    if (!theirs) mail.tell_failure(e.what());
    if (!once) {
      std::cerr << "ferry bench: initiator " << peer.address()
                << (theirs ? " failed: " + *theirs : ": " + std::string(e.what())) << std::endl;
    }
    return false;
  }
}

// After "listening on": the addresses a remote host can use when listening on every interface.
void print_reachable(const Address& listen, uint16_t port) {
  bool v4 = listen.host == "0.0.0.0", v6 = listen.host == "::";  // [::] takes IPv4 too
  if (!v4 && !v6) return;
  std::vector<InterfaceAddress> all = interface_addresses();
  std::stable_partition(all.begin(), all.end(), [](const auto& a) { return !a.loopback; });
  for (const auto& a : all) {
    if (!a.up || a.link_local || (a.ipv6 && !v6)) continue;
    std::cout << "reachable at " << Address{a.address, port}.to_string() << " (" << a.name
              << (a.loopback ? ", this host only" : "") << ")\n";
  }
  std::cout << std::flush;
}

}  // namespace

int run_target(const BenchOptions& o) {
  Engine engine(engine_config(o, *o.listen));
  std::atomic<uint64_t> initiator{0}, imms{0};
  std::function<void(const ImmEvent&)> count_imms = [&](const ImmEvent& e) {
    if (e.peer_engine_id == initiator.load()) imms.fetch_add(1);
  };
  engine.on_imm(count_imms);
  // The first line as it is: the initiator that started this target reads it.
  std::cout << "listening on " << engine.address() << std::endl;
  print_reachable(*o.listen, engine.port());
  for (;;) {
    std::optional<Peer> accepted = engine.accept(kIdleTimeout);
    if (!accepted) {
      if (o.once) return 1;
      continue;
    }
    imms = 0;
    initiator = accepted->engine_id();
    bool ok = serve_one(engine, *accepted, imms, count_imms, o.once);
    if (o.once) return ok ? 0 : 1;
  }
}

}  // namespace ferry::cli::bench
