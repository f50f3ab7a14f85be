// The pipeline cache: the compute pipelines of registered kernels, shared by every kernel with
// the same content, kept (up to a capacity) after their last kernel is unregistered so that
// re-registering is free, and evicted least-recently-registered first. Keys are content hashes;
// a hit is confirmed by comparing the content (abi::same_pipelines), and a colliding kernel
// probes to the next key, so a 64-bit hash match is never taken as proof. Variants (the
// private tier, adstack/adstack_layout.h "Storage tiers", and launch specialization,
// abi/kernel_abi.h) are made on first use and live with the entry.
// Destruction of evicted pipelines is deferred by the rhi deleter to the last submission that
// bound them.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "abi/kernel_abi.h"
#include "base/status.h"
#include "rhi/device.h"
#include "rhi/pipeline.h"
#include "runtime/launch_plan.h"

namespace vkad::runtime {

class PipelineCache {
 public:
  // A task's pipeline beyond the generic one: its tier, the private lengths bucket (private
  // tier) and the launch-constant values (one per CompiledTask::spec_words; empty: none
  // specialized).
  struct VariantKey {
    bool private_tier = false;
    PrivateLengths len{};
    std::vector<uint32_t> spec_values;
    auto operator<=>(const VariantKey&) const = default;
  };
  // A variant made on another thread (variant()'s `background`): the pipeline (counted when
  // asked for, on the caller's thread: rhi::Device::create_compute_pipeline's `counted`) and
  // the milliseconds it took.
  struct Made {
    Result<rhi::ComputePipeline> pipeline;
    double ms = 0;
  };
  struct Variant {
    rhi::ComputePipeline pipeline;  // valid() once made
    std::future<Made> pending;      // valid() while made in the background, until harvested
    bool failed = false;            // its creation failed: the tier's generic pipeline instead
    rhi::Device* device = nullptr;  // where a background creation's pipeline is counted
  };
  struct Entry {
    // One per task: the heap tier, unspecialized (not valid() until made, where made on
    // demand: acquire's generic_on_demand, or while made on a thread: `making`).
    std::vector<rhi::ComputePipeline> tasks;
    // Per task: the generic pipeline being made on a thread (acquire's `background`), valid()
    // until its first use or a harvest takes it in.
    std::vector<std::future<Made>> making;
    rhi::Device* device = nullptr;  // where `making`'s pipelines are counted
    // Per task, the variants made or being made so far.
    std::vector<std::map<VariantKey, Variant>> variants;
    std::shared_ptr<const abi::CompiledKernel> content;  // what they were built from
    uint32_t refs = 0;
    uint64_t last_used = 0;  // acquisition tick, for LRU eviction
  };
  using HashFn = uint64_t (*)(const abi::CompiledKernel&);

  // `hash`: nullptr for CompiledKernel::content_hash (a test seam replaces it).
  PipelineCache(size_t capacity, HashFn hash) : capacity_(capacity), hash_(hash) {}

  // The key of `kernel`'s pipelines, created on a miss (after `validate` passes: drivers trust
  // their input, so every module is checked before one reaches the driver), with one more
  // reference. *hit tells which. `generic_on_demand`: a task with spec_words gets its generic
  // pipeline at the first variant() that returns it, not here. `background`: the generic
  // pipelines are made on threads (at most max_making() at a time; counted now), so that the
  // kernels a program registers one after another compile side by side in the driver; the
  // first variant() that needs one waits for it, and makes it again where the driver refused
  // it on its thread (that creation's error is then the caller's).
  Result<uint64_t> acquire(rhi::Device& device, const abi::CompiledKernel& kernel,
                           const std::function<Status()>& validate, bool generic_on_demand,
                           bool* hit, bool background = false);
  // Drops one reference; then evicts unreferenced entries past the capacity.
  void release(uint64_t key);
  // One more reference to an entry that has one (a captured graph keeps its pipelines).
  void retain(uint64_t key) { ++entries_.at(key).refs; }
  Entry& at(uint64_t key) { return entries_.at(key); }
  // The pipeline of `task` for `*variant`: the generic one for the heap tier unspecialized;
  // otherwise made on first use. A specialized variant not made yet, when `task` has
  // `max_specialized` of them already, is not made: its spec_values are cleared and the
  // tier's generic pipeline is returned (the caller counts that as a miss); so is one whose
  // creation failed in the background.
  //
  // `background`: a specialized heap-tier variant of a task whose generic pipeline exists is
  // made on a thread of its own instead of by this call; until a later call finds it made,
  // the generic pipeline is returned with spec_values cleared and *pending set. The generic
  // one computes the same (the constants equal the words it loads), so a launch need not
  // wait for the driver: the creation (~0.4 ms warm, tens of ms cold on NVIDIA) leaves the
  // caller's thread.
  Result<rhi::ComputePipeline*> variant(rhi::Device& device, uint64_t key, uint32_t task,
                                        VariantKey* variant, uint32_t max_specialized,
                                        bool background = false, bool* pending = nullptr);
  // Starts on a thread what variant(device, key, task, *wanted, max_specialized) would make
  // (the variant, or the generic pipeline where that is what it would return) and returns
  // without waiting; finish_background() takes them in. A batch of prepares
  // (Runtime::begin_prepare_batch).
  void start(rhi::Device& device, uint64_t key, uint32_t task, const VariantKey& wanted,
             uint32_t max_specialized);
  // Waits for every variant being made in the background and takes it in (counted as made
  // here). The destructor, clear() and eviction do the same first.
  void finish_background();
  // Waits for `key`'s generic pipelines being made on threads (acquire's `background`) and
  // takes them in, making again any the driver refused there (its error then returned).
  Status finish_making(uint64_t key);
  size_t size() const { return entries_.size(); }
  uint64_t private_variant_count() const;  // variants in the private tier
  // Variants with launch constants fixed, made or being made (not failed ones).
  uint64_t specialized_variant_count() const;
  uint64_t pending_count() const;  // variants being made in the background, not taken in yet
  // Milliseconds spent in the driver creating this cache's pipelines, and how many it made,
  // so far.
  double create_ms() const { return create_ms_; }
  uint64_t created() const { return created_; }
  void clear();
  // Before the device goes: clear() waits for the background creations first.
  ~PipelineCache() { clear(); }
  PipelineCache(PipelineCache&&) = default;
  PipelineCache& operator=(PipelineCache&& o) noexcept {
    clear();
    capacity_ = o.capacity_;
    hash_ = o.hash_;
    tick_ = o.tick_;
    create_ms_ = o.create_ms_;
    created_ = o.created_;
    turns_ = std::move(o.turns_);
    entries_ = std::move(o.entries_);
    return *this;
  }

 private:
  void evict_unreferenced();
  // Takes a background creation's result into `v` (waiting for it): the pipeline kept, or
  // the variant marked failed and its count taken back.
  void harvest(Variant& v);
  // Waits for every background creation of `e` (before it is dropped).
  void harvest_all(Entry& e);
  // Starts making `desc` on a thread of its own into `v` (counted now); false where no thread
  // could be had (`v` untouched: the caller makes it).
  bool start_background(rhi::Device& device, const rhi::ComputePipelineDesc& desc, Variant* v,
                        bool with_turns = false);
  // Starts making `desc` on a thread into `*f` (counted now), `with_turns`: the driver's
  // compiles at most max_making() at a time (the others' threads wait for a turn); false where
  // no thread could be had.
  bool start_making(rhi::Device& device, const rhi::ComputePipelineDesc& desc, std::future<Made>* f,
                    bool with_turns = true);
  // Takes a generic pipeline made on a thread into `*p` (waiting for it); the driver's error
  // where it failed (its count taken back).
  Status take_made(rhi::Device& device, std::future<Made>& f, rhi::ComputePipeline* p);
  Result<rhi::ComputePipeline*> generic(rhi::Device& device, Entry& e, uint32_t task);
  Result<rhi::ComputePipeline> create(rhi::Device& device, const rhi::ComputePipelineDesc& desc);
  // Generic pipelines made on threads at once, at most (acquire's `background`): the
  // hardware's threads less the caller's, 1 to 8.
  static uint32_t max_making();
  struct Turns;  // the creations' turns (a counting semaphore shared with their threads)
  std::shared_ptr<Turns> turns();  // made on first use
  std::shared_ptr<Turns> turns_;
  double create_ms_ = 0;
  uint64_t created_ = 0;
  size_t capacity_;
  HashFn hash_;
  uint64_t tick_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace vkad::runtime
