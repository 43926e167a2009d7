#include "transport/verbs/verbs_api.hpp"

#include <dlfcn.h>

#include <mutex>

namespace ferry::transport::verbs {

namespace {

struct Loaded {
  VerbsApi api;
  std::string why;
  bool ok = false;
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn& out, std::string& why) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (out == nullptr) why = std::string("libibverbs lacks ") + name;
  return out != nullptr;
}

Loaded load() {
  Loaded l;
  // Never closed: provider libraries loaded by libibverbs stay referenced for the process.
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    l.why = std::string("libibverbs.so.1 not loadable (install rdma-core / libibverbs1): ") +
            (err != nullptr ? err : "unknown error");
    return l;
  }
  VerbsApi& a = l.api;
  bool ok = bind(lib, "ibv_get_device_list", a.get_device_list, l.why) &&
            bind(lib, "ibv_free_device_list", a.free_device_list, l.why) &&
            bind(lib, "ibv_get_device_name", a.get_device_name, l.why) &&
            bind(lib, "ibv_open_device", a.open_device, l.why) &&
            bind(lib, "ibv_close_device", a.close_device, l.why) &&
            bind(lib, "ibv_query_device", a.query_device, l.why) &&
            bind(lib, "ibv_query_port", a.query_port, l.why) &&
            bind(lib, "ibv_query_gid", a.query_gid, l.why) &&
            bind(lib, "ibv_alloc_pd", a.alloc_pd, l.why) &&
            bind(lib, "ibv_dealloc_pd", a.dealloc_pd, l.why) &&
            bind(lib, "ibv_reg_mr", a.reg_mr, l.why) &&
            bind(lib, "ibv_dereg_mr", a.dereg_mr, l.why) &&
            bind(lib, "ibv_create_comp_channel", a.create_comp_channel, l.why) &&
            bind(lib, "ibv_destroy_comp_channel", a.destroy_comp_channel, l.why) &&
            bind(lib, "ibv_create_cq", a.create_cq, l.why) &&
            bind(lib, "ibv_destroy_cq", a.destroy_cq, l.why) &&
            bind(lib, "ibv_get_cq_event", a.get_cq_event, l.why) &&
            bind(lib, "ibv_ack_cq_events", a.ack_cq_events, l.why) &&
            bind(lib, "ibv_create_qp", a.create_qp, l.why) &&
            bind(lib, "ibv_destroy_qp", a.destroy_qp, l.why) &&
            bind(lib, "ibv_modify_qp", a.modify_qp, l.why) &&
            bind(lib, "ibv_create_srq", a.create_srq, l.why) &&
            bind(lib, "ibv_destroy_srq", a.destroy_srq, l.why) &&
            bind(lib, "ibv_wc_status_str", a.wc_status_str, l.why);
  if (!ok) return l;
  std::string ignored;
  bind(lib, "_ibv_query_gid_ex", a.query_gid_ex, ignored);
  bind(lib, "_ibv_query_gid_table", a.query_gid_table, ignored);
  bind(lib, "ibv_reg_mr_iova2", a.reg_mr_iova2, ignored);
  l.ok = true;
  return l;
}

}  // namespace

const VerbsApi* VerbsApi::get(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.ok) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace ferry::transport::verbs
