#include "engine/directory.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/log.hpp"
#include "core/sys.hpp"

namespace ferry::detail {
namespace {
using nlohmann::json;

constexpr std::size_t kMaxNameLength = 128;

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

uint64_t from_hex(const json& j, const char* field) {
  const std::string& s = j.at(field).get_ref<const std::string&>();
  std::size_t used = 0;
  uint64_t v = std::stoull(s, &used, 16);
  if (used != s.size() || s.size() != 16) throw std::invalid_argument(std::string(field));
  return v;
}

// What an engine's entry holds (docs/discovery.md, "Key layout").
std::string entry_of(const Directory::Self& self) {
  return json{{"engine_id", hex(self.id)},
              {"incarnation", hex(self.incarnation)},
              {"addresses", self.addresses},
              {"public_key", self.public_key}}
      .dump();
}

NamedEngine parse_entry(std::string_view name, const std::string& value) {
  NamedEngine e;
  e.name = std::string(name);
  try {
    json j = json::parse(value);
    e.engine_id = from_hex(j, "engine_id");
    e.incarnation = from_hex(j, "incarnation");
    e.addresses = j.at("addresses").get<std::vector<std::string>>();
    e.public_key = j.at("public_key").get<std::string>();
  } catch (const std::exception& ex) {
    throw Error(ErrorCode::kProtocol, "directory: the entry of '" + std::string(name) +
                                          "' is malformed (" + ex.what() + ")");
  }
  if (e.engine_id == 0) {
    throw Error(ErrorCode::kProtocol,
                "directory: the entry of '" + std::string(name) + "' names engine 0");
  }
  return e;
}

core::EtcdClient client_for(const Config& config) {
  std::vector<core::HostPort> endpoints;
  core::throw_if_error(core::EtcdClient::parse_endpoints(config.etcd, endpoints));
  return core::EtcdClient(std::move(endpoints), config.etcd_timeout);
}

void say_failed(const char* what, const Status& s) {
  core::log(LogLevel::kWarn, "directory", [&] { return std::string(what) + ": " + s.to_string(); });
}

// Waits up to `period` for the watch to be stopped; true once it is.
bool stopped_within(WatchState& w, std::chrono::milliseconds period) {
  pollfd p{w.wake.get(), POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(period.count()));
  return w.stopping.load();
}

// A watch's thread: the entry now, then every change, again after each outage.
void run_watch(WatchState& w, core::EtcdClient client, const std::string& key,
               const std::string& name, const std::function<void(const NamedEngine&)>& fn) {
  int64_t delivered = -1;  // mod revision of the entry last reported; 0: reported absent
  auto report = [&](int64_t mod_revision, const std::string* value) {
    if (mod_revision == delivered || w.stopping.load()) return;
    delivered = mod_revision;
    NamedEngine e;
    e.name = name;
    if (value != nullptr) {
      try {
        e = parse_entry(name, *value);
      } catch (const Error& ex) {
        say_failed("watch", ex.status());
        return;
      }
    }
    fn(e);
  };
  bool unreachable = false;
  while (!w.stopping.load()) {
    std::optional<core::EtcdClient::KeyValue> found;
    int64_t revision = 0;
    Status s = client.get(key, found, &revision);
    if (s.ok()) {
      if (found) {
        report(found->mod_revision, &found->value);
      } else {
        report(0, nullptr);
      }
      s = client.watch(
          key, revision + 1,
          [&](const std::vector<core::EtcdClient::Event>& events) {
            for (const auto& e : events) {
              if (e.deleted)
                report(0, nullptr);
              else
                report(e.kv.mod_revision, &e.kv.value);
            }
          },
          w.wake.get());
    }
    if (s.code() == ErrorCode::kCancelled || w.stopping.load()) break;
    if (!unreachable) say_failed(("watch of '" + name + "'").c_str(), s);
    unreachable = true;
    if (stopped_within(w, Directory::kRetryPeriod)) break;
  }
}
}  // namespace

void WatchState::stop() {
  stopping.store(true);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t woke = ::write(wake.get(), &one, sizeof one);
  std::lock_guard lock(mu);
  if (!thread.joinable()) return;
  if (thread.get_id() == std::this_thread::get_id()) {
    thread.detach();  // from its own callback: it ends when the callback returns
  } else {
    thread.join();
  }
}

Directory::Directory(const Config& config, Self self)
    : prefix_(config.etcd_prefix),
      ttl_(std::chrono::duration_cast<std::chrono::seconds>(config.etcd_ttl)),
      self_(std::move(self)),
      self_entry_(entry_of(self_)),
      client_(client_for(config)) {
  keeper_ = std::thread([this] { keep(); });
}

Directory::~Directory() { stop(); }

void Directory::check_name(std::string_view name) {
  bool ok = !name.empty() && name.size() <= kMaxNameLength &&
            std::all_of(name.begin(), name.end(), [](char c) {
              return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '.' || c == '_' || c == '-' || c == ':';
            });
  if (!ok) {
    throw Error(ErrorCode::kInvalidArgument,
                "directory: bad name '" + std::string(name.substr(0, kMaxNameLength)) +
                    "' (1-128 characters: letters, digits, '.', '_', '-', ':')");
  }
}

std::string Directory::engine_key(std::string_view name) const {
  return prefix_ + "engines/" + std::string(name);
}

std::string Directory::region_key(uint64_t id, uint64_t incarnation, std::string_view name) const {
  return prefix_ + "regions/" + hex(id) + "/" + hex(incarnation) + "/" + std::string(name);
}

int64_t Directory::lease_locked() {
  if (stopping_) throw Error(ErrorCode::kCancelled, "directory: engine shut down");
  if (lease_ == 0) core::throw_if_error(client_.grant_lease(ttl_, lease_));
  return lease_;
}

void Directory::claim_locked(const std::string& name) {
  const std::string key = engine_key(name);
  const int64_t lease = lease_locked();
  std::optional<core::EtcdClient::KeyValue> current;
  core::throw_if_error(client_.get(key, current));
  // Another writer may come between the read and the write: the write happens only if the
  // entry is still the one read, else the newer one is judged the same way.
  for (;;) {
    int64_t expected = 0;
    if (current) {
      NamedEngine holder = parse_entry(name, current->value);
      if (holder.engine_id != self_.id) {
        throw Error(ErrorCode::kAlreadyExists, "publish '" + name + "': held by engine " +
                                                   hex(holder.engine_id) + " (incarnation " +
                                                   hex(holder.incarnation) + ")");
      }
      expected = current->mod_revision;
    }
    bool done = false;
    core::throw_if_error(client_.put_if(key, self_entry_, lease, expected, done, current));
    if (done) return;
  }
}

void Directory::publish_engine(std::string_view name) {
  check_name(name);
  std::lock_guard lock(mu_);
  claim_locked(std::string(name));
  engines_.emplace(name);
}

void Directory::unpublish_engine(std::string_view name) {
  check_name(name);
  std::lock_guard lock(mu_);
  if (engines_.erase(std::string(name)) == 0) return;
  // Only an entry still ours goes: a newer incarnation of our identity may have taken it.
  const std::string key = engine_key(name);
  std::optional<core::EtcdClient::KeyValue> current;
  core::throw_if_error(client_.get(key, current));
  if (current && parse_entry(name, current->value).incarnation == self_.incarnation) {
    core::throw_if_error(client_.remove(key));
  }
}

void Directory::publish_region(std::string_view name, uint32_t region_id,
                               std::string descriptor_text) {
  check_name(name);
  std::lock_guard lock(mu_);
  const int64_t lease = lease_locked();
  core::throw_if_error(
      client_.put(region_key(self_.id, self_.incarnation, name), descriptor_text, lease));
  regions_.insert_or_assign(std::string(name), Published{region_id, std::move(descriptor_text)});
}

void Directory::region_gone(uint32_t region_id) {
  std::lock_guard lock(mu_);
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (it->second.region_id != region_id) {
      ++it;
      continue;
    }
    std::string key = region_key(self_.id, self_.incarnation, it->first);
    if (Status s = client_.remove(key); !s.ok()) {
      say_failed("remove a deregistered region's name (retried)", s);
      stale_keys_.push_back(std::move(key));
    }
    it = regions_.erase(it);
  }
}

NamedEngine Directory::resolve(std::string_view name) {
  check_name(name);
  std::optional<core::EtcdClient::KeyValue> found;
  core::throw_if_error(client_.get(engine_key(name), found));
  if (!found) {
    throw Error(ErrorCode::kNotFound,
                "directory: no engine published as '" + std::string(name) + "'");
  }
  return parse_entry(name, found->value);
}

std::string Directory::region_of(uint64_t id, uint64_t incarnation, std::string_view name) {
  check_name(name);
  std::optional<core::EtcdClient::KeyValue> found;
  core::throw_if_error(client_.get(region_key(id, incarnation, name), found));
  if (!found) {
    throw Error(ErrorCode::kNotFound, "directory: engine " + hex(id) + " (incarnation " +
                                          hex(incarnation) + ") published no region '" +
                                          std::string(name) + "'");
  }
  return found->value;
}

std::shared_ptr<WatchState> Directory::watch(std::string_view name,
                                             std::function<void(const NamedEngine&)> fn) {
  check_name(name);
  auto w = std::make_shared<WatchState>();
  w->wake = core::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!w->wake.valid()) throw Error(core::sys_status("eventfd"));
  std::lock_guard lock(mu_);
  if (stopping_) throw Error(ErrorCode::kCancelled, "watch: engine shut down");
  // The thread holds the state, so a watch stopped from its own callback outlives the handle.
  std::lock_guard thread_lock(w->mu);
  w->thread = std::thread([w, client = client_, key = engine_key(name), name = std::string(name),
                           fn = std::move(fn)] { run_watch(*w, client, key, name, fn); });
  std::erase_if(watches_, [](const std::weak_ptr<WatchState>& x) { return x.expired(); });
  watches_.push_back(w);
  return w;
}

void Directory::keep() {
  const auto period = ttl_ / 3;
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, period, [&] { return stopping_; })) renew();
}

void Directory::renew() {
  if (lease_ == 0 && engines_.empty() && regions_.empty() && stale_keys_.empty()) return;
  int64_t ttl_left = 0;
  Status s;
  if (lease_ != 0) s = client_.keep_alive(lease_, ttl_left);
  if (s.ok() && ttl_left == 0) {
    // The lease ran out (etcd unreachable for longer than the TTL), or a new one could not be
    // had since: everything under it is gone and is written again under a new one.
    if (lease_ != 0) {
      core::log(LogLevel::kWarn, "directory",
                [] { return std::string("the lease ran out; publishing every name again"); });
    }
    lease_ = 0;
    try {
      lease_locked();
      for (auto it = engines_.begin(); it != engines_.end();) {
        try {
          claim_locked(*it);
          ++it;
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kAlreadyExists) throw;
          say_failed("publish again", e.status());  // another engine took it meanwhile
          it = engines_.erase(it);
        }
      }
      for (const auto& [name, r] : regions_) {
        core::throw_if_error(
            client_.put(region_key(self_.id, self_.incarnation, name), r.descriptor_text, lease_));
      }
    } catch (const Error& e) {
      s = e.status();
      lease_ = 0;  // the next renewal starts again
    }
  }
  if (s.ok()) {
    std::erase_if(stale_keys_, [&](const std::string& key) { return client_.remove(key).ok(); });
  }
  if (!s.ok() && !unreachable_) say_failed("renew the lease", s);
  if (s.ok() && unreachable_) {
    core::log(LogLevel::kInfo, "directory", [] { return std::string("etcd reachable again"); });
  }
  unreachable_ = !s.ok();
}

void Directory::stop() {
  std::vector<std::weak_ptr<WatchState>> watches;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    watches.swap(watches_);
  }
  cv_.notify_all();
  if (keeper_.joinable()) keeper_.join();
  for (auto& weak : watches) {
    if (auto w = weak.lock()) w->stop();
  }
  if (lease_ != 0) {
    if (Status s = client_.revoke_lease(lease_); !s.ok()) {
      say_failed("end the lease (the entries stay until it runs out)", s);
    }
  }
}

}  // namespace ferry::detail
