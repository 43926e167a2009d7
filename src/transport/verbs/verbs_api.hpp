// libibverbs, loaded at run time: the same binary runs on hosts without RDMA devices or
// without libibverbs installed; then load() says why verbs is unavailable.
//
// Only the exported functions below are called through pointers. The data-path calls
// (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are inline in verbs.h and go
// through the device context's ops table, so they need no symbol from the library.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace ferry::transport::verbs {

struct VerbsApi {
  ibv_device** (*get_device_list)(int*) = nullptr;
  void (*free_device_list)(ibv_device**) = nullptr;
  const char* (*get_device_name)(ibv_device*) = nullptr;
  ibv_context* (*open_device)(ibv_device*) = nullptr;
  int (*close_device)(ibv_context*) = nullptr;
  int (*query_device)(ibv_context*, ibv_device_attr*) = nullptr;
  int (*query_port)(ibv_context*, uint8_t, _compat_ibv_port_attr*) = nullptr;
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*) = nullptr;
  // Optional (rdma-core >= 32): GID type without reading sysfs, and every valid GID in one
  // call (rxe's table has 1024 entries; asking for each slowed every engine's setup in the guest:
  // docs/performance-history.md, "Where a ping-pong round goes, and what came off it").
  int (*query_gid_ex)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t) = nullptr;
  ssize_t (*query_gid_table)(ibv_context*, ibv_gid_entry*, size_t, uint32_t, size_t) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context*) = nullptr;
  int (*dealloc_pd)(ibv_pd*) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int) = nullptr;
  // Optional: registration with optional access flags such as relaxed ordering.
  ibv_mr* (*reg_mr_iova2)(ibv_pd*, void*, size_t, uint64_t, unsigned int) = nullptr;
  int (*dereg_mr)(ibv_mr*) = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context*) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel*) = nullptr;
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroy_cq)(ibv_cq*) = nullptr;
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**) = nullptr;
  void (*ack_cq_events)(ibv_cq*, unsigned int) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*destroy_qp)(ibv_qp*) = nullptr;
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  ibv_srq* (*create_srq)(ibv_pd*, ibv_srq_init_attr*) = nullptr;
  int (*destroy_srq)(ibv_srq*) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status) = nullptr;

  // The process-wide table, loaded once; null with `why` set when unavailable.
  static const VerbsApi* get(std::string* why = nullptr);
};

}  // namespace ferry::transport::verbs
