// The client half of the handshake (src/engine/dialer.cpp): it waits on no socket past the
// connect deadline, and the engine's shutdown wakes it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <stop_token>
#include <string>

#include "support/pair.hpp"

namespace ferry::test {
namespace {

// A listening socket nobody answers on: connections complete in the kernel's backlog and hear
// nothing, as from a listener that hung.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof a;
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    address_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  ~SilentListener() { ::close(fd_); }
  const std::string& address() const { return address_; }
  // Takes the next connection off the backlog (and keeps it open, saying nothing).
  int take() { return taken_ = ::accept(fd_, nullptr, nullptr); }

 private:
  int fd_ = -1;
  int taken_ = -1;
  std::string address_;
};

TEST(Dialer, ASilentListenerTimesOutNamingWhereAndWhy) {
  SilentListener silent;
  Config c = test_config();
  c.listen = false;
  c.connect_timeout = std::chrono::milliseconds(300);
  Engine e(c);
  try {
    e.connect(silent.address());
    FAIL() << "connected to a listener that said nothing";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kTimeout) << err.what();
    EXPECT_NE(std::string(err.what()).find("connect " + silent.address() + ": handshake"),
              std::string::npos)
        << err.what();
  }
  EXPECT_EQ(e.stats().peers, 0u);
}

TEST(Dialer, ShutdownWakesAConnectWaitingForItsAnswer) {
  SilentListener silent;
  Config c = test_config();
  c.listen = false;
  c.connect_timeout = std::chrono::hours(1);  // only shutdown can end the wait
  Engine e(c);
  auto connecting = std::async(std::launch::async, [&] {
    try {
      e.connect(silent.address());
      return Status();
    } catch (const Error& err) {
      return err.status();
    }
  });
  ASSERT_GE(silent.take(), 0);  // its HELLO is on the way: it waits for the answer
  e.shutdown();
  Status s = connecting.get();
  EXPECT_EQ(s.code(), ErrorCode::kCancelled) << s.to_string();
  EXPECT_NE(s.message().find("engine shut down"), std::string::npos) << s.to_string();
}

// A stop requested by the caller ends a connect waiting for its answer (the wait for the TCP
// connection watches the same descriptor). The engine serves on.
TEST(Dialer, AStopRequestedByTheCallerEndsTheConnectAndTheEngineServesOn) {
  SilentListener silent;
  Config c = test_config();
  c.listen = false;
  c.connect_timeout = std::chrono::hours(1);  // only the stop can end the wait
  Engine e(c);
  std::stop_source stop;
  auto connecting = std::async(std::launch::async, [&] {
    try {
      e.connect(silent.address(), stop.get_token());
      return Status();
    } catch (const Error& err) {
      return err.status();
    }
  });
  ASSERT_GE(silent.take(), 0);  // its HELLO is on the way: it waits for the answer
  stop.request_stop();
  Status s = connecting.get();
  EXPECT_EQ(s.code(), ErrorCode::kCancelled) << s.to_string();
  EXPECT_NE(s.message().find("stopped by the caller"), std::string::npos) << s.to_string();

  // The engine is not shut down: it connects to a real target afterwards.
  Engine target(test_config());
  EXPECT_TRUE(e.connect(target.address()).connected());
}

// Many engines of one host connecting at once to one target (worker processes starting
// together), more than its per-source handshake limit: the refused ones try again within their
// connect_timeout, and every one connects and moves bytes. The limit is lowered so that a small
// burst exceeds it many times over (it failed so, before clients tried again when busy).
TEST(Dialer, ABurstFromOneHostBeyondItsHandshakeLimitConnectsInFull) {
  Config target_config = test_config();
  target_config.max_handshakes_per_source = 2;
  Engine target(target_config);
  constexpr int kEngines = 16;
  std::vector<uint8_t> theirs(kEngines, 0);
  Region granted = target.register_memory(theirs.data(), theirs.size(), Access::kRemoteWrite);
  Descriptor d = granted.descriptor();

  Config c = test_config();
  c.listen = false;
  c.connect_timeout = std::chrono::seconds(60);  // generous: sanitizer runs on 2 cores
  std::vector<std::unique_ptr<Engine>> engines;
  for (int i = 0; i < kEngines; ++i) engines.push_back(std::make_unique<Engine>(c));
  std::vector<std::future<Status>> connects;
  for (int i = 0; i < kEngines; ++i) {
    connects.push_back(std::async(std::launch::async, [&, i] {
      try {
        Peer peer = engines[i]->connect(target.address());
        uint8_t mine = static_cast<uint8_t>(i + 1);
        Region source = engines[i]->register_memory(&mine, 1, Access::kLocal);
        Transfer t{&source, 0, &d, static_cast<uint64_t>(i), 1};
        return peer.write({&t, 1}).wait(kWait);
      } catch (const Error& e) {
        return e.status();
      }
    }));
  }
  for (auto& f : connects) {
    Status s = f.get();
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  for (int i = 0; i < kEngines; ++i)
    EXPECT_EQ(theirs[i], static_cast<uint8_t>(i + 1)) << "engine " << i;
}

}  // namespace
}  // namespace ferry::test
