#include "cuda_interop.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstring>

namespace vkad::cuda {

namespace {

// The few driver API types used, declared with cuda.h's layout (CUDA 11.2+ for timeline
// semaphores; the NVIDIA driver's libcuda.so.1 provides every entry point below).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUstream = void*;
using CUexternalMemory = void*;
using CUexternalSemaphore = void*;
using CUdeviceptr = unsigned long long;
struct CUuuid {
  char bytes[16];
};
constexpr int kExternalMemoryOpaqueFd = 1;  // CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD
constexpr int kExternalSemaphoreTimelineFd =
    9;  // CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD

struct MemoryHandleDesc {  // CUDA_EXTERNAL_MEMORY_HANDLE_DESC
  int type;
  union {
    int fd;
    struct {
      void* handle;
      const void* name;
    } win32;
    const void* nv_sci_buf_object;
  } handle;
  unsigned long long size;
  unsigned int flags;
  unsigned int reserved[16];
};
struct MemoryBufferDesc {  // CUDA_EXTERNAL_MEMORY_BUFFER_DESC
  unsigned long long offset;
  unsigned long long size;
  unsigned int flags;
  unsigned int reserved[16];
};
struct SemaphoreHandleDesc {  // CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC
  int type;
  union {
    int fd;
    struct {
      void* handle;
      const void* name;
    } win32;
    const void* nv_sci_sync_obj;
  } handle;
  unsigned int flags;
  unsigned int reserved[16];
};
struct SemaphoreWaitParams {  // CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS
  struct {
    struct {
      unsigned long long value;
    } fence;
    union {
      void* fence;
      unsigned long long reserved;
    } nv_sci_sync;
    struct {
      unsigned long long key;
      unsigned int timeout_ms;
    } keyed_mutex;
    unsigned int reserved[10];
  } params;
  unsigned int flags;
  unsigned int reserved[16];
};
static_assert(sizeof(MemoryHandleDesc) == 104);
static_assert(sizeof(MemoryBufferDesc) == 88);
static_assert(sizeof(SemaphoreHandleDesc) == 96);
static_assert(sizeof(SemaphoreWaitParams) == 144);

}  // namespace

struct Driver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetUuid)(CUuuid*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuImportExternalMemory)(CUexternalMemory*, const MemoryHandleDesc*);
  CUresult (*cuExternalMemoryGetMappedBuffer)(CUdeviceptr*, CUexternalMemory,
                                              const MemoryBufferDesc*);
  CUresult (*cuDestroyExternalMemory)(CUexternalMemory);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuImportExternalSemaphore)(CUexternalSemaphore*, const SemaphoreHandleDesc*);
  CUresult (*cuDestroyExternalSemaphore)(CUexternalSemaphore);
  CUresult (*cuWaitExternalSemaphoresAsync)(const CUexternalSemaphore*, const SemaphoreWaitParams*,
                                            unsigned int, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
};

namespace {

// Loaded once per process; the library stays loaded (the driver does not support unloading
// while contexts live).
Result<const Driver*> load_driver() {
  static Driver driver;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      error = std::string("libcuda.so.1 (the NVIDIA driver's CUDA library) could not be loaded: ") +
              (why ? why : "unknown reason");
      return;
    }
    // The _v2 names are what cuda.h maps the calls to.
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && error.empty()) error = std::string("libcuda.so.1 lacks ") + name;
    };
    sym(driver.cuInit, "cuInit");
    sym(driver.cuGetErrorString, "cuGetErrorString");
    sym(driver.cuDeviceGetCount, "cuDeviceGetCount");
    sym(driver.cuDeviceGet, "cuDeviceGet");
    sym(driver.cuDeviceGetUuid, "cuDeviceGetUuid");
    sym(driver.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    sym(driver.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    sym(driver.cuCtxPushCurrent, "cuCtxPushCurrent_v2");
    sym(driver.cuCtxPopCurrent, "cuCtxPopCurrent_v2");
    sym(driver.cuImportExternalMemory, "cuImportExternalMemory");
    sym(driver.cuExternalMemoryGetMappedBuffer, "cuExternalMemoryGetMappedBuffer");
    sym(driver.cuDestroyExternalMemory, "cuDestroyExternalMemory");
    sym(driver.cuMemFree, "cuMemFree_v2");
    sym(driver.cuImportExternalSemaphore, "cuImportExternalSemaphore");
    sym(driver.cuDestroyExternalSemaphore, "cuDestroyExternalSemaphore");
    sym(driver.cuWaitExternalSemaphoresAsync, "cuWaitExternalSemaphoresAsync");
    sym(driver.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    sym(driver.cuStreamSynchronize, "cuStreamSynchronize");
  });
  if (!error.empty()) return make_error(ErrorCode::kUnsupported, error);
  return &driver;
}

Status check(const Driver* cu, CUresult r, const char* call) {
  if (r == 0) return {};
  const char* text = nullptr;
  if (cu->cuGetErrorString(r, &text) != 0 || text == nullptr) text = "unknown error";
  return make_error(ErrorCode::kInternal, std::string(call) + " failed with CUDA error " +
                                              std::to_string(r) + " (" + text + ")");
}

// The primary context current on this thread for a scope.
class Pushed {
 public:
  Pushed(const Driver* cu, void* ctx) : cu_(cu) { ok_ = cu->cuCtxPushCurrent(ctx) == 0; }
  ~Pushed() {
    CUcontext old = nullptr;
    if (ok_) cu_->cuCtxPopCurrent(&old);
  }
  Pushed(const Pushed&) = delete;
  Pushed& operator=(const Pushed&) = delete;
  bool ok() const { return ok_; }

 private:
  const Driver* cu_;
  bool ok_ = false;
};

}  // namespace

Result<std::unique_ptr<Interop>> Interop::create(const std::array<uint8_t, 16>& device_uuid) {
  VKAD_ASSIGN_OR_RETURN(const Driver* cu, load_driver());
  if (CUresult r = cu->cuInit(0); r != 0) {
    return make_error(ErrorCode::kUnsupported,
                      "CUDA is not usable here: " + check(cu, r, "cuInit").message());
  }
  int count = 0;
  VKAD_TRY(check(cu, cu->cuDeviceGetCount(&count), "cuDeviceGetCount"));
  std::unique_ptr<Interop> out(new Interop());
  out->cu_ = cu;
  for (int i = 0; i < count; ++i) {
    CUdevice d = 0;
    CUuuid uuid{};
    if (cu->cuDeviceGet(&d, i) != 0 || cu->cuDeviceGetUuid(&uuid, d) != 0) continue;
    if (std::memcmp(uuid.bytes, device_uuid.data(), 16) == 0) {
      out->device_ = d;
      out->ordinal_ = i;
      break;
    }
  }
  if (out->ordinal_ < 0) {
    return make_error(ErrorCode::kUnsupported,
                      "no CUDA device has the Vulkan device's UUID (" + std::to_string(count) +
                          " CUDA devices); the device is not an NVIDIA GPU CUDA can use");
  }
  VKAD_TRY(check(cu, cu->cuDevicePrimaryCtxRetain(&out->context_, out->device_),
                 "cuDevicePrimaryCtxRetain"));
  return out;
}

Interop::~Interop() {
  if (cu_ == nullptr || context_ == nullptr) return;
  {
    Pushed p(cu_, context_);
    if (p.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [id, m] : blocks_) destroy(m);
      blocks_.clear();
      if (timeline_) cu_->cuDestroyExternalSemaphore(timeline_);
      timeline_ = nullptr;
    }
  }
  cu_->cuDevicePrimaryCtxRelease(device_);
}

void Interop::destroy(Mapping& m) {
  // The mapped range first, then the import (cuda.h: "all mapped buffers must be freed").
  if (m.base) cu_->cuMemFree(m.base);
  if (m.memory) cu_->cuDestroyExternalMemory(m.memory);
  m.base = 0;
  m.memory = nullptr;
}

Result<uint64_t> Interop::acquire_block(uint64_t block_id, uint64_t block_bytes,
                                        const std::function<Result<int>()>& fd_source) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = blocks_.find(block_id);
  if (it != blocks_.end() && !it->second.block_gone) {
    ++it->second.refs;
    return it->second.base;
  }
  VKAD_ASSIGN_OR_RETURN(int fd, fd_source());
  Pushed p(cu_, context_);
  if (!p.ok()) {
    close(fd);
    return make_error(ErrorCode::kInternal, "cuCtxPushCurrent failed");
  }
  MemoryHandleDesc desc{};
  desc.type = kExternalMemoryOpaqueFd;
  desc.handle.fd = fd;
  desc.size = block_bytes;  // the whole VkDeviceMemory allocation, as CUDA requires
  Mapping m;
  if (Status s =
          check(cu_, cu_->cuImportExternalMemory(&m.memory, &desc), "cuImportExternalMemory");
      !s.ok()) {
    close(fd);  // not taken over on failure
    return s;
  }
  MemoryBufferDesc buf{};
  buf.offset = 0;
  buf.size = block_bytes;
  CUdeviceptr base = 0;
  if (Status s = check(cu_, cu_->cuExternalMemoryGetMappedBuffer(&base, m.memory, &buf),
                       "cuExternalMemoryGetMappedBuffer");
      !s.ok()) {
    cu_->cuDestroyExternalMemory(m.memory);
    return s;
  }
  m.base = base;
  m.refs = 1;
  if (it != blocks_.end()) {  // a stale entry of a freed block whose exports are still held
    // Cannot happen with block ids unique per allocation; kept simple: replace only a dead one.
    destroy(it->second);
    it->second = m;
  } else {
    blocks_.emplace(block_id, m);
  }
  return m.base;
}

void Interop::release_block(uint64_t block_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = blocks_.find(block_id);
  if (it == blocks_.end() || it->second.refs == 0) return;
  if (--it->second.refs == 0 && it->second.block_gone) {
    Pushed p(cu_, context_);
    if (p.ok()) destroy(it->second);
    blocks_.erase(it);
  }
}

void Interop::block_freed(uint64_t block_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = blocks_.find(block_id);
  if (it == blocks_.end()) return;
  if (it->second.refs > 0) {
    it->second.block_gone = true;  // CUDA's import keeps the memory alive until then
    return;
  }
  Pushed p(cu_, context_);
  if (p.ok()) destroy(it->second);
  blocks_.erase(it);
}

size_t Interop::mapped_blocks() const {
  std::lock_guard<std::mutex> l(mu_);
  return blocks_.size();
}

Status Interop::import_timeline(int fd) {
  Pushed p(cu_, context_);
  if (!p.ok()) {
    close(fd);
    return make_error(ErrorCode::kInternal, "cuCtxPushCurrent failed");
  }
  SemaphoreHandleDesc desc{};
  desc.type = kExternalSemaphoreTimelineFd;
  desc.handle.fd = fd;
  Status s =
      check(cu_, cu_->cuImportExternalSemaphore(&timeline_, &desc), "cuImportExternalSemaphore");
  if (!s.ok()) {
    close(fd);
    timeline_ = nullptr;
  }
  return s;
}

Status Interop::wait_on_stream(uint64_t value, uintptr_t stream) {
  Pushed p(cu_, context_);
  if (!p.ok()) return make_error(ErrorCode::kInternal, "cuCtxPushCurrent failed");
  SemaphoreWaitParams params{};
  params.params.fence.value = value;
  return check(cu_,
               cu_->cuWaitExternalSemaphoresAsync(&timeline_, &params, 1,
                                                  reinterpret_cast<CUstream>(stream)),
               "cuWaitExternalSemaphoresAsync");
}

Status Interop::copy_and_wait(uint64_t dst, uint64_t src, uint64_t bytes, uintptr_t stream) {
  Pushed p(cu_, context_);
  if (!p.ok()) return make_error(ErrorCode::kInternal, "cuCtxPushCurrent failed");
  auto s = reinterpret_cast<CUstream>(stream);
  VKAD_TRY(check(cu_, cu_->cuMemcpyDtoDAsync(dst, src, bytes, s), "cuMemcpyDtoDAsync"));
  return check(cu_, cu_->cuStreamSynchronize(s), "cuStreamSynchronize");
}

}  // namespace vkad::cuda
