// Discovery through a real etcd (support/etcd_server.hpp): engines and regions published by
// name, found, connected to and used; names held, freed, killed with their engines, taken over by
// a new incarnation that a watch reports; etcd stopped and started during transfers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/etcd_server.hpp"
#include "support/target_process.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

// Long enough for a loaded machine; no assertion depends on how soon within it.
constexpr auto kEventually = 60s;

class Directory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { etcd_ = new test::EtcdServer(); }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  void SetUp() override {
    // Every test its own prefix, so that none sees another's names.
    prefix_ =
        std::string("t/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
  }
  Config config() const {
    Config c;
    c.transports = {TransportKind::kTcp};
    c.transports_from_environment = false;
    c.etcd = etcd_->url();
    c.etcd_prefix = prefix_;
    c.etcd_ttl = 2s;
    return c;
  }
  // A target process publishing itself as `engine_name` and its region as `region_name`.
  std::unique_ptr<test::TargetProcess> published_target(const std::string& engine_name,
                                                        const std::string& region_name,
                                                        const std::string& identity = {}) {
    Env etcd("FERRY_ETCD", etcd_->url());
    Env prefix("FERRY_ETCD_PREFIX", prefix_);
    Env publish("FERRY_TEST_PUBLISH", engine_name + " " + region_name);
    Env id("FERRY_TEST_IDENTITY", identity);
    return std::make_unique<test::TargetProcess>(4096, "tcp");
  }
  // Publishes `engine` as `name` and `memory`, registered with `access`, as its region "kv".
  static Region publish_with_kv(Engine& engine, const std::string& name,
                                std::vector<uint8_t>& memory, Access access) {
    Region region = engine.register_memory(memory.data(), memory.size(), access);
    engine.publish(name);
    region.publish("kv");
    return region;
  }
  // Polls `done` until it holds or kEventually passes.
  template <typename F>
  static bool eventually(F&& done) {
    auto deadline = std::chrono::steady_clock::now() + kEventually;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(50ms);
    }
    return true;
  }
  static ErrorCode code_of(const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kOk;
  }

  // Sets an environment variable for a scope (empty: leaves it unset).
  struct Env {
    Env(const char* name, const std::string& value) : name_(name) {
      if (!value.empty()) ::setenv(name, value.c_str(), 1);
    }
    ~Env() { ::unsetenv(name_); }
    const char* name_;
  };

  static test::EtcdServer* etcd_;
  std::string prefix_;
};
test::EtcdServer* Directory::etcd_ = nullptr;

// What a watch reported, in order. Declared before the Watch, so that it outlives it.
struct Seen {
  Watch watch(Engine& engine, const std::string& name) {
    return engine.watch(name, [this](const NamedEngine& e) {
      std::lock_guard lock(mu);
      events.push_back(e);
      cv.notify_all();
    });
  }
  // Waits until `done` holds of the events so far; false after kEventually.
  bool wait(const std::function<bool(const std::vector<NamedEngine>&)>& done) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kEventually, [&] { return done(events); });
  }
  NamedEngine event(std::size_t i) {
    std::lock_guard lock(mu);
    return events.at(i);
  }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<NamedEngine> events;
};

// Reads the whole of `remote` through `peer` and compares it with the target's pattern.
void expect_target_pattern(const Peer& peer, Engine& engine, const Descriptor& remote) {
  std::vector<uint8_t> back(remote.length, 0);
  Region local = engine.register_memory(back.data(), back.size(), Access::kLocal);
  Transfer t{&local, 0, &remote, 0, remote.length};
  ASSERT_TRUE(peer.read({&t, 1}).wait(10s).ok());
  for (std::size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], test::target_byte(i)) << i;
}

TEST_F(Directory, APublishedEngineAndRegionAreFoundConnectedAndWrittenByName) {
  Engine target(config());
  std::vector<uint8_t> memory(64 << 10, 0);
  Region region = publish_with_kv(target, "prefill-0", memory, Access::kRemoteReadWrite);

  Engine initiator(config());
  NamedEngine found = initiator.resolve("prefill-0");
  EXPECT_EQ(found.name, "prefill-0");
  EXPECT_EQ(found.engine_id, target.id());
  EXPECT_EQ(found.incarnation, target.incarnation());
  EXPECT_EQ(found.addresses, target.addresses());
  EXPECT_EQ(found.public_key, target.public_key());

  Peer peer = initiator.connect_named("prefill-0");
  EXPECT_EQ(peer.engine_id(), target.id());
  Descriptor kv = peer.region_named("kv");
  EXPECT_EQ(kv.to_string(), region.descriptor().to_string());

  std::vector<uint8_t> source(memory.size());
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 3);
  Region local = initiator.register_memory(source.data(), source.size(), Access::kLocal);
  Transfer t{&local, 0, &kv, 0, source.size()};
  ASSERT_TRUE(peer.write({&t, 1}).wait(10s).ok());
  EXPECT_EQ(memory, source);
}

TEST_F(Directory, UnknownNamesAreNotFoundAndBadNamesAreRefused) {
  Engine target(config());
  Engine initiator(config());
  EXPECT_EQ(code_of([&] { initiator.resolve("nobody"); }), ErrorCode::kNotFound);
  EXPECT_EQ(code_of([&] { initiator.connect_named("nobody"); }), ErrorCode::kNotFound);
  Peer peer = initiator.connect(target.address());
  EXPECT_EQ(code_of([&] { peer.region_named("none"); }), ErrorCode::kNotFound);
  for (std::string bad : {std::string(), std::string("a/b"), std::string("a b"),
                          std::string(129, 'x'), std::string("caf\xc3\xa9")}) {
    EXPECT_EQ(code_of([&] { target.publish(bad); }), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(code_of([&] { initiator.resolve(bad); }), ErrorCode::kInvalidArgument) << bad;
  }
  target.publish(std::string(128, 'x'));  // the longest name passes
  EXPECT_EQ(initiator.resolve(std::string(128, 'x')).engine_id, target.id());
}

TEST_F(Directory, WithoutEtcdEveryDirectoryCallIsUnsupported) {
  Config c = config();
  c.etcd.clear();
  Engine engine(c);
  Engine other(config());
  Peer peer = engine.connect(other.address());
  std::vector<uint8_t> memory(64);
  Region region = engine.register_memory(memory.data(), memory.size(), Access::kRemoteRead);
  EXPECT_EQ(code_of([&] { engine.publish("x"); }), ErrorCode::kUnsupported);
  EXPECT_EQ(code_of([&] { engine.resolve("x"); }), ErrorCode::kUnsupported);
  EXPECT_EQ(code_of([&] { engine.connect_named("x"); }), ErrorCode::kUnsupported);
  EXPECT_EQ(code_of([&] { engine.watch("x", [](const NamedEngine&) {}); }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(code_of([&] { region.publish("x"); }), ErrorCode::kUnsupported);
  EXPECT_EQ(code_of([&] { peer.region_named("x"); }), ErrorCode::kUnsupported);
}

TEST_F(Directory, MalformedEndpointsAreRefusedWhenFirstUsed) {
  for (const char* bad :
       {"127.0.0.1:2379", "http://", "http://h:1/path", "http://h", "http://h:1,", "https://h:1"}) {
    Config c = config();
    c.etcd = bad;
    Engine engine(c);
    EXPECT_EQ(code_of([&] { engine.resolve("x"); }), std::string(bad).starts_with("https")
                                                         ? ErrorCode::kUnsupported
                                                         : ErrorCode::kInvalidArgument)
        << bad;
  }
  Config c = config();
  c.etcd_ttl = 1s;
  EXPECT_EQ(code_of([&] { Engine e(c); }), ErrorCode::kInvalidArgument);
  c.etcd_ttl = 2500ms;
  EXPECT_EQ(code_of([&] { Engine e(c); }), ErrorCode::kInvalidArgument);
}

TEST_F(Directory, ANameHeldByAnotherEngineIsRefusedUntilItsHolderLetsGo) {
  Engine first(config());
  auto second = std::make_unique<Engine>(config());
  first.publish("decode-0");
  EXPECT_EQ(code_of([&] { second->publish("decode-0"); }), ErrorCode::kAlreadyExists);
  first.publish("decode-0");  // publishing again what it holds is fine
  first.unpublish("decode-0");
  second->publish("decode-0");
  EXPECT_EQ(first.resolve("decode-0").engine_id, second->id());
  // Its holder shutting down frees it at once (the lease is revoked, not left to run out).
  second->shutdown();
  EXPECT_EQ(code_of([&] { first.resolve("decode-0"); }), ErrorCode::kNotFound);
  first.publish("decode-0");
}

TEST_F(Directory, ARegionsNameGoesWithItsDeregistrationAndANewerRegionTakesIt) {
  Engine target(config());
  Engine initiator(config());
  std::vector<uint8_t> a(64), b(128);
  Region ra = target.register_memory(a.data(), a.size(), Access::kRemoteRead);
  Region rb = target.register_memory(b.data(), b.size(), Access::kRemoteRead);
  ra.publish("weights");
  Peer peer = initiator.connect(target.address());
  EXPECT_EQ(peer.region_named("weights").length, 64u);
  rb.publish("weights");
  EXPECT_EQ(peer.region_named("weights").length, 128u);
  rb.deregister();
  EXPECT_EQ(code_of([&] { peer.region_named("weights"); }), ErrorCode::kNotFound);
  EXPECT_EQ(code_of([&] { rb.publish("weights"); }), ErrorCode::kInvalidArgument);
}

TEST_F(Directory, AKilledEngineLeavesTheDirectoryWithinItsLeaseAndAWatchSaysSo) {
  auto target = published_target("victim", "kv");
  Engine watcher(config());
  Seen seen;
  Watch watch = seen.watch(watcher, "victim");
  ASSERT_TRUE(seen.wait([](auto& events) { return !events.empty(); }));
  EXPECT_TRUE(seen.event(0).present());
  Peer peer = watcher.connect_named("victim");
  expect_target_pattern(peer, watcher, peer.region_named("kv"));
  target->kill_now();  // no shutdown: only the lease running out removes it
  ASSERT_TRUE(seen.wait([](auto& events) { return events.size() >= 2; }));
  EXPECT_FALSE(seen.event(1).present());
  EXPECT_EQ(code_of([&] { watcher.resolve("victim"); }), ErrorCode::kNotFound);
}

TEST_F(Directory, ARestartedEngineTakesItsNameAWatchReportsItAndOldDescriptorsAreRefused) {
  std::string identity =
      std::filesystem::temp_directory_path() / ("ferry-directory-id-" + std::to_string(::getpid()));
  std::filesystem::remove(identity);
  auto first = published_target("svc", "kv", identity);
  Engine client(config());
  Seen seen;
  Watch watch = seen.watch(client, "svc");
  Peer before = client.connect_named("svc");
  Descriptor old_kv = before.region_named("kv");
  expect_target_pattern(before, client, old_kv);

  // The same identity in a new process: the name passes to it even though the old entry's lease
  // has not run out.
  first->kill_now();
  auto second = published_target("svc", "kv", identity);
  NamedEngine now = client.resolve("svc");
  EXPECT_EQ(now.engine_id, before.engine_id());
  EXPECT_NE(now.incarnation, before.incarnation());
  ASSERT_TRUE(seen.wait([&](auto& events) {
    return !events.empty() && events.back().incarnation == now.incarnation;
  }));
  Peer after = client.connect_named("svc");
  EXPECT_EQ(after.incarnation(), now.incarnation);
  std::vector<uint8_t> back(old_kv.length);
  Region local = client.register_memory(back.data(), back.size(), Access::kLocal);
  Transfer stale{&local, 0, &old_kv, 0, old_kv.length};
  EXPECT_EQ(after.read({&stale, 1}).wait(10s).code(), ErrorCode::kStaleIncarnation);
  Descriptor new_kv = after.region_named("kv");
  EXPECT_EQ(new_kv.incarnation, now.incarnation);
  expect_target_pattern(after, client, new_kv);
  std::filesystem::remove(identity);
}

TEST_F(Directory, ALapsedLeaseIsReplacedAndEveryNamePublishedAgain) {
  Engine target(config());
  std::vector<uint8_t> memory(256);
  Region region = publish_with_kv(target, "phoenix", memory, Access::kRemoteRead);
  // Revoking the lease behind the engine's back removes its entries, as an outage longer than
  // the TTL does.
  core::EtcdClient etcd = etcd_->client();
  std::optional<core::EtcdClient::KeyValue> entry;
  ASSERT_TRUE(etcd.get(prefix_ + "engines/phoenix", entry).ok());
  ASSERT_TRUE(entry.has_value());
  ASSERT_TRUE(etcd.revoke_lease(entry->lease).ok());
  Engine initiator(config());
  EXPECT_TRUE(
      eventually([&] { return code_of([&] { initiator.resolve("phoenix"); }) == ErrorCode::kOk; }));
  Peer peer = initiator.connect_named("phoenix");
  EXPECT_TRUE(
      eventually([&] { return code_of([&] { peer.region_named("kv"); }) == ErrorCode::kOk; }));
  // Written again under a new lease, not under the revoked one.
  std::optional<core::EtcdClient::KeyValue> again;
  ASSERT_TRUE(etcd.get(prefix_ + "engines/phoenix", again).ok());
  ASSERT_TRUE(again.has_value());
  EXPECT_NE(again->lease, entry->lease);
}

TEST_F(Directory, EtcdDownLeavesTransfersAloneFailsLookupsClearlyAndComesBack) {
  Engine target(config());
  std::vector<uint8_t> memory(4096);
  Region region = publish_with_kv(target, "steady", memory, Access::kRemoteReadWrite);
  Engine initiator(config());
  Peer peer = initiator.connect_named("steady");
  Descriptor kv = peer.region_named("kv");
  Seen seen;
  Watch watch = seen.watch(initiator, "steady");

  etcd_->stop();
  std::vector<uint8_t> source(memory.size());
  Region local = initiator.register_memory(source.data(), source.size(), Access::kLocal);
  for (int round = 0; round < 50; ++round) {
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i + round);
    Transfer t{&local, 0, &kv, 0, source.size()};
    ASSERT_TRUE(peer.write({&t, 1}).wait(10s).ok()) << round;
    ASSERT_EQ(memory, source) << round;
  }
  try {
    initiator.resolve("steady");
    ADD_FAILURE() << "resolve succeeded with etcd stopped";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kConnectFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find(etcd_->url().substr(7)), std::string::npos) << e.what();
  }
  // A name published while etcd is down fails now and can be published once it is back.
  EXPECT_EQ(code_of([&] { target.publish("later"); }), ErrorCode::kConnectFailed);

  etcd_->start();
  EXPECT_TRUE(
      eventually([&] { return code_of([&] { initiator.resolve("steady"); }) == ErrorCode::kOk; }));
  target.publish("later");
  EXPECT_EQ(initiator.resolve("later").engine_id, target.id());
  // The watch reconnected: the name going is reported.
  target.unpublish("steady");
  EXPECT_TRUE(seen.wait([](auto& events) { return !events.empty() && !events.back().present(); }));
}

TEST_F(Directory, AWatchStoppedFromItsOwnCallbackEndsAndEngineShutdownEndsTheRest) {
  Engine target(config());
  target.publish("w");
  auto engine = std::make_unique<Engine>(config());
  std::atomic<int> calls{0};
  Watch self_stopping;
  std::mutex mu;
  std::unique_lock hold(mu);  // the callback waits until the handle is in place
  self_stopping = engine->watch("w", [&](const NamedEngine&) {
    std::lock_guard lock(mu);
    calls.fetch_add(1);
    self_stopping.stop();
  });
  hold.unlock();
  EXPECT_TRUE(eventually([&] { return calls.load() == 1; }));
  std::atomic<int> other_calls{0};
  Watch other = engine->watch("w", [&](const NamedEngine&) { other_calls.fetch_add(1); });
  EXPECT_TRUE(eventually([&] { return other_calls.load() == 1; }));
  engine->shutdown();
  target.unpublish("w");  // nobody hears of it: both watches ended
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(other_calls.load(), 1);
  EXPECT_EQ(code_of([&] { engine->resolve("w"); }), ErrorCode::kCancelled);
}

TEST_F(Directory, ShutdownEndsAWatchWhoseCallbackKeepsCallingTheDirectory) {
  Engine target(config());
  target.publish("busy");
  auto engine = std::make_unique<Engine>(config());
  std::atomic<bool> inside{false};
  std::atomic<int> refused{0};
  Watch watch = engine->watch("busy", [&](const NamedEngine&) {
    inside = true;
    // Reconnecting from a callback is what watches are for: here, lookups until shutdown
    // refuses them.
    for (;;) {
      try {
        engine->resolve("busy");
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kCancelled) {
          refused.fetch_add(1);
          return;
        }
      }
      std::this_thread::sleep_for(5ms);
    }
  });
  ASSERT_TRUE(eventually([&] { return inside.load(); }));
  engine->shutdown();  // returns once the callback did, having seen the refusal
  EXPECT_EQ(refused.load(), 1);
}

}  // namespace
}  // namespace ferry
