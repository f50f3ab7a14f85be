// Sharing an ndarray's memory with another API (runtime/ndarray_export.cpp): a view of a Runtime
// (Runtime::interop()) that holds nothing of its own, under the runtime's thread model
// (runtime.h, "Threads"); valid while its runtime lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "runtime/runtime.h"

namespace vkad::runtime {

class Runtime::Interop {
 public:
  explicit Interop(Runtime& rt) : rt_(rt), use_guard_(rt.use_guard_) {}

  // What the Python package's DLPack exchange is built on (docs/interop.md, "Sharing arrays
  // with PyTorch, JAX and numpy"). The memory stays the runtime's: a caller that hands it out must
  // keep the array alive (not free it) while anyone uses it, and order the other API's work
  // against this runtime's itself, with the serials and the semaphore below.
  struct NdArrayMemory {
    std::byte* host = nullptr;  // the mapped bytes (host-visible memory), else null
    bool host_coherent = true;  // false: host views need hold_host_view's flushes
    uint64_t block_id = 0;      // the VkDeviceMemory block (rhi::BlockInfo::id)
    uint64_t block_bytes = 0;   // its size
    uint64_t offset = 0;        // the array's first byte in the block
    uint64_t bytes = 0;         // the array's size
    bool exportable = false;    // export_ndarray_fd can hand out the block
    // The serial of the last submission that used the array (rhi::kNoSerial: none): the
    // value the stream's timeline semaphore reaches when that work is done.
    rhi::Serial last_use;
  };
  // Submits what is recorded (so every use of the array so far has a serial), then says where
  // its bytes are. kNotFound / kInvalidArgument for a dead or foreign handle; kFailedPrecondition
  // while capturing (nothing could be submitted).
  Result<NdArrayMemory> ndarray_memory(NdArrayHandle array);
  // Blocks until the array's last use (as of ndarray_memory) completed; then device writes are
  // visible through the mapped pointer (non-coherent memory is invalidated).
  Status wait_ndarray(NdArrayHandle array);
  // While a host view of a mapped array is held (counted), every flush first makes host writes
  // to it visible to the device and synchronize() makes device writes visible to the host:
  // non-coherent memory is flushed / invalidated; nothing is done for coherent memory.
  // release_host_view ignores an unknown handle (it never fails).
  Status hold_host_view(NdArrayHandle array);
  void release_host_view(NdArrayHandle array);
  // A new opaque POSIX fd of the block holding the array (the caller owns it), for
  // cuImportExternalMemory. kUnsupported when the block is not exportable.
  Result<int> export_ndarray_fd(NdArrayHandle array);
  // A new opaque POSIX fd of the stream's timeline semaphore, whose value is the last serial
  // completed (kUnsupported where it is not exportable: Capabilities::export_semaphore_fd).
  Result<int> export_timeline_fd();
  // Called with a block id (NdArrayMemory::block_id) just before that block's memory is freed
  // (see rhi::MemoryAllocator::set_block_freed_hook), on the thread inside the runtime.
  void set_block_freed_hook(std::function<void(uint64_t)> hook);

 private:
  Runtime& rt_;
  UseGuard& use_guard_;  // the runtime's (VKAD_EXCLUSIVE_USE)
};

}  // namespace vkad::runtime
