// Calls that wait for the engine's own progress, made from a completion callback (which runs on
// the thread that completes operations): they refuse at once or finish later, and every other
// operation still completes.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

// Over each transport whose completions run on the engine's threads in their own way.
class Callbacks : public ::testing::TestWithParam<TransportKind> {
 protected:
  static Config config() {
    Config c = test_config();
    c.transports = {GetParam()};
    return c;
  }
};

// Eight writes from `source` into `d`, in flight together.
std::vector<Future> writes_in_flight(Peer& peer, Region& source, const Descriptor& d) {
  std::vector<Future> out;
  std::size_t part = source.size() / 8;
  for (std::size_t i = 0; i < 8; ++i) {
    Transfer t{&source, i * part, &d, i * part, part};
    out.push_back(peer.write({&t, 1}));
  }
  return out;
}

TEST_P(Callbacks, DeregisterFromACallbackIsRefusedAndTheOtherOperationsComplete) {
  Pair pair(config(), config());
  std::vector<uint8_t> mine(1 << 20), theirs(1 << 20, 0);
  fill_pattern(mine, 11);
  Region source = pair.initiator.register_memory(mine.data(), mine.size(), Access::kLocal);
  Region granted = pair.target.register_memory(theirs.data(), theirs.size(), Access::kRemoteWrite);
  Descriptor d = granted.descriptor();

  std::promise<std::string> refused;
  Transfer first{&source, 0, &d, 0, 4096};
  pair.peer.write({&first, 1}).then([&](const Status&) {
    try {
      source.deregister();
      refused.set_value("returned");
    } catch (const Error& e) {
      refused.set_value(std::string(to_string(e.code())) + ": " + e.what());
    }
  });
  std::vector<Future> others = writes_in_flight(pair.peer, source, d);
  std::future<std::string> outcome = refused.get_future();
  ASSERT_EQ(outcome.wait_for(kWait), std::future_status::ready);
  std::string said = outcome.get();
  EXPECT_NE(said.find("invalid_argument"), std::string::npos) << said;
  EXPECT_NE(said.find("completion callback"), std::string::npos) << said;
  for (Future& f : others) ASSERT_TRUE(f.wait(kWait).ok());
  EXPECT_EQ(theirs, mine);
  // Refused means unchanged: the region still serves.
  Transfer again{&source, 0, &d, 0, mine.size()};
  EXPECT_TRUE(pair.peer.write({&again, 1}).wait(kWait).ok());
}

TEST_P(Callbacks, ARegionDroppedInACallbackIsDeregisteredOnceItsOperationsEnd) {
  Pair pair(config(), config());
  std::vector<uint8_t> mine(1 << 20), theirs(1 << 20, 0);
  fill_pattern(mine, 12);
  // Lent for remote reads too, so that its revocation shows at the target.
  auto source = std::make_shared<Region>(
      pair.initiator.register_memory(mine.data(), mine.size(), Access::kRemoteRead));
  Descriptor source_d = source->descriptor();
  Region granted = pair.target.register_memory(theirs.data(), theirs.size(), Access::kRemoteWrite);
  Descriptor d = granted.descriptor();

  // The callback is a message's: it runs on a progress thread, once the target sends, while
  // the writes below may still use the region.
  std::vector<uint8_t> note(8), said(8, 1);
  Region inbox = pair.initiator.register_memory(note.data(), note.size(), Access::kLocal);
  Region outbox = pair.target.register_memory(said.data(), said.size(), Access::kLocal);
  std::promise<void> dropped;
  pair.peer.recv(1, inbox, 0, note.size()).then([&, keep = source](const Status&) mutable {
    keep.reset();  // the last reference: its destructor runs here
    dropped.set_value();
  });
  std::vector<Future> others = writes_in_flight(pair.peer, *source, d);
  source.reset();
  ASSERT_TRUE(pair.target_peer.send(1, outbox, 0, said.size()).wait(kWait).ok());
  ASSERT_EQ(dropped.get_future().wait_for(kWait), std::future_status::ready);
  for (Future& f : others) ASSERT_TRUE(f.wait(kWait).ok());
  EXPECT_EQ(theirs, mine);
  // The dropped region is revoked soon after: the target's reads of it fail.
  std::vector<uint8_t> back(4096);
  Region into = pair.target.register_memory(back.data(), back.size(), Access::kLocal);
  Transfer read_back{&into, 0, &source_d, 0, back.size()};
  Status s;
  for (auto until = std::chrono::steady_clock::now() + kWait;
       std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(std::chrono::milliseconds(5))) {
    s = pair.target_peer.read({&read_back, 1}).wait(kWait);
    if (!s.ok()) break;
  }
  EXPECT_TRUE(s.code() == ErrorCode::kRevoked || s.code() == ErrorCode::kUnknownRegion)
      << s.to_string();
}

TEST_P(Callbacks, ShutdownFromACallbackReturnsAndEveryOtherOperationEnds) {
  for (bool of_own_engine : {true, false}) {
    SCOPED_TRACE(of_own_engine ? "the initiator's own engine" : "the target's engine");
    auto pair = std::make_unique<Pair>(config(), config());
    std::vector<uint8_t> mine(1 << 20), theirs(1 << 20, 0);
    fill_pattern(mine, 13);
    Region source = pair->initiator.register_memory(mine.data(), mine.size(), Access::kLocal);
    Region granted =
        pair->target.register_memory(theirs.data(), theirs.size(), Access::kRemoteWrite);
    Descriptor d = granted.descriptor();

    Engine& stopped = of_own_engine ? pair->initiator : pair->target;
    std::promise<void> returned;
    Transfer first{&source, 0, &d, 0, 4096};
    pair->peer.write({&first, 1}).then([&](const Status&) {
      stopped.shutdown();
      returned.set_value();
    });
    std::vector<Future> others = writes_in_flight(pair->peer, source, d);
    ASSERT_EQ(returned.get_future().wait_for(kWait), std::future_status::ready);
    // Each ends, done or failed for the shutdown; none hangs.
    for (Future& f : others) {
      Status s = f.wait(kWait);
      EXPECT_NE(s.code(), ErrorCode::kTimeout) << s.to_string();
    }
    // A shut-down engine starts nothing more.
    if (of_own_engine) {
      EXPECT_FALSE(pair->peer.write({&first, 1}).wait(kWait).ok());
    }
    pair.reset();  // and the engines' destructors return
  }
}

TEST_P(Callbacks, AnEngineWhoseLastHandleIsDroppedInACallbackClosesOffThatThread) {
  auto target = std::make_shared<Engine>(config());
  Engine initiator(config());
  Peer peer = initiator.connect(target->address());
  std::optional<Peer> accepted = target->accept(kWait);
  ASSERT_TRUE(accepted.has_value());
  std::vector<uint8_t> mine(4096, 1), theirs(4096, 0);
  Region local = target->register_memory(theirs.data(), theirs.size(), Access::kLocal);
  Region granted = initiator.register_memory(mine.data(), mine.size(), Access::kRemoteRead);
  Descriptor d = granted.descriptor();
  Transfer t{&local, 0, &d, 0, mine.size()};
  std::promise<void> dropped;
  Future f = accepted->read({&t, 1});
  f.then([&, last = std::move(target)](const Status&) mutable {
    last.reset();
    dropped.set_value();
  });
  // Everything that refers to the target's engine goes, so the callback holds the last handle.
  accepted.reset();
  { Region gone = std::move(local); }
  ASSERT_EQ(dropped.get_future().wait_for(kWait), std::future_status::ready);
  EXPECT_TRUE(f.wait(kWait).ok());
  EXPECT_EQ(theirs, mine);
}

INSTANTIATE_TEST_SUITE_P(Transports, Callbacks,
                         ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace ferry::test
