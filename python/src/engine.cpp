// ferry.Engine and ferry.Region: configuration, registration of any buffer-protocol or DLPack
// object without a copy, connecting, accepting, notifications.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cmath>

#include "bindings.hpp"

namespace ferry::python {
namespace {

using namespace nb::literals;

Duration seconds(double s, const char* what) {
  if (!(s >= 0) || !std::isfinite(s)) {
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + " must be >= 0 seconds");
  }
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

TransportKind transport_kind(const std::string& name) {
  if (std::optional<TransportKind> kind = transport_named(name)) return *kind;
  throw Error(ErrorCode::kInvalidArgument, "unknown transport '" + name + "'");
}

// The memory of `obj`: the buffer protocol first (NumPy, bytearray, memoryview, array), else
// DLPack (torch tensors). Refuses non-contiguous memory, and read-only memory where peers would
// write it.
void take_memory(PyRegion& r, nb::handle obj, Access access, void*& data, std::size_t& length) {
  bool remote_write = allows(access, Access::kRemoteWrite);
  if (PyObject_CheckBuffer(obj.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
      PyErr_Clear();
      if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_ANY_CONTIGUOUS) != 0) {
        PyErr_Clear();
        throw Error(ErrorCode::kInvalidArgument,
                    "register: the memory is not contiguous (copy it first, e.g. "
                    "numpy.ascontiguousarray or tensor.contiguous())");
      }
      if (remote_write) {
        PyBuffer_Release(&view);
        throw Error(ErrorCode::kInvalidArgument,
                    "register: the memory is read-only but remote write access was asked for");
      }
      r.read_only = true;
    }
    r.view = view;
    data = view.buf;
    length = static_cast<std::size_t>(view.len);
    return;
  }
  if (!nb::hasattr(obj, "__dlpack__")) {
    throw nb::type_error(
        "register: expected an object with the buffer protocol or __dlpack__ "
        "(a NumPy array, a torch tensor, a bytearray)");
  }
  nb::ndarray<> array;
  if (!nb::try_cast(obj, array, false)) {
    throw Error(ErrorCode::kInvalidArgument, "register: the object's DLPack export failed");
  }
  if (array.device_type() != nb::device::cpu::value) {
    throw Error(ErrorCode::kUnsupported, "register: only CPU memory can be registered so far");
  }
  // Contiguous in C order: each stride is the product of the sizes after it.
  int64_t expected = 1;
  for (std::size_t d = array.ndim(); d-- > 0;) {
    if (array.shape(d) != 1 && array.stride(d) != expected) {
      throw Error(ErrorCode::kInvalidArgument,
                  "register: the memory is not contiguous (tensor.contiguous() copies it)");
    }
    expected *= static_cast<int64_t>(array.shape(d));
  }
  r.owner = nb::cast(array);  // holds the DLPack export until deregistration
  data = array.data();
  length = array.nbytes();
}

}  // namespace

PyEngine::~PyEngine() {
  if (!engine) return;
  nb::gil_scoped_release unlocked;
  engine.reset();
}

PyRegion::~PyRegion() {
  if (!region.valid() && !view) return;
  if (nb::detail::cleanup_guard guard{}) deregister();
}

void PyRegion::deregister() {
  if (region.valid()) {
    nb::gil_scoped_release unlocked;  // waits for in-flight operations, whose callbacks need it
    region.deregister();
  }
  if (view) {
    PyBuffer_Release(&*view);
    view.reset();
  }
  owner = nb::object();
}

namespace {
// One entry of Engine(settings={...}): a str, int or bool value, as Engine::set takes it.
void apply_setting(Config& c, nb::handle name, nb::handle value) {
  if (!nb::isinstance<nb::str>(name)) throw nb::type_error("settings: names are str");
  std::string text;
  if (nb::isinstance<nb::bool_>(value)) {
    text = nb::cast<bool>(value) ? "true" : "false";
  } else if (nb::isinstance<nb::int_>(value)) {
    text = std::to_string(nb::cast<int64_t>(value));
  } else if (nb::isinstance<nb::str>(value)) {
    text = nb::cast<std::string>(value);
  } else {
    throw nb::type_error(("settings['" + nb::cast<std::string>(name) +
                          "']: a str, int or bool, not " +
                          nb::cast<std::string>(nb::str(value.type())))
                             .c_str());
  }
  try {
    Engine::set(c, nb::cast<std::string>(name), text);
  } catch (const Error& e) {
    raise_status(e.status());
  }
}
}  // namespace

void bind_engine(nb::module_& m) {
  nb::enum_<Access>(m, "Access", nb::is_flag(), "What a peer may do with a registered region.")
      .value("LOCAL", Access::kLocal, "only this engine uses it")
      .value("REMOTE_READ", Access::kRemoteRead)
      .value("REMOTE_WRITE", Access::kRemoteWrite)
      .value("REMOTE_READ_WRITE", Access::kRemoteReadWrite);

  nb::class_<ImmEvent>(m, "ImmEvent", "A write_with_imm notification.")
      .def_ro("peer_engine_id", &ImmEvent::peer_engine_id)
      .def_ro("imm", &ImmEvent::imm)
      .def_prop_ro(
          "peer_address", [](const ImmEvent& e) { return e.peer.address(); },
          "Where the connection it arrived on comes from.")
      .def_prop_ro("peer_incarnation", [](const ImmEvent& e) { return e.peer.incarnation(); })
      .def("__repr__", [](const ImmEvent& e) {
        return "ImmEvent(peer_engine_id=" + std::to_string(e.peer_engine_id) +
               ", imm=" + std::to_string(e.imm) + ")";
      });

  nb::class_<PyRegion>(m, "Region",
                       "Registered memory. Keeps the registered object and its engine alive; "
                       "deregister() (or dropping it) revokes peers' access and waits until no "
                       "operation touches the memory.")
      .def(
          "descriptor",
          [](const PyRegion& r) {
            std::vector<uint8_t> b = r.get().descriptor().encode();
            return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          "What a peer needs to access this region, as bytes; hand it over by any channel.")
      .def(
          "to_string", [](const PyRegion& r) { return r.get().descriptor().to_string(); },
          "The descriptor as printable text ('ferry1:...'); peers accept it where bytes go.")
      .def_prop_ro("size", [](const PyRegion& r) { return r.region.valid() ? r.region.size() : 0; })
      .def_prop_ro(
          "address",
          [](const PyRegion& r) {
            return reinterpret_cast<uintptr_t>(r.region.valid() ? r.region.data() : nullptr);
          })
      .def_prop_ro("access", [](const PyRegion& r) { return r.get().access(); })
      .def_prop_ro("read_only", [](const PyRegion& r) { return r.read_only; })
      .def_prop_ro("valid", [](const PyRegion& r) { return r.region.valid(); })
      .def_prop_ro(
          "obj", [](const PyRegion& r) { return r.owner.is_valid() ? r.owner : nb::none(); },
          "The registered object (None once deregistered).")
      .def("deregister", &PyRegion::deregister,
           "Revoke peers' access; returns once no operation touches the memory.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PyRegion& r, nb::args) { r.deregister(); });

  Config defaults;
  nb::class_<PyEngine>(m, "Engine",
                       "A Ferry engine: registers memory, connects to peers and accepts them.")
      .def(
          "__init__",
          [](PyEngine* self, bool listen, const std::string& listen_host, uint16_t listen_port,
             std::optional<std::vector<std::string>> transports, const std::string& secret,
             uint64_t engine_id, int progress_threads, const std::string& rdma_device,
             int rdma_gid_index, int verbs_qps, int tcp_streams, std::size_t slice_bytes,
             std::size_t stripe_threshold, double busy_poll, double wait_spin, double peer_timeout,
             double connect_timeout, std::size_t max_unexpected_bytes,
             std::size_t max_unexpected_messages, std::size_t max_unexpected_bytes_total,
             bool zero_copy_receives, std::size_t max_peers, std::size_t max_handshakes,
             int max_handshakes_per_source, std::size_t max_queued_imms,
             std::size_t max_queued_imms_total, double revoke_timeout, std::size_t tcp_eager_bytes,
             bool metrics, std::optional<nb::dict> settings) {
            Config c;
            c.listen = listen;
            c.listen_host = listen_host;
            c.listen_port = listen_port;
            if (transports) {
              c.transports.clear();
              for (const auto& t : *transports) c.transports.push_back(transport_kind(t));
            }
            c.secret = secret;
            c.engine_id = engine_id;
            c.progress_threads = progress_threads;
            c.verbs.device = rdma_device;
            c.verbs.gid_index = rdma_gid_index;
            c.verbs.qps = verbs_qps;
            c.tcp.streams = tcp_streams;
            c.slice_bytes = slice_bytes;
            c.stripe_threshold = stripe_threshold;
            c.busy_poll = seconds(busy_poll, "busy_poll");
            c.wait_spin = seconds(wait_spin, "wait_spin");
            c.peer_timeout = seconds(peer_timeout, "peer_timeout");
            c.connect_timeout = seconds(connect_timeout, "connect_timeout");
            c.max_unexpected_bytes = max_unexpected_bytes;
            c.max_unexpected_messages = max_unexpected_messages;
            c.max_unexpected_bytes_total = max_unexpected_bytes_total;
            c.verbs.zero_copy_receives = zero_copy_receives;
            c.max_peers = max_peers;
            c.max_handshakes = max_handshakes;
            c.max_handshakes_per_source = max_handshakes_per_source;
            c.max_queued_imms = max_queued_imms;
            c.max_queued_imms_total = max_queued_imms_total;
            c.revoke_timeout = seconds(revoke_timeout, "revoke_timeout");
            c.tcp.eager_bytes = tcp_eager_bytes;
            c.metrics = metrics;
            if (settings) {
              for (auto [name, value] : *settings) apply_setting(c, name, value);
            }
            std::unique_ptr<Engine> engine;
            {
              nb::gil_scoped_release unlocked;
              engine = std::make_unique<Engine>(c);
            }
            new (self) PyEngine{std::move(engine)};
          },
          nb::kw_only(), "listen"_a = defaults.listen, "listen_host"_a = defaults.listen_host,
          "listen_port"_a = defaults.listen_port, "transports"_a = nb::none(),
          "secret"_a = defaults.secret, "engine_id"_a = defaults.engine_id,
          "progress_threads"_a = defaults.progress_threads, "rdma_device"_a = defaults.verbs.device,
          "rdma_gid_index"_a = defaults.verbs.gid_index, "verbs_qps"_a = defaults.verbs.qps,
          "tcp_streams"_a = defaults.tcp.streams, "slice_bytes"_a = defaults.slice_bytes,
          "stripe_threshold"_a = defaults.stripe_threshold,
          "busy_poll"_a = std::chrono::duration<double>(defaults.busy_poll).count(),
          "wait_spin"_a = std::chrono::duration<double>(defaults.wait_spin).count(),
          "peer_timeout"_a = std::chrono::duration<double>(defaults.peer_timeout).count(),
          "connect_timeout"_a = std::chrono::duration<double>(defaults.connect_timeout).count(),
          "max_unexpected_bytes"_a = defaults.max_unexpected_bytes,
          "max_unexpected_messages"_a = defaults.max_unexpected_messages,
          "max_unexpected_bytes_total"_a = defaults.max_unexpected_bytes_total,
          "zero_copy_receives"_a = defaults.verbs.zero_copy_receives,
          "max_peers"_a = defaults.max_peers, "max_handshakes"_a = defaults.max_handshakes,
          "max_handshakes_per_source"_a = defaults.max_handshakes_per_source,
          "max_queued_imms"_a = defaults.max_queued_imms,
          "max_queued_imms_total"_a = defaults.max_queued_imms_total,
          "revoke_timeout"_a = std::chrono::duration<double>(defaults.revoke_timeout).count(),
          "tcp_eager_bytes"_a = defaults.tcp.eager_bytes, "metrics"_a = defaults.metrics,
          "settings"_a = nb::none(),
          "Settings as in ferry::Config (include/ferry/ferry.hpp); times in seconds. "
          "transports: names in order of preference, e.g. ['verbs', 'tcp']. settings: any "
          "transport setting by name, {'tcp.streams': 4, 'shm.stream_poll': '50us'} "
          "(ferry.settings() lists them), applied after the keywords.")
      .def_prop_ro(
          "address", [](const PyEngine& e) { return e.get().address(); },
          "'host:port' peers can connect to ('' when not listening).")
      .def_prop_ro("addresses", [](const PyEngine& e) { return e.get().addresses(); })
      .def_prop_ro("port", [](const PyEngine& e) { return e.get().port(); })
      .def_prop_ro("id", [](const PyEngine& e) { return e.get().id(); })
      .def_prop_ro("incarnation", [](const PyEngine& e) { return e.get().incarnation(); })
      .def_prop_ro(
          "stats",
          [](const PyEngine& e) {
            EngineStats s = e.get().stats();
            nb::dict d;
            d["peers"] = s.peers;
            d["peers_admitted"] = s.peers_admitted;
            d["pending_handshakes"] = s.pending_handshakes;
            d["refused_connections"] = s.refused_connections;
            d["accept_failures"] = s.accept_failures;
            return d;
          },
          "What the engine holds and refused: peers, pending_handshakes, refused_connections, "
          "accept_failures.")
      .def(
          "metrics",
          [](const PyEngine& e) {
            EngineMetrics m = e.get().metrics();
            nb::dict d;
            nb::list peers;
            for (const PeerMetrics& p : m.peers) peers.append(metrics_dict(p));
            d["peers"] = peers;
            d["peers_admitted"] = m.peers_admitted;
            d["refused_connections"] = m.refused_connections;
            return d;
          },
          "Every connected peer's operation counts (peers: a list of Peer.metrics dicts; "
          "latency holds counts of buckets whose bounds are ferry.LATENCY_BUCKET_BOUNDS_S), with "
          "peers_admitted and refused_connections.")
      .def(
          "prometheus", [](const PyEngine& e) { return e.get().metrics().prometheus(); },
          "The engine's metrics in Prometheus text format (what ferry --web serves at /metrics).")
      .def(
          "register",
          [](nb::handle self, nb::handle obj, Access access) {
            auto& engine = nb::cast<PyEngine&>(self);
            auto region = std::make_unique<PyRegion>();
            void* data = nullptr;
            std::size_t length = 0;
            take_memory(*region, obj, access, data, length);
            if (!region->owner.is_valid()) region->owner = nb::borrow(obj);
            region->engine = nb::borrow(self);
            try {
              region->region = engine.get().register_memory(data, length, access);
            } catch (...) {
              region->deregister();
              throw;
            }
            return region.release();
          },
          "obj"_a, "access"_a = Access::kLocal, nb::rv_policy::take_ownership,
          "Register the memory of `obj` (buffer protocol or DLPack: NumPy arrays, torch CPU "
          "tensors, bytearray) without copying it. The object stays alive while registered.")
      .def(
          "allocate",
          [](nb::handle self, std::size_t length, Access access) {
            auto& engine = nb::cast<PyEngine&>(self);
            auto region = std::make_unique<PyRegion>();
            region->engine = nb::borrow(self);
            {
              nb::gil_scoped_release unlocked;  // zeroing large memory takes a while
              region->region = engine.get().allocate(length, access);
            }
            // The array holds the memory, so it stays valid after deregistration (the bytes
            // are then this process's alone).
            auto* kept = new std::shared_ptr<void>(region->region.memory());
            nb::capsule holder(
                kept, [](void* p) noexcept { delete static_cast<std::shared_ptr<void>*>(p); });
            std::size_t shape[1] = {length};
            region->owner = nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(
                region->region.data(), 1, shape, holder));
            return region.release();
          },
          "length"_a, "access"_a = Access::kLocal, nb::rv_policy::take_ownership,
          "Allocate `length` zeroed bytes that the engine registers with `access`: a same-host "
          "peer maps them and copies with plain memcpy. Region.obj is a NumPy uint8 array over "
          "them, valid for as long as it lives, even after deregistration.")
      .def(
          "connect",
          [](nb::handle self, const std::string& address) {
            auto& engine = nb::cast<PyEngine&>(self);
            Peer peer;
            {
              nb::gil_scoped_release unlocked;
              peer = engine.get().connect(address);
            }
            return new PyPeer{std::move(peer), nb::borrow(self)};
          },
          "address"_a, nb::rv_policy::take_ownership,
          "Connect to the engine at 'host:port' (bounded by connect_timeout).")
      .def(
          "accept",
          [](nb::handle self, double timeout) -> std::optional<nb::object> {
            auto& engine = nb::cast<PyEngine&>(self);
            std::optional<Peer> peer;
            {
              nb::gil_scoped_release unlocked;
              peer = engine.get().accept(seconds(timeout, "timeout"));
            }
            if (!peer) return std::nullopt;
            return nb::cast(new PyPeer{std::move(*peer), nb::borrow(self)},
                            nb::rv_policy::take_ownership);
          },
          "timeout"_a, nb::sig("def accept(self, timeout: float) -> Peer | None"),
          "The next peer that connected, or None after `timeout` seconds.")
      .def(
          "next_imm",
          [](PyEngine& e, double timeout) {
            Duration t = seconds(timeout, "timeout");
            nb::gil_scoped_release unlocked;
            return e.get().next_imm(t);
          },
          "timeout"_a, "The next write_with_imm notification, or None after `timeout` seconds.")
      .def(
          "on_imm",
          [](PyEngine& e, nb::object fn) {
            if (fn.is_none()) {
              e.get().on_imm(nullptr);
              return;
            }
            auto ref = std::make_shared<SharedRef>(std::move(fn));
            e.get().on_imm([ref](const ImmEvent& event) {
              nb::detail::cleanup_guard guard{};
              if (!guard) return;
              try {
                ref->get()(event);
              } catch (nb::python_error& err) {
                err.discard_as_unraisable(ref->get());
              }
            });
          },
          "fn"_a.none(),
          "Deliver notifications to fn(ImmEvent) on a Ferry thread instead of next_imm(); "
          "None switches back. Exceptions fn raises go to sys.unraisablehook.")
      .def(
          "shutdown",
          [](PyEngine& e) {
            if (!e.engine) return;
            nb::gil_scoped_release unlocked;
            e.engine->shutdown();
          },
          "Cancel what is in flight, close every peer, stop Ferry's threads. Idempotent.")
      .def_static(
          "transports",
          [] {
            std::vector<nb::dict> out;
            for (const auto& t : Engine::transports()) {
              nb::dict d;
              d["name"] = std::string(to_string(t.kind));
              d["usable"] = t.usable;
              d["detail"] = t.detail;
              d["devices"] = t.devices;
              out.push_back(d);
            }
            return out;
          },
          "Transports compiled in and whether they are usable on this host, and why.")
      .def_static(
          "settings",
          [] {
            std::vector<nb::dict> out;
            for (const SettingInfo& s : Engine::settings()) {
              nb::dict d;
              d["name"] = s.name;
              d["type"] = s.type;
              d["value"] = s.value;
              d["default"] = s.default_value;
              d["range"] = s.range;
              d["environment"] = s.environment;
              d["help"] = s.help;
              out.push_back(d);
            }
            return out;
          },
          "Every transport setting: name, type, value (the environment applied), default, range, "
          "environment variable, help.");
}

}  // namespace ferry::python
