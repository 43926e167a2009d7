// ferry.Engine and ferry.Region: configuration, registration of any buffer-protocol or DLPack
// object without a copy, connecting, accepting, notifications.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stop_token>
#include <thread>

#include "bindings.hpp"

namespace ferry::python {
namespace {

using namespace nb::literals;

// The memory of `obj`: the buffer protocol first (NumPy, bytearray, memoryview, array), else
// DLPack (torch tensors). Refuses non-contiguous memory, and read-only memory where peers would
// write it.
// What registering memory holds until the registration has ended: the buffer export (the
// exporter cannot resize meanwhile) and the memory's owner. Dropped by the engine after the
// deregistration, on whichever thread ended it (another than the caller's for a region dropped
// in a callback), so no operation still touches memory the owner may free.
class MemoryHold {
 public:
  MemoryHold(std::optional<Py_buffer> view, nb::object owner)
      : view_(view), owner_(std::move(owner)) {}
  ~MemoryHold() {
    if (!view_) return;
    if (nb::detail::cleanup_guard guard{}) PyBuffer_Release(&*view_);
  }
  MemoryHold(const MemoryHold&) = delete;
  MemoryHold& operator=(const MemoryHold&) = delete;

 private:
  std::optional<Py_buffer> view_;
  SharedRef owner_;
};

// Whether `obj` says (__dlpack_device__) its memory is not the CPU's: such an object may still
// offer the buffer protocol (nanobind's arrays do) and refuse it, so DLPack is asked instead.
bool on_device(nb::handle obj) {
  if (!nb::hasattr(obj, "__dlpack_device__")) return false;
  nb::object said = obj.attr("__dlpack_device__")();
  nb::tuple where;
  int type = 0;
  return nb::try_cast(said, where) && where.size() == 2 && nb::try_cast(where[0], type) &&
         type != nb::device::cpu::value;
}

void take_memory(PyRegion& r, nb::handle obj, Access access, void*& data, std::size_t& length,
                 std::optional<Py_buffer>& taken) {
  bool remote_write = allows(access, Access::kRemoteWrite);
  if (!on_device(obj) && PyObject_CheckBuffer(obj.ptr())) {
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
    taken = view;
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
  const int32_t device = array.device_type();
  if (device != nb::device::cpu::value && device != nb::device::cuda::value &&
      device != nb::device::cuda_host::value) {
    throw Error(ErrorCode::kUnsupported,
                "register: memory of DLPack device type " + std::to_string(device) +
                    " cannot be registered (CPU, CUDA and CUDA host memory can)");
  }
  if (device == nb::device::cuda::value) r.expected = Memory::cuda(array.device_id());
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
  if (!region.valid()) return;
  nb::gil_scoped_release unlocked;
  Region gone = std::move(region);
}

void PyRegion::deregister() {
  if (region.valid()) {
    nb::gil_scoped_release unlocked;  // waits for in-flight operations, whose callbacks need it
    region.deregister();
  }
  owner = nb::object();
}

namespace {

// Access, ImmEvent and Region.
void bind_region(nb::module_& m) {
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
      .def_prop_ro(
          "location", [](const PyRegion& r) { return to_string(r.get().location()); },
          "Where the memory is: 'host' or 'cuda:N'.")
      .def_prop_ro("read_only", [](const PyRegion& r) { return r.read_only; })
      .def_prop_ro("valid", [](const PyRegion& r) { return r.region.valid(); })
      .def_prop_ro(
          "obj", [](const PyRegion& r) { return r.owner.is_valid() ? r.owner : nb::none(); },
          "The registered object (None once deregistered).")
      .def(
          "publish",
          [](const PyRegion& r, const std::string& name) {
            const Region& region = r.get();
            nb::gil_scoped_release unlocked;
            region.publish(name);
          },
          "name"_a,
          "Publish the descriptor under `name` among the engine's names in etcd, for "
          "Peer.region_named (Config.etcd); it leaves with the region.")
      .def("deregister", &PyRegion::deregister,
           "Revoke peers' access; returns once no operation touches the memory.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PyRegion& r, nb::args) { r.deregister(); });
}

// What an engine holds and has counted.
void bind_state(nb::class_<PyEngine>& cls) {
  cls.def_prop_ro(
         "address", [](const PyEngine& e) { return e.get().address(); },
         "'host:port' peers can connect to ('' when not listening).")
      .def_prop_ro("addresses", [](const PyEngine& e) { return e.get().addresses(); })
      .def_prop_ro("port", [](const PyEngine& e) { return e.get().port(); })
      .def_prop_ro("id", [](const PyEngine& e) { return e.get().id(); })
      .def_prop_ro("incarnation", [](const PyEngine& e) { return e.get().incarnation(); })
      .def_prop_ro("public_key", [](const PyEngine& e) { return e.get().public_key(); })
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
          "The engine's metrics in Prometheus text format (what ferry --web serves at /metrics).");
}

// Registration and allocation: regions that keep their memory's owner and the engine alive.
void bind_memory(nb::class_<PyEngine>& cls) {
  cls.def(
         "register",
         [](nb::handle self, nb::handle obj, Access access) {
           auto& engine = nb::cast<PyEngine&>(self);
           auto region = std::make_unique<PyRegion>();
           void* data = nullptr;
           std::size_t length = 0;
           std::optional<Py_buffer> view;
           take_memory(*region, obj, access, data, length, view);
           if (!region->owner.is_valid()) region->owner = nb::borrow(obj);
           region->engine = nb::borrow(self);
           auto hold = std::make_shared<MemoryHold>(view, region->owner);
           region->region = engine.get().register_memory(data, length, access, std::move(hold));
           // The engine tells memory kinds apart by asking the CUDA driver; a CUDA export it
           // takes for host memory would be touched by the CPU, so the two must agree.
           if (region->expected && region->region.location() != *region->expected) {
             std::string said = to_string(region->region.location());
             region->deregister();
             throw Error(ErrorCode::kInvalidArgument, "register: DLPack says the memory is on " +
                                                          to_string(*region->expected) +
                                                          " but the CUDA driver says " + said);
           }
           return region.release();
         },
         "obj"_a, "access"_a = Access::kLocal, nb::rv_policy::take_ownership,
         "Register the memory of `obj` (buffer protocol or DLPack: NumPy arrays, torch CPU and "
         "CUDA tensors, bytearray) without copying it. The object stays alive while registered. "
         "Transfers do not wait for work queued on the object's CUDA streams: synchronize "
         "before posting one that reads what a kernel writes.")
      .def(
          "allocate",
          [](nb::handle self, std::size_t length, Access access, const std::string& memory) {
            auto& engine = nb::cast<PyEngine&>(self);
            Memory where = parse_memory(memory);
            auto region = std::make_unique<PyRegion>();
            region->engine = nb::borrow(self);
            {
              nb::gil_scoped_release unlocked;  // zeroing large memory takes a while
              region->region = engine.get().allocate(length, access, where);
            }
            // The array holds the memory, so it stays valid after deregistration (the bytes
            // are then this process's alone).
            auto* kept = new std::shared_ptr<void>(region->region.memory());
            nb::capsule holder(
                kept, [](void* p) noexcept { delete static_cast<std::shared_ptr<void>*>(p); });
            std::size_t shape[1] = {length};
            if (where.kind == MemoryKind::kHost) {
              region->owner = nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(
                  region->region.data(), 1, shape, holder));
            } else {
              region->owner = nb::cast(nb::ndarray<nb::array_api, uint8_t, nb::ndim<1>>(
                  region->region.data(), 1, shape, holder, nullptr, nb::dtype<uint8_t>(),
                  nb::device::cuda::value, where.device));
            }
            return region.release();
          },
          "length"_a, "access"_a = Access::kLocal, "memory"_a = "host",
          nb::rv_policy::take_ownership,
          "Allocate `length` zeroed bytes that the engine registers with `access`, in host "
          "memory or on a GPU (memory='cuda:0'). For host memory a same-host peer maps them and "
          "copies with plain memcpy; Region.obj is a NumPy uint8 array over them, for GPU memory "
          "a DLPack array (torch.from_dlpack takes it). It stays valid for as long as it lives, "
          "even after deregistration.");
}

// `dial(stop)` (Engine::connect or connect_named) on a thread of its own, so that this one can
// take signals: Ctrl-C stops it (the thread's stop token) and waits for it to end, which it does
// at once.
template <typename Dial>
PyPeer* dial_interruptibly(nb::handle engine, Dial dial) {
  Peer peer;
  std::exception_ptr failed;
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  {
    std::jthread dialing([&](std::stop_token stop) {
      try {
        peer = dial(stop);
      } catch (...) {
        failed = std::current_exception();
      }
      std::lock_guard lock(mu);
      finished = true;
      cv.notify_all();
    });
    try {
      wait_interruptibly(Clock::time_point::max(), [&](Duration slice) {
        std::unique_lock lock(mu);
        return cv.wait_for(lock, slice, [&] { return finished; });
      });
    } catch (...) {
      dialing.request_stop();
      {
        nb::gil_scoped_release unlocked;  // a name lookup under way cannot be stopped
        dialing.join();
      }
      throw;
    }
  }
  if (failed) std::rethrow_exception(failed);
  return new PyPeer{std::move(peer), nb::borrow(engine)};
}

// A watch of a name (Engine.watch): its callback takes the GIL on the watch's thread.
struct PyWatch {
  Watch watch;
  // Both wait for a callback under way, which needs the GIL.
  ~PyWatch() { stop(); }
  void stop() {
    // Taken with the GIL held, so that two Python threads stopping it never share the handle.
    Watch taken = std::move(watch);
    if (!taken.valid()) return;
    nb::gil_scoped_release unlocked;
    taken.stop();
  }
};

// Discovery through etcd: publishing, resolving, connecting and watching by name.
void bind_directory(nb::module_& m, nb::class_<PyEngine>& cls) {
  nb::class_<NamedEngine>(m, "NamedEngine", "An engine as etcd knows it by name.")
      .def_ro("name", &NamedEngine::name)
      .def_ro("engine_id", &NamedEngine::engine_id, "0: no engine holds the name")
      .def_ro("incarnation", &NamedEngine::incarnation)
      .def_ro("addresses", &NamedEngine::addresses)
      .def_ro("public_key", &NamedEngine::public_key)
      .def_prop_ro("present", &NamedEngine::present)
      .def("__repr__", [](const NamedEngine& e) {
        return "NamedEngine(name=" + e.name + ", engine_id=" + std::to_string(e.engine_id) +
               ", incarnation=" + std::to_string(e.incarnation) + ")";
      });
  nb::class_<PyWatch>(m, "Watch", "A watch of a name in etcd (Engine.watch).")
      .def("stop", &PyWatch::stop, "End it, waiting for a callback under way.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PyWatch& w, nb::args) { w.stop(); });
  cls.def(
         "publish",
         [](const PyEngine& e, const std::string& name) {
           Engine& engine = e.get();
           nb::gil_scoped_release unlocked;
           engine.publish(name);
         },
         "name"_a,
         "Publish this engine under `name` in etcd (Config.etcd) while it lives; AlreadyExists "
         "when another engine holds it.")
      .def(
          "unpublish",
          [](const PyEngine& e, const std::string& name) {
            Engine& engine = e.get();
            nb::gil_scoped_release unlocked;
            engine.unpublish(name);
          },
          "name"_a, "Remove this engine's entry under `name`.")
      .def(
          "resolve",
          [](const PyEngine& e, const std::string& name) {
            Engine& engine = e.get();
            nb::gil_scoped_release unlocked;
            return engine.resolve(name);
          },
          "name"_a, "The engine published under `name`; NotFound when none is.")
      .def(
          "connect_named",
          [](nb::handle self, const std::string& name) {
            Engine& engine = nb::cast<PyEngine&>(self).get();
            return dial_interruptibly(self, [&](const std::stop_token& stop) {
              return engine.connect_named(name, stop);
            });
          },
          "name"_a, nb::rv_policy::take_ownership,
          "Connect to the engine published under `name`, checking it is the engine published.")
      .def(
          "watch",
          [](const PyEngine& e, const std::string& name, nb::object fn) {
            auto call = std::make_shared<SharedRef>(std::move(fn));
            Engine& engine = e.get();
            nb::gil_scoped_release unlocked;
            return new PyWatch{engine.watch(name, [call](const NamedEngine& named) {
              nb::detail::cleanup_guard guard{};
              if (!guard) return;  // the interpreter is gone
              try {
                call->get()(named);
              } catch (nb::python_error& err) {
                err.discard_as_unraisable(call->get());
              }
            })};
          },
          "name"_a, "fn"_a, nb::rv_policy::take_ownership,
          "Call fn(NamedEngine) on a thread of the watch's own with the name's entry now and at "
          "each change (present False once it is gone). Exceptions fn raises go to "
          "sys.unraisablehook.");
}

void bind_peers(nb::class_<PyEngine>& cls) {
  cls.def(
         "connect",
         [](nb::handle self, const std::string& address) {
           Engine& engine = nb::cast<PyEngine&>(self).get();
           return dial_interruptibly(
               self, [&](const std::stop_token& stop) { return engine.connect(address, stop); });
         },
         "address"_a, nb::rv_policy::take_ownership,
         "Connect to the engine at 'host:port' (bounded by connect_timeout).")
      .def(
          "accept",
          [](nb::handle self, double timeout) -> std::optional<nb::object> {
            auto& engine = nb::cast<PyEngine&>(self);
            std::optional<Peer> peer;
            wait_interruptibly(deadline_after(seconds(timeout, "timeout")), [&](Duration slice) {
              peer = engine.get().accept(slice);
              return peer.has_value();
            });
            if (!peer) return std::nullopt;
            return nb::cast(new PyPeer{std::move(*peer), nb::borrow(self)},
                            nb::rv_policy::take_ownership);
          },
          "timeout"_a, nb::sig("def accept(self, timeout: float) -> Peer | None"),
          "The next peer that connected, or None after `timeout` seconds.");
}

// An engine's notifications handed to an asyncio event loop in batches (ferry.Notifications):
// queued on the Ferry thread that delivers them, without the GIL.
class Notifier {
 public:
  explicit Notifier(nb::handle engine) : engine_(nb::borrow(engine)) {
    nb::cast<PyEngine&>(engine_).get().on_imm(
        [queue = queue_](const ImmEvent& event) { queue->push(event); });
  }
  int fileno() const { return queue_->fileno(); }
  std::vector<ImmEvent> drain() { return queue_->take(); }
  // Notifications go back to next_imm(); one delivered meanwhile still comes out of drain().
  void close() {
    auto& engine = nb::cast<PyEngine&>(engine_);
    if (engine.engine) engine.engine->on_imm(nullptr);
  }

 private:
  nb::object engine_;  // PyEngine
  // Shared with the callback, which a delivery under way may still hold after close().
  std::shared_ptr<LoopQueue<ImmEvent>> queue_ = std::make_shared<LoopQueue<ImmEvent>>();
};

// Notifications, and shutdown.
void bind_notifications(nb::module_& m, nb::class_<PyEngine>& cls) {
  nb::class_<Notifier>(m, "Notifier",
                       "An engine's notifications for one asyncio event loop, in batches: wait "
                       "for fileno() to be readable, drain() them.")
      .def(nb::init<nb::handle>(), "engine"_a)
      .def("fileno", &Notifier::fileno)
      .def("drain", &Notifier::drain, "The notifications delivered since the last call.")
      .def("close", &Notifier::close, "Switch the engine's notifications back to next_imm().");

  cls.def(
         "next_imm",
         [](PyEngine& e, double timeout) {
           std::optional<ImmEvent> event;
           wait_interruptibly(deadline_after(seconds(timeout, "timeout")), [&](Duration slice) {
             event = e.get().next_imm(slice);
             return event.has_value();
           });
           return event;
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
          "Cancel what is in flight, close every peer, stop Ferry's threads. Idempotent.");
}

// What is compiled in and what can be set, without an engine.
void bind_listings(nb::class_<PyEngine>& cls) {
  cls.def_static(
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

}  // namespace

void bind_engine(nb::module_& m) {
  bind_region(m);
  nb::class_<PyEngine> cls(m, "Engine",
                           "A Ferry engine: registers memory, connects to peers and accepts them.");
  cls.def(
      "__init__",
      [](PyEngine* self, nb::handle config, const nb::kwargs& keywords) {
        Config c = config_from(config, keywords);
        std::unique_ptr<Engine> engine;
        {
          nb::gil_scoped_release unlocked;
          engine = std::make_unique<Engine>(c);
        }
        new (self) PyEngine{std::move(engine)};
      },
      "config"_a = nb::none(), "keywords"_a,
      nb::sig("def __init__(self, config: Config | None = None, /, **keywords) -> None"),
      "An engine with `config` (a ferry.Config; None: the defaults), then `keywords`: any "
      "Config attribute (listen=False, transports=['verbs', 'tcp'], peer_timeout=5.0), any "
      "transport setting as <transport>_<name> (tcp_streams=4), or settings={'tcp.streams': 4, "
      "'shm.stream_poll': '50us'} (ferry.settings() lists them).");
  bind_state(cls);
  bind_memory(cls);
  bind_peers(cls);
  bind_directory(m, cls);
  bind_notifications(m, cls);
  bind_listings(cls);
}

}  // namespace ferry::python
