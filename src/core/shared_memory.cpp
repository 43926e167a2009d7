#include "core/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/log.hpp"
#include "core/sys.hpp"

namespace ferry::core {

namespace {

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }
constexpr const char* kRegionFileName = "ferry-region";  // tests find regions' mappings by it

}  // namespace

Status map_memory_file(const char* name, unsigned flags, std::size_t size, Fd& fd, uint8_t*& base,
                       bool only_this_mapping_writes) {
  fd = Fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | flags));
  if (!fd.valid()) return sys_status("memfd_create", errno, ErrorCode::kResourceExhausted);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return sys_status("ftruncate memfd", errno, ErrorCode::kResourceExhausted);
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return sys_status("mmap memfd", errno, ErrorCode::kResourceExhausted);
  // Its size is fixed: a peer that maps it can never see it shrink under its mapping. Sealed
  // against future writes, the kernel refuses every writable shared mapping and write() made
  // from now on, through any descriptor of the file, however reopened (/proc/PID/fd/N).
  int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (only_this_mapping_writes) seals |= F_SEAL_FUTURE_WRITE;
  int added = ::fcntl(fd.get(), F_ADD_SEALS, seals);
  if (added != 0 && errno == EINVAL && only_this_mapping_writes) {
    // A kernel before Linux 5.1 has no F_SEAL_FUTURE_WRITE: a peer is lent a read-only
    // reopening of the file (shm_mapped.cpp), which a process that may reopen it can undo.
    static std::once_flag warned;
    std::call_once(warned, [] {
      log(LogLevel::kWarn, "memory", [] {
        return "this kernel cannot seal memory against writes (F_SEAL_FUTURE_WRITE, Linux 5.1): "
               "a same-host peer lent read-only memory could reopen it for writing";
      });
    });
    added = ::fcntl(fd.get(), F_ADD_SEALS, seals & ~F_SEAL_FUTURE_WRITE);
  }
  if (added != 0) {
    Status s = sys_status(only_this_mapping_writes ? "fcntl F_ADD_SEALS (with F_SEAL_FUTURE_WRITE)"
                                                   : "fcntl F_ADD_SEALS");
    ::munmap(p, size);
    return s;
  }
  base = static_cast<uint8_t*>(p);
  return {};
}

Status SharedMemory::create(std::size_t length, SharedMemory& out, bool only_we_write) {
  if (length == 0) return {ErrorCode::kInvalidArgument, "zero length"};
  out.reset();
  std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (length >= kHugePageBytes) {
    // Explicit huge pages exist only where the host reserved them; a failure is no error.
    std::size_t size = round_up(length, kHugePageBytes);
    if (map_memory_file(kRegionFileName, MFD_HUGETLB, size, out.fd_, out.base_, only_we_write)
            .ok()) {
      // Touched now: a reservation that runs short shows here as an error, not as SIGBUS later.
      if (::madvise(out.base_, size, MADV_POPULATE_WRITE) == 0) {
        out.mapped_ = size;
        return {};
      }
      ::munmap(out.base_, size);
      out.base_ = nullptr;
    }
  }
  std::size_t size = round_up(length, page);
  if (Status s = map_memory_file(kRegionFileName, 0, size, out.fd_, out.base_, only_we_write);
      !s.ok()) {
    out.reset();
    return s;
  }
  out.mapped_ = size;
  // Transparent huge pages for shared memory where the kernel allows them when advised.
  if (length >= kHugePageBytes) (void)::madvise(out.base_, size, MADV_HUGEPAGE);
  return {};
}

Status SharedMemory::detach() {
  if (!fd_.valid()) return {};
  void* copy = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED)
    return sys_status("mmap (a private copy)", errno, ErrorCode::kResourceExhausted);
  std::memcpy(copy, base_, mapped_);
  // Moved over the shared mapping in one step: the address never shows anything else.
  if (::mremap(copy, mapped_, mapped_, MREMAP_MAYMOVE | MREMAP_FIXED, base_) == MAP_FAILED) {
    Status s = sys_status("mremap (over the shared mapping)");
    ::munmap(copy, mapped_);
    return s;
  }
  fd_.reset();
  return {};
}

SharedMemory::~SharedMemory() { reset(); }

void SharedMemory::reset() {
  if (base_ != nullptr) ::munmap(base_, mapped_);
  base_ = nullptr;
  mapped_ = 0;
  fd_ = Fd();
}

}  // namespace ferry::core
