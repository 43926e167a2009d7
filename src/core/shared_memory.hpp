// Memory the engine allocates for a region (Engine::allocate): an anonymous memory file
// (memfd), sealed at its size and mapped shared, so that a same-host transport can hand its
// descriptor to a peer that maps the same pages.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/net.hpp"
#include "ferry/error.hpp"

namespace ferry::core {

// Huge pages are asked for from this size up: below it a 2 MiB page would mostly hold padding.
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// A memory file named `name` (flags add to memfd_create's) of `size` bytes, sealed at that size
// (a peer that maps it never sees it shrink under its mapping), mapped shared and writable.
// `only_this_mapping_writes` seals it against every later write (F_SEAL_FUTURE_WRITE): whoever
// else maps it, by whatever descriptor, maps it read-only.
Status map_memory_file(const char* name, unsigned flags, std::size_t size, Fd& fd, uint8_t*& base,
                       bool only_this_mapping_writes = false);

class SharedMemory {
 public:
  // `length` bytes (> 0), zeroed. From kHugePageBytes up, in huge pages: explicit ones
  // (hugetlbfs) where the host reserved some, else transparent ones where the kernel allows them
  // for shared memory (advised); plain pages otherwise. `only_we_write`: nobody else can ever
  // write it (map_memory_file), for memory that grants no remote write. Errors name the failed
  // call.
  static Status create(std::size_t length, SharedMemory& out, bool only_we_write);

  SharedMemory() = default;
  // Held in place by its region's record: never moved or copied.
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  ~SharedMemory();

  uint8_t* data() const { return base_; }
  // Gives up the memory file and keeps the bytes at the same address, in private memory shared
  // with nobody: whoever else still maps the file keeps its own pages from then on. One copy.
  Status detach();
  // The memory file: what a peer maps (same size, same pages).
  int fd() const { return fd_.get(); }

 private:
  void reset();
  Fd fd_;
  uint8_t* base_ = nullptr;
  std::size_t mapped_ = 0;  // the whole mapping, a multiple of its page size
};

}  // namespace ferry::core
