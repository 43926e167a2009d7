// The lines `ferry emulate` and `ferry stream` print while they run and at the end: the same
// fields as text for people or as one JSON object per line (--json) for programs.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "info.hpp"  // json_string

namespace ferry::cli {

class ReportLine {
 public:
  // `who`: the command ("emulate", "stream send", ...); `kind`: "progress" or "summary";
  // `seconds`: since the command started its work.
  ReportLine(std::string who, std::string kind, double seconds)
      : who_(std::move(who)), kind_(std::move(kind)), seconds_(seconds) {}
  // A number: `key` in JSON, "label value unit" in text.
  ReportLine& number(std::string key, std::string label, double value, int decimals,
                     const std::string& unit = "");
  ReportLine& count(std::string key, std::string label, uint64_t value,
                    const std::string& unit = "");
  ReportLine& text(std::string key, std::string label, const std::string& value);
  void print(std::ostream& out, bool json) const;

 private:
  struct Field {
    std::string key, label, json, shown;
  };
  std::string who_, kind_;
  double seconds_;
  std::vector<Field> fields_;
};

}  // namespace ferry::cli
