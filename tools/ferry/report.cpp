#include "report.hpp"

#include <cstdio>

namespace ferry::cli {

ReportLine& ReportLine::number(std::string key, std::string label, double value, int decimals,
                               const std::string& unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  std::string shown = buf;
  if (!unit.empty()) shown += " " + unit;
  fields_.push_back({std::move(key), std::move(label), buf, std::move(shown)});
  return *this;
}

ReportLine& ReportLine::count(std::string key, std::string label, uint64_t value,
                              const std::string& unit) {
  std::string v = std::to_string(value);
  fields_.push_back({std::move(key), std::move(label), v, unit.empty() ? v : v + " " + unit});
  return *this;
}

ReportLine& ReportLine::text(std::string key, std::string label, const std::string& value) {
  fields_.push_back({std::move(key), std::move(label), json_string(value), value});
  return *this;
}

void ReportLine::print(std::ostream& out, bool json) const {
  char at[32];
  std::snprintf(at, sizeof at, "%.1f", seconds_);
  std::string line;
  if (json) {
    line = "{\"command\":" + json_string(who_) + ",\"kind\":" + json_string(kind_) +
           ",\"seconds\":" + at;
    for (const Field& f : fields_) line += ",\"" + f.key + "\":" + f.json;
    line += "}";
  } else {
    line = "ferry " + who_ + ": " + kind_ + " at " + at + " s:";
    const char* sep = " ";
    for (const Field& f : fields_) {
      line += sep + (f.label.empty() ? f.shown : f.label + " " + f.shown);
      sep = ", ";
    }
  }
  out << line << std::endl;
}

}  // namespace ferry::cli
