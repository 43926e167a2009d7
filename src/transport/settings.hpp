// A transport's settings, each declared once in its folder (its entry.cpp): name, type, default,
// range, help. Everything users see of a setting comes from that one declaration: its check
// when an engine starts, the environment variable FERRY_<TRANSPORT>_<NAME>, Engine::set and
// Engine::settings (so Python's `settings=` keyword and `ferry.settings()`), `ferry bench --set`
// and `ferry info`'s listing. A setting is kept in a typed field of Config where it has one (the
// typed face users write to, `config.tcp.streams`); one declared without a field is kept by
// name in Config::transport_settings, so a new setting needs no line outside its folder.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ferry/config.hpp"
#include "ferry/error.hpp"
#include "ferry/types.hpp"

namespace ferry::transport {

enum class SettingType : uint8_t {
  kBool,      // 0 / 1, true / false, on / off
  kCount,     // an integer
  kBytes,     // an integer with an optional K, M, G (binary) suffix
  kDuration,  // a number with a unit (ns, us, ms, s); a bare number is microseconds
  kText,
};

// A setting's value as the declaration reads and writes it: integers (durations in ns) or text.
struct SettingValue {
  int64_t number = 0;
  std::string text;
};

struct Setting {
  const char* name;  // lower_snake_case; the full name is "<transport>.<name>"
  SettingType type;
  const char* help;  // one line: what it does and what measurement chose its default
  int64_t min = 0;   // the range, inclusive (not for text); durations in ns
  int64_t max = 0;
  // Its typed field in Config, if it has one; both null: kept by name (transport_settings).
  SettingValue (*get)(const Config&) = nullptr;
  void (*set)(Config&, const SettingValue&) = nullptr;
  // The default, as text, for a setting without a field (one with a field takes Config{}'s).
  const char* default_text = "";
};

// A setting kept in the typed field `config.*Group.*Field` (a bool, an integer, a Duration or a
// std::string): `bound<&Config::tcp, &TcpConfig::streams>({"streams", SettingType::kCount, ...})`.
template <auto Group, auto Field>
constexpr Setting bound(Setting s) {
  s.get = [](const Config& c) {
    const auto& v = c.*Group.*Field;
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::string>) {
      return SettingValue{0, v};
    } else if constexpr (std::is_same_v<T, Duration>) {
      return SettingValue{v.count(), {}};
    } else {
      return SettingValue{static_cast<int64_t>(v), {}};
    }
  };
  s.set = [](Config& c, const SettingValue& value) {
    auto& v = c.*Group.*Field;
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::string>) {
      v = value.text;
    } else if constexpr (std::is_same_v<T, Duration>) {
      v = Duration(value.number);
    } else if constexpr (std::is_same_v<T, bool>) {
      v = value.number != 0;
    } else {
      v = static_cast<T>(value.number);
    }
  };
  return s;
}

// Every declared setting, transport by transport in transports.def order.
struct NamedSetting {
  std::string_view transport;
  const Setting* setting;
  std::string full_name() const { return std::string(transport) + "." + setting->name; }
};
std::vector<NamedSetting> declared_settings();
const Setting* find_setting(std::string_view full_name, std::string_view* transport = nullptr);

// "FERRY_TCP_STREAMS" for tcp.streams.
std::string environment_variable(std::string_view transport, const Setting& s);

// The value in `config` (its field, its entry by name, or its default), as text and typed.
std::string setting_text(const Config& config, std::string_view transport, const Setting& s);
SettingValue setting_value(const Config& config, std::string_view transport, const Setting& s);

// Parses `text` as the setting's type and range and stores it in `config`; kInvalidArgument
// naming the setting (and why) for a value it does not take.
Status set_setting(Config& config, std::string_view full_name, std::string_view text);
// Every setting's value within its range, else kInvalidArgument naming the first that is not.
Status check_settings(const Config& config);
// Applies each FERRY_<TRANSPORT>_<NAME> variable that is set; a bad value is kInvalidArgument
// naming the variable.
Status apply_setting_environment(Config& config);

// For listings: "count", "bytes", ...; "1..64" (empty for text and bool).
std::string_view setting_type_name(SettingType type);
std::string setting_range(const Setting& s);

// Reads a setting kept by name (transport_settings), as its type, for the transport's use.
int64_t number_setting(const Config& config, std::string_view transport, const Setting& s);
std::string text_setting(const Config& config, std::string_view transport, const Setting& s);

}  // namespace ferry::transport
