#include "transport/settings.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <initializer_list>
#include <cstdlib>
#include <limits>
#include <optional>

#include "transport/registry.hpp"

namespace ferry::transport {

namespace {

const char* type_name(SettingType t) {
  switch (t) {
    case SettingType::kBool:
      return "bool";
    case SettingType::kCount:
      return "count";
    case SettingType::kBytes:
      return "bytes";
    case SettingType::kDuration:
      return "duration";
    case SettingType::kText:
      return "text";
  }
  return "?";
}

std::optional<int64_t> parse_integer(std::string_view text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// `text` without the suffix `unit` (case-insensitive), if it ends so.
bool strip_suffix(std::string_view& text, std::string_view unit) {
  if (text.size() < unit.size()) return false;
  std::string_view tail = text.substr(text.size() - unit.size());
  for (std::size_t i = 0; i < unit.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(tail[i])) != unit[i]) return false;
  }
  text.remove_suffix(unit.size());
  return true;
}

// A number times the scale of its suffix, if it fits in 63 bits.
std::optional<int64_t> scaled(std::string_view text, int64_t scale) {
  std::optional<int64_t> n = parse_integer(text);
  if (!n || (*n != 0 && std::abs(*n) > std::numeric_limits<int64_t>::max() / scale)) {
    return std::nullopt;
  }
  return *n * scale;
}

std::optional<int64_t> parse_bytes(std::string_view text) {
  for (auto [unit, scale] : {std::pair<std::string_view, int64_t>{"kib", 1 << 10},
                             {"mib", 1 << 20},
                             {"gib", int64_t{1} << 30},
                             {"k", 1 << 10},
                             {"m", 1 << 20},
                             {"g", int64_t{1} << 30}}) {
    if (strip_suffix(text, unit)) return scaled(text, scale);
  }
  return parse_integer(text);
}

std::optional<int64_t> parse_duration_ns(std::string_view text) {
  for (auto [unit, scale] : {std::pair<std::string_view, int64_t>{"ns", 1},
                             {"us", 1000},
                             {"ms", 1000 * 1000},
                             {"s", 1000 * 1000 * 1000}}) {
    if (strip_suffix(text, unit)) return scaled(text, scale);
  }
  return scaled(text, 1000);  // microseconds
}

std::optional<bool> parse_bool(std::string_view text) {
  for (std::string_view yes : {"1", "true", "on", "yes"}) {
    if (text == yes) return true;
  }
  for (std::string_view no : {"0", "false", "off", "no"}) {
    if (text == no) return false;
  }
  return std::nullopt;
}

// `n` in the largest of `units` (scale, suffix; largest first) that divides it.
std::string in_units(int64_t n, std::initializer_list<std::pair<int64_t, const char*>> units) {
  if (n == 0) return "0";
  for (auto [scale, suffix] : units) {
    if (n % scale == 0) return std::to_string(n / scale) + suffix;
  }
  return std::to_string(n);
}

std::string format_number(SettingType type, int64_t n) {
  switch (type) {
    case SettingType::kBool:
      return n != 0 ? "true" : "false";
    case SettingType::kDuration:
      return in_units(n, {{1000 * 1000 * 1000, "s"}, {1000 * 1000, "ms"}, {1000, "us"}, {1, "ns"}});
    case SettingType::kBytes:
      return in_units(n, {{int64_t{1} << 30, "G"}, {1 << 20, "M"}, {1 << 10, "K"}, {1, ""}});
    default:
      return std::to_string(n);
  }
}

std::string range_text(const Setting& s) {
  if (s.type == SettingType::kText || s.type == SettingType::kBool) return {};
  return format_number(s.type, s.min) + ".." + format_number(s.type, s.max);
}

// The value `text` stands for, or an error saying what the setting takes.
Status parse(const Setting& s, std::string_view full_name, std::string_view text,
             SettingValue& out) {
  std::optional<int64_t> n;
  switch (s.type) {
    case SettingType::kText:
      out.text = std::string(text);
      return {};
    case SettingType::kBool:
      if (std::optional<bool> b = parse_bool(text)) n = *b ? 1 : 0;
      break;
    case SettingType::kCount:
      n = parse_integer(text);
      break;
    case SettingType::kBytes:
      n = parse_bytes(text);
      break;
    case SettingType::kDuration:
      n = parse_duration_ns(text);
      break;
  }
  if (!n) {
    return {ErrorCode::kInvalidArgument,
            std::string(full_name) + ": '" + std::string(text) + "' is not a " + type_name(s.type)};
  }
  out.number = *n;
  return {};
}

Status in_range(const Setting& s, std::string_view full_name, const SettingValue& v) {
  if (s.type == SettingType::kText || s.type == SettingType::kBool) return {};
  if (v.number >= s.min && v.number <= s.max) return {};
  return {ErrorCode::kInvalidArgument, std::string(full_name) + " must be " + range_text(s) +
                                           " (is " + format_number(s.type, v.number) + ")"};
}

const std::string* kept_by_name(const Config& config, std::string_view full_name) {
  for (const auto& [name, value] : config.transport_settings) {
    if (name == full_name) return &value;
  }
  return nullptr;
}

}  // namespace

std::vector<NamedSetting> declared_settings() {
  std::vector<NamedSetting> out;
  for (const TransportEntry* e : registered_transports()) {
    for (const Setting& s : e->settings) out.push_back({e->name, &s});
  }
  return out;
}

const Setting* find_setting(std::string_view full_name, std::string_view* transport) {
  for (const NamedSetting& n : declared_settings()) {
    if (n.full_name() != full_name) continue;
    if (transport != nullptr) *transport = n.transport;
    return n.setting;
  }
  return nullptr;
}

std::string environment_variable(std::string_view transport, const Setting& s) {
  std::string out = "FERRY_" + std::string(transport) + "_" + s.name;
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

SettingValue setting_value(const Config& config, std::string_view transport, const Setting& s) {
  if (s.get != nullptr) return s.get(config);
  std::string full = std::string(transport) + "." + s.name;
  const std::string* kept = kept_by_name(config, full);
  SettingValue v;
  // Stored values were parsed when set; the declared default parses by construction.
  (void)parse(s, full, kept != nullptr ? *kept : std::string_view(s.default_text), v);
  return v;
}

std::string setting_text(const Config& config, std::string_view transport, const Setting& s) {
  SettingValue v = setting_value(config, transport, s);
  return s.type == SettingType::kText ? v.text : format_number(s.type, v.number);
}

int64_t number_setting(const Config& config, std::string_view transport, const Setting& s) {
  return setting_value(config, transport, s).number;
}

std::string text_setting(const Config& config, std::string_view transport, const Setting& s) {
  return setting_value(config, transport, s).text;
}

Status set_setting(Config& config, std::string_view full_name, std::string_view text) {
  std::string_view transport;
  const Setting* s = find_setting(full_name, &transport);
  if (s == nullptr) {
    std::string known;
    for (const NamedSetting& n : declared_settings()) {
      known += (known.empty() ? "" : ", ") + n.full_name();
    }
    return {ErrorCode::kInvalidArgument,
            "no setting named '" + std::string(full_name) + "' (known: " + known + ")"};
  }
  SettingValue v;
  if (Status st = parse(*s, full_name, text, v); !st.ok()) return st;
  if (Status st = in_range(*s, full_name, v); !st.ok()) return st;
  if (s->set != nullptr) {
    s->set(config, v);
    return {};
  }
  std::string value = s->type == SettingType::kText ? v.text : std::string(text);
  for (auto& [name, kept] : config.transport_settings) {
    if (name == full_name) {
      kept = value;
      return {};
    }
  }
  config.transport_settings.emplace_back(std::string(full_name), value);
  return {};
}

Status check_settings(const Config& config) {
  for (const NamedSetting& n : declared_settings()) {
    if (Status s =
            in_range(*n.setting, n.full_name(), setting_value(config, n.transport, *n.setting));
        !s.ok()) {
      return s;
    }
  }
  for (const auto& [name, value] : config.transport_settings) {
    std::string_view transport;
    const Setting* s = find_setting(name, &transport);
    if (s == nullptr) return {ErrorCode::kInvalidArgument, "no setting named '" + name + "'"};
    SettingValue v;
    if (Status st = parse(*s, name, value, v); !st.ok()) return st;
  }
  return {};
}

Status apply_setting_environment(Config& config) {
  for (const NamedSetting& n : declared_settings()) {
    std::string variable = environment_variable(n.transport, *n.setting);
    const char* value = std::getenv(variable.c_str());
    if (value == nullptr) continue;
    if (Status s = set_setting(config, n.full_name(), value); !s.ok()) {
      return {s.code(), variable + "=\"" + value + "\": " + s.message()};
    }
  }
  return {};
}

std::string_view setting_type_name(SettingType type) { return type_name(type); }
std::string setting_range(const Setting& s) { return range_text(s); }

}  // namespace ferry::transport
