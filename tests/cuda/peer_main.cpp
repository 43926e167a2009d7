// A second process for the CUDA tests: opens a legacy IPC handle another process exported and
// reads or writes through it, as a peer's transport will.
//
//   ferry_cuda_peer read  <handle hex> <offset> <length>   prints the bytes as hex
//   ferry_cuda_peer write <handle hex> <offset> <length> <byte>
//   ferry_cuda_peer open  <handle hex>                      prints "opened", holds the mapping
//                                                           until stdin ends
// Exits 0 on success; on a failed call prints "<call>: <CUDA error name>" and exits 2.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda.hpp"

namespace cuda = ferry::core::cuda;

namespace {

bool parse_handle(const char* hex, cuda::CUipcMemHandle& handle) {
  if (std::strlen(hex) != 2 * sizeof handle.reserved) return false;
  for (std::size_t i = 0; i < sizeof handle.reserved; ++i) {
    unsigned byte = 0;
    if (std::sscanf(hex + 2 * i, "%2x", &byte) != 1) return false;
    handle.reserved[i] = static_cast<char>(byte);
  }
  return true;
}

int fail(const cuda::Driver& d, const char* call, cuda::CUresult r) {
  const char* name = nullptr;
  d.get_error_name(r, &name);
  std::printf("%s: %s\n", call, name != nullptr ? name : "?");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 64;
  std::string why;
  const cuda::Driver* d = cuda::Driver::get(&why);
  if (d == nullptr) {
    std::printf("no driver: %s\n", why.c_str());
    return 3;
  }
  cuda::use_device(*d, 0);
  cuda::CUipcMemHandle handle{};
  if (!parse_handle(argv[2], handle)) return 64;
  cuda::CUdeviceptr base = 0;
  if (auto r = d->ipc_open_mem_handle(&base, handle, cuda::kIpcLazyEnablePeerAccess); r != 0)
    return fail(*d, "cuIpcOpenMemHandle", r);
  std::string verb = argv[1];
  if (verb == "open") {
    std::printf("opened\n");
    std::fflush(stdout);
    while (std::getchar() != EOF) {
    }
  } else if ((verb == "read" && argc == 5) || (verb == "write" && argc == 6)) {
    std::size_t offset = std::strtoull(argv[3], nullptr, 10);
    std::size_t length = std::strtoull(argv[4], nullptr, 10);
    std::vector<unsigned char> bytes(length);
    if (verb == "write") {
      std::memset(bytes.data(), static_cast<int>(std::strtol(argv[5], nullptr, 10)), length);
      if (auto r =
              d->memcpy(base + offset, reinterpret_cast<cuda::CUdeviceptr>(bytes.data()), length);
          r != 0)
        return fail(*d, "cuMemcpy", r);
    } else {
      if (auto r =
              d->memcpy(reinterpret_cast<cuda::CUdeviceptr>(bytes.data()), base + offset, length);
          r != 0)
        return fail(*d, "cuMemcpy", r);
      for (unsigned char b : bytes) std::printf("%02x", b);
      std::printf("\n");
    }
  } else {
    return 64;
  }
  if (auto r = d->ipc_close_mem_handle(base); r != 0) return fail(*d, "cuIpcCloseMemHandle", r);
  return 0;
}
