#include "core/etcd.hpp"

#include <charconv>
#include <nlohmann/json.hpp>

#include "core/base64.hpp"
#include "core/http.hpp"

namespace ferry::core {
namespace {
using nlohmann::json;

// gRPC's NotFound, as the gateway's error bodies carry it ("code": 5).
constexpr int kGrpcNotFound = 5;

// The gateway writes 64-bit integers as strings and leaves out those that are zero.
int64_t number(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  int64_t v = 0;
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return v;
  }
  throw std::invalid_argument(std::string(field) + ": not a number");
}

std::string bytes_of(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return {};
  auto decoded = base64_decode(it->get_ref<const std::string&>());
  if (!decoded) throw std::invalid_argument(std::string(field) + ": not base64");
  return {decoded->begin(), decoded->end()};
}

EtcdClient::KeyValue key_value(const json& j) {
  return {bytes_of(j, "key"), bytes_of(j, "value"), number(j, "mod_revision"), number(j, "lease")};
}

std::string text(int64_t v) { return std::to_string(v); }

json put_request(std::string_view key, std::string_view value, int64_t lease) {
  json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = text(lease);
  return put;
}

// A transaction that does `then` only if the key's entry is still the one of `mod_revision`
// (0: absent), else reads the entry.
json if_unchanged(std::string_view key, int64_t mod_revision, json then) {
  const std::string k = base64_encode(key);
  return {{"compare", json::array({{{"key", k},
                                    {"target", "MOD"},
                                    {"result", "EQUAL"},
                                    {"mod_revision", text(mod_revision)}}})},
          {"success", json::array({std::move(then)})},
          {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
}

// Parses etcd's answer, turning what the JSON library throws into a kProtocol error.
template <typename F>
Status parsed(std::string_view what, const std::string& response, F&& use) {
  try {
    use(json::parse(response));
    return {};
  } catch (const std::exception& e) {
    return {ErrorCode::kProtocol,
            "etcd " + std::string(what) + ": malformed answer (" + e.what() + ")"};
  }
}
}  // namespace

Status EtcdClient::parse_endpoints(std::string_view endpoints, std::vector<HostPort>& out) {
  out.clear();
  for (;;) {
    std::size_t comma = endpoints.find(',');
    std::string_view one = endpoints.substr(0, comma);
    HostPort hp;
    if (Status s = parse_http_url(one, hp); !s.ok()) return {s.code(), "etcd " + s.message()};
    out.push_back(std::move(hp));
    if (comma == std::string_view::npos) break;
    endpoints.remove_prefix(comma + 1);
  }
  return {};
}

Status EtcdClient::call(std::string_view path, const std::string& body, std::string& response) {
  Status last;
  for (const HostPort& endpoint : endpoints_) {
    int status = 0;
    last = http_post(endpoint, path, body, std::chrono::steady_clock::now() + timeout_,
                     kMaxResponseBytes, status, response);
    if (!last.ok()) continue;  // unreachable or cut off: the next endpoint may answer
    if (status / 100 == 2) return {};
    std::string message = "HTTP " + std::to_string(status);
    int code = 0;
    try {
      json j = json::parse(response);
      message = j.value("message", message);
      code = j.value("code", 0);
    } catch (const std::exception&) {
    }
    last = {code == kGrpcNotFound ? ErrorCode::kNotFound : ErrorCode::kProtocol,
            "etcd " + endpoint.to_string() + std::string(path) + ": " + message};
    if (status / 100 != 5) return last;  // a refusal; a server error may be this member's alone
  }
  return last;
}

Status EtcdClient::get(std::string_view key, std::optional<KeyValue>& out, int64_t* revision) {
  std::string response;
  json request = {{"key", base64_encode(key)}};
  if (Status s = call("/v3/kv/range", request.dump(), response); !s.ok()) return s;
  out.reset();
  return parsed("range", response, [&](const json& j) {
    if (revision != nullptr) *revision = number(j.at("header"), "revision");
    if (auto kvs = j.find("kvs"); kvs != j.end() && !kvs->empty()) out = key_value(kvs->at(0));
  });
}

Status EtcdClient::put(std::string_view key, std::string_view value, int64_t lease) {
  std::string response;
  return call("/v3/kv/put", put_request(key, value, lease).dump(), response);
}

Status EtcdClient::put_if(std::string_view key, std::string_view value, int64_t lease,
                          int64_t expected_mod_revision, bool& done,
                          std::optional<KeyValue>& current) {
  json request =
      if_unchanged(key, expected_mod_revision, {{"request_put", put_request(key, value, lease)}});
  std::string response;
  if (Status s = call("/v3/kv/txn", request.dump(), response); !s.ok()) return s;
  current.reset();
  return parsed("txn", response, [&](const json& j) {
    done = j.value("succeeded", false);
    if (done) return;
    const json& range = j.at("responses").at(0).at("response_range");
    if (auto kvs = range.find("kvs"); kvs != range.end() && !kvs->empty()) {
      current = key_value(kvs->at(0));
    }
  });
}

Status EtcdClient::remove(std::string_view key) {
  std::string response;
  json request = {{"key", base64_encode(key)}};
  return call("/v3/kv/deleterange", request.dump(), response);
}

Status EtcdClient::remove_if(std::string_view key, int64_t mod_revision, bool& done) {
  json request =
      if_unchanged(key, mod_revision, {{"request_delete_range", {{"key", base64_encode(key)}}}});
  std::string response;
  if (Status s = call("/v3/kv/txn", request.dump(), response); !s.ok()) return s;
  return parsed("txn", response, [&](const json& j) { done = j.value("succeeded", false); });
}

Status EtcdClient::grant_lease(std::chrono::seconds ttl, int64_t& lease) {
  std::string response;
  json request = {{"TTL", text(ttl.count())}};
  if (Status s = call("/v3/lease/grant", request.dump(), response); !s.ok()) return s;
  return parsed("lease grant", response, [&](const json& j) {
    lease = number(j, "ID");
    if (lease == 0) throw std::invalid_argument("no lease ID");
  });
}

Status EtcdClient::keep_alive(int64_t lease, int64_t& ttl_left) {
  std::string response;
  json request = {{"ID", text(lease)}};
  if (Status s = call("/v3/lease/keepalive", request.dump(), response); !s.ok()) return s;
  // One request on the stream gets one answer, on one line.
  return parsed("lease keepalive", response.substr(0, response.find('\n')),
                [&](const json& j) { ttl_left = number(j.at("result"), "TTL"); });
}

Status EtcdClient::revoke_lease(int64_t lease) {
  std::string response;
  json request = {{"ID", text(lease)}};
  Status s = call("/v3/lease/revoke", request.dump(), response);
  return s.code() == ErrorCode::kNotFound ? Status{} : s;
}

Status EtcdClient::watch(std::string_view key, int64_t from_revision,
                         const std::function<void(const std::vector<Event>&)>& on_events,
                         int wake) {
  json create = {{"key", base64_encode(key)}, {"start_revision", text(from_revision)}};
  const std::string body = json{{"create_request", create}}.dump();
  Status last{ErrorCode::kConnectFailed, "etcd watch: no endpoint"};
  for (const HostPort& endpoint : endpoints_) {
    HttpStream stream(kMaxResponseBytes);
    last =
        stream.open(endpoint, "/v3/watch", body, std::chrono::steady_clock::now() + timeout_, wake);
    if (last.code() == ErrorCode::kCancelled) return last;
    if (!last.ok()) continue;
    std::vector<Event> events;
    for (;;) {
      std::string line;
      // Waits for as long as nothing changes; a server gone silent is noticed by the stream's
      // TCP keepalive (core/http.cpp).
      if (Status s = stream.next_line(line, Deadline::max(), wake); !s.ok()) return s;
      if (line.empty()) continue;
      bool compacted = false;
      std::optional<std::string> canceled;
      Status s = parsed("watch", line, [&](const json& j) {
        if (auto error = j.find("error"); error != j.end()) {
          throw std::invalid_argument(error->dump());
        }
        const json& result = j.at("result");
        compacted = number(result, "compact_revision") != 0;
        if (result.value("canceled", false)) {
          canceled = result.value("cancel_reason", std::string("no reason given"));
        }
        events.clear();
        if (auto list = result.find("events"); list != result.end()) {
          for (const json& e : *list) {
            events.push_back({e.value("type", "PUT") == "DELETE", key_value(e.at("kv"))});
          }
        }
      });
      if (!s.ok()) return s;
      if (compacted) {
        return {ErrorCode::kOutOfBounds,
                "etcd watch: revision " + text(from_revision) + " was compacted"};
      }
      if (canceled) return {ErrorCode::kProtocol, "etcd watch: canceled (" + *canceled + ")"};
      if (!events.empty()) on_events(events);
    }
  }
  return last;
}

}  // namespace ferry::core
