// `ferry stream`, what its two sides share: the engine's configuration, errors, progress lines.
#include "stream_wire.hpp"

#include <stdexcept>

namespace ferry::cli::stream {

void check(const Status& s, const std::string& what) {
  if (!s.ok()) throw std::runtime_error(what + ": " + s.to_string());
}

Config engine_config(const StreamOptions& o) {
  Config c;
  if (o.listen) {
    c.listen_host = o.listen->host;
    c.listen_port = o.listen->port;
  }
  if (o.transport != "auto") {
    c.transports = {*transport_named(o.transport)};
    c.transports_from_environment = false;
  }
  c.secret = o.secret;
  return c;
}

ReportLine Meter::line(const std::string& who, const std::string& kind, bool since_last,
                       const char* wait_label) {
  auto now = Clock::now();
  double s = seconds_between(since_last ? last : start, now);
  uint64_t b = since_last ? bytes - bytes_at_last : bytes;
  uint64_t w = since_last ? waited_ns - waited_at_last : waited_ns;
  ReportLine r(who, kind, seconds_between(start, now));
  r.number("mb_per_s", "", s > 0 ? static_cast<double>(b) / s / 1e6 : 0, 1, "MB/s")
      .count("total_bytes", "total", bytes, "bytes")
      .count("chunks", "chunks", chunks)
      .number(std::string(wait_label) + "_ms", wait_label, static_cast<double>(w) / 1e6, 1, "ms");
  if (since_last) {
    last = now;
    bytes_at_last = bytes;
    waited_at_last = waited_ns;
  }
  return r;
}

}  // namespace ferry::cli::stream
