// Records commands for one submission of a Stream. Every command that references a buffer,
// pipeline or query pool marks it used at this list's serial, which is what keeps the object
// alive (through the deferred deleter) until the submission completes.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "rhi/serial.h"
#include "rhi/unique_handle.h"

namespace vkad::rhi {

class Stream;
class Buffer;
class ComputePipeline;
class QueryPool;
struct ResourceUse;

// Memory dependencies between commands of one list, named by what they order.
enum class Barrier : uint8_t {
  kComputeToCompute,   // shader writes -> shader reads/writes (dependent dispatches)
  kComputeToTransfer,  // shader writes -> copy source
  kTransferToCompute,  // copy/fill writes -> shader reads/writes
  kTransferToTransfer,
  kToHost,  // shader or copy writes -> host reads after the submission completes
};

// A sub-range of a buffer for binding 0 of bind_buffers (offset a multiple of the device's
// minStorageBufferOffsetAlignment; size 0: to the end of the buffer).
struct BufferRange {
  uint64_t offset = 0;
  uint64_t size = 0;
};

class CommandList;

// A secondary command buffer recorded once (Stream::begin_bundle / end_bundle) and executed by
// any number of lists (CommandList::execute), also while earlier executions are in flight
// (recorded with SIMULTANEOUS_USE). It keeps the objects it references as pointers to their
// ResourceUse and marks them at each execution's serial, so the deferred deleter keeps them
// alive exactly as if the commands had been recorded into the list: the owner must keep every
// referenced object alive, and unmoved, for as long as it executes the bundle (vkad's graphs
// check their arrays before each replay and re-record when the adstack heaps were replaced).
// Destroying it hands the command buffer back to its stream, freed once the last submission
// that executed it completed. Move-only; never throws.
class Bundle {
 public:
  Bundle() = default;
  Bundle(Bundle&& other) noexcept { *this = std::move(other); }
  Bundle& operator=(Bundle&& other) noexcept;
  ~Bundle() { reset(); }
  void reset() noexcept;
  bool valid() const { return cb_ != VK_NULL_HANDLE; }
  uint32_t dispatch_count() const { return dispatches_; }

 private:
  friend class Stream;
  friend class CommandList;
  Stream* stream_ = nullptr;  // borrowed; outlives its bundles
  VkCommandBuffer cb_ = VK_NULL_HANDLE;
  std::vector<ResourceUse*> uses_;
  Serial last_use_ = kNoSerial;
  uint32_t dispatches_ = 0;
  int side_ = -1;  // the stream's side pool it comes from (Stream::begin_side_bundle); -1: none
};

class CommandList {
 public:
  CommandList() = default;
  CommandList(CommandList&& other) noexcept = default;
  CommandList& operator=(CommandList&& other) noexcept = default;
  // An unsubmitted list gives its command buffer back to the stream (cb_'s deleter). Never throws.
  ~CommandList() = default;

  bool recording() const { return static_cast<bool>(cb_); }
  Serial serial() const { return serial_; }
  VkCommandBuffer handle() const { return cb_.get(); }
  uint32_t dispatch_count() const { return dispatches_; }

  // Binds `pipeline` unless it is the one this list bound last (a launch of the kernel launched
  // before it records no bind: the bound pipeline, its push descriptors and push constants stay
  // as Vulkan keeps them until another pipeline is bound or a bundle executes).
  void bind_pipeline(ComputePipeline& pipeline);
  // Binds `buffers` to bindings 0..n-1 (whole ranges, but `first` for binding 0: a slot of a
  // ring of per-launch memory) and marks them used: with push descriptors where the pipeline
  // has them (pipeline.push_descriptors()), else through a descriptor set allocated from the
  // stream's pools (recycled when this serial completes). kInvalidArgument when the count does
  // not match the pipeline's layout or a buffer is empty.
  Status bind_buffers(ComputePipeline& pipeline, std::span<Buffer* const> buffers,
                      BufferRange first = {});
  // Records vkCmdPushConstants unless the same bytes were pushed since the bound pipeline was
  // bound (at most 16 bytes are remembered; longer pushes always record).
  void push_constants(ComputePipeline& pipeline, const void* data, uint32_t bytes);
  void dispatch(uint32_t x, uint32_t y = 1, uint32_t z = 1);
  void barrier(Barrier kind);
  void copy(Buffer& src, Buffer& dst, uint64_t bytes, uint64_t src_offset = 0,
            uint64_t dst_offset = 0);
  // Fills `bytes` (a multiple of 4, or VK_WHOLE_SIZE) at `offset` with the 32-bit `value`.
  void fill(Buffer& dst, uint32_t value, uint64_t offset = 0, uint64_t bytes = VK_WHOLE_SIZE);
  // Fills the first `bytes` (a multiple of 8) of `dst` with the 64-bit `value` repeated, all
  // recorded in the list (a graph can hold it; no host staging): vkCmdUpdateBuffer writes the
  // first min(bytes, 64 KiB), then copies within `dst` double the filled prefix until it is
  // covered, a transfer -> transfer barrier before each. Leaves the last write a transfer write
  // (the caller's barrier orders it before its readers), as fill() does.
  void fill64(Buffer& dst, uint64_t value, uint64_t bytes);
  void reset_queries(QueryPool& pool, uint32_t first, uint32_t count);
  void write_timestamp(QueryPool& pool, uint32_t index);
  // Copies timestamps [first, first + count) of `pool` as 64-bit values into `dst` at
  // `dst_offset`, waiting for each (a transfer write: the list's closing kToHost barrier makes
  // it visible to the host once the submission completed). Query commands on one queue run in
  // submission order, so a later reset of the same queries needs no barrier.
  void copy_timestamps(QueryPool& pool, uint32_t first, uint32_t count, Buffer& dst,
                       uint64_t dst_offset);
  // Marks an object used by this submission without recording a command (e.g. a buffer only
  // reached through a device address). In a bundle's recording: remembered, and marked at each
  // execution instead.
  void mark_used(ResourceUse& use);
  // Executes a bundle (vkCmdExecuteCommands) and marks everything it references used by this
  // list. The list's bound pipeline and push state are undefined afterwards (Vulkan's rule for
  // secondary command buffers): the next bind_pipeline binds again. Not valid in a bundle's own
  // recording.
  void execute(Bundle& bundle);
  bool is_bundle() const { return bundle_; }

 private:
  friend class Stream;
  CommandList(Stream* stream, VkCommandBuffer cb, Serial serial, bool bundle = false, int side = -1)
      : stream_(stream),
        cb_(cb, Abandon{stream, bundle, side}),
        serial_(serial),
        bundle_(bundle),
        side_(side) {}

  // Gives an unsubmitted command buffer (or an unfinished bundle's) back to its stream.
  struct Abandon {
    Stream* stream = nullptr;
    bool bundle = false;
    int side = -1;  // a side bundle's pool: freed there by the thread recording it
    void operator()(VkCommandBuffer cb) noexcept;
  };

  Stream* stream_ = nullptr;  // borrowed
  UniqueHandle<VkCommandBuffer, Abandon> cb_;
  Serial serial_ = kNoSerial;
  uint32_t dispatches_ = 0;
  VkPipeline bound_ = VK_NULL_HANDLE;  // the pipeline bound last; none after execute()
  // The push constants recorded since bound_ was bound (pushed_bytes_ 0: none known).
  uint32_t pushed_bytes_ = 0;
  std::array<std::byte, 16> pushed_{};
  bool bundle_ = false;             // recording a Bundle (a secondary command buffer)
  int side_ = -1;                   // ... from this side pool of the stream
  std::vector<ResourceUse*> uses_;  // a bundle's recording: what it references
};

}  // namespace vkad::rhi
