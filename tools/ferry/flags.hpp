// Helpers that declare a command's flags: each flag's text goes through a parser that throws
// CLI::ValidationError naming the flag (options.hpp's *_value functions).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "options.hpp"

namespace ferry::cli {

// A flag whose text `parse(flag, text)` turns into `out`.
template <class T, class Parse>
CLI::Option* add(CLI::App& app, const std::string& flag, T& out, Parse parse,
                 const std::string& help) {
  return app.add_option_function<std::string>(
      flag, [flag, &out, parse](const std::string& text) { out = parse(flag, text); }, help);
}

inline auto count(int lo, int hi) {
  return [lo, hi](const std::string& flag, const std::string& text) {
    return int_value(flag, text, lo, hi);
  };
}

inline auto bytes(uint64_t lo, uint64_t hi) {
  return [lo, hi](const std::string& flag, const std::string& text) {
    return size_value(flag, text, lo, hi);
  };
}

inline auto address(bool listen) {
  return [listen](const std::string& flag, const std::string& text) {
    return address_value(flag, text, listen);
  };
}

}  // namespace ferry::cli
