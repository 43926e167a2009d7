// Hostile peers and heavy load: what one peer can make an engine hold, and what it cannot.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

// A caller whose write finds the socket already broken closes the channel from post(); the
// stream's send lock must not be held then (one lock order: close lock before send lock, as in
// attach()). The initiator's only progress thread is kept busy in a callback so that it cannot
// notice the lost connection first: the callers' writes meet the broken sockets. TSan reports a
// lock-order inversion if post() closes under the send lock.
TEST(LockOrder, APostThatFindsTheSocketBrokenClosesOutsideTheSendLock) {
  Config c = test_config();
  c.progress_threads = 1;
  auto target = std::make_unique<Engine>(test_config());
  Engine initiator(c);
  Peer peer = initiator.connect(target->address());
  auto accepted = target->accept(kWait);
  ASSERT_TRUE(accepted.has_value());
  Buffer local(initiator, 4096, Access::kLocal, 1);
  Buffer remote(*target, 4096, Access::kRemoteWrite, 2);
  Descriptor d = remote.region.descriptor();
  Buffer msg(*target, 8, Access::kLocal, 3);

  std::promise<void> in_callback, release;
  std::shared_future<void> released = release.get_future().share();
  Future r = peer.recv(1, local.region, 0, 8);
  r.then([&in_callback, released](const Status&) {
    in_callback.set_value();
    released.wait();  // holds the initiator's progress thread
  });
  Future sent = accepted->send(1, msg.region, 0, 8);
  in_callback.get_future().wait();

  target.reset();  // closes every socket of the peer
  std::vector<Future> writes;
  Transfer t{&local.region, 0, &d, 0, 8};
  for (int i = 0; i < 32; ++i) writes.push_back(peer.write({&t, 1}));
  release.set_value();
  for (Future& f : writes) {
    Status s = f.wait(kWait);
    EXPECT_EQ(s.code(), ErrorCode::kPeerLost) << s.to_string();
  }
  EXPECT_TRUE(r.wait(kWait).ok());
}

}  // namespace
}  // namespace ferry::test
