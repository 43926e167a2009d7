// ferry.Config: the engine's own settings as attributes (times in seconds), every transport's
// declared setting by name, and how Engine(config, **keywords) reads its keywords.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "bindings.hpp"

namespace ferry::python {

Duration seconds(double s, const char* what) {
  if (!(s >= 0) || !std::isfinite(s)) {
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + " must be >= 0 seconds");
  }
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

namespace {

using namespace nb::literals;

double in_seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

TransportKind transport_kind(const std::string& name) {
  if (std::optional<TransportKind> kind = transport_named(name)) return *kind;
  throw Error(ErrorCode::kInvalidArgument, "unknown transport '" + name + "'");
}

// A transport setting by its declared name: a str, int or bool value, as Engine::set takes it.
void set_setting(Config& c, const std::string& name, nb::handle value) {
  std::string text;
  if (nb::isinstance<nb::bool_>(value)) {
    text = nb::cast<bool>(value) ? "true" : "false";
  } else if (nb::isinstance<nb::int_>(value)) {
    text = std::to_string(nb::cast<int64_t>(value));
  } else if (nb::isinstance<nb::str>(value)) {
    text = nb::cast<std::string>(value);
  } else {
    throw nb::type_error(("settings['" + name + "']: a str, int or bool, not " +
                          nb::cast<std::string>(nb::str(value.type())))
                             .c_str());
  }
  try {
    Engine::set(c, name, text);
  } catch (const Error& e) {
    raise_status(e.status());
  }
}

// The declared setting a keyword names: "tcp_streams" is "tcp.streams" (none: "").
std::string setting_of_keyword(const std::string& keyword) {
  for (const SettingInfo& s : Engine::settings()) {
    std::string as_keyword = s.name;
    std::replace(as_keyword.begin(), as_keyword.end(), '.', '_');
    if (as_keyword == keyword) return s.name;
  }
  return {};
}

// An engine-wide setting in seconds, as a read-write attribute.
template <Duration Config::*field>
void duration_attribute(nb::class_<Config>& cls, const char* name, const char* doc) {
  cls.def_prop_rw(
      name, [](const Config& c) { return in_seconds(c.*field); },
      [name](Config& c, double s) { c.*field = seconds(s, name); }, doc);
}

}  // namespace

Config config_from(nb::handle base, const nb::kwargs& keywords) {
  Config c = base.is_none() ? Config{} : nb::cast<Config>(base);
  nb::object view = nb::cast(&c, nb::rv_policy::reference);
  for (auto [key, value] : keywords) {
    std::string name = nb::cast<std::string>(key);
    if (name == "settings") {
      if (value.is_none()) continue;
      if (!nb::isinstance<nb::dict>(value)) throw nb::type_error("settings: a dict");
      for (auto [setting, v] : nb::borrow<nb::dict>(value)) {
        if (!nb::isinstance<nb::str>(setting)) throw nb::type_error("settings: names are str");
        set_setting(c, nb::cast<std::string>(setting), v);
      }
    } else if (nb::hasattr(view, name.c_str())) {
      nb::setattr(view, name.c_str(), value);
    } else if (std::string setting = setting_of_keyword(name); !setting.empty()) {
      set_setting(c, setting, value);
    } else {
      throw nb::type_error(("unexpected keyword argument '" + name +
                            "' (ferry.Config's attributes and ferry.settings() list the names)")
                               .c_str());
    }
  }
  return c;
}

void bind_config(nb::module_& m) {
  nb::class_<Config> cls(
      m, "Config",
      "An engine's settings (ferry::Config, include/ferry/config.hpp): the engine's own as "
      "attributes, times in seconds; transport settings with set(name, value), as "
      "ferry.settings() lists them. Config(**keywords) and Engine(config, **keywords) (which "
      "takes a copy) apply keywords: attribute names, transport settings as "
      "<transport>_<name> (tcp_streams=4), or settings={'tcp.streams': 4}.");
  cls.def(
         "__init__",
         [](Config* self, const nb::kwargs& keywords) {
           new (self) Config(config_from(nb::none(), keywords));
         },
         "keywords"_a, nb::sig("def __init__(self, **keywords) -> None"),
         "The defaults, then `keywords` as Engine() takes them.")
      .def("__copy__", [](const Config& c) { return Config(c); })
      .def_rw("listen", &Config::listen, "accept peers (False: only connect)")
      .def_rw("listen_host", &Config::listen_host)
      .def_rw("listen_port", &Config::listen_port, "0: any free port")
      .def_prop_rw(
          "transports",
          [](const Config& c) {
            std::vector<std::string> names;
            for (TransportKind k : c.transports) names.emplace_back(to_string(k));
            return names;
          },
          [](Config& c, const std::vector<std::string>& names) {
            std::vector<TransportKind> kinds;
            for (const auto& n : names) kinds.push_back(transport_kind(n));
            c.transports = std::move(kinds);
          },
          "names in order of preference, e.g. ['verbs', 'tcp']")
      .def_rw("transports_from_environment", &Config::transports_from_environment)
      .def_rw("settings_from_environment", &Config::settings_from_environment)
      .def_rw("secret", &Config::secret)
      .def_rw("identity_file", &Config::identity_file)
      .def_rw("trusted_keys", &Config::trusted_keys)
      .def_rw("progress_threads", &Config::progress_threads)
      .def_rw("slice_bytes", &Config::slice_bytes)
      .def_rw("stripe_threshold", &Config::stripe_threshold)
      .def_rw("staging_chunk_bytes", &Config::staging_chunk_bytes)
      .def_rw("staging_chunks", &Config::staging_chunks)
      .def_rw("metrics", &Config::metrics)
      .def_rw("max_unexpected_bytes", &Config::max_unexpected_bytes)
      .def_rw("max_unexpected_messages", &Config::max_unexpected_messages)
      .def_rw("max_unexpected_bytes_total", &Config::max_unexpected_bytes_total)
      .def_rw("max_peers", &Config::max_peers)
      .def_rw("max_handshakes", &Config::max_handshakes)
      .def_rw("max_handshakes_per_source", &Config::max_handshakes_per_source)
      .def_rw("max_peers_per_source", &Config::max_peers_per_source)
      .def_rw("max_joining_per_source", &Config::max_joining_per_source)
      .def_rw("max_queued_imms", &Config::max_queued_imms)
      .def_rw("max_queued_imms_total", &Config::max_queued_imms_total)
      .def_rw("etcd", &Config::etcd, "etcd's 'http://host:port' for discovery ('': none)")
      .def_rw("etcd_prefix", &Config::etcd_prefix, "every key in etcd starts with it")
      .def(
          "set",
          [](Config& c, const std::string& name, nb::handle value) { set_setting(c, name, value); },
          "name"_a, "value"_a, "Sets a transport setting by name ('tcp.streams', 4).")
      .def(
          "settings",
          [](const Config& c) {
            nb::dict out;
            for (const SettingInfo& s : Engine::settings(c)) out[s.name.c_str()] = s.value;
            return out;
          },
          "Every transport setting's value in this config, by name, as text.");
  duration_attribute<&Config::busy_poll>(cls, "busy_poll", "progress threads spin this long");
  duration_attribute<&Config::wait_spin>(cls, "wait_spin", "Future.wait spins this long");
  duration_attribute<&Config::peer_timeout>(cls, "peer_timeout", "silence before a peer is lost");
  duration_attribute<&Config::connect_timeout>(cls, "connect_timeout", "bounds connect()");
  duration_attribute<&Config::revoke_timeout>(cls, "revoke_timeout",
                                              "deregister() waits this long for accesses");
  duration_attribute<&Config::etcd_ttl>(cls, "etcd_ttl",
                                        "published names outlive a dead engine this long");
  duration_attribute<&Config::etcd_timeout>(cls, "etcd_timeout", "bounds each request to etcd");
}

}  // namespace ferry::python
