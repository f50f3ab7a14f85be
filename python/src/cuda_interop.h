// vkad memory and timeline semaphores imported into CUDA, through the CUDA driver API loaded at
// run time (dlopen("libcuda.so.1")): no CUDA toolkit at build time, no dependency where there is
// no NVIDIA driver. What the Python package's DLPack exchange uses on NVIDIA GPUs (docs/interop.md,
// "Sharing arrays with PyTorch, JAX and numpy").
//
// Design: vkad carves arrays from 64 MiB VkDeviceMemory blocks (rhi/memory_allocator.h), made
// exportable as opaque fds on such devices. A block is imported into CUDA once
// (cuImportExternalMemory + cuExternalMemoryGetMappedBuffer over the whole block) and the
// mapping is cached by the block's id, so an array's CUDA pointer (block base + offset) is the
// same at every export. Each export holds a reference to its block's mapping; the mapping is
// destroyed when no export holds it and the block was freed (or the Interop is destroyed).
//
// Ordering: vkad's timeline semaphore is imported once as a CUDA external semaphore; a consumer's
// stream waits for the serial of the array's last vkad use with cuWaitExternalSemaphoresAsync
// (no host wait). Without an exportable timeline the caller waits on the host instead.
//
// Threads: every call may come from any thread (a DLPack deleter runs where the consumer frees);
// an internal mutex guards the mapping table. CUDA calls run with the device's primary context
// pushed (the one PyTorch, CuPy and JAX use).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/status.h"

namespace vkad::cuda {

struct Driver;  // the driver API's entry points (cuda_interop.cpp)

class Interop {
 public:
  // Loads the driver, initialises it, finds the CUDA device whose UUID is `device_uuid` (the
  // Vulkan device's VkPhysicalDeviceIDProperties::deviceUUID) and retains its primary context.
  // kUnsupported naming the reason: no libcuda.so.1, cuInit failed, no CUDA device with this
  // UUID (the Vulkan device is not an NVIDIA GPU CUDA sees).
  static Result<std::unique_ptr<Interop>> create(const std::array<uint8_t, 16>& device_uuid);
  // Destroys every mapping and the semaphore and releases the primary context. Exports still
  // held then point at memory CUDA no longer maps: the binding keeps the Interop alive until
  // the last export is released.
  ~Interop();
  Interop(const Interop&) = delete;
  Interop& operator=(const Interop&) = delete;

  int ordinal() const { return ordinal_; }  // the CUDA device ordinal (DLPack device_id)

  // The CUDA address of the block's first byte, importing the block on first use: `fd_source`
  // gives a new opaque fd of it (the driver takes the fd over on success; it is closed on
  // failure). Counts a reference: release_block once per successful call.
  Result<uint64_t> acquire_block(uint64_t block_id, uint64_t block_bytes,
                                 const std::function<Result<int>()>& fd_source);
  void release_block(uint64_t block_id);
  // Vulkan is freeing the block: its mapping goes as soon as no export holds it (at once when
  // none does).
  void block_freed(uint64_t block_id);
  size_t mapped_blocks() const;

  // Imports vkad's timeline semaphore (takes `fd` over on success, closes it on failure).
  Status import_timeline(int fd);
  bool has_timeline() const { return timeline_ != nullptr; }
  // Makes `stream` (a CUstream; 1 = legacy default, 2 = per-thread default) wait, on the GPU,
  // until the timeline reaches `value`.
  Status wait_on_stream(uint64_t value, uintptr_t stream);
  // dst <- src (device pointers) on `stream`, then waits on the host for it to complete.
  Status copy_and_wait(uint64_t dst, uint64_t src, uint64_t bytes, uintptr_t stream);

 private:
  Interop() = default;
  struct Mapping {
    void* memory = nullptr;  // CUexternalMemory
    uint64_t base = 0;       // CUdeviceptr of the block's byte 0
    uint32_t refs = 0;
    bool block_gone = false;
  };
  void destroy(Mapping& m);  // with the context pushed

  const Driver* cu_ = nullptr;
  int device_ = -1;  // CUdevice
  int ordinal_ = -1;
  void* context_ = nullptr;   // CUcontext (primary)
  void* timeline_ = nullptr;  // CUexternalSemaphore
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Mapping> blocks_;
};

}  // namespace vkad::cuda
