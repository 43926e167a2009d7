// The engine's names in etcd (Config::etcd; docs/discovery.md has the key layout): the entries
// it published, all under one lease that a thread of the directory's own renews, the lookups,
// and watches. Made on first use; etcd is never on the data path.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/etcd.hpp"
#include "core/net.hpp"
#include "ferry/config.hpp"
#include "ferry/ferry.hpp"

namespace ferry::detail {

// A watch's thread and how to stop it (the public Watch holds it).
struct WatchState {
  // Ends the watch: wakes its thread and waits until it has ended, also when another caller is
  // joining it; from the watch's own callback it returns at once (the thread ends after it).
  // Idempotent.
  void stop();
  // The thread's last act.
  void ended();

  core::Fd wake;  // an eventfd, readable once stopping
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable done_cv;
  std::thread thread;  // joinable until a stop() takes it (under mu)
  std::thread::id id;  // the thread's, kept after it was taken (under mu)
  bool done = false;   // the thread ended (under mu)
};

class Directory {
 public:
  // What this engine publishes about itself.
  struct Self {
    uint64_t id = 0;
    uint64_t incarnation = 0;
    std::vector<std::string> addresses;
    std::string public_key;
  };
  // While etcd cannot be reached, a watch tries again this often (and the renewals every third
  // of the TTL, as always).
  static constexpr std::chrono::seconds kRetryPeriod{1};

  // Throws kInvalidArgument for malformed endpoints (Config::etcd).
  Directory(const Config& config, Self self);
  ~Directory();  // stop()
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // Throw kInvalidArgument for a name outside 1-128 of [A-Za-z0-9._:-].
  static void check_name(std::string_view name);

  void publish_engine(std::string_view name);
  void unpublish_engine(std::string_view name);
  // Publishes while `registered` holds: checked under the lock region_gone takes, so a name
  // never outlives its region's deregistration (kRevoked once it began).
  void publish_region(std::string_view name, uint32_t region_id, std::string descriptor_text,
                      const std::atomic<bool>& registered);
  // The region was deregistered: its names leave the directory (retried by the renewals while
  // etcd cannot be reached). A region that has none costs a look at a map.
  void region_gone(uint32_t region_id);
  NamedEngine resolve(std::string_view name);
  // The text of the descriptor engine `id` in `incarnation` published under `name`.
  std::string region_of(uint64_t id, uint64_t incarnation, std::string_view name);
  std::shared_ptr<WatchState> watch(std::string_view name,
                                    std::function<void(const NamedEngine&)> fn);
  // Stops the renewals and the watches (waking all before waiting for any), then ends the
  // lease: every entry leaves at once (when etcd answers within Config::etcd_timeout; else the
  // lease runs out). Idempotent.
  void stop();

 private:
  std::string engine_key(std::string_view name) const;
  std::string region_key(uint64_t id, uint64_t incarnation, std::string_view name) const;
  // The lease, granted on first need (io_mu_ held).
  int64_t lease_for_io();
  // Writes this engine's entry under `name` unless another engine's is there (kAlreadyExists);
  // an entry of another incarnation of this identity is taken over when `take_over`, else
  // refused the same way (io_mu_ held).
  void claim(const std::string& name, bool take_over);
  // The renewals' thread: every third of the TTL.
  void keep();
  void renew();
  // Writes every entry again under a new lease (io_mu_ held); what failed is retried next time.
  Status rewrite_all();

  const std::string prefix_;
  const std::chrono::seconds ttl_;
  const Self self_;
  const std::string self_entry_;  // the JSON under this engine's names
  core::EtcdClient client_;

  // Two locks, taken in this order: io_mu_ serializes what writes to etcd (publications,
  // renewals, removals) and is held across requests; mu_ guards the state below and is never
  // held across a request, so a deregistration never waits for etcd unless it has names to take.
  std::mutex io_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool unreachable_ = false;  // the last renewal failed: said once per outage
  bool rewrite_ = false;      // a new lease was granted and not every entry is under it yet
  int64_t lease_ = 0;
  std::set<std::string> engines_;  // names this engine holds
  struct Published {
    uint32_t region_id;
    std::string descriptor_text;
  };
  std::map<std::string, Published, std::less<>> regions_;
  std::vector<std::string> stale_keys_;  // removals that failed, retried by the renewals
  std::vector<std::weak_ptr<WatchState>> watches_;
  std::thread keeper_;
};

}  // namespace ferry::detail
