// A client of etcd's v3 API through its JSON gateway (etcd 3.4 and later: /v3/...), over
// core/http: what the engine's directory needs (docs/discovery.md) and nothing more. Each request
// goes to the endpoints in turn, each given the whole timeout, until one answers other than with
// a server error; one that reaches none fails with kConnectFailed or kTimeout naming the last,
// and etcd's own refusals come back with its text.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/net.hpp"
#include "ferry/error.hpp"

namespace ferry::core {

class EtcdClient {
 public:
  struct KeyValue {
    std::string key;
    std::string value;
    int64_t mod_revision = 0;
    int64_t lease = 0;
  };
  struct Event {
    bool deleted = false;
    KeyValue kv;  // a deletion carries the key and its revision only
  };
  // Responses larger than this are refused (kProtocol): far above a directory's entries.
  static constexpr std::size_t kMaxResponseBytes = 4 << 20;

  // `endpoints`: "http://host:port", several separated by commas, tried in turn; `timeout`
  // bounds each call. kInvalidArgument when one is malformed.
  static Status parse_endpoints(std::string_view endpoints, std::vector<HostPort>& out);
  EtcdClient(std::vector<HostPort> endpoints, std::chrono::nanoseconds timeout)
      : endpoints_(std::move(endpoints)), timeout_(timeout) {}

  // The key's entry, or nullopt when there is none; `revision` (when given) the store's revision
  // it was read at, from which a watch misses nothing.
  Status get(std::string_view key, std::optional<KeyValue>& out, int64_t* revision = nullptr);
  Status put(std::string_view key, std::string_view value, int64_t lease);
  // Puts only when the key's entry is absent (`expected_mod_revision` 0) or still the one of
  // that revision; `done` says whether it did, `current` holds the entry that stopped it.
  Status put_if(std::string_view key, std::string_view value, int64_t lease,
                int64_t expected_mod_revision, bool& done, std::optional<KeyValue>& current);
  Status remove(std::string_view key);
  // Removes the key's entry only if it is still the one of `mod_revision`; `done` says whether.
  Status remove_if(std::string_view key, int64_t mod_revision, bool& done);

  Status grant_lease(std::chrono::seconds ttl, int64_t& lease);
  // Renews the lease; `ttl_left` 0 means it is gone (expired or revoked).
  Status keep_alive(int64_t lease, int64_t& ttl_left);
  // Ends the lease and with it every key put under it. A lease already gone is not an error.
  Status revoke_lease(int64_t lease);

  // Watches `key` from `from_revision` on, calling `on_events` with
  // each batch of events in order, until `wake` becomes readable (kCancelled), the stream fails,
  // or etcd cancels the watch (kOutOfBounds when the revision was compacted away: read afresh and
  // watch from there). Blocks; `on_events` runs on the caller's thread.
  Status watch(std::string_view key, int64_t from_revision,
               const std::function<void(const std::vector<Event>&)>& on_events, int wake);

 private:
  // POSTs to the endpoints in turn until one answers other than with a server error (5xx: no
  // leader, say); an HTTP error status becomes an error carrying etcd's message (gRPC's NotFound
  // as kNotFound).
  Status call(std::string_view path, const std::string& body, std::string& response);

  const std::vector<HostPort> endpoints_;
  const std::chrono::nanoseconds timeout_;
};

}  // namespace ferry::core
