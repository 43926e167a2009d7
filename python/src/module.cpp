// The ferry._ferry extension module: the C++ library's API for Python (ferry/__init__.py
// re-exports it with the exception classes and asyncio support).
#include <nanobind/stl/string.h>

#include <limits>

#include "bindings.hpp"

NB_MODULE(_ferry, m) {
  using namespace ferry::python;
  m.doc() = "Ferry's C++ engine (use the ferry package, which re-exports it).";
  m.attr("__version__") = std::string(ferry::Engine::version());
  // References a Ferry thread still held when the interpreter wound down are leaked on purpose
  // (SharedRef): reporting them at every exit would only be noise.
  nb::set_leak_warnings(false);
  // Upper bounds of the latency buckets of metrics, in seconds; the last bucket has none.
  nanobind::list bounds;
  for (int b = 0; b < ferry::kLatencyBuckets - 1; ++b)
    bounds.append(static_cast<double>(ferry::latency_bucket_bound_ns(b)) * 1e-9);
  bounds.append(std::numeric_limits<double>::infinity());
  m.attr("LATENCY_BUCKET_BOUNDS_S") = bounds;
  register_errors(m);
  bind_config(m);
  bind_engine(m);
  bind_descriptor(m);
  bind_peer(m);
  bind_future(m);
  bind_log(m);
}
