// The CUDA stand-in: a libcuda.so.1 for tests, implementing the driver calls Ferry makes with the
// documented semantics and error codes of the real driver (cuda.h's comments), over host memory.
// docs/gpu.md says what it proves and what only a GPU proves.
//
// - Device memory is a memfd per allocation. Its device address lies in a PROT_NONE reservation,
//   so host code that dereferences a device pointer crashes as it would on a GPU; the stand-in
//   reaches the bytes through a second, private mapping of the memfd (the "shadow").
// - Legacy IPC handles name the exporter's pid, the memfd's descriptor number and inode, so
//   another process opens the very same pages (/proc/<pid>/fd/<fd>); a freed allocation's memfd
//   is closed and its handle no longer opens.
// - Streams run their copies in order on a thread each; events complete in stream order.
// - Misuse fails as documented: no current context, an unknown or destroyed handle, a pointer
//   that is not an allocation's base, a handle opened in the process that exported it, a copy
//   touching freed memory or running past an allocation's end.
//
// Settings (environment): FERRY_STANDIN_DEVICES (2; 0 makes cuInit fail with
// CUDA_ERROR_NO_DEVICE), FERRY_STANDIN_DEVICE_MEMORY (bytes per device, 8 GiB),
// FERRY_STANDIN_INIT_LOG (a file each process's first cuInit appends its pid to: tests see who
// started CUDA).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

// The driver's types, as cuda.h declares them.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(google-runtime-int)
struct CUctx_st;
using CUcontext = CUctx_st*;
struct CUstream_st;
using CUstream = CUstream_st*;
struct CUevent_st;
using CUevent = CUevent_st*;
struct CUipcMemHandle {
  char reserved[64];
};

namespace {

enum : CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_MAP_FAILED = 205,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
};
enum : int {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
  CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
  CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
  CU_POINTER_ATTRIBUTE_MAPPED = 13,
};
enum : unsigned { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };
enum : int {
  CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
  CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
  CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
  CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
  CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
  CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116,
  CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
};

constexpr int kMaxDevices = 16;
// Device addresses come from one reservation no host access may touch; 64 GiB of address
// space holds every test's allocations (addresses are not reused, so a stale pointer never
// lands in a newer allocation).
constexpr std::size_t kReservationBytes = std::size_t{64} << 30;
// Allocations start on this boundary with an untouchable gap after each (a copy running past
// an allocation's end is refused, not spilled into the next one).
constexpr std::size_t kAllocationAlign = std::size_t{64} << 10;
constexpr std::size_t kDefaultDeviceMemory = std::size_t{8} << 30;
constexpr uint32_t kHandleMagic = 0x48495346;  // "FSIH"

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return static_cast<std::size_t>(std::strtoull(v, nullptr, 10));
}

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

struct CUctx_st {
  int device = 0;
  int retained = 0;
};

namespace {

enum class Kind { kDevice, kImported };

struct Allocation {
  uint64_t id = 0;
  Kind kind = Kind::kDevice;
  CUdeviceptr base = 0;
  std::size_t size = 0;    // as asked for
  std::size_t mapped = 0;  // page-rounded
  int fd = -1;             // the memfd (exported allocations keep it open)
  uint64_t inode = 0;
  char* shadow = nullptr;  // the stand-in's own view of the bytes
  int device = 0;
  int refs = 1;  // opens of one imported handle
  uint64_t exporter_pid = 0;
  uint64_t exporter_id = 0;
};

struct HostBlock {
  std::size_t size = 0;
  int device = 0;
};

struct Handle {  // the bytes of a CUipcMemHandle
  uint32_t magic;
  uint32_t pid;
  int32_t fd;
  int32_t device;
  uint64_t inode;
  uint64_t id;
  uint64_t size;
};
static_assert(sizeof(Handle) <= sizeof(CUipcMemHandle));

class Stream;

struct State {
  std::mutex mu;
  bool initialized = false;
  int devices = 0;
  std::size_t device_memory = 0;
  std::size_t used[kMaxDevices] = {};
  CUctx_st primary[kMaxDevices];
  char* reservation = nullptr;
  std::size_t next_offset = 0;
  uint64_t next_id = 1;
  std::map<CUdeviceptr, Allocation> allocations;       // by base
  std::map<uintptr_t, HostBlock> host_blocks;          // pinned host memory, by base
  std::map<Stream*, std::shared_ptr<Stream>> streams;  // live handles' streams
  std::set<CUevent_st*> events;
  std::map<int, std::shared_ptr<Stream>> null_streams;  // per device: what stream 0 means
};

State& state() {
  static State* s = new State;  // never destroyed: worker threads may outlive static teardown
  return *s;
}

thread_local CUctx_st* current_context = nullptr;

// The allocation holding [address, address + length), or null. Caller holds state().mu.
Allocation* find(State& s, CUdeviceptr address, std::size_t length) {
  auto it = s.allocations.upper_bound(address);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  if (address < a.base || address - a.base >= a.size) return nullptr;
  if (length > a.size - (address - a.base)) return nullptr;
  return &a;
}

bool in_reservation(const State& s, CUdeviceptr address) {
  auto begin = reinterpret_cast<uintptr_t>(s.reservation);
  return s.reservation != nullptr && address >= begin && address - begin < kReservationBytes;
}

// Where the stand-in reads or writes [address, address + length): the shadow of a device
// allocation, or the host address itself. Null for device addresses outside any live allocation.
char* resolve(State& s, CUdeviceptr address, std::size_t length) {
  if (!in_reservation(s, address)) return reinterpret_cast<char*>(address);
  Allocation* a = find(s, address, length);
  return a == nullptr ? nullptr : a->shadow + (address - a->base);
}

CUdeviceptr reserve_addresses(State& s, std::size_t mapped) {
  std::size_t span = round_up(mapped, kAllocationAlign) + kAllocationAlign;
  if (s.next_offset + span > kReservationBytes) return 0;
  CUdeviceptr base = reinterpret_cast<uintptr_t>(s.reservation) + s.next_offset;
  s.next_offset += span;
  return base;
}

void release(Allocation& a) {
  munmap(a.shadow, a.mapped);
  if (a.fd >= 0) close(a.fd);
}

// Maps `fd` as allocation `a` (its kind, size, device and origin filled in): device addresses
// for it and the stand-in's own view. The caller holds s.mu and keeps `fd` only if `a.fd` is it.
CUresult map_allocation(State& s, int fd, Allocation a, CUdeviceptr* dptr) {
  a.mapped = round_up(a.size, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  a.base = reserve_addresses(s, a.mapped);
  void* shadow =
      a.base == 0 ? MAP_FAILED : mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (shadow == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  a.id = s.next_id++;
  a.shadow = static_cast<char*>(shadow);
  s.allocations.emplace(a.base, a);
  *dptr = a.base;
  return CUDA_SUCCESS;
}

// A stream: its commands run in order on a thread of its own.
struct Copy {
  char* dst;
  const char* src;
  std::size_t length;
};
struct Marker {
  std::shared_ptr<struct EventState> event;
  uint64_t generation;
};
using Command = std::variant<Copy, Marker>;

struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t completed = 0;
};

class Stream {
 public:
  explicit Stream(int device) : device_(device), worker_([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  int device() const { return device_; }
  void push(Command c) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(c));
      ++pushed_;
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock lock(mu_);
    uint64_t target = pushed_;
    idle_cv_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Command c = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (auto* copy = std::get_if<Copy>(&c)) {
        std::memmove(copy->dst, copy->src, copy->length);
      } else {
        auto& marker = std::get<Marker>(c);
        {
          std::lock_guard event_lock(marker.event->mu);
          marker.event->completed = std::max(marker.event->completed, marker.generation);
        }
        marker.event->cv.notify_all();
      }
      lock.lock();
      ++done_;
      idle_cv_.notify_all();
    }
  }

  int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Command> queue_;
  uint64_t pushed_ = 0;
  uint64_t done_ = 0;
  bool stop_ = false;
  std::thread worker_;  // last: started once the rest is built
};

// Every stream's queued work done (what cuMemFree's implicit synchronisation waits for).
void drain_all(State& s, std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<Stream>> all;
  for (auto& [raw, stream] : s.streams) all.push_back(stream);
  for (auto& [device, stream] : s.null_streams) all.push_back(stream);
  lock.unlock();
  for (auto& stream : all) stream->drain();
  lock.lock();
}

// Unmaps the allocation of `kind` based at `dptr` once every stream's queued work is done (the
// real driver synchronises the device in cuMemFree). Lets go of `lock` meanwhile.
CUresult unmap_allocation(State& s, std::unique_lock<std::mutex>& lock, CUdeviceptr dptr,
                          Kind kind) {
  auto it = s.allocations.find(dptr);
  if (it == s.allocations.end() || it->second.kind != kind) return CUDA_ERROR_INVALID_VALUE;
  drain_all(s, lock);
  it = s.allocations.find(dptr);  // another thread may have been first
  if (it == s.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  if (kind == Kind::kDevice) s.used[it->second.device] -= it->second.mapped;
  release(it->second);
  s.allocations.erase(it);
  return CUDA_SUCCESS;
}

}  // namespace

struct CUstream_st {
  Stream* stream;
};
struct CUevent_st {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

namespace {

CUresult ready(State& s) { return s.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

// What a call about one device checks first: the driver initialised, somewhere to answer, and
// a device that exists.
CUresult check_device(State& s, const void* out, CUdevice device) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= s.devices) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

// The current context, or why there is none.
CUresult need_context(State& s) {
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (current_context == nullptr || current_context->retained == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

// Stream 0 is the current context's device's null stream. Caller holds s.mu.
std::shared_ptr<Stream> stream_for(State& s, CUstream handle, CUresult& err) {
  if (handle == nullptr) {
    int device = current_context->device;
    auto it = s.null_streams.find(device);
    if (it == s.null_streams.end())
      it = s.null_streams.emplace(device, std::make_shared<Stream>(device)).first;
    return it->second;
  }
  // A handle is live while its stream is in the map (cuStreamDestroy removes it first).
  auto it = s.streams.find(handle->stream);
  if (it != s.streams.end()) return it->second;
  err = CUDA_ERROR_INVALID_HANDLE;
  return nullptr;
}

CUresult enqueue_copy(CUdeviceptr dst, CUdeviceptr src, std::size_t length, CUstream handle,
                      bool wait) {
  State& s = state();
  std::unique_lock lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = stream_for(s, handle, err);
  if (stream == nullptr) return err;
  if (length == 0) return CUDA_SUCCESS;
  char* to = resolve(s, dst, length);
  char* from = resolve(s, src, length);
  if (to == nullptr || from == nullptr) return CUDA_ERROR_INVALID_VALUE;
  stream->push(Copy{to, from, length});
  lock.unlock();
  if (wait) stream->drain();
  return CUDA_SUCCESS;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;  // as the real driver's cuGetErrorString words it
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
};

const ErrorText* find_error(CUresult r) {
  for (const ErrorText& e : kErrors) {
    if (e.code == r) return &e;
  }
  return nullptr;
}

}  // namespace

extern "C" {

#define STANDIN_API __attribute__((visibility("default")))

STANDIN_API CUresult cuInit(unsigned flags) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.initialized) return CUDA_SUCCESS;
  if (const char* log = std::getenv("FERRY_STANDIN_INIT_LOG"); log != nullptr && *log != 0) {
    if (FILE* f = std::fopen(log, "a")) {
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
    }
  }
  s.devices =
      static_cast<int>(std::min<std::size_t>(env_size("FERRY_STANDIN_DEVICES", 2), kMaxDevices));
  if (s.devices == 0) return CUDA_ERROR_NO_DEVICE;
  s.device_memory = env_size("FERRY_STANDIN_DEVICE_MEMORY", kDefaultDeviceMemory);
  void* r = mmap(nullptr, kReservationBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (r == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  s.reservation = static_cast<char*>(r);
  for (int i = 0; i < s.devices; ++i) s.primary[i].device = i;
  s.initialized = true;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = 12080;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuGetErrorName(CUresult error, const char** out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *out = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STANDIN_API CUresult cuGetErrorString(CUresult error, const char** out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *out = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STANDIN_API CUresult cuDeviceGetCount(int* count) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = s.devices;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = check_device(s, device, ordinal); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = check_device(s, name, device); r != CUDA_SUCCESS) return r;
  if (length <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<std::size_t>(length), "Ferry CUDA stand-in %d", device);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = check_device(s, value, device); r != CUDA_SUCCESS) return r;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = 0x10 + device;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:  // no NIC reaches host memory posing
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:          // as a GPU's
      *value = 0;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *value = 1;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

STANDIN_API CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice device) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = check_device(s, bytes, device); r != CUDA_SUCCESS) return r;
  *bytes = s.device_memory;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = check_device(s, ctx, device); r != CUDA_SUCCESS) return r;
  ++s.primary[device].retained;
  *ctx = &s.primary[device];
  return CUDA_SUCCESS;
}

// The last release resets the primary context: its allocations are freed.
STANDIN_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  State& s = state();
  std::unique_lock lock(s.mu);
  if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
  if (device < 0 || device >= s.devices) return CUDA_ERROR_INVALID_DEVICE;
  if (s.primary[device].retained == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--s.primary[device].retained > 0) return CUDA_SUCCESS;
  drain_all(s, lock);
  for (auto it = s.allocations.begin(); it != s.allocations.end();) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    if (it->second.kind == Kind::kDevice) s.used[device] -= it->second.mapped;
    release(it->second);
    it = s.allocations.erase(it);
  }
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr && (ctx < &s.primary[0] || ctx >= &s.primary[s.devices]))
    return CUDA_ERROR_INVALID_CONTEXT;
  current_context = ctx;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxGetCurrent(CUcontext* ctx) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = current_context;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytes) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Allocation a;
  a.size = bytes;
  a.device = current_context->device;
  std::size_t pages = round_up(bytes, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  if (s.used[a.device] + pages > s.device_memory) return CUDA_ERROR_OUT_OF_MEMORY;
  a.fd = memfd_create("ferry-cuda-standin", MFD_CLOEXEC);
  if (a.fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat st {};
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(a.fd, static_cast<off_t>(pages)) == 0 && fstat(a.fd, &st) == 0) {
    a.inode = st.st_ino;
    r = map_allocation(s, a.fd, a, dptr);
  }
  if (r != CUDA_SUCCESS) {
    close(a.fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  s.used[a.device] += pages;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  State& s = state();
  std::unique_lock lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  return unmap_allocation(s, lock, dptr, Kind::kDevice);
}

STANDIN_API CUresult cuMemHostAlloc(void** pointer, std::size_t bytes, unsigned /*flags*/) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  if (pointer == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  s.host_blocks[reinterpret_cast<uintptr_t>(p)] = HostBlock{bytes, current_context->device};
  *pointer = p;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemFreeHost(void* pointer) {
  State& s = state();
  std::unique_lock lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  auto it = s.host_blocks.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == s.host_blocks.end()) return CUDA_ERROR_INVALID_VALUE;
  drain_all(s, lock);
  it = s.host_blocks.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == s.host_blocks.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(pointer, it->second.size);
  s.host_blocks.erase(it);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size,
                                             CUdeviceptr dptr) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  Allocation* a = find(s, dptr, 0);
  if (a == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (base != nullptr) *base = a->base;
  if (size != nullptr) *size = a->size;
  return CUDA_SUCCESS;
}

// Unknown pointers are no error: their attributes read as zero (cuda.h, cuPointerGetAttributes).
STANDIN_API CUresult cuPointerGetAttributes(unsigned count, int* attributes, void** data,
                                            CUdeviceptr ptr) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
  if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Allocation* a = in_reservation(s, ptr) ? find(s, ptr, 0) : nullptr;
  const HostBlock* host = nullptr;
  uintptr_t host_base = 0;
  if (a == nullptr && !s.host_blocks.empty()) {
    auto it = s.host_blocks.upper_bound(static_cast<uintptr_t>(ptr));
    if (it != s.host_blocks.begin()) {
      --it;
      if (ptr - it->first < it->second.size) {
        host = &it->second;
        host_base = it->first;
      }
    }
  }
  for (unsigned i = 0; i < count; ++i) {
    void* out = data[i];
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    switch (attributes[i]) {
      case CU_POINTER_ATTRIBUTE_CONTEXT: {
        CUcontext ctx = nullptr;
        if (a != nullptr) ctx = &s.primary[a->device];
        if (host != nullptr) ctx = &s.primary[host->device];
        std::memcpy(out, &ctx, sizeof ctx);
        break;
      }
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: {
        unsigned type = 0;
        if (a != nullptr) type = CU_MEMORYTYPE_DEVICE;
        if (host != nullptr) type = CU_MEMORYTYPE_HOST;
        std::memcpy(out, &type, sizeof type);
        break;
      }
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      case CU_POINTER_ATTRIBUTE_HOST_POINTER: {
        // Pinned host memory is mapped at one address for both (unified addressing); device
        // memory has no host address.
        CUdeviceptr p = 0;
        if (host != nullptr ||
            (a != nullptr && attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_POINTER))
          p = ptr;
        std::memcpy(out, &p, sizeof p);
        break;
      }
      case CU_POINTER_ATTRIBUTE_BUFFER_ID: {
        unsigned long long id = a != nullptr ? a->id : 0;  // NOLINT(google-runtime-int)
        std::memcpy(out, &id, sizeof id);
        break;
      }
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: {
        bool managed = false;
        std::memcpy(out, &managed, sizeof managed);
        break;
      }
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: {
        int ordinal = a != nullptr ? a->device : host != nullptr ? host->device : 0;
        std::memcpy(out, &ordinal, sizeof ordinal);
        break;
      }
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: {
        CUdeviceptr start = a != nullptr ? a->base : host_base;
        std::memcpy(out, &start, sizeof start);
        break;
      }
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
        std::size_t size = a != nullptr ? a->size : host != nullptr ? host->size : 0;
        std::memcpy(out, &size, sizeof size);
        break;
      }
      case CU_POINTER_ATTRIBUTE_MAPPED: {
        bool mapped = a != nullptr || host != nullptr;
        std::memcpy(out, &mapped, sizeof mapped);
        break;
      }
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemsetD8_v2(CUdeviceptr dptr, unsigned char value, std::size_t count) {
  State& s = state();
  std::unique_lock lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  char* to = resolve(s, dptr, count);
  if (to == nullptr) return CUDA_ERROR_INVALID_VALUE;
  drain_all(s, lock);  // synchronous, after the work already queued
  std::memset(to, value, count);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  return enqueue_copy(dst, src, bytes, nullptr, true);
}

STANDIN_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes,
                                   CUstream stream) {
  return enqueue_copy(dst, src, bytes, stream, false);
}

STANDIN_API CUresult cuStreamCreate(CUstream* stream, unsigned /*flags*/) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto st = std::make_shared<Stream>(current_context->device);
  *stream = new CUstream_st{st.get()};
  s.streams.emplace(st.get(), std::move(st));
  return CUDA_SUCCESS;
}

// Work already queued still runs (cuda.h: the call returns at once and resources are released
// once the device is done); the stream's thread is joined here.
STANDIN_API CUresult cuStreamDestroy_v2(CUstream stream) {
  State& s = state();
  std::unique_lock lock(s.mu);
  if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
  auto it = stream == nullptr ? s.streams.end() : s.streams.find(stream->stream);
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  std::shared_ptr<Stream> st = std::move(it->second);
  s.streams.erase(it);
  delete stream;
  lock.unlock();
  st->drain();  // and the last reference joins its thread
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuStreamSynchronize(CUstream handle) {
  State& s = state();
  std::unique_lock lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = stream_for(s, handle, err);
  if (stream == nullptr) return err;
  lock.unlock();
  stream->drain();
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventCreate(CUevent* event, unsigned /*flags*/) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *event = new CUevent_st;
  s.events.insert(*event);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventRecord(CUevent event, CUstream handle) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  if (s.events.count(event) == 0) return CUDA_ERROR_INVALID_HANDLE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = stream_for(s, handle, err);
  if (stream == nullptr) return err;
  uint64_t generation = 0;
  {
    std::lock_guard event_lock(event->state->mu);
    generation = ++event->state->recorded;
  }
  stream->push(Marker{event->state, generation});
  return CUDA_SUCCESS;
}

// An event never recorded has nothing outstanding: CUDA_SUCCESS.
STANDIN_API CUresult cuEventQuery(CUevent event) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
  if (s.events.count(event) == 0) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard event_lock(event->state->mu);
  return event->state->completed >= event->state->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

STANDIN_API CUresult cuEventSynchronize(CUevent event) {
  State& s = state();
  std::shared_ptr<EventState> e;
  {
    std::lock_guard lock(s.mu);
    if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
    if (s.events.count(event) == 0) return CUDA_ERROR_INVALID_HANDLE;
    e = event->state;
  }
  std::unique_lock event_lock(e->mu);
  uint64_t target = e->recorded;
  e->cv.wait(event_lock, [&] { return e->completed >= target; });
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventDestroy_v2(CUevent event) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = ready(s); r != CUDA_SUCCESS) return r;
  if (s.events.erase(event) == 0) return CUDA_ERROR_INVALID_HANDLE;
  delete event;  // a marker still queued holds the state
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s.allocations.find(dptr);  // the base of an allocation made here
  if (it == s.allocations.end() || it->second.kind != Kind::kDevice)
    return CUDA_ERROR_INVALID_VALUE;
  const Allocation& a = it->second;
  Handle h{kHandleMagic, static_cast<uint32_t>(getpid()), a.fd, a.device, a.inode, a.id, a.size};
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

// Opened once per process and handle: a second open counts a reference and returns the same
// address (cuda.h). The exporter's own process may not open its handle.
STANDIN_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle,
                                           unsigned flags) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || (flags & ~1U) != 0) return CUDA_ERROR_INVALID_VALUE;
  Handle h{};
  std::memcpy(&h, handle.reserved, sizeof h);
  if (h.magic != kHandleMagic || h.size == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (h.pid == static_cast<uint32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  for (auto& [base, a] : s.allocations) {
    if (a.kind == Kind::kImported && a.exporter_pid == h.pid && a.exporter_id == h.id) {
      ++a.refs;
      *dptr = a.base;
      return CUDA_SUCCESS;
    }
  }
  std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporter or its allocation is gone
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_ino != h.inode) {
    close(fd);
    return CUDA_ERROR_INVALID_HANDLE;  // the descriptor number now names another file
  }
  Allocation a;
  a.kind = Kind::kImported;
  a.size = h.size;
  a.inode = h.inode;
  a.device = current_context->device;
  a.exporter_pid = h.pid;
  a.exporter_id = h.id;
  CUresult r = map_allocation(s, fd, a, dptr);
  close(fd);  // the mapping keeps the pages
  return r;
}

STANDIN_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  State& s = state();
  std::unique_lock lock(s.mu);
  if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
  auto it = s.allocations.find(dptr);
  if (it == s.allocations.end() || it->second.kind != Kind::kImported)
    return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs > 0) return CUDA_SUCCESS;
  return unmap_allocation(s, lock, dptr, Kind::kImported);
}

}  // extern "C"
