// ferry.Peer and ferry.Prepared: one-sided batches (single entries or page-table arrays),
// prepared batches, tagged messages.
#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace ferry::python {
namespace {

using namespace nb::literals;

PyFuture* wrap(Future f, nb::handle peer, nb::object uses) {
  return new PyFuture{std::move(f), nb::borrow(peer), std::move(uses)};
}

enum class OneSided { kWrite, kRead, kWriteImm };

// The Region passed as `parameter` of `call`; anything else is a TypeError naming both (a
// NumPy array or bytearray is registered first, with Engine.register).
const PyRegion& region_argument(nb::handle obj, const char* call, const char* parameter) {
  PyRegion* region = nullptr;
  if (!nb::try_cast<PyRegion*>(obj, region, false) || region == nullptr) {
    std::string given = nb::cast<std::string>(nb::str(obj.type().attr("__name__")));
    throw nb::type_error((std::string(call) + "(): " + parameter +
                          " must be a ferry.Region (Engine.register or Engine.allocate makes "
                          "one), not " +
                          given)
                             .c_str());
  }
  return *region;
}

constexpr const char* name_of(OneSided kind) {
  return kind == OneSided::kWrite ? "write" : kind == OneSided::kRead ? "read" : "write_with_imm";
}

// Runs a one-sided operation (or prepares it) with the GIL released while posting.
template <typename Post>
auto one_sided(nb::handle self, const PyRegion& local, nb::handle remote, nb::handle local_offset,
               nb::handle remote_offset, nb::handle length, OneSided kind, Post&& post) {
  Batch batch;
  build_batch(local, remote, local_offset, remote_offset, length, kind == OneSided::kRead, batch);
  const Peer& peer = nb::cast<PyPeer&>(self).peer;
  nb::gil_scoped_release unlocked;
  return post(peer, batch.transfers());
}

constexpr const char* kBatchDoc =
    "local: a Region; remote: a peer's descriptor: a ferry.Descriptor (decoded once: the fast "
    "path), or the bytes / str it came as. local_offset, remote_offset "
    "and length are ints, or 1-D integer arrays (NumPy, torch) of one length for a page-table "
    "batch, where an int applies to every entry; length defaults to the rest of `local`. ";

template <OneSided kind>
PyFuture* post_one_sided(nb::handle self, nb::handle local_obj, nb::handle remote, uint32_t imm,
                         nb::handle local_offset, nb::handle remote_offset, nb::handle length) {
  const PyRegion& local = region_argument(local_obj, name_of(kind), "local");
  Future f = one_sided(self, local, remote, local_offset, remote_offset, length, kind,
                       [&](const Peer& peer, std::span<const Transfer> batch) {
                         if constexpr (kind == OneSided::kWrite) return peer.write(batch);
                         if constexpr (kind == OneSided::kRead) return peer.read(batch);
                         return peer.write_with_imm(batch, imm);
                       });
  return wrap(std::move(f), self, nb::borrow(local_obj));
}

template <OneSided kind>
PyPrepared* prepare_one_sided(nb::handle self, nb::handle local_obj, nb::handle remote,
                              uint32_t imm, nb::handle local_offset, nb::handle remote_offset,
                              nb::handle length) {
  const std::string call = std::string("prepare_") + name_of(kind);
  const PyRegion& local = region_argument(local_obj, call.c_str(), "local");
  Prepared p = one_sided(self, local, remote, local_offset, remote_offset, length, kind,
                         [&](const Peer& peer, std::span<const Transfer> batch) {
                           if constexpr (kind == OneSided::kWrite) return peer.prepare_write(batch);
                           if constexpr (kind == OneSided::kRead) return peer.prepare_read(batch);
                           return peer.prepare_write_with_imm(batch, imm);
                         });
  return new PyPrepared{std::move(p), nb::borrow(self), nb::borrow(local_obj)};
}

uint64_t rest_of(const Region& r, uint64_t offset, nb::handle length) {
  if (!length.is_none()) return nb::cast<uint64_t>(length);
  return offset < r.size() ? r.size() - offset : 0;
}

// send() or, with `receive`, recv(): `length` is the message length or the receive capacity.
template <bool receive>
PyFuture* message(nb::handle self, uint64_t tag, nb::handle region_obj, uint64_t offset,
                  nb::handle length) {
  const PyRegion& region = region_argument(region_obj, receive ? "recv" : "send", "region");
  const Region& r = region.get();
  if (receive && region.read_only)
    throw Error(ErrorCode::kInvalidArgument, "recv: the region is read-only");
  uint64_t len = rest_of(r, offset, length);
  const Peer& peer = nb::cast<PyPeer&>(self).peer;
  Future f;
  {
    nb::gil_scoped_release unlocked;
    f = receive ? peer.recv(tag, r, offset, len) : peer.send(tag, r, offset, len);
  }
  return wrap(std::move(f), self, nb::borrow(region_obj));
}

}  // namespace

nb::dict metrics_dict(const PeerMetrics& m) {
  nb::dict d;
  d["engine_id"] = m.engine_id;
  d["address"] = m.address;
  d["imms_received"] = m.imms_received;
  nb::dict transports;
  for (const TransportMetrics& t : m.transports) {
    nb::dict kinds;
    for (int k = 0; k < kOperationKinds; ++k) {
      const OperationMetrics& o = t.operations[static_cast<std::size_t>(k)];
      nb::dict op;
      op["succeeded"] = o.succeeded;
      op["failed"] = o.failed;
      op["bytes"] = o.bytes;
      op["in_flight"] = o.in_flight;
      nb::list latency;
      for (uint64_t n : o.latency) latency.append(n);
      op["latency"] = latency;
      op["latency_sum_s"] = static_cast<double>(o.latency_sum_ns) * 1e-9;
      kinds[to_string(static_cast<OperationKind>(k))] = op;
    }
    nb::dict errors;
    for (const auto& [code, n] : t.errors) errors[to_string(code)] = n;
    kinds["errors"] = errors;
    transports[std::string(to_string(t.transport)).c_str()] = kinds;
  }
  d["transports"] = transports;
  return d;
}

void bind_peer(nb::module_& m) {
  auto peer = nb::class_<PyPeer>(m, "Peer",
                                 "A connected peer. Either side may start operations; every "
                                 "method may be called from any thread.");
  auto one_sided_args = [](auto&& cls, const char* name, auto fn, const char* doc, bool imm) {
    if (imm) {
      cls.def(name, fn, "local"_a, "remote"_a, "imm"_a, nb::kw_only(), "local_offset"_a = 0,
              "remote_offset"_a = 0, "length"_a = nb::none(), doc);
    } else {
      cls.def(
          name,
          [fn](nb::handle self, nb::handle local, nb::handle remote, nb::handle lo, nb::handle ro,
               nb::handle len) { return fn(self, local, remote, 0, lo, ro, len); },
          "local"_a, "remote"_a, nb::kw_only(), "local_offset"_a = 0, "remote_offset"_a = 0,
          "length"_a = nb::none(), doc);
    }
  };
  static const std::string write_doc =
      std::string("Write local bytes into the peer's region. ") + kBatchDoc + "Returns a Future.";
  static const std::string read_doc =
      std::string("Read the peer's region into local memory. ") + kBatchDoc + "Returns a Future.";
  static const std::string imm_doc =
      std::string(
          "Like write(); the peer's engine then yields `imm` (next_imm, notifications) "
          "once every byte is visible there. ") +
      kBatchDoc;
  static const std::string prep_doc =
      std::string(
          "Check and plan the batch once; Prepared.post() posts it, any number of "
          "times. Raises what the operation would fail with. ") +
      kBatchDoc;
  one_sided_args(peer, "write", &post_one_sided<OneSided::kWrite>, write_doc.c_str(), false);
  one_sided_args(peer, "read", &post_one_sided<OneSided::kRead>, read_doc.c_str(), false);
  one_sided_args(peer, "write_with_imm", &post_one_sided<OneSided::kWriteImm>, imm_doc.c_str(),
                 true);
  one_sided_args(peer, "prepare_write", &prepare_one_sided<OneSided::kWrite>, prep_doc.c_str(),
                 false);
  one_sided_args(peer, "prepare_read", &prepare_one_sided<OneSided::kRead>, prep_doc.c_str(),
                 false);
  one_sided_args(peer, "prepare_write_with_imm", &prepare_one_sided<OneSided::kWriteImm>,
                 prep_doc.c_str(), true);

  peer.def("send", &message<false>, "tag"_a, "region"_a, "offset"_a = 0, "length"_a = nb::none(),
           "Send `length` bytes (default: the rest of the region) as a message with `tag`. "
           "Completes once the peer took or buffered it.")
      .def("recv", &message<true>, "tag"_a, "region"_a, "offset"_a = 0, "capacity"_a = nb::none(),
           "Receive the next message with `tag` into the region; Future.bytes is its length.")
      .def(
          "region_named",
          [](const PyPeer& p, const std::string& name) {
            Descriptor d;
            {
              nb::gil_scoped_release unlocked;
              d = p.peer.region_named(name);
            }
            return PyDescriptor{std::move(d)};
          },
          "name"_a,
          "The descriptor of the peer's region published under `name` (Region.publish), as a "
          "ferry.Descriptor; NotFound when it has none.")
      .def_prop_ro("engine_id", [](const PyPeer& p) { return p.peer.engine_id(); })
      .def_prop_ro("incarnation", [](const PyPeer& p) { return p.peer.incarnation(); })
      .def_prop_ro("public_key", [](const PyPeer& p) { return p.peer.public_key(); })
      .def_prop_ro("address", [](const PyPeer& p) { return p.peer.address(); })
      .def_prop_ro("transport",
                   [](const PyPeer& p) { return std::string(to_string(p.peer.transport())); })
      .def_prop_ro(
          "reach", [](const PyPeer& p) { return std::string(to_string(p.peer.reach())); },
          "'same process', 'same host' or 'other host', as the handshake showed.")
      .def_prop_ro(
          "routes",
          [](const PyPeer& p) {
            nb::list out;
            for (const RouteInfo& r : p.peer.routes()) {
              nb::dict d;
              d["operations"] = r.operations;
              d["local"] = std::string(to_string(r.local));
              d["remote"] = std::string(to_string(r.remote));
              d["transport"] =
                  r.transport ? nb::cast(std::string(to_string(*r.transport))) : nb::none();
              d["why"] = r.why;
              out.append(d);
            }
            return out;
          },
          "Which transport each class of operation takes, and why: a list of dicts.")
      .def_prop_ro("connected", [](const PyPeer& p) { return p.peer.connected(); })
      .def_prop_ro("stats",
                   [](const PyPeer& p) {
                     PeerStats s = p.peer.stats();
                     nb::dict d;
                     nb::dict channels;  // by transport name
                     for (const ChannelStats& c : s.channels) {
                       nb::dict ch;
                       ch["lanes"] = c.lanes;
                       ch["messages_sent"] = c.messages_sent;
                       ch["messages_received"] = c.messages_received;
                       ch["messages_zero_copy"] = c.messages_zero_copy;
                       ch["messages_compact"] = c.messages_compact;
                       channels[std::string(to_string(c.transport)).c_str()] = ch;
                     }
                     d["channels"] = channels;
                     nb::list paths;  // same-host transfers sent either way (PathStats)
                     for (const PathStats& ps : s.paths) {
                       nb::dict p;
                       p["transfers"] = ps.transfers;
                       p["from_bytes"] = ps.from_bytes;
                       p["bounced"] = ps.bounced;
                       p["direct"] = ps.direct;
                       p["bounced_mb_per_s"] = ps.bounced_mb_per_s;
                       p["direct_mb_per_s"] = ps.direct_mb_per_s;
                       paths.append(p);
                     }
                     d["paths"] = paths;
                     d["unexpected_messages"] = s.unexpected_messages;
                     d["unexpected_bytes"] = s.unexpected_bytes;
                     return d;
                   })
      .def_prop_ro(
          "metrics", [](const PyPeer& p) { return metrics_dict(p.peer.metrics()); },
          "Its operations' counts per transport (a dict; see Engine.metrics).")
      .def(
          "close",
          [](PyPeer& p) {
            nb::gil_scoped_release unlocked;
            p.peer.close();
          },
          "Fail in-flight operations with Cancelled and close the connection.");

  nb::class_<PyPrepared>(m, "Prepared", "A one-sided batch checked once, posted many times.")
      .def(
          "post",
          [](PyPrepared& p) {
            Future f;
            {
              nb::gil_scoped_release unlocked;
              f = p.prepared.post();
            }
            return new PyFuture{std::move(f), p.peer, p.uses};
          },
          nb::rv_policy::take_ownership,
          "Post the batch again; each post has its own Future and may overlap with others.");
}

}  // namespace ferry::python
