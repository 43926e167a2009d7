// A child forked from a process with engines (Python's multiprocessing does it by default): the
// inherited engines are inert there, and the parent's connections go on untouched.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

// Runs `call` in the child: true when it threw kInvalidArgument saying the process was forked.
template <typename Call>
bool refused_as_forked(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.code() == ErrorCode::kInvalidArgument &&
           std::string(e.what()).find("forked") != std::string::npos;
  }
  return false;
}

class Fork : public ::testing::TestWithParam<TransportKind> {};

TEST_P(Fork, AChildFindsInheritedEnginesInertAndTheParentsConnectionGoesOn) {
  Config config = test_config();
  config.transports = {GetParam()};
  auto pair = std::make_unique<Pair>(config, config);
  std::vector<uint8_t> mine(1 << 16), theirs(1 << 16, 0), note(8);
  fill_pattern(mine, 21);
  Region source = pair->initiator.register_memory(mine.data(), mine.size(), Access::kLocal);
  Region granted = pair->target.register_memory(theirs.data(), theirs.size(), Access::kRemoteWrite);
  Region inbox = pair->initiator.register_memory(note.data(), note.size(), Access::kLocal);
  Descriptor d = granted.descriptor();
  Transfer t{&source, 0, &d, 0, mine.size()};
  Future pending = pair->peer.recv(5, inbox, 0, note.size());  // the parent's, never sent

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Each refusal is a bit of the exit status: a failed check names itself.
    int failed = 0;
    if (!refused_as_forked([&] { (void)pair->peer.write({&t, 1}); })) failed |= 1;
    if (!refused_as_forked([&] { (void)pair->peer.send(5, inbox, 0, 8); })) failed |= 2;
    if (!refused_as_forked([&] { pair->peer.close(); })) failed |= 4;
    if (!refused_as_forked([&] { (void)pair->initiator.connect(pair->target.address()); }))
      failed |= 8;
    if (!refused_as_forked([&] { pair->initiator.shutdown(); })) failed |= 16;
    Status waited = pending.wait(std::chrono::seconds(1));
    if (waited.code() != ErrorCode::kInvalidArgument) failed |= 32;
    if (!refused_as_forked([&] { source.deregister(); })) failed |= 64;
    // Dropping everything inherited returns, and touches nothing the parent uses.
    { Region gone = std::move(granted); }
    pair.reset();
    ::_exit(failed);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits of the checks that failed in the child";

  // The parent's peers are connected still, both ways, and move bytes.
  EXPECT_TRUE(pair->peer.connected());
  EXPECT_TRUE(pair->target_peer.connected());
  ASSERT_TRUE(pair->peer.write({&t, 1}).wait(kWait).ok());
  EXPECT_EQ(theirs, mine);
  std::vector<uint8_t> said(8, 9);
  Region outbox = pair->target.register_memory(said.data(), said.size(), Access::kLocal);
  ASSERT_TRUE(pair->target_peer.send(5, outbox, 0, said.size()).wait(kWait).ok());
  ASSERT_TRUE(pending.wait(kWait).ok());
  EXPECT_EQ(note, said);
}

INSTANTIATE_TEST_SUITE_P(Transports, Fork,
                         ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace ferry::test
