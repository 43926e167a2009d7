// `ferry bench`: the two-process transfer benchmark.
#pragma once

#include <string>

#include "options.hpp"

namespace ferry::cli {

// Options already checked (check_bench_options). Throws on failure; a failure the target
// reported reads "target: <its reason>".
int run_bench(const BenchOptions& options, const std::string& self_path);

}  // namespace ferry::cli
