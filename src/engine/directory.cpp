#include "engine/directory.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
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
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (s.size() != 16 || ec != std::errc() || end != s.data() + s.size()) {
    throw std::invalid_argument(std::string(field) + ": not 16 hex digits");
  }
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

bool same(const NamedEngine& a, const NamedEngine& b) {
  return a.engine_id == b.engine_id && a.incarnation == b.incarnation &&
         a.addresses == b.addresses && a.public_key == b.public_key;
}

// A watch's thread: the entry now, then every change of what it says (a rewrite of the same
// entry, as after a new lease, is none), again after each outage.
void run_watch(WatchState& w, core::EtcdClient client, const std::string& key,
               const std::string& name, const std::function<void(const NamedEngine&)>& fn) {
  std::optional<NamedEngine> delivered;
  auto report = [&](const std::string* value) {
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
    if ((delivered && same(*delivered, e)) || w.stopping.load()) return;
    delivered = e;
    try {
      fn(e);
    } catch (const std::exception& ex) {
      core::log(LogLevel::kError, "directory", [&] {
        return "watch of '" + name + "': the callback threw (ignored): " + ex.what();
      });
    }
  };
  bool unreachable = false;
  while (!w.stopping.load()) {
    std::optional<core::EtcdClient::KeyValue> found;
    int64_t revision = 0;
    Status s = client.get(key, found, &revision);
    if (s.ok()) {
      if (unreachable) {
        core::log(LogLevel::kInfo, "directory",
                  [&] { return "watch of '" + name + "': etcd reachable again"; });
      }
      unreachable = false;
      report(found ? &found->value : nullptr);
      s = client.watch(
          key, revision + 1,
          [&](const std::vector<core::EtcdClient::Event>& events) {
            for (const auto& e : events) report(e.deleted ? nullptr : &e.kv.value);
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
  std::unique_lock lock(mu);
  if (id == std::this_thread::get_id()) {
    // From its own callback: it ends once the callback returns.
    if (thread.joinable()) thread.detach();
    return;
  }
  if (thread.joinable()) {
    std::thread joining = std::move(thread);
    lock.unlock();
    joining.join();
    return;
  }
  done_cv.wait(lock, [&] { return done; });  // another stop() is joining it, or it detached
}

void WatchState::ended() {
  {
    std::lock_guard lock(mu);
    done = true;
  }
  done_cv.notify_all();
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

int64_t Directory::lease_for_io() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) throw Error(ErrorCode::kCancelled, "directory: engine shut down");
    if (lease_ != 0) return lease_;
  }
  int64_t granted = 0;
  core::throw_if_error(client_.grant_lease(ttl_, granted));
  std::lock_guard lock(mu_);
  lease_ = granted;
  return granted;
}

void Directory::claim(const std::string& name, bool take_over) {
  const std::string key = engine_key(name);
  const int64_t lease = lease_for_io();
  std::optional<core::EtcdClient::KeyValue> current;
  core::throw_if_error(client_.get(key, current));
  // Another writer may come between the read and the write: the write happens only if the
  // entry is still the one read, else the newer one is judged the same way.
  for (;;) {
    int64_t expected = 0;
    if (current) {
      NamedEngine holder = parse_entry(name, current->value);
      bool other_incarnation = holder.incarnation != self_.incarnation;
      if (holder.engine_id != self_.id || (other_incarnation && !take_over)) {
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
  std::lock_guard io(io_mu_);
  claim(std::string(name), true);
  std::lock_guard lock(mu_);
  engines_.emplace(name);
}

void Directory::unpublish_engine(std::string_view name) {
  check_name(name);
  std::lock_guard io(io_mu_);
  {
    std::lock_guard lock(mu_);
    if (engines_.count(std::string(name)) == 0) return;
  }
  // Only an entry still ours goes, and only as it was read: a newer incarnation of our identity
  // may take the name meanwhile. A failure leaves the name ours, for a retry.
  const std::string key = engine_key(name);
  std::optional<core::EtcdClient::KeyValue> current;
  core::throw_if_error(client_.get(key, current));
  if (current) {
    NamedEngine holder = parse_entry(name, current->value);
    if (holder.engine_id == self_.id && holder.incarnation == self_.incarnation) {
      bool done = false;
      core::throw_if_error(client_.remove_if(key, current->mod_revision, done));
    }
  }
  std::lock_guard lock(mu_);
  engines_.erase(std::string(name));
}

void Directory::publish_region(std::string_view name, uint32_t region_id,
                               std::string descriptor_text, const std::atomic<bool>& registered) {
  check_name(name);
  std::lock_guard io(io_mu_);
  const std::string key = region_key(self_.id, self_.incarnation, name);
  core::throw_if_error(client_.put(key, descriptor_text, lease_for_io()));
  {
    std::lock_guard lock(mu_);
    std::erase(stale_keys_, key);  // an earlier region's failed removal must not take this one
    if (registered.load()) {
      regions_.insert_or_assign(std::string(name),
                                Published{region_id, std::move(descriptor_text)});
      return;
    }
  }
  // Deregistered meanwhile, and region_gone found no name to take: this one goes too.
  if (Status s = client_.remove(key); !s.ok()) {
    std::lock_guard lock(mu_);
    stale_keys_.push_back(key);
  }
  throw Error(ErrorCode::kRevoked, "Region::publish: the region was deregistered");
}

void Directory::region_gone(uint32_t region_id) {
  auto named = [&] {
    return std::any_of(regions_.begin(), regions_.end(),
                       [&](const auto& r) { return r.second.region_id == region_id; });
  };
  {
    std::lock_guard lock(mu_);
    if (!named()) return;
  }
  // Serialized with publications, so that a name a newer region took is not removed.
  std::lock_guard io(io_mu_);
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second.region_id == region_id) {
        keys.push_back(region_key(self_.id, self_.incarnation, it->first));
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::string& key : keys) {
    if (Status s = client_.remove(key); !s.ok()) {
      say_failed("remove a deregistered region's name (retried)", s);
      std::lock_guard lock(mu_);
      stale_keys_.push_back(std::move(key));
    }
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
  w->thread = std::thread(
      [w, client = client_, key = engine_key(name), name = std::string(name), fn = std::move(fn)] {
        run_watch(*w, client, key, name, fn);
        w->ended();
      });
  w->id = w->thread.get_id();
  std::erase_if(watches_, [](const std::weak_ptr<WatchState>& x) { return x.expired(); });
  watches_.push_back(w);
  return w;
}

void Directory::keep() {
  const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(ttl_) / 3;
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, period, [&] { return stopping_; })) {
    lock.unlock();
    renew();
    lock.lock();
  }
}

Status Directory::rewrite_all() {
  try {
    lease_for_io();
    std::set<std::string> engines;
    std::map<std::string, Published, std::less<>> regions;
    {
      std::lock_guard lock(mu_);
      rewrite_ = true;
      engines = engines_;
      regions = regions_;
    }
    for (const std::string& name : engines) {
      try {
        claim(name, false);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kAlreadyExists) throw;
        say_failed("publish again (the name is dropped)", e.status());  // taken meanwhile
        std::lock_guard lock(mu_);
        engines_.erase(name);
      }
    }
    for (const auto& [name, r] : regions) {
      core::throw_if_error(client_.put(region_key(self_.id, self_.incarnation, name),
                                       r.descriptor_text, lease_for_io()));
    }
  } catch (const Error& e) {
    return e.status();  // rewrite_ stays set: the next renewal goes on, under the same lease
  }
  std::lock_guard lock(mu_);
  rewrite_ = false;
  return {};
}

void Directory::renew() {
  std::lock_guard io(io_mu_);
  int64_t lease = 0;
  bool rewrite = false;
  bool published = false;
  std::vector<std::string> stale;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    lease = lease_;
    rewrite = rewrite_;
    published = !engines_.empty() || !regions_.empty();
    stale = stale_keys_;
  }
  if (lease == 0 && !published && stale.empty()) return;
  Status s;
  if (lease != 0) {
    int64_t ttl_left = 0;
    s = client_.keep_alive(lease, ttl_left);
    if (s.ok() && ttl_left == 0) {
      // The lease ran out (etcd unreachable for longer than the TTL): everything under it is gone
      // and is written again under a new one.
      core::log(LogLevel::kWarn, "directory",
                [] { return std::string("the lease ran out; publishing every name again"); });
      std::lock_guard lock(mu_);
      lease_ = 0;
      rewrite = true;
    }
  }
  if (s.ok() && published && (lease == 0 || rewrite)) s = rewrite_all();
  if (s.ok()) {
    for (const std::string& key : stale) {
      if (client_.remove(key).ok()) {
        std::lock_guard lock(mu_);
        std::erase(stale_keys_, key);
      }
    }
  }
  std::lock_guard lock(mu_);
  if (!s.ok() && !unreachable_) say_failed("renew the lease", s);
  if (s.ok() && unreachable_) {
    core::log(LogLevel::kInfo, "directory", [] { return std::string("etcd reachable again"); });
  }
  unreachable_ = !s.ok();
}

void Directory::stop() {
  std::vector<std::shared_ptr<WatchState>> watches;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& weak : watches_) {
      if (auto w = weak.lock()) watches.push_back(std::move(w));
    }
    watches_.clear();
  }
  // Every thread is woken before any is waited for.
  for (auto& w : watches) {
    w->stopping.store(true);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t woke = ::write(w->wake.get(), &one, sizeof one);
  }
  cv_.notify_all();
  if (keeper_.joinable()) keeper_.join();
  for (auto& w : watches) w->stop();
  std::lock_guard io(io_mu_);  // a publication under way ends first
  int64_t lease = 0;
  {
    std::lock_guard lock(mu_);
    lease = lease_;
  }
  if (lease != 0) {
    if (Status s = client_.revoke_lease(lease); !s.ok()) {
      say_failed("end the lease (the entries stay until it runs out)", s);
    }
  }
}

}  // namespace ferry::detail
