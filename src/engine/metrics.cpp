// The Prometheus text form of EngineMetrics (exposition format 0.0.4).
#include "ferry/metrics.hpp"

#include <cinttypes>
#include <cstdio>

namespace ferry {

namespace {

// A label value: backslash, double quote and line feed escaped.
void append_escaped(std::string& out, std::string_view value) {
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

std::string peer_labels(const PeerMetrics& p) {
  char id[17];
  std::snprintf(id, sizeof id, "%016" PRIx64, p.engine_id);
  std::string s = "peer=\"";
  s += id;
  s += "\",address=\"";
  append_escaped(s, p.address);
  s += '"';
  return s;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, std::string_view name, const std::string& labels, uint64_t value) {
  out += name;
  out += '{';
  out += labels;
  out += "} ";
  out += std::to_string(value);
  out += '\n';
}

// Calls fn(labels, operation metrics) for each kind of operation each transport of each peer
// carried (kinds never used are left out: none completed or in flight).
template <typename Fn>
void each_operation(const EngineMetrics& m, Fn&& fn) {
  for (const PeerMetrics& p : m.peers) {
    std::string peer = peer_labels(p);
    for (const TransportMetrics& t : p.transports) {
      for (int k = 0; k < kOperationKinds; ++k) {
        const OperationMetrics& o = t.operations[static_cast<std::size_t>(k)];
        if (o.succeeded + o.failed + o.in_flight == 0) continue;
        std::string labels = peer + ",transport=\"" + std::string(to_string(t.transport)) +
                             "\",kind=\"" + to_string(static_cast<OperationKind>(k)) + '"';
        fn(labels, o);
      }
    }
  }
}

template <typename Fn>
void each_transport(const EngineMetrics& m, Fn&& fn) {
  for (const PeerMetrics& p : m.peers) {
    std::string peer = peer_labels(p);
    for (const TransportMetrics& t : p.transports) {
      fn(peer + ",transport=\"" + std::string(to_string(t.transport)) + '"', t);
    }
  }
}

}  // namespace

std::string EngineMetrics::prometheus() const {
  std::string out;
  family(out, "ferry_operations_total", "counter",
         "Operations completed, by peer, transport, kind and outcome.");
  each_operation(*this, [&](const std::string& labels, const OperationMetrics& o) {
    sample(out, "ferry_operations_total", labels + ",outcome=\"succeeded\"", o.succeeded);
    sample(out, "ferry_operations_total", labels + ",outcome=\"failed\"", o.failed);
  });
  family(out, "ferry_bytes_total", "counter", "Bytes moved by the operations that succeeded.");
  each_operation(*this, [&](const std::string& labels, const OperationMetrics& o) {
    sample(out, "ferry_bytes_total", labels, o.bytes);
  });
  family(out, "ferry_operation_latency_seconds", "histogram",
         "Time from the call that started an operation to its completion.");
  each_operation(*this, [&](const std::string& labels, const OperationMetrics& o) {
    uint64_t cumulative = 0;
    for (int b = 0; b < kLatencyBuckets - 1; ++b) {
      cumulative += o.latency[static_cast<std::size_t>(b)];
      sample(
          out, "ferry_operation_latency_seconds_bucket",
          labels + ",le=\"" + number(static_cast<double>(latency_bucket_bound_ns(b)) * 1e-9) + '"',
          cumulative);
    }
    cumulative += o.latency[kLatencyBuckets - 1];
    sample(out, "ferry_operation_latency_seconds_bucket", labels + ",le=\"+Inf\"", cumulative);
    out += "ferry_operation_latency_seconds_sum{" + labels + "} " +
           number(static_cast<double>(o.latency_sum_ns) * 1e-9) + '\n';
    sample(out, "ferry_operation_latency_seconds_count", labels, cumulative);
  });
  family(out, "ferry_errors_total", "counter", "Failed operations by error code.");
  each_transport(*this, [&](const std::string& labels, const TransportMetrics& t) {
    for (const auto& [code, n] : t.errors) {
      sample(out, "ferry_errors_total", labels + ",code=\"" + to_string(code) + '"', n);
    }
  });
  family(out, "ferry_in_flight_operations", "gauge",
         "Operations posted and not yet complete (receives: waiting for their messages).");
  each_operation(*this, [&](const std::string& labels, const OperationMetrics& o) {
    sample(out, "ferry_in_flight_operations", labels, o.in_flight);
  });
  family(out, "ferry_imms_received_total", "counter",
         "write_with_imm notifications that arrived from the peer.");
  for (const PeerMetrics& p : peers)
    sample(out, "ferry_imms_received_total", peer_labels(p), p.imms_received);
  family(out, "ferry_peers", "gauge", "Peers connected now.");
  out += "ferry_peers " + std::to_string(peers.size()) + '\n';
  family(out, "ferry_peers_admitted_total", "counter", "Peers that connected to this engine.");
  out += "ferry_peers_admitted_total " + std::to_string(peers_admitted) + '\n';
  family(out, "ferry_refused_connections_total", "counter",
         "Handshakes refused, evicted, timed out or failed.");
  out += "ferry_refused_connections_total " + std::to_string(refused_connections) + '\n';
  return out;
}

}  // namespace ferry
