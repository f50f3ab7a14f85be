// The Vulkan instance + logical device, its capabilities, validation messages, object names,
// the memory allocator and the deferred deleter.
//
// Duties (and why each lives here):
//  - device choice (discrete GPU > integrated > ... > lavapipe), forced by option or VKAD_DEVICE;
//  - a capability snapshot, so codegen can ask "float64? atomic float add?" without Vulkan;
//  - the validation layer's messages, counted, because a single one fails a test;
//  - debug-utils names on every object, so capture tools show a readable trace;
//  - the sticky device-lost state: once lost, every call reports it and nothing hangs;
//  - live-object counters, which tests and benchmarks read to prove nothing leaks or piles up.
//
// Threading: a Device and everything created from it are externally synchronised (one thread at
// a time), as Vulkan queues are. The validation callback alone may run on any thread.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "rhi/deferred_deleter.h"
#include "rhi/device_plan.h"
#include "rhi/instance.h"
#include "rhi/memory_allocator.h"
#include "rhi/vk_check.h"

struct VolkDeviceTable;  // volk.h: this device's device-level entry points

namespace vkad::rhi {

class Stream;
class Buffer;
class ComputePipeline;
class QueryPool;
struct BufferDesc;
struct ComputePipelineDesc;
struct StreamOptions;

// Optional features an imported VkDevice was created with. Vulkan cannot be asked what a
// device enabled, so the caller states it; vkad uses a feature only when it is both stated here
// and supported by the physical device.
struct ExternalFeatures {
  bool timeline_semaphore = false;  // VkPhysicalDeviceVulkan12Features::timelineSemaphore
  bool host_query_reset = false;
  bool shader_int64 = false;
  bool shader_float64 = false;
  bool shader_float16 = false;
  bool buffer_int64_atomics = false;  // shaderBufferInt64Atomics
  bool buffer_device_address = false;
  bool atomic_float32_add = false;  // VK_EXT_shader_atomic_float enabled, and the feature
  bool atomic_float64_add = false;
  bool push_descriptor = false;  // VK_KHR_push_descriptor enabled
};

// A Vulkan device that an embedder (a DSL with its own renderer or runtime) already has, for vkad
// to share instead of creating its own. Requirements: created through the same Vulkan loader
// vkad uses (libvulkan.so.1), Vulkan 1.2 or later (instance apiVersion and device), the queues
// [first_queue, first_queue + queue_count) of `queue_family` created and supporting compute.
// vkad never destroys the instance or the device, never waits for the whole device (it waits
// only for its own submissions), and submits to those queues only from inside vkad calls: the
// embedder must not use them concurrently with a vkad call (Vulkan's external synchronization
// of VkQueue), or must give vkad queues of its own. The instance's validation layer, if any, is
// the embedder's: vkad's enable_validation does not apply to an imported device.
struct ExternalDevice {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical_device = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  uint32_t first_queue = 0;
  uint32_t queue_count = 1;
  ExternalFeatures enabled;
};

// Everything vkad reads from a physical device, as plain values (no Vulkan calls): what
// capabilities_from() turns into Capabilities. Gathered by gather_device_facts().
struct DeviceFacts {
  VkPhysicalDeviceProperties properties{};
  VkPhysicalDeviceFeatures features{};
  VkPhysicalDeviceVulkan11Properties p11{};
  VkPhysicalDeviceVulkan12Properties p12{};
  VkPhysicalDeviceVulkan12Features f12{};
  VkPhysicalDeviceShaderAtomicFloatFeaturesEXT atomic_float{};
  bool has_atomic_float_ext = false;
  bool has_push_descriptor_ext = false;
  bool has_external_memory_fd_ext = false;              // VK_KHR_external_memory_fd
  bool has_external_semaphore_fd_ext = false;           // VK_KHR_external_semaphore_fd
  bool has_pipeline_executable_properties_ext = false;  // VK_KHR_pipeline_executable_properties
  uint32_t max_push_descriptors = 0;
  VkQueueFamilyProperties queue_family{};
  VkPhysicalDeviceMemoryProperties memory{};
};

struct DeviceOptions {
  // Khronos validation layer + debug messenger. Also turned on by VKAD_VALIDATION=1.
  bool enable_validation = false;
  // "" = automatic; else an index or a name substring (see choose_device). When empty, the
  // environment variable VKAD_DEVICE is used if set.
  std::string device;
  // Feature names from Capabilities::feature_names() that must be present, e.g. "float64".
  std::vector<std::string> required_features;
  // 0 = no cap. Otherwise device-memory allocations past this many bytes fail with
  // kOutOfDeviceMemory, as a real exhaustion would (used to test out-of-memory handling).
  uint64_t memory_limit_bytes = 0;
  // Size of each VkDeviceMemory block the sub-allocator carves buffers from (host-only memory
  // types start smaller and grow to it: device_plan.h, shared_block_bytes).
  uint64_t memory_block_bytes = 64ull << 20;
  // Empty shared blocks kept per memory type when their last buffer is freed, so a
  // free/allocate cycle does not call vkAllocateMemory each time; further empty blocks (and
  // every empty dedicated block) go back to the driver at once. 0 = give every empty block back.
  uint32_t spare_blocks_per_memory_type = 1;
  // Bind kernel buffers with VK_KHR_push_descriptor where the device has it: no descriptor
  // sets or pools to allocate, write and recycle per launch. false forces the descriptor-set
  // path (devices without the extension take it anyway), so both are tested.
  bool push_descriptors = true;
  // Set: share this existing device instead of creating one (see ExternalDevice); `device`
  // (the choice) and enable_validation are then ignored.
  std::optional<ExternalDevice> external;
  // Make device-local memory exportable as opaque POSIX fds (VK_KHR_external_memory_fd), and
  // the streams' timeline semaphores too (VK_KHR_external_semaphore_fd), where the device can
  // and its device-local memory is not host-visible (a discrete GPU): what sharing an array
  // with CUDA needs (DLPack; docs/interop.md). Costs
  // nothing at run time. Not for an imported device. VKAD_EXPORT_MEMORY=0 turns it off too.
  bool export_memory = true;
  // Directory of the on-disk driver pipeline cache (rhi/pipeline_cache_file.h); "" = none (the
  // VkPipelineCache then lives as long as the device). runtime::Runtime sets it from
  // RuntimeOptions::cache_dir.
  std::string pipeline_cache_dir;
};

// What Device::create found of the on-disk pipeline cache.
struct PipelineCacheLoad {
  bool loaded = false;  // a file for this device was read and given to the driver
  uint64_t bytes = 0;   // its driver data's size
  // "off" (no directory), "missing", "corrupt" (vkad header or checksum), "stale" (another
  // format, key, or a Vulkan header of another device / driver), or "hit".
  std::string outcome = "off";
};

struct MemoryHeap {
  uint64_t size = 0;
  bool device_local = false;
};

struct Capabilities {
  std::string device_name;
  std::string driver_name;
  std::string driver_info;  // VkPhysicalDeviceVulkan12Properties::driverInfo ("580.159.04")
  DeviceKind kind = DeviceKind::kOther;
  uint32_t api_version = 0;
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  // VkPhysicalDeviceVulkan11Properties::deviceUUID: which physical device this is, across
  // processes and APIs (on NVIDIA the CUDA device UUID; rhi/device_plan.h format_uuid).
  DeviceUuid device_uuid{};
  bool timeline_semaphore = false;
  bool shader_int64 = false;
  bool shader_float64 = false;
  bool shader_float16 = false;
  bool atomic_float32_add = false;  // VK_EXT_shader_atomic_float, shaderBufferFloat32AtomicAdd
  bool atomic_float64_add = false;
  bool atomic_int64 = false;  // shaderBufferInt64Atomics (f64 atomic add by compare-and-swap)
  bool buffer_device_address = false;
  bool push_descriptor = false;  // VK_KHR_push_descriptor present and enabled
  // shaderSignedZeroInfNanPreserveFloat32/64 (float controls, core in Vulkan 1.2): shaders may
  // ask that NaN, infinities and the sign of zero survive every operation.
  bool preserve_nan_inf_f32 = false;
  bool preserve_nan_inf_f64 = false;
  uint32_t max_push_descriptors = 0;
  bool timestamps = false;
  float timestamp_period_ns = 0;
  uint32_t timestamp_valid_bits = 0;  // of the compute queue's family (0: no timestamps)
  uint32_t subgroup_size = 0;
  // Compute shaders may use the basic, vote and arithmetic subgroup operations
  // (VkPhysicalDeviceVulkan11Properties: subgroupSupportedStages has the compute stage,
  // subgroupSupportedOperations BASIC | VOTE | ARITHMETIC). Properties, nothing to enable.
  bool subgroup_arithmetic = false;
  // ... and the ballot and relative shuffle operations too (BALLOT | SHUFFLE_RELATIVE besides
  // the three above): what combining runs of an atomic add needs (spirv_emitter.cpp).
  bool subgroup_shuffle = false;
  uint64_t max_storage_buffer_range = 0;
  // Storage buffers one compute pipeline may bind: the least of maxPerStageDescriptorStorage-
  // Buffers, maxDescriptorSetStorageBuffers and maxPerStageResources. Past
  // max_push_descriptors a pipeline binds through a pooled descriptor set instead.
  uint32_t max_storage_buffers = 0;
  std::array<uint32_t, 3> max_workgroup_count{};
  std::array<uint32_t, 3> max_workgroup_size{};
  uint32_t max_workgroup_invocations = 0;
  uint32_t max_push_constants_size = 0;
  // Loop passes one shader invocation may make before the driver silently leaves the loop,
  // counted over all its loops; 0 = no such limit. Mesa's lavapipe (driver id
  // MESA_LLVMPIPE): 65,535 (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS).
  uint32_t max_loop_passes = 0;
  uint64_t min_storage_buffer_offset_alignment = 0;
  uint64_t non_coherent_atom_size = 1;  // flush / invalidate granularity of mapped memory
  std::vector<MemoryHeap> heaps;
  // Device-local blocks are allocated exportable as opaque fds (DeviceOptions::export_memory),
  // and the streams' timeline semaphores are exportable as opaque fds.
  bool export_memory_fd = false;
  bool export_semaphore_fd = false;

  // Names accepted in DeviceOptions::required_features.
  static const std::vector<std::string>& feature_names();
  // Whether the named feature is present; kInvalidArgument for an unknown name.
  Result<bool> has_feature(const std::string& name) const;
  // Human-readable multi-line summary (vkad-info prints it).
  std::string to_string() const;
};

// kUnsupported naming the first missing feature (and the device), or ok.
Status check_required_features(const Capabilities& caps, const std::vector<std::string>& names);

struct LiveObjects {
  int64_t buffers = 0;
  int64_t memory_blocks = 0;
  int64_t pipelines = 0;
  int64_t command_buffers = 0;
  int64_t descriptor_pools = 0;
  int64_t fences = 0;
  int64_t query_pools = 0;
  // Vulkan objects (and VkDeviceMemory blocks) created over the device's life: the counter a
  // steady-state loop must not move (RuntimeStats; a training iteration creates none).
  uint64_t created = 0;
};

// What the deferred deleter holds: one Vulkan handle (+ its memory, for buffers).
struct Garbage {
  VkObjectType type = VK_OBJECT_TYPE_UNKNOWN;
  uint64_t handle = 0;
  Allocation allocation;  // valid only for buffers
};

// The capability snapshot of a device with these facts (pure: unit-tested without a device).
// Features the device would enable are the ones present; push descriptors only when
// `use_push_descriptors` and the extension reports at least one.
Capabilities capabilities_from(const DeviceFacts& facts, bool use_push_descriptors);
// The same, restricted to what an imported device was created with.
Capabilities capabilities_from(const DeviceFacts& facts, const ExternalFeatures& enabled);

// What every rhi object reads of its device: the Vulkan handles and function table, the queue
// family, the capabilities, whether the device is lost, the live-object counts, the validation
// messages on it and debug names. Device (below) derives from it and makes the objects; nothing
// else derives from it.
class DeviceCore : public ValidationSink {
 public:
  // True when the device is an imported one (never destroyed by vkad).
  bool imported() const { return imported_; }
  const Capabilities& caps() const { return caps_; }
  VkDevice handle() const { return device_; }
  VkPhysicalDevice physical_device() const { return physical_; }
  VkInstance instance() const { return instance_->handle(); }
  // This device's function table. Every device-level call (vkCreateBuffer, vkCmd*,
  // vkQueueSubmit, ...) goes through it: volk's global device pointers are never loaded, so two
  // devices (one with validation, one without; or created on two threads) never see each
  // other's entry points.
  const VolkDeviceTable& fn() const { return *fn_; }
  uint32_t queue_family() const { return queue_family_; }
  uint32_t queue_count() const { return queue_count_; }
  // The index of queue 0 of vkad's queue range in queue_family (non-zero only for an imported
  // device that reserved other queues for itself).
  uint32_t first_queue() const { return first_queue_; }

  // ok, or kDeviceLost once any call has reported the device lost (sticky).
  Status status() const;
  // Runs a Vulkan call through the checker; a VK_ERROR_DEVICE_LOST marks the device lost.
  template <typename Fn>
  Status vk(const char* call, Fn&& fn) {
    Status s = vk_call(call, std::forward<Fn>(fn));
    if (s.code() == ErrorCode::kDeviceLost) lost_ = true;
    return s;
  }
  void mark_lost() { lost_ = true; }

  // Gives `handle` a debug-utils name (no-op when the extension is absent).
  void set_name(VkObjectType type, uint64_t handle, const std::string& name);

  bool validation_enabled() const { return validation_enabled_; }
  uint64_t validation_message_count() const { return validation_count_.load(); }
  std::vector<std::string> validation_messages() const;
  void clear_validation_messages();

  const LiveObjects& live() const { return live_; }
  LiveObjects& live_mut() { return live_; }

 protected:
  DeviceCore();
  ~DeviceCore() override;
  DeviceCore(const DeviceCore&) = delete;
  DeviceCore& operator=(const DeviceCore&) = delete;
  void on_validation_message(const std::string& message) override;

  std::shared_ptr<Instance> instance_;
  std::unique_ptr<VolkDeviceTable> fn_;
  bool sink_added_ = false;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  bool imported_ = false;  // adopted (ExternalDevice): never destroyed here
  uint32_t queue_family_ = 0;
  uint32_t queue_count_ = 0;
  uint32_t first_queue_ = 0;
  bool debug_utils_ = false;
  bool validation_enabled_ = false;
  std::atomic<bool> lost_{false};  // a background pipeline creation may set it
  Capabilities caps_;
  LiveObjects live_;
  std::atomic<uint64_t> validation_count_{0};
  mutable std::mutex validation_mutex_;
  std::vector<std::string> validation_messages_;
};

class Device final : public DeviceCore {
 public:
  // Creates the device on the process-wide instance (see instance.h). kNoDevice when Vulkan has no
  // device at all, kUnsupported when the chosen one lacks Vulkan 1.2 or a required feature (the
  // message names it). Chooses a physical device (or adopts options.external), reads its
  // capabilities and creates the logical device. kNoDevice when none qualifies; kInvalidArgument
  // for an ExternalDevice with null handles or a queue range the family does not have; kUnsupported
  // for a device below Vulkan 1.2 or missing a required feature.
  static Result<std::unique_ptr<Device>> create(const DeviceOptions& options = {});
  // Waits for the device to go idle, destroys every queued and live object it owns. Streams,
  // buffers and pipelines created from it must be destroyed first. Never throws.
  ~Device() override;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Streams: at most kMaxStreams per device. The stream is owned by the caller and must be
  // destroyed before the device.
  Result<std::unique_ptr<Stream>> create_stream(const StreamOptions& options);
  Result<Buffer> create_buffer(const BufferDesc& desc);
  // `counted` false: the live-object and unsaved-pipeline counters are left for
  // count_pipeline(), so that another thread may create it (the runtime's background
  // specialization): everything else this call touches is the driver's (a VkPipelineCache is
  // internally synchronized) or atomic. The pipeline is destroyed through the deleter as any.
  Result<ComputePipeline> create_compute_pipeline(const ComputePipelineDesc& desc,
                                                  bool counted = true);
  // The counting a create_compute_pipeline(desc, false) leaves out, on the device's thread
  // (-1: taking back the count of one that then failed).
  void count_pipeline(int n = 1) {
    live_.pipelines += n;
    live_.created += static_cast<uint64_t>(static_cast<int64_t>(n));
    if (n > 0) pipelines_unsaved_ += static_cast<uint64_t>(n);
  }
  Result<QueryPool> create_query_pool(uint32_t count, const std::string& name);

  // The driver's pipeline cache every pipeline of this device is created with (never null
  // after create()), loaded from DeviceOptions::pipeline_cache_dir when a valid file for this
  // device's identity is there (pipeline_cache_file.h).
  VkPipelineCache pipeline_cache() const { return pipeline_cache_; }
  const PipelineCacheLoad& pipeline_cache_load() const { return pipeline_cache_load_; }
  // Writes the driver's cache data to the directory (atomically; see base/cache_file.h) if
  // pipelines were created since it was loaded or last saved, after merging in what the file
  // holds now (vkMergePipelineCaches: another process may have saved meanwhile); nothing is
  // written when the result equals the file, or without a directory. The destructor calls it (and
  // logs a failure as a warning). kInternal naming the file on an I/O error, kVulkan if the driver
  // does not hand out its data.
  Status save_pipeline_cache();
  MemoryAllocator& allocator() { return *allocator_; }
  // A new opaque POSIX fd for the VkDeviceMemory block of `allocation` (vkGetMemoryFdKHR); the
  // caller owns it (CUDA's import takes it over). kUnsupported when the block is not
  // exportable (Capabilities::export_memory_fd off, or a host-visible usage).
  Result<int> export_memory_fd(const Allocation& allocation);
  // For mapped memory that is not host-coherent: makes host writes to the allocation visible
  // to the device (flush) / device writes visible to the host (invalidate; after the writing
  // submission completed). No-ops for coherent or unmapped memory.
  Status flush_mapped(const Allocation& allocation);
  Status invalidate_mapped(const Allocation& allocation);

  // Hands `garbage` to the deferred deleter: destroyed once every serial in `use` completed.
  void release(const ResourceUse& use, Garbage garbage);
  // Destroys whatever the deleter holds that has completed (non-blocking).
  size_t collect_garbage();
  size_t garbage_pending() const { return deleter_.pending(); }

  // Used by Stream to register/unregister itself as tracker `index`.
  int attach_stream(SerialTracker* tracker);
  void detach_stream(int index);

 private:
  Device();
  void destroy_now(Garbage&& g);
  // The parts of create(): choose the physical device, create the logical device with exactly
  // what caps_ says, or adopt an imported one.
  Status choose_physical(const DeviceOptions& options);
  Status create_logical(const DeviceFacts& facts);
  Status adopt(const ExternalDevice& external);
  // Creates pipeline_cache_, with the on-disk data when there is valid data for this device.
  Status create_pipeline_cache(const std::string& dir);
  // The parts of create_compute_pipeline() after the shader module: the descriptor set and
  // pipeline layouts (push descriptors where `push_descriptors`), and the pipeline. On an
  // error, what was made is left in the out-parameters for the caller to destroy.
  Status create_pipeline_layouts(const ComputePipelineDesc& desc, bool push_descriptors,
                                 VkDescriptorSetLayout* set_layout, VkPipelineLayout* layout);
  Status create_pipeline_object(const ComputePipelineDesc& desc, VkShaderModule module,
                                VkPipelineLayout layout, VkPipeline* pipeline);
  void print_pipeline_stats(const std::string& name, VkPipeline pipeline) const;

  // VKAD_PIPELINE_STATS=1 where the driver has VK_KHR_pipeline_executable_properties: each
  // pipeline is created capturing its statistics, printed to stderr (a diagnostic).
  bool pipeline_stats_ = false;
  VkPhysicalDeviceProperties properties_{};  // the pipeline cache's identity
  VkPipelineCache pipeline_cache_ = VK_NULL_HANDLE;
  PipelineCacheLoad pipeline_cache_load_;
  std::string pipeline_cache_dir_;
  uint64_t pipelines_unsaved_ = 0;  // pipelines created since the cache was loaded or saved
  std::unique_ptr<MemoryAllocator> allocator_;
  DeferredDeleter<Garbage> deleter_;
  std::array<bool, kMaxStreams> stream_slots_{};
};

}  // namespace vkad::rhi
